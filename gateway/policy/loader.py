"""Load a policy: strict YAML -> JSON Schema (Draft 2020-12, format checking) -> semantic pass -> frozen model.

Every stage reports *every* problem it finds, sorted by line, as ``file:line: $.path: message``; a policy
that fails any stage is never half-loaded. Compile once, evaluate many times.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
from dataclasses import replace
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from jsonschema import Draft202012Validator

from gateway.canonical import policy_fingerprint_bytes, sha256_hex
from gateway.errors import PolicyError, Problem
from gateway.policy.compose import MAX_POLICY_BYTES, decode_policy, read_policy, resolve_extends
from gateway.policy.images import image_allowed, parse_image_ref
from gateway.policy.model import (
    DEFAULT_LANGUAGE,
    DEFAULT_OUTPUT_FILES,
    DEFAULT_PACKAGES_SIZE,
    EGRESS,
    MAX_ENV_TOTAL_BYTES,
    MAX_ENV_VALUE_BYTES,
    MIN_CPUS,
    MIN_MEMORY,
    MIN_WORKSPACE,
    RELAXABLE_LIMITS,
    RUNSC_MIN_PIDS,
    EgressRule,
    EnvRule,
    FilesRule,
    ImageEntry,
    ImagesRule,
    LanguagesRule,
    Limit,
    Limits,
    Mode,
    MountRoot,
    MountsRule,
    NetworkRule,
    NpmRule,
    PackagesRule,
    Policy,
    PolicyException,
    PoolConfig,
    RuntimeRule,
    SessionsRule,
    UserSpec,
)
from gateway.policy.packages import canonical_name, canonical_pattern
from gateway.policy.paths import denied_host_reason, rw_overlaps, target_problem
from gateway.resources import load_schema
from gateway.sizes import SizeError, format_size, parse_size
from gateway.validation import problems_from_error
from gateway.yamlstrict import LoadedYaml, load_yaml

if TYPE_CHECKING:
    from gateway.egress.addresses import Destination
    from gateway.egress.secrets import SecretRule

__all__ = [
    "MAX_POLICY_BYTES",
    "canonical_sha256",
    "load_policy",
    "load_policy_text",
    "schema_problems",
]

_SIZE_LIMITS = ("memory", "output_bytes", "output_files_bytes", "tmpfs", "code_size", "files_size")
_DEFAULT_OUTPUT_FILES = 1024 * 1024


@cache
def _validator() -> Draft202012Validator:
    schema = load_schema("policy")
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def canonical_sha256(data: Any) -> str:
    """sha256 of the policy fingerprint format (:func:`gateway.canonical.policy_fingerprint_bytes`)."""
    return sha256_hex(policy_fingerprint_bytes(data))


def schema_problems(loaded: LoadedYaml) -> list[Problem]:
    """Every JSON Schema violation of a loaded document, as problems with lines."""
    problems: list[Problem] = []
    for error in _validator().iter_errors(loaded.data):
        found = problems_from_error(error, source=loaded.source, domain="policy", line_of=loaded.line_of)
        problems.extend(replace(p, source=loaded.source_of(p.path)) for p in found)
    return problems


def _order(problem: Problem) -> tuple[str, int, str]:
    """Problems sorted by file (a merged policy's own file and its bases), then line, then path."""
    return (problem.source or "", problem.line or 0, problem.path)


class _Semantic:
    """Cross-field checks the schema cannot express, collecting problems instead of stopping at the first."""

    def __init__(self, loaded: LoadedYaml) -> None:
        self.loaded = loaded
        self.problems: list[Problem] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(
            Problem(
                message,
                path=path,
                source=self.loaded.source_of(path),
                line=self.loaded.line_of(path),
                code="policy.semantic",
            )
        )

    def size(self, value: Any, path: str) -> int:
        try:
            return parse_size(value)
        except SizeError as exc:
            self.fail(path, str(exc))
            return 0

    def limit(
        self,
        raw: dict[str, Any],
        key: str,
        *,
        size: bool,
        has_default: bool = True,
        absent: Limit | None = None,
        section: str = "$.spec.limits",
    ) -> Limit:
        path = f"{section}.{key}"
        entry = raw.get(key)
        if entry is None:  # only optional limits reach here
            return absent or Limit(default=_DEFAULT_OUTPUT_FILES, max=_DEFAULT_OUTPUT_FILES)
        convert = self.size if size else (lambda v, _p: v)
        maximum = convert(entry["max"], f"{path}.max")
        default = convert(entry["default"], f"{path}.default") if has_default else maximum
        if default > maximum:
            shown = (format_size(default), format_size(maximum)) if size else (default, maximum)
            self.fail(f"{path}.default", f"default {shown[0]} is above the ceiling max {shown[1]}")
        mode = cast(Mode, entry.get("mode", "enforce"))
        hard_max = None if "hard_max" not in entry else convert(entry["hard_max"], f"{path}.hard_max")
        self._hard_max(path, mode, maximum, hard_max, size=size, clampable=has_default)
        return Limit(default=default, max=maximum, mode=mode, hard_max=hard_max)

    def _hard_max(
        self, path: str, mode: Mode, maximum: float, hard_max: float | None, *, size: bool, clampable: bool
    ) -> None:
        """``hard_max`` belongs to audit and approve mode and lies at or above ``max``; a limit that cannot be
        clamped (the bytes a request sends) needs one in audit mode, or audit mode would lift its ceiling."""

        def show(value: float) -> str:
            return format_size(int(value)) if size else f"{value:g}"

        if hard_max is not None and mode == "enforce":
            self.fail(
                f"{path}.hard_max",
                "hard_max is only valid with mode: audit or approve (in enforce mode max already denies); "
                "set mode: audit or approve, or remove hard_max",
            )
        elif hard_max is not None and hard_max < maximum:
            message = f"hard_max {show(hard_max)} is below max {show(maximum)}; it must be at least max"
            self.fail(f"{path}.hard_max", message)
        elif hard_max is None and mode == "audit" and not clampable:
            self.fail(
                f"{path}.mode",
                "audit mode cannot clamp what a request sends, so it would lift this ceiling; "
                "add hard_max (the size denied even in audit mode) or use mode: enforce",
            )


_OWN_IMAGE = ("javascript",)
"""Languages whose interpreter not every sandbox image has (every gateway image has python3 and bash): a policy
allowing one names its images in ``spec.languages.images``."""


def _languages(spec: dict[str, Any], sem: _Semantic, images: ImagesRule) -> LanguagesRule:
    """``spec.languages``: the default among the allowed, and per language a default image its own allowlist and
    ``spec.images`` both allow."""
    lang_raw = spec.get("languages", {"allowed": [DEFAULT_LANGUAGE]})
    lang_allowed = tuple(lang_raw["allowed"])
    lang_default = lang_raw.get("default", lang_allowed[0])
    mode = lang_raw.get("mode", "enforce")
    if lang_default not in lang_allowed:
        sem.fail("$.spec.languages.default", f"default {lang_default!r} is not in allowed {list(lang_allowed)}")
    per_language: list[tuple[str, ImagesRule]] = []
    for language, raw in lang_raw.get("images", {}).items():
        path = f"$.spec.languages.images.{language}"
        if language not in lang_allowed:
            sem.fail(path, f"{language!r} has images but is not in allowed {list(lang_allowed)}; allow it or drop this")
        if "allow" in raw:
            entries = _image_entries(raw["allow"], f"{path}.allow", sem)
        else:
            ref = parse_image_ref(raw["default"])
            entries = (ImageEntry(ref.repository, tuple(filter(None, [ref.tag])), tuple(filter(None, [ref.digest]))),)
        rule = ImagesRule(raw["default"], entries, mode)
        for why in (image_allowed(rule, rule.default), image_allowed(images, rule.default)):
            if why is not None:
                sem.fail(f"{path}.default", f"the default image of {language} is not allowed: {why}")
        per_language.append((language, rule))
    named = {language for language, _ in per_language}
    for language in _OWN_IMAGE:
        if language in lang_allowed and language not in named:
            sem.fail(
                "$.spec.languages.images",
                f"{language} is allowed but has no images: name the image with its interpreter, e.g. "
                f"images: {{{language}: {{default: gateway/sandbox-node:24-bookworm}}}}",
            )
    return LanguagesRule(lang_allowed, lang_default, mode, tuple(per_language))


def _images(spec: dict[str, Any], sem: _Semantic) -> ImagesRule:
    img_raw = spec["images"]
    entries = _image_entries(img_raw["allow"], "$.spec.images.allow", sem)
    images = ImagesRule(img_raw["default"], entries, img_raw.get("mode", "enforce"))
    why = image_allowed(images, images.default)
    if why is not None:
        sem.fail("$.spec.images.default", f"the default image is not allowed by the allowlist: {why}")
    return images


def _limits(spec: dict[str, Any], sem: _Semantic) -> Limits:
    lim = spec["limits"]
    limits = Limits(
        memory=sem.limit(lim, "memory", size=True),
        cpus=sem.limit(lim, "cpus", size=False),
        pids=sem.limit(lim, "pids", size=False),
        timeout_s=sem.limit(lim, "timeout_s", size=False),
        output_bytes=sem.limit(lim, "output_bytes", size=True),
        output_files_bytes=sem.limit(lim, "output_files_bytes", size=True),
        tmpfs=sem.limit(lim, "tmpfs", size=True),
        code_size=sem.limit(lim, "code_size", size=True, has_default=False),
        files_size=sem.limit(lim, "files_size", size=True, has_default=False),
        nofile=lim.get("nofile", 256),
        output_files=sem.limit(lim, "output_files", size=False, absent=DEFAULT_OUTPUT_FILES),
    )
    for key in ("default", "max"):
        value = getattr(limits.memory, key)
        if 0 < value < MIN_MEMORY or value == 0:
            sem.fail(f"$.spec.limits.memory.{key}", f"{format_size(value)} is below Docker's minimum of 6m")
        cpus = getattr(limits.cpus, key)
        if cpus < MIN_CPUS:
            sem.fail(
                f"$.spec.limits.cpus.{key}",
                f"{cpus:g} CPU is below the smallest quota a sandbox can be given ({MIN_CPUS:g}); no request could run",
            )
    if limits.tmpfs.max == 0:
        sem.fail("$.spec.limits.tmpfs.max", "a tmpfs of size 0 would be unbounded in Docker; give a size")
    return limits


def _network(spec: dict[str, Any], sem: _Semantic) -> NetworkRule:
    net_raw = spec.get("network", {})
    net_allowed = tuple(net_raw.get("allowed", ("none",)))
    net_default = net_raw.get("default", "none")
    for index, name in enumerate(net_allowed):
        if name == "host" or name.startswith("container:"):
            sem.fail(f"$.spec.network.allowed[{index}]", f"{name!r} can never be allowed")
        elif name == EGRESS:
            sem.fail(
                f"$.spec.network.allowed[{index}]",
                "'egress' is not a Docker network: list the destinations under spec.network.egress.allow, and a "
                "request may then ask for network egress",
            )
    if net_default not in net_allowed:
        sem.fail("$.spec.network.default", f"default {net_default!r} is not in allowed {list(net_allowed)}")
    egress = _egress(net_raw["egress"], sem) if "egress" in net_raw else None
    return NetworkRule(net_default, net_allowed, net_raw.get("mode", "enforce"), egress)


_EGRESS = "$.spec.network.egress"
_EGRESS_DEFAULTS = EgressRule(allow=())


def _refused_literal(entry: Destination) -> str | None:
    """The refused class an IP literal or network host reaches into (judged by its first and last address), when
    no CIDR of the entry holds it; None for a name, or a literal the entry's CIDRs show to be meant."""
    from gateway.egress.addresses import refused_class  # noqa: PLC0415 -- see _egress

    network = entry.network
    if network is None:
        return None
    if any(network.version == c.version and network.subnet_of(c) for c in entry.cidrs):  # type: ignore[arg-type]
        return None
    for address in (network.network_address, network.broadcast_address):
        refused = refused_class(address)
        if refused is not None:
            return refused
    return None


def _egress(raw: dict[str, Any], sem: _Semantic) -> EgressRule:
    """``spec.network.egress``: each entry a valid :class:`Destination`, no host twice, a literal in a refused
    class only with a CIDR naming it, and each limit's default within its ceiling."""
    # Imported here: gateway.egress loads its proxy (asyncio, ssl) too, which only a policy with egress needs.
    from gateway.egress.addresses import DEFAULT_PORT, Destination, HostError  # noqa: PLC0415

    destinations: list[Destination] = []
    first: dict[str, int] = {}
    for index, item in enumerate(raw["allow"]):
        path = f"{_EGRESS}.allow[{index}]"
        cidrs = []
        for c_index, text in enumerate(item.get("cidrs", ())):
            try:
                cidrs.append(ipaddress.ip_network(text, strict=True))
            except ValueError as exc:
                sem.fail(f"{path}.cidrs[{c_index}]", f"{text!r} is not a network: {exc}; write e.g. 10.1.0.0/16")
        try:
            entry = Destination(item["host"], tuple(item.get("ports", (DEFAULT_PORT,))), tuple(cidrs))
        except (HostError, ValueError) as exc:
            sem.fail(f"{path}.host", str(exc))
            continue
        refused = _refused_literal(entry)
        if refused is not None:
            sem.fail(
                f"{path}.host",
                f"{item['host']!r} holds {refused} addresses; list a network holding it under cidrs too, to show it "
                "is meant, or name the host instead",
            )
        key = f"{entry.kind}:{entry.key}"
        if key in first:
            sem.fail(f"{path}.host", f"host {item['host']!r} is already listed by allow[{first[key]}]; merge the ports")
        first.setdefault(key, index)
        destinations.append(entry)
    lim = raw.get("limits", {})
    section = f"{_EGRESS}.limits"
    rule = EgressRule(
        allow=tuple(destinations),
        connections=sem.limit(lim, "connections", size=False, section=section, absent=_EGRESS_DEFAULTS.connections),
        bytes_out=sem.limit(lim, "bytes_out", size=True, section=section, absent=_EGRESS_DEFAULTS.bytes_out),
        bytes_in=sem.limit(lim, "bytes_in", size=True, section=section, absent=_EGRESS_DEFAULTS.bytes_in),
        rate=sem.limit(lim, "rate", size=False, section=section, absent=_EGRESS_DEFAULTS.rate),
        mode=raw.get("mode", "enforce"),
        secrets=_secrets(raw.get("secrets", ()), destinations, sem),
    )
    for name in ("bytes_out", "bytes_in"):
        if getattr(rule, name).default == 0:
            sem.fail(f"{section}.{name}.default", "0 bytes would let no connection carry anything; give a size")
    return rule


_FRAMING_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te", "trailer", "keep-alive"}
)


def _secrets(raw: list[dict[str, Any]], allow: list[Destination], sem: _Semantic) -> tuple[SecretRule, ...]:
    """``spec.network.egress.secrets``: each host a name on the egress list; a host bound twice only to disjoint
    sets of principals (else which value a run gets would depend on the order)."""
    from gateway.egress.addresses import HostError, normalise_name  # noqa: PLC0415 -- see _egress
    from gateway.egress.secrets import SecretRule  # noqa: PLC0415 -- see _egress

    rules: list[SecretRule] = []
    bound: dict[str, list[tuple[int, frozenset[str]]]] = {}
    for index, item in enumerate(raw):
        path = f"{_EGRESS}.secrets[{index}]"
        principals = frozenset(item.get("principals", ()))
        hosts: list[str] = []
        for h_index, text in enumerate(item["hosts"]):
            at = f"{path}.hosts[{h_index}]"
            try:
                host = normalise_name(text)
            except HostError as exc:
                sem.fail(at, f"{exc}; a secret is bound to host names only (no wildcard, no IP literal)")
                continue
            if not any(entry.names(host) for entry in allow):
                sem.fail(at, f"host {text!r} is not on the egress list: add it under spec.network.egress.allow")
            for other, theirs in bound.get(host, ()):
                if not principals or not theirs or principals & theirs:
                    sem.fail(at, f"host {text!r} is already bound by secrets[{other}] for the same principals")
            bound.setdefault(host, []).append((index, principals))
            hosts.append(host)
        header = item.get("header", "Authorization")
        if header.lower() in _FRAMING_HEADERS:
            sem.fail(f"{path}.header", f"{header!r} frames the request itself; name the header the host reads")
        rules.append(
            SecretRule(
                name=item["name"],
                hosts=tuple(hosts),
                header=header,
                template=item.get("template", "Bearer {secret}"),
                principals=tuple(item.get("principals", ())),
            )
        )
    return tuple(rules)


_PACKAGES = "$.spec.packages"


def _index_egress(
    url: str, egress: EgressRule | None, sem: _Semantic, path: str = f"{_PACKAGES}.index", what: str = "index"
) -> Destination | None:
    """The install phase's one destination: the index URL's host and port, with the CIDRs of the egress entry
    that covers them; None (and a problem) when the URL is not usable or no entry covers it."""
    from gateway.egress.addresses import Destination, HostError  # noqa: PLC0415 -- see _egress

    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        sem.fail(path, f"{url!r} has no valid port: {exc}")
        return None
    if parts.username is not None or parts.query or parts.fragment or not parts.hostname:
        sem.fail(path, f"{url!r}: expected http(s)://host[:port]/path/, with no credentials, query or fragment")
        return None
    host = parts.hostname
    if egress is None:
        sem.fail(
            path,
            f"the {what} host {host}:{port} must be on the egress list, but the policy lists none: add it "
            "under spec.network.egress.allow",
        )
        return None
    try:
        asked = Destination(host, (port,))
    except (HostError, ValueError) as exc:
        sem.fail(path, f"{url!r}: {exc}")
        return None
    for entry in egress.allow:
        if asked.network is not None:
            within = entry.network is not None and entry.network.version == asked.network.version
            covers = within and asked.network.subnet_of(entry.network)  # type: ignore[arg-type]
        else:
            covers = entry.names(asked.key)
        if covers and port in entry.ports:
            return Destination(host, (port,), entry.cidrs)
    sem.fail(
        path,
        f"the {what} host {host}:{port} is not on the egress list: add it (and the port) under "
        "spec.network.egress.allow",
    )
    return None


def _npm(raw: dict[str, Any], egress: EgressRule | None, sem: _Semantic) -> NpmRule | None:
    """``spec.packages.npm``: a registry on the egress list, hashes keyed by ``name@version``."""
    section = f"{_PACKAGES}.npm"
    destination = _index_egress(raw["registry"], egress, sem, f"{section}.registry", "registry")
    hashes = tuple(sorted((key, tuple(sorted(v))) for key, v in raw["hashes"].items())) if "hashes" in raw else None
    size = sem.size(raw["size"], f"{section}.size") if "size" in raw else DEFAULT_PACKAGES_SIZE
    if size < MIN_WORKSPACE:
        sem.fail(
            f"{section}.size",
            f"{format_size(size)} is below the smallest install tree ({format_size(MIN_WORKSPACE)}); "
            "give at least that",
        )
    if destination is None:
        return None
    return NpmRule(
        registry=raw["registry"],
        registry_egress=destination,
        allow=tuple(raw["allow"]),
        hashes=hashes,
        max=raw.get("max", 16),
        size=size,
    )


def _packages(raw: dict[str, Any], egress: EgressRule | None, sem: _Semantic) -> PackagesRule | None:
    """``spec.packages``: an index on the egress list, canonical patterns, hashes keyed by canonical name (None
    when the section names only an npm registry)."""
    if "index" not in raw:
        return None
    destination = _index_egress(raw["index"], egress, sem)
    hashes: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    if "hashes" in raw:
        keyed: dict[str, tuple[str, ...]] = {}
        for key, digests in raw["hashes"].items():
            name, _, version = key.partition("==")
            canonical = f"{canonical_name(name)}=={version}"
            if canonical in keyed:
                sem.fail(
                    f"{_PACKAGES}.hashes[{key!r}]",
                    f"{key!r} names {canonical!r} again (names compare after PEP 503 "
                    "normalisation); merge the two lists",
                )
            keyed[canonical] = tuple(sorted(digests))
        hashes = tuple(sorted(keyed.items()))
    size = sem.size(raw["size"], f"{_PACKAGES}.size") if "size" in raw else DEFAULT_PACKAGES_SIZE
    if size < MIN_WORKSPACE:
        sem.fail(
            f"{_PACKAGES}.size",
            f"{format_size(size)} is below the smallest install tree "
            f"({format_size(MIN_WORKSPACE)}); give at least that",
        )
    if destination is None:
        return None
    return PackagesRule(
        index=raw["index"],
        index_egress=destination,
        allow=tuple(canonical_pattern(p) for p in raw["allow"]),
        binary_only=raw.get("binary_only", True),
        hashes=hashes,
        max=raw.get("max", 16),
        size=size,
    )


def _runtime(spec: dict[str, Any], sem: _Semantic, limits: Limits) -> RuntimeRule:
    rt_raw = spec.get("runtime", {})
    required = rt_raw.get("required")
    rt_allowed = tuple(rt_raw.get("allowed", (required,) if required else ("runc",)))
    rt_default = rt_raw.get("default", required or rt_allowed[0])
    if required is not None:
        if rt_allowed != (required,):
            sem.fail("$.spec.runtime.allowed", f"runtime {required!r} is required, so allowed may list only it")
        if rt_default != required:
            sem.fail("$.spec.runtime.default", f"runtime {required!r} is required, so the default must be it")
    if rt_default not in rt_allowed:
        sem.fail("$.spec.runtime.default", f"default {rt_default!r} is not in allowed {list(rt_allowed)}")
    if "runsc" in rt_allowed and limits.pids.max < RUNSC_MIN_PIDS:
        sem.fail(
            "$.spec.limits.pids.max",
            f"runsc is allowed but the pids ceiling {limits.pids.max} is below {RUNSC_MIN_PIDS}; gVisor's own "
            "threads count against it and the sandbox would be killed",
        )
    if rt_default == "runsc" and limits.pids.default < RUNSC_MIN_PIDS:
        sem.fail(
            "$.spec.limits.pids.default",
            f"the default runtime is runsc but the pids default {limits.pids.default} is below {RUNSC_MIN_PIDS}",
        )
    return RuntimeRule(rt_allowed, rt_default, required, rt_raw.get("mode", "enforce"))


def _mounts(spec: dict[str, Any], sem: _Semantic) -> MountsRule:
    if "mounts" not in spec:
        return MountsRule()
    m_raw = spec["mounts"]
    roots = []
    for index, item in enumerate(m_raw["allow"]):
        path = f"$.spec.mounts.allow[{index}]"
        root = os.path.realpath(posixpath.normpath(item["root"]))
        reason = denied_host_reason(root)
        if reason is not None:
            sem.fail(f"{path}.root", f"root {item['root']!r} is not allowable: {reason}")
        targets = []
        for t_index, target in enumerate(item["targets"]):
            problem = target_problem(target)
            if problem is not None:
                sem.fail(f"{path}.targets[{t_index}]", problem)
            targets.append(posixpath.normpath(target))
        roots.append(MountRoot(root, tuple(item.get("modes", ("ro",))), tuple(targets)))
    for i, j in rw_overlaps([(r.root, r.modes) for r in roots]):
        sem.fail(
            f"$.spec.mounts.allow[{j}].root",
            f"root {roots[j].root} overlaps root {roots[i].root} (allow[{i}]) and one of them allows rw: a "
            "sandbox with the rw mount could rearrange the other's tree; use sibling directories instead",
        )
    return MountsRule(tuple(roots), m_raw.get("max_count", 4), m_raw.get("mode", "enforce"))


def _env(spec: dict[str, Any], sem: _Semantic) -> EnvRule:
    if "env" not in spec:
        return EnvRule()
    e_raw = spec["env"]
    rule = EnvRule(
        allowed=tuple(e_raw["allowed"]),
        allow_dangerous=frozenset(e_raw.get("allow_dangerous", ())),
        max_count=e_raw.get("max_count", 32),
        max_value_bytes=sem.size(e_raw.get("max_value_bytes", 4096), "$.spec.env.max_value_bytes"),
        max_total_bytes=sem.size(e_raw.get("max_total_bytes", 32768), "$.spec.env.max_total_bytes"),
        mode=e_raw.get("mode", "enforce"),
    )
    for key, most, what in (
        ("max_value_bytes", MAX_ENV_VALUE_BYTES, "the kernel refuses to start a program with a longer variable"),
        ("max_total_bytes", MAX_ENV_TOTAL_BYTES, "a larger environment can fail the sandbox's exec"),
    ):
        if getattr(rule, key) > most:
            sem.fail(f"$.spec.env.{key}", f"{getattr(rule, key)} bytes is above {most}: {what}")
    return rule


_SIZE_CEILINGS = frozenset(_SIZE_LIMITS)


def _image_entries(raw: list[Any], path: str, sem: _Semantic) -> tuple[ImageEntry, ...]:
    entries = []
    for index, item in enumerate(raw):
        if "tags" not in item and "digests" not in item:
            sem.fail(f"{path}[{index}]", "lists neither tags nor digests; nothing would be allowed")
        entries.append(ImageEntry(item["repository"], tuple(item.get("tags", ())), tuple(item.get("digests", ()))))
    return tuple(entries)


def _exceptions(spec: dict[str, Any], sem: _Semantic, limits: Limits) -> tuple[PolicyException, ...]:
    """``spec.exceptions``: unique ids, aware expiry times, and relaxations that only widen."""
    out: list[PolicyException] = []
    first: dict[str, int] = {}
    for index, raw in enumerate(spec.get("exceptions", ())):
        path = f"$.spec.exceptions[{index}]"
        if raw["id"] in first:
            sem.fail(f"{path}.id", f"exception id {raw['id']!r} is already used by exceptions[{first[raw['id']]}]")
        first.setdefault(raw["id"], index)
        try:
            expires = datetime.fromisoformat(raw["expires"].replace("z", "Z"))
        except ValueError:
            sem.fail(f"{path}.expires", f"{raw['expires']!r} is not an RFC 3339 time such as 2027-01-31T00:00:00Z")
            expires = datetime.min
        if expires.tzinfo is None:
            sem.fail(f"{path}.expires", f"{raw['expires']!r} has no UTC offset; write Z or +HH:MM")
        relaxed: list[tuple[str, int | float]] = []
        for name in RELAXABLE_LIMITS:
            if name not in raw.get("limits", {}):
                continue
            where = f"{path}.limits.{name}.max"
            value = raw["limits"][name]["max"]
            ceiling = sem.size(value, where) if name in _SIZE_CEILINGS else value
            current = getattr(limits, name).max
            if ceiling <= current:
                shown = (
                    (format_size(int(ceiling)), format_size(int(current)))
                    if name in _SIZE_CEILINGS
                    else (f"{ceiling:g}", f"{current:g}")
                )
                sem.fail(
                    where, f"{shown[0]} does not raise the policy's ceiling {shown[1]}; an exception only widens",
                )  # fmt: skip
            relaxed.append((name, ceiling))
        images = _image_entries(raw.get("images", {}).get("allow", []), f"{path}.images.allow", sem)
        out.append(
            PolicyException(
                id=raw["id"],
                principals=tuple(raw["match"]["principals"]),
                reason=raw["reason"],
                approved_by=raw["approved_by"],
                expires=expires,
                limits=tuple(relaxed),
                images=images,
                source=sem.loaded.source_of(path),
                line=sem.loaded.line_of(path),
            )
        )
    return tuple(out)


def _compile(loaded: LoadedYaml) -> Policy:
    """The frozen model of a schema-valid document, after the semantic pass (every problem, sorted)."""
    doc: dict[str, Any] = loaded.data
    spec: dict[str, Any] = doc["spec"]
    sem = _Semantic(loaded)
    images = _images(spec, sem)
    languages = _languages(spec, sem, images)
    limits = _limits(spec, sem)
    network = _network(spec, sem)
    runtime = _runtime(spec, sem, limits)
    mounts = _mounts(spec, sem)
    env = _env(spec, sem)
    f_raw = spec.get("files", {})
    files = FilesRule(f_raw.get("max_count", 64), f_raw.get("mode", "enforce"))
    exceptions = _exceptions(spec, sem, limits)
    pool = _pool(spec, sem)
    sessions = _sessions(spec, sem)
    packages = _packages(spec["packages"], network.egress, sem) if "packages" in spec else None
    npm_raw = spec.get("packages", {}).get("npm")
    npm = _npm(npm_raw, network.egress, sem) if npm_raw is not None else None

    if sem.problems:
        raise PolicyError(
            f"{loaded.source} has {len(sem.problems)} problem(s)",
            problems=sorted(sem.problems, key=_order),
        )
    meta = doc["metadata"]
    return Policy(
        name=meta["name"],
        description=meta.get("description", ""),
        api_version=doc["apiVersion"],
        sha256=canonical_sha256(doc),
        source=loaded.source,
        languages=languages,
        images=images,
        limits=limits,
        network=network,
        user=UserSpec(spec["user"]["uid"], spec["user"]["gid"]),
        runtime=runtime,
        mounts=mounts,
        env=env,
        files=files,
        pull=spec.get("pull", "never"),
        seccomp=spec.get("seccomp", "gateway"),
        labels=tuple(sorted(meta.get("labels", {}).items())),
        exceptions=exceptions,
        pool=pool,
        sessions=sessions,
        packages=packages,
        npm=npm,
    )


def _sessions(spec: dict[str, Any], sem: _Semantic) -> SessionsRule | None:
    """``spec.sessions``: each bound's default within its ceiling, a workspace of at least 1m, ready kernels only
    with kernel mode."""
    raw = spec.get("sessions")
    if raw is None:
        return None
    section = "$.spec.sessions"
    rule = SessionsRule(
        modes=tuple(raw["modes"]),
        max_per_principal=raw["max_per_principal"],
        idle_s=sem.limit(raw, "idle_s", size=False, section=section),
        lifetime_s=sem.limit(raw, "lifetime_s", size=False, section=section),
        workspace_size=sem.limit(raw, "workspace_size", size=True, section=section),
        mode=raw.get("mode", "enforce"),
        pool_size=raw.get("pool", {}).get("size", 0),
    )
    if rule.pool_size and "kernel" not in rule.modes:
        sem.fail(
            f"{section}.pool.size",
            f"{rule.pool_size} ready kernels, but kernel is not in modes {list(rule.modes)}: no session could use "
            "them; add kernel to modes or set pool.size to 0",
        )
    for key in ("default", "max"):
        value = getattr(rule.workspace_size, key)
        if value < MIN_WORKSPACE:
            sem.fail(
                f"{section}.workspace_size.{key}",
                f"{format_size(int(value))} is below the smallest workspace ({format_size(MIN_WORKSPACE)}); "
                "no session could be created",
            )
    return rule


def _pool(spec: dict[str, Any], sem: _Semantic) -> PoolConfig:
    raw = spec.get("pool", {})
    pool = PoolConfig(
        size=raw.get("size", 0),
        min=raw.get("min", 0),
        max=raw.get("max", 0),
        idle_s=float(raw.get("idle_s", 300.0)),
        burst=raw.get("burst", "cold"),
        burst_wait_s=float(raw.get("burst_wait_s", 1.0)),
        profiles=raw.get("profiles", 4),
    )
    if pool.min > pool.size:
        sem.fail("$.spec.pool.min", f"pool min {pool.min} is above its size {pool.size}: expected at most size")
    if pool.max and pool.max < pool.size:
        sem.fail("$.spec.pool.max", f"pool max {pool.max} is below its size {pool.size}: expected 0 or at least size")
    return pool


def load_policy_text(text: str | bytes, *, source: str = "<string>") -> Policy:
    """Load a policy from its text. Raises :class:`PolicyError` (with every problem) and nothing else.

    A document that ``extends`` a base is merged with it first (:mod:`gateway.policy.compose`)."""
    loaded = resolve_extends(load_yaml(decode_policy(text, source=source), source=source))
    problems = schema_problems(loaded)
    if problems:
        problems.sort(key=_order)
        raise PolicyError(f"{source} has {len(problems)} problem(s)", problems=problems)
    policy = _compile(loaded)
    return _with_audit_policy(policy, loaded)


def _with_audit_policy(policy: Policy, loaded: LoadedYaml) -> Policy:
    """``policy`` with the shadow policy its ``spec.audit_policy`` names, loaded (relative to the file that
    names it). A shadow policy may not name one of its own."""
    name = loaded.data["spec"].get("audit_policy")
    if name is None:
        return policy
    path = "$.spec.audit_policy"
    declared_in = loaded.source_of(path)
    folder = os.path.dirname(declared_in) if not declared_in.startswith("<") else ""
    target = os.path.normpath(os.path.join(folder, name))

    def problem(message: str) -> Problem:
        return Problem(message, path=path, source=declared_in, line=loaded.line_of(path), code="policy.audit_policy")

    try:
        shadow = load_policy(target)
    except PolicyError as exc:
        head = problem(f"the audit policy {name!r} ({target}) does not load: {exc.message}")
        raise PolicyError(f"{loaded.source}: its audit policy does not load", problems=[head, *exc.problems]) from exc
    if shadow.audit_policy is not None:
        message = f"the audit policy {name!r} names an audit policy of its own; a shadow policy cannot have one"
        raise PolicyError(f"{loaded.source} has 1 problem(s)", problems=[problem(message)])
    return replace(policy, audit_policy=shadow)


def load_policy(path: str | os.PathLike[str]) -> Policy:
    """Load and compile the policy file at ``path``."""
    source = os.fspath(path)
    return load_policy_text(read_policy(source), source=source)

"""Resolved sandbox settings: every value of one execution decided, in no backend's vocabulary.

:func:`resolve` takes the request's value where it gave one and the policy default otherwise. The rules judge
these settings, and the backend's assembler turns the very same object into its own options, so what was
judged is what runs. :class:`SandboxProfile` is the part that depends only on the policy, the resolved limits
and the language (what a warm pool can prepare ahead of a request); the rest belongs to one run.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.hostfs import HostPathError, Identity, identity_of, open_beneath, scan
from gateway.policy.model import EGRESS, RUNSC_MIN_PIDS, EgressRule, Limit, NpmRule, PackagesRule, Policy
from gateway.policy.npm import NpmSpec, NpmSpecError, npm_name_allowed, parse_npm_spec
from gateway.policy.packages import Requirement, RequirementError, name_allowed, parse_requirement
from gateway.policy.paths import is_within
from gateway.request import EgressAsk, ExecutionRequest

if TYPE_CHECKING:
    # gateway.egress loads its proxy (asyncio, ssl) too: imported where a run with egress needs it.
    from gateway.egress.addresses import Destination
    from gateway.egress.proxy import EgressLimits
    from gateway.egress.secrets import SecretRule

__all__ = [
    "BackendLimits",
    "ResolvedEgress",
    "ResolvedMount",
    "ResolvedNpm",
    "ResolvedPackages",
    "SandboxProfile",
    "SandboxSettings",
    "covering_entry",
    "pick",
    "resolve",
]


@dataclass(frozen=True, slots=True)
class BackendLimits:
    """What a backend says it can give one sandbox, besides the fixed minimums every backend shares (the policy
    model's ``MIN_CPUS``, ``MIN_MEMORY``, ...). The limits rules deny a request beyond them, even in audit mode,
    instead of letting the backend fail after a container was made. ``None``: the backend does not know."""

    max_cpus: float | None = None
    """The most CPUs one sandbox can be given (for an engine: the CPUs of its host)."""


@dataclass(frozen=True, slots=True)
class ResolvedMount:
    source: str
    """As the request wrote it."""
    canonical: str
    """``realpath`` of the source: the path judged against the allowlist and the denied paths. What is bound
    is not this string but the directory with ``identity``, opened below ``root`` from this path."""
    target: str
    """Container path as requested; the ``mounts.target`` rule denies it unless it is already normalised."""
    mode: str
    """``ro`` or ``rw``."""
    root: str | None = None
    """The allowlisted root that contains ``canonical`` (None: no root does)."""
    identity: Identity | None = None
    """Device and inode of the directory opened below ``root`` with no symlink followed: the judged
    directory. A backend binds only a directory with this identity."""
    problem: str | None = None
    """Why the source could not be opened below its root (``identity`` is then None)."""
    contents: str | None = None
    """Why what lies below the source may not be exposed (a socket, a mount point, too many entries)."""
    owner: tuple[int, int, int] | None = None
    """``(st_uid, st_gid, st_mode)`` of the opened directory (the ``mounts.writable`` warning reads it)."""

    def to_dict(self) -> dict[str, Any]:
        ident = self.identity
        return {
            "source": self.source,
            "canonical": self.canonical,
            "target": self.target,
            "mode": self.mode,
            "device": ident.device if ident else None,
            "inode": ident.inode if ident else None,
        }


def _judge_mount(policy: Policy, source: str, target: str, mode: str) -> ResolvedMount:
    """Resolve the source, open it below its allowlisted root (no symlinks), take its identity, scan it."""
    canonical = _canonical(source)
    root = next((r.root for r in policy.mounts.allow if is_within(canonical, r.root)), None)
    if root is None:
        return ResolvedMount(source, canonical, target, mode)
    try:
        fd = open_beneath(root, canonical)
    except HostPathError as exc:
        return ResolvedMount(source, canonical, target, mode, root, problem=str(exc))
    try:
        st = os.fstat(fd)
        owner = (st.st_uid, st.st_gid, st.st_mode)
        contents = scan(fd, canonical)
        return ResolvedMount(source, canonical, target, mode, root, identity_of(fd), contents=contents, owner=owner)
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class ResolvedEgress:
    """The egress of one run with network ``egress``: exactly the destinations it may reach, and its limits.

    ``destinations`` are the policy's entries, or the request's narrowing of them (each keeping the CIDRs of the
    policy entry covering it): what the proxy is given as it is. A requested destination no entry covers is in
    ``outside`` (rule ``network.egress`` judges it) and never among the destinations: a request never widens."""

    destinations: tuple[Destination, ...]
    connections: int
    bytes_out: int
    bytes_in: int
    rate: int
    outside: tuple[tuple[int, str], ...] = ()
    """``(index in the request's egress list, why no policy entry covers it)``."""
    secrets: tuple[SecretRule, ...] = ()
    """The policy's secret rules for this run's principal, each with only the hosts among ``destinations``: what
    the proxy injects (names only; the runner looks the values up)."""

    def proxy_limits(self) -> EgressLimits:
        """The proxy's limits for this run."""
        from gateway.egress.proxy import EgressLimits  # noqa: PLC0415 -- see the imports

        return EgressLimits(
            connections=self.connections, bytes_out=self.bytes_out, bytes_in=self.bytes_in, rate=self.rate
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "destinations": [
                {"host": d.host, "ports": list(d.ports), "cidrs": [str(c) for c in d.cidrs]} for d in self.destinations
            ],
            "limits": {
                "connections": self.connections,
                "bytes_out": self.bytes_out,
                "bytes_in": self.bytes_in,
                "rate": self.rate,
            },
            **({"secrets": [rule.to_dict() for rule in self.secrets]} if self.secrets else {}),
        }


def covering_entry(rule: EgressRule, ask: EgressAsk) -> Destination | str:
    """The policy entry that covers a requested destination (its host and every port), or why none does.

    A name is covered by an entry naming it or a wildcard above it; a wildcard by the same or a wider wildcard;
    an IP literal or network by an entry whose network holds it."""
    from gateway.egress.addresses import Destination, HostError  # noqa: PLC0415 -- see the imports

    try:
        asked = Destination(ask.host, ask.ports)
    except (HostError, ValueError) as exc:
        return str(exc)
    hosts: list[Destination] = []
    for entry in rule.allow:
        if asked.kind == "network":
            covers = (
                entry.network is not None
                and asked.network is not None
                and entry.network.version == asked.network.version
                and asked.network.subnet_of(entry.network)  # type: ignore[arg-type]
            )
        elif asked.kind == "name":
            covers = entry.names(asked.key)
        else:
            covers = entry.kind == "wildcard" and (asked.key == entry.key or asked.key.endswith("." + entry.key))
        if covers:
            hosts.append(entry)
            if set(asked.ports) <= set(entry.ports):
                return entry
    if not hosts:
        return f"host {ask.host!r} is not within any host of the policy's egress list"
    allowed = sorted({p for e in hosts for p in e.ports})
    return f"host {ask.host!r} ports {list(ask.ports)} are not all allowed; the policy allows {allowed} for it"


def _resolve_egress(rule: EgressRule, request: ExecutionRequest) -> ResolvedEgress:
    from gateway.egress.addresses import Destination  # noqa: PLC0415 -- see the imports

    asks = request.egress
    req = request.limits
    destinations = list(rule.allow)
    outside: list[tuple[int, str]] = []
    if asks is not None:
        destinations = []
        for index, ask in enumerate(asks):
            found = covering_entry(rule, ask)
            if isinstance(found, str):
                outside.append((index, found))
            else:
                destinations.append(Destination(ask.host, ask.ports, found.cidrs))
    return ResolvedEgress(
        destinations=tuple(destinations),
        connections=int(pick(req.egress_connections, rule.connections)),
        bytes_out=int(pick(req.egress_bytes_out, rule.bytes_out)),
        bytes_in=int(pick(req.egress_bytes_in, rule.bytes_in)),
        rate=int(pick(req.egress_rate, rule.rate)),
        outside=tuple(outside),
        secrets=_bound_secrets(rule.secrets, destinations, request.principal),
    )


def _bound_secrets(
    rules: tuple[SecretRule, ...], destinations: list[Destination], principal: str | None
) -> tuple[SecretRule, ...]:
    """The rules that apply to ``principal``, each keeping only the hosts a destination of the run names."""
    bound = []
    for rule in rules:
        hosts = tuple(h for h in rule.hosts if any(d.names(h) for d in destinations))
        if hosts and rule.applies_to(principal):
            bound.append(dataclasses.replace(rule, hosts=hosts))
    return tuple(bound)


@dataclass(frozen=True, slots=True)
class ResolvedPackages:
    """The install phase of one run: the request's requirements, normalised, and the policy section judging them.

    A requirement that does not parse, or names a project outside ``allow``, is in ``refused`` (rule
    ``packages.allowed`` denies it) and never among :attr:`requirements`."""

    rule: PackagesRule
    requirements: tuple[Requirement, ...]
    """Sorted by their text: the same set of requirements is the same install, however it was written."""
    refused: tuple[tuple[int, str], ...] = ()
    """``(index in the request's packages, why)``."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.rule.index,
            "requirements": [str(r) for r in self.requirements],
            "binary_only": self.rule.binary_only,
        }


def _resolve_packages(rule: PackagesRule, asked: tuple[str, ...]) -> ResolvedPackages:
    accepted: dict[str, Requirement] = {}
    refused: list[tuple[int, str]] = []
    for index, text in enumerate(asked):
        try:
            requirement = parse_requirement(text)
        except RequirementError as exc:
            refused.append((index, str(exc)))
            continue
        if not name_allowed(requirement.name, rule.allow):
            refused.append((index, f"project {requirement.name!r} is not allowed (allowed: {list(rule.allow)})"))
            continue
        accepted[str(requirement)] = requirement
    return ResolvedPackages(rule, tuple(accepted[k] for k in sorted(accepted)), tuple(refused))


@dataclass(frozen=True, slots=True)
class ResolvedNpm:
    """The npm install phase of one JavaScript run: the request's specs, normalised, and the policy section
    judging them. A spec that does not parse, or names a package outside ``allow``, is in ``refused``."""

    rule: NpmRule
    specs: tuple[NpmSpec, ...]
    """Sorted by their text: the same set of specs is the same install, however it was written."""
    refused: tuple[tuple[int, str], ...] = ()
    """``(index in the request's packages, why)``."""

    def to_dict(self) -> dict[str, Any]:
        return {"registry": self.rule.registry, "specs": [str(s) for s in self.specs]}


def _resolve_npm(rule: NpmRule, asked: tuple[str, ...]) -> ResolvedNpm:
    accepted: dict[str, NpmSpec] = {}
    refused: list[tuple[int, str]] = []
    for index, text in enumerate(asked):
        try:
            spec = parse_npm_spec(text)
        except NpmSpecError as exc:
            refused.append((index, str(exc)))
            continue
        if not npm_name_allowed(spec.name, rule.allow):
            refused.append((index, f"package {spec.name!r} is not allowed (allowed: {list(rule.allow)})"))
            continue
        accepted[str(spec)] = spec
    return ResolvedNpm(rule, tuple(accepted[k] for k in sorted(accepted)), tuple(refused))


@dataclass(frozen=True, slots=True)
class SandboxProfile:
    """What a sandbox is made of before any request arrives: the policy, the image, the runtime, the limits.

    Two requests with equal profiles can be served by identically prepared sandboxes (the warm pool's key).
    """

    policy: str
    """``name@sha256:<hex>`` of the policy that decided it."""
    image: str
    runtime: str
    network: str
    memory: int
    """Bytes; memory and memory+swap alike."""
    cpus: float
    pids: int
    tmpfs: int
    """Bytes of each of ``/tmp`` and the workspace."""
    nofile: int
    uid: int
    gid: int
    pull: str
    """``never`` or ``if-missing``."""
    seccomp: str = "gateway"
    """``gateway`` (the engine default minus what a code sandbox never needs) or ``engine-default``."""
    interpreter: str = "python"
    """The request's language: the interpreter the sandbox's supervisor starts ahead (``python``, ``shell``,
    ``javascript``), so a warm pool keeps containers per language and a claim matches only its own."""


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    """Every setting of one execution: its profile plus what belongs to this run alone."""

    profile: SandboxProfile
    language: str
    timeout_s: float
    output_bytes: int
    output_files_bytes: int
    output_files: int
    """How many files the run returns at most."""
    env: tuple[tuple[str, str], ...]
    mounts: tuple[ResolvedMount, ...]
    code_bytes: int
    files_bytes: int
    egress: ResolvedEgress | None = None
    """With network ``egress`` under a policy that lists destinations: what the run may reach; else None."""
    packages: ResolvedPackages | None = None
    """With a request's packages under a policy with ``spec.packages``: what its install phase installs."""
    npm: ResolvedNpm | None = None
    """With a JavaScript request's packages under a policy with ``spec.packages.npm``: what npm installs."""

    def plan(self) -> dict[str, Any]:
        """The ``plan`` object of the decision record (a contract: keys are added, never renamed)."""
        p = self.profile
        plan: dict[str, Any] = {
            "image": p.image,
            "runtime": p.runtime,
            "network": p.network,
            "timeout_s": self.timeout_s,
            "output_bytes": self.output_bytes,
            "output_files_bytes": self.output_files_bytes,
            "output_files": self.output_files,
            "pull": p.pull,
            "language": self.language,
            "code_bytes": self.code_bytes,
            "files_bytes": self.files_bytes,
            "mounts": [m.to_dict() for m in self.mounts],
        }
        if self.egress is not None:
            plan["egress"] = self.egress.to_dict()
        if self.packages is not None:
            plan["packages"] = self.packages.to_dict()
        if self.npm is not None:
            plan["npm"] = self.npm.to_dict()
        return plan


def _canonical(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return posixpath.normpath(path)


def pick(asked: float | None, limit: Limit) -> float:
    """The request's value, else the default; in audit mode never above the ceiling (clamped to ``max``: an
    audit rollout observes a limit, it never removes it)."""
    if asked is None:
        return limit.default
    if limit.mode == "audit" and asked > limit.max:
        return limit.max
    return asked


def resolve(policy: Policy, request: ExecutionRequest) -> SandboxSettings:
    """Decide every setting: the request's value where it gave one, otherwise the policy default (the image: its
    language's default image, if the policy names one); a limit in audit mode is clamped to its ceiling (the rule
    still judges, and warns about, what was asked)."""
    lim = policy.limits
    req = request.limits
    runtime = request.runtime or policy.runtime.default
    language = request.language or policy.languages.default
    own_images = policy.languages.images_of(language)
    pids = req.pids if req.pids is None else int(pick(req.pids, lim.pids))
    if pids is None:
        pids = int(lim.pids.default)
        if runtime == "runsc" and pids < RUNSC_MIN_PIDS:
            pids = min(RUNSC_MIN_PIDS, int(lim.pids.max))
    profile = SandboxProfile(
        policy=policy.ref,
        image=request.image or (own_images or policy.images).default,
        runtime=runtime,
        network=request.network or policy.network.default,
        memory=int(pick(req.memory, lim.memory)),
        cpus=float(pick(req.cpus, lim.cpus)),
        pids=pids,
        tmpfs=int(pick(req.tmpfs, lim.tmpfs)),
        nofile=lim.nofile,
        uid=policy.user.uid,
        gid=policy.user.gid,
        pull=policy.pull,
        seccomp=policy.seccomp,
        interpreter=language,
    )
    return SandboxSettings(
        profile=profile,
        language=language,
        timeout_s=float(pick(req.timeout_s, lim.timeout_s)),
        output_bytes=int(pick(req.output_bytes, lim.output_bytes)),
        output_files_bytes=int(pick(req.output_files_bytes, lim.output_files_bytes)),
        output_files=int(pick(req.output_files, lim.output_files)),
        env=tuple(request.env.items()),
        mounts=tuple(_judge_mount(policy, m.source, m.target, m.mode) for m in request.mounts),
        code_bytes=request.code_bytes,
        files_bytes=request.files_bytes,
        egress=_resolve_egress(policy.network.egress, request)
        if profile.network == EGRESS and policy.network.egress is not None
        else None,
        packages=_resolve_packages(policy.packages, request.packages)
        if request.packages and policy.packages is not None and language == "python"
        else None,
        npm=_resolve_npm(policy.npm, request.packages)
        if request.packages and policy.npm is not None and language == "javascript"
        else None,
    )

"""Decisions: every rule judges the request, every result is kept, and the decision explains itself.

Rules are small generators (in the style of jsonschema's keyword functions): each takes the evaluation
context and yields :class:`RuleResult` objects. The engine runs them all, so *every* violation is reported,
not just the first. A rule that raises yields an ``error`` result, and an error always denies. A rule in
``audit`` mode has its failures downgraded to ``warn``: recorded, but the request proceeds.

When nothing denies, the options are assembled from the very :class:`~gateway.assembly.RunSpec` the rules
judged, and the invariant guard re-checks them; a guard refusal is an ``error`` result and a deny.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import posixpath
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, NamedTuple

from gateway.assembly import RunSpec, build_options, guard, resolve
from gateway.errors import UnsafeOptionsError
from gateway.policy.images import image_allowed
from gateway.policy.loader import MIN_MEMORY, RUNSC_MIN_PIDS
from gateway.policy.model import ImagesRule, Limit, Mode, MountRoot, Policy
from gateway.policy.paths import denied_host_reason, is_within, target_problem
from gateway.policy.sizes import format_size
from gateway.request import ExecutionRequest

__all__ = [
    "DANGEROUS_ENV",
    "Decision",
    "Plan",
    "PolicyRef",
    "RuleResult",
    "Status",
    "default_audit_dir",
    "evaluate",
]

Status = Literal["pass", "fail", "warn", "error", "skip"]

DANGEROUS_ENV: tuple[str, ...] = (
    "LD_*",
    "DYLD_*",
    "PYTHONSTARTUP",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONINSPECT",
    "PYTHONBREAKPOINT",
    "PYTHONUSERBASE",
    "PYTHONEXECUTABLE",
    "PYTHONWARNINGS",
    "BASH_ENV",
    "ENV",
    "PERL5OPT",
    "PERL5LIB",
    "NODE_OPTIONS",
    "RUBYOPT",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "GCONV_PATH",
    "MALLOC_*",
    "HOSTALIASES",
    "PATH",
    "HOME",
    "IFS",
)
"""Variables that change how the interpreter or the loader behaves. Denied unless the policy lists the
exact name under ``env.allow_dangerous``; a glob in ``env.allowed`` never allows them."""


class RuleResult(NamedTuple):
    """One rule's verdict on one part of the request.

    A NamedTuple rather than a frozen dataclass: equally immutable, and three times cheaper to build,
    which matters at about twenty results per decision.
    """

    rule: str
    """Stable rule id, e.g. ``limits.memory``."""
    status: Status
    mode: Mode
    path: str
    """JSON path into the request (``$.limits.memory``)."""
    got: Any
    """What the request asked for (or was defaulted to), as JSON data."""
    expected: Any
    """What the policy allows, as JSON data."""
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "status": self.status,
            "mode": self.mode,
            "path": self.path,
            "got": _copy_json(self.got),
            "expected": _copy_json(self.expected),
            "message": self.message,
        }


@dataclass(frozen=True, slots=True)
class PolicyRef:
    name: str
    sha256: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "sha256": self.sha256, "source": self.source}


@dataclass(frozen=True, slots=True)
class Plan:
    """What the runner needs besides the container options."""

    image: str
    runtime: str
    network: str
    timeout_s: float
    output_bytes: int
    output_files_bytes: int
    pull: str
    language: str
    code_bytes: int
    files_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "runtime": self.runtime,
            "network": self.network,
            "timeout_s": self.timeout_s,
            "output_bytes": self.output_bytes,
            "output_files_bytes": self.output_files_bytes,
            "pull": self.pull,
            "language": self.language,
            "code_bytes": self.code_bytes,
            "files_bytes": self.files_bytes,
        }


def _copy_json(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {k: _copy_json(v) for k, v in value.items()}
    if kind is list:
        return [_copy_json(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class Decision:
    """The single source of truth for one request: CLI, server, audit and reports serialise it, never rebuild it."""

    decision_id: str
    request_id: str
    allowed: bool
    policy: PolicyRef
    results: tuple[RuleResult, ...]
    _options: dict[str, Any] | None
    """The ``containers.create`` arguments (None when denied). Private: never handed out, only copied, so
    nothing can change them after the guard passed them. Read them through :attr:`options`."""
    plan: Plan | None

    @property
    def options(self) -> dict[str, Any] | None:
        """A fresh plain-JSON copy of the ``containers.create`` arguments, or None when denied."""
        if self._options is None:
            return None
        result: dict[str, Any] = _copy_json(self._options)
        return result

    @property
    def options_json(self) -> str | None:
        """The options as canonical JSON (sorted keys, compact separators), or None when denied."""
        if self._options is None:
            return None
        return json.dumps(self._options, sort_keys=True, separators=(",", ":"), ensure_ascii=False)

    @property
    def options_sha256(self) -> str | None:
        """sha256 of :attr:`options_json`, for audit records that refer to the exact options."""
        text = self.options_json
        return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()

    @property
    def violations(self) -> tuple[RuleResult, ...]:
        """Every result that denies: an enforce-mode failure, or an error in any mode."""
        return tuple(r for r in self.results if r.status == "error" or (r.status == "fail" and r.mode == "enforce"))

    @property
    def warnings(self) -> tuple[RuleResult, ...]:
        return tuple(r for r in self.results if r.status == "warn")

    def create_kwargs(self) -> dict[str, Any]:
        """A fresh, mutable copy of the options for ``containers.create``; refuses on a denied decision."""
        options = self.options
        if not self.allowed or options is None:
            raise UnsafeOptionsError("a denied decision has no run options")
        return options

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision_id": self.decision_id,
            "request_id": self.request_id,
            "allowed": self.allowed,
            "policy": self.policy.to_dict(),
            "results": [r.to_dict() for r in self.results],
            "violations": [r.to_dict() for r in self.violations],
            "warnings": [r.to_dict() for r in self.warnings],
            "options": self.options,
            "plan": self.plan.to_dict() if self.plan is not None else None,
        }


# --- rules ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Ctx:
    policy: Policy
    request: ExecutionRequest
    spec: RunSpec
    audit_dir: str


class _Rule:
    """A rule id plus a generator of results. ``mode`` is the policy section's mode."""

    __slots__ = ("check", "mode", "rule")

    def __init__(self, rule: str, mode: Callable[[Policy], Mode], check: Callable[[_Ctx, Mode], Iterator[RuleResult]]):
        self.rule = rule
        self.mode = mode
        self.check = check


def _res(rule: str, mode: Mode, ok: bool, path: str, got: Any, expected: Any, message: str) -> RuleResult:  # noqa: PLR0917
    status: Status = "pass" if ok else ("warn" if mode == "audit" else "fail")
    return RuleResult(rule, status, mode, path, got, expected, message)


def _skip(rule: str, mode: Mode, path: str, message: str) -> RuleResult:
    return RuleResult(rule, "skip", mode, path, None, None, message)


def _language(ctx: _Ctx, mode: Mode) -> Iterator[RuleResult]:
    allowed = list(ctx.policy.languages.allowed)
    got = ctx.spec.language
    ok = got in allowed
    yield _res(
        "language.supported",
        mode,
        ok,
        "$.language",
        got,
        allowed,
        f"language {got!r} is supported" if ok else f"language {got!r} is not supported (allowed: {allowed})",
    )


@cache
def _images_expected(rule: ImagesRule) -> list[dict[str, Any]]:
    # Computed once per policy; shared by results, so RuleResult.to_dict() hands out copies.
    return [{"repository": e.repository, "tags": list(e.tags), "digests": list(e.digests)} for e in rule.allow]


def _images(ctx: _Ctx, mode: Mode) -> Iterator[RuleResult]:
    why = image_allowed(ctx.policy.images, ctx.spec.image)
    expected = _images_expected(ctx.policy.images)
    message = f"image {ctx.spec.image!r} is allowed" if why is None else why
    yield _res("images.allowlist", mode, why is None, "$.image", ctx.spec.image, expected, message)


_LIMIT_PATHS = {
    name: f"$.limits.{name}"
    for name in ("memory", "cpus", "pids", "timeout_s", "output_bytes", "output_files_bytes", "tmpfs")
}


@cache
def _limit_expected(maximum: float, floor: float | None) -> dict[str, Any]:
    # Shared between results (RuleResult.to_dict() copies), built once per distinct ceiling.
    return {"max": maximum} if floor is None else {"max": maximum, "min": floor}


def _show(value: float, size: bool) -> str:
    return format_size(int(value)) if size else f"{value:g}"


def _limit_result(
    rule: str, field: str, limit: Limit, value: float, asked: float | None, *, size: bool, floor: float | None = None
) -> RuleResult:
    path = _LIMIT_PATHS[field]
    expected = _limit_expected(limit.max, floor)
    if value > limit.max:
        return _res(
            rule, limit.mode, False, path, value, expected,
            f"{field} {_show(value, size)} is above the ceiling {_show(limit.max, size)}",
        )  # fmt: skip
    if floor is not None and value < floor:
        return _res(
            rule, limit.mode, False, path, value, expected,
            f"{field} {_show(value, size)} is below the minimum {_show(floor, size)}",
        )  # fmt: skip
    message = "requested value within the ceiling" if asked is not None else "policy default within the ceiling"
    return _res(rule, limit.mode, True, path, value, expected, message)


def _limits(ctx: _Ctx, _mode: Mode) -> Iterator[RuleResult]:
    lim = ctx.policy.limits
    req = ctx.request.limits
    spec = ctx.spec
    pids_floor = RUNSC_MIN_PIDS if spec.runtime == "runsc" and lim.pids.max >= RUNSC_MIN_PIDS else None
    yield _limit_result("limits.memory", "memory", lim.memory, spec.memory, req.memory, size=True, floor=MIN_MEMORY)
    yield _limit_result("limits.cpus", "cpus", lim.cpus, spec.cpus, req.cpus, size=False)
    yield _limit_result("limits.pids", "pids", lim.pids, spec.pids, req.pids, size=False, floor=pids_floor)
    yield _limit_result("limits.timeout", "timeout_s", lim.timeout_s, spec.timeout_s, req.timeout_s, size=False)
    yield _limit_result(
        "limits.output_bytes", "output_bytes", lim.output_bytes, spec.output_bytes, req.output_bytes, size=True
    )
    yield _limit_result(
        "limits.output_files_bytes",
        "output_files_bytes",
        lim.output_files_bytes,
        spec.output_files_bytes,
        req.output_files_bytes,
        size=True,
    )
    yield _limit_result("limits.tmpfs", "tmpfs", lim.tmpfs, spec.tmpfs, req.tmpfs, size=True, floor=1024 * 1024)
    code_max = int(lim.code_size.max)
    ok = spec.code_bytes <= code_max
    yield _res(
        "limits.code_size", lim.code_size.mode, ok, "$.code", spec.code_bytes, {"max": code_max},
        "code within ceiling" if ok else f"code is {spec.code_bytes} bytes; the ceiling is {format_size(code_max)}",
    )  # fmt: skip
    files_max = int(lim.files_size.max)
    ok = spec.files_bytes <= files_max
    yield _res(
        "limits.files_size", lim.files_size.mode, ok, "$.files", spec.files_bytes, {"max": files_max},
        "files within ceiling" if ok
        else f"files total {spec.files_bytes} bytes; the ceiling is {format_size(files_max)}",
    )  # fmt: skip


def _file_name_problem(name: str) -> str | None:
    if not name:
        return "file name is empty"
    if "\x00" in name:
        return "file name contains NUL"
    if "\\" in name:
        return "file name contains a backslash"
    if name.startswith("/"):
        return "file name is absolute; names are relative to /workspace"
    parts = name.split("/")
    if any(p == ".." for p in parts):
        return "file name contains '..'"
    if any(p in ("", ".") for p in parts):
        return "file name has an empty or '.' component"
    if any(ord(ch) < 32 for ch in name):
        return "file name contains a control character"
    return None


def _files(ctx: _Ctx, mode: Mode) -> Iterator[RuleResult]:
    files = ctx.request.files
    if not files:
        yield _skip("files.path", mode, "$.files", "no files sent")
        return
    rule = ctx.policy.files
    expected = "relative path without '..', NUL, backslash or empty components"
    bad = False
    for name in files:
        problem = _file_name_problem(name)
        if problem is not None:
            bad = True
            yield _res("files.path", mode, False, f"$.files[{name!r}]", name, expected, f"{problem}: {name!r}")
    if len(files) > rule.max_count:
        bad = True
        yield _res(
            "files.path",
            mode,
            False,
            "$.files",
            len(files),
            {"max_count": rule.max_count},
            f"{len(files)} files sent; at most {rule.max_count} allowed",
        )
    if not bad:
        yield _res("files.path", mode, True, "$.files", len(files), expected, f"{len(files)} file name(s) are safe")


def _network(ctx: _Ctx, mode: Mode) -> Iterator[RuleResult]:
    got = ctx.spec.network
    allowed = list(ctx.policy.network.allowed)
    if got == "host" or got.startswith("container:"):
        yield _res(
            "network.mode",
            mode if mode == "enforce" else "enforce",
            False,
            "$.network",
            got,
            allowed,
            f"network {got!r} can never be allowed",
        )
        return
    ok = got in allowed
    message = f"network {got!r} is allowed" if ok else f"network {got!r} is not allowed (allowed: {allowed})"
    yield _res("network.mode", mode, ok, "$.network", got, allowed, message)


def _runtime(ctx: _Ctx, mode: Mode) -> Iterator[RuleResult]:
    got = ctx.spec.runtime
    rule = ctx.policy.runtime
    allowed = list(rule.allowed)
    ok = got in allowed
    message = f"runtime {got!r} is allowed" if ok else f"runtime {got!r} is not allowed (allowed: {allowed})"
    yield _res("runtime.allowed", mode, ok, "$.runtime", got, allowed, message)
    if rule.required is None:
        yield _skip("runtime.required", mode, "$.runtime", "the policy requires no particular runtime")
    else:
        ok = got == rule.required
        yield _res(
            "runtime.required",
            mode,
            ok,
            "$.runtime",
            got,
            rule.required,
            f"runtime {got!r} {'is' if ok else 'is not'} the required {rule.required!r}",
        )


def _user(ctx: _Ctx, _mode: Mode) -> Iterator[RuleResult]:
    user = ctx.policy.user
    ok = user.uid != 0 and user.gid != 0
    yield _res(
        "user.non_root",
        "enforce",
        ok,
        "$",
        f"{user.uid}:{user.gid}",
        "uid and gid not 0",
        "runs as a non-root user" if ok else "the policy user is root",
    )


def _matching_root(roots: tuple[MountRoot, ...], canonical: str) -> MountRoot | None:
    for root in roots:
        if is_within(canonical, root.root):
            return root
    return None


def _mounts(ctx: _Ctx, mode: Mode) -> Iterator[RuleResult]:
    mounts = ctx.spec.mounts
    rule = ctx.policy.mounts
    if not mounts:
        for rid in ("mounts.allowlist", "mounts.denied_path", "mounts.target"):
            yield _skip(rid, mode, "$.mounts", "no mounts requested")
        return
    roots = [r.root for r in rule.allow]
    if not rule.allow:
        yield _res("mounts.allowlist", mode, False, "$.mounts", len(mounts), [], "this policy allows no mounts")
    elif len(mounts) > rule.max_count:
        yield _res(
            "mounts.allowlist",
            mode,
            False,
            "$.mounts",
            len(mounts),
            {"max_count": rule.max_count},
            f"{len(mounts)} mounts requested; at most {rule.max_count} allowed",
        )
    extra = (ctx.audit_dir,)
    seen_targets: set[str] = set()
    for index, m in enumerate(mounts):
        path = f"$.mounts[{index}]"
        # Denied paths first, on the canonical path: a symlink inside an allowed root cannot smuggle the socket.
        reason = denied_host_reason(m.canonical, extra=extra)
        if reason is None and m.canonical != m.source:
            reason = denied_host_reason(posixpath.normpath(m.source), extra=extra)
        yield _res(
            "mounts.denied_path",
            "enforce",
            reason is None,
            f"{path}.source",
            m.canonical,
            "not a system path, engine socket or the audit directory",
            reason or f"{m.canonical} is not a denied path",
        )
        root = _matching_root(rule.allow, m.canonical)
        if rule.allow:
            if not os.path.exists(m.canonical):
                yield _res(
                    "mounts.allowlist",
                    mode,
                    False,
                    f"{path}.source",
                    m.source,
                    roots,
                    f"mount source {m.source!r} does not exist",
                )
            elif root is None:
                shown = m.source if m.canonical == m.source else f"{m.source} (resolves to {m.canonical})"
                yield _res(
                    "mounts.allowlist",
                    mode,
                    False,
                    f"{path}.source",
                    m.canonical,
                    roots,
                    f"mount source {shown} is not inside an allowlisted root",
                )
            elif m.mode not in root.modes:
                yield _res(
                    "mounts.allowlist",
                    mode,
                    False,
                    f"{path}.mode",
                    m.mode,
                    list(root.modes),
                    f"mode {m.mode!r} is not allowed under {root.root} (allowed: {list(root.modes)})",
                )
            else:
                yield _res(
                    "mounts.allowlist",
                    mode,
                    True,
                    f"{path}.source",
                    m.canonical,
                    roots,
                    f"{m.canonical} lies inside {root.root} ({m.mode})",
                )
        problem = target_problem(m.target)
        targets = list(root.targets) if root is not None else sorted({t for r in rule.allow for t in r.targets})
        if problem is None and not any(is_within(m.target, t) for t in targets):
            problem = f"target {m.target} is not one of the allowed targets {targets}"
        if problem is None and m.target in seen_targets:
            problem = f"target {m.target} is used by more than one mount"
        seen_targets.add(m.target)
        yield _res(
            "mounts.target",
            mode,
            problem is None,
            f"{path}.target",
            m.target,
            targets,
            problem or f"target {m.target} is allowed",
        )


@cache
def _glob_matcher(patterns: tuple[str, ...]) -> Callable[[str], object]:
    """One compiled regex for a set of shell globs (compiled once per policy, not per request)."""
    if not patterns:
        return lambda _name: None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)).match


def _is_dangerous(name: str) -> bool:
    return _glob_matcher(DANGEROUS_ENV)(name) is not None


def _env(ctx: _Ctx, mode: Mode) -> Iterator[RuleResult]:
    env = ctx.request.env
    rule = ctx.policy.env
    if not env:
        for rid in ("env.allowed", "env.dangerous", "env.limits"):
            yield _skip(rid, mode, "$.env", "no environment variables requested")
        return
    allowed = list(rule.allowed)
    matches = _glob_matcher(rule.allowed)
    not_allowed = [n for n in env if matches(n) is None and n not in rule.allow_dangerous]
    for name in not_allowed:
        yield _res(
            "env.allowed",
            mode,
            False,
            f"$.env.{name}",
            name,
            allowed,
            f"variable {name!r} is not allowed" + ("" if allowed else " (this policy allows none)"),
        )
    if not not_allowed:
        yield _res("env.allowed", mode, True, "$.env", sorted(env), allowed, "every variable name is allowed")
    dangerous = [n for n in env if _is_dangerous(n) and n not in rule.allow_dangerous]
    for name in dangerous:
        yield _res(
            "env.dangerous",
            "enforce",
            False,
            f"$.env.{name}",
            name,
            sorted(rule.allow_dangerous),
            f"variable {name!r} changes how the interpreter or loader behaves; it must be listed in "
            "env.allow_dangerous",
        )
    if not dangerous:
        yield _res(
            "env.dangerous", mode, True, "$.env", sorted(env), sorted(rule.allow_dangerous), "no dangerous variables"
        )
    total = 0
    bad = False
    for name, value in env.items():
        size = len(value.encode("utf-8", "surrogatepass"))
        total += size + len(name)
        if "\x00" in value:
            bad = True
            yield _res(
                "env.limits", mode, False, f"$.env.{name}", name, "no NUL characters", f"value of {name!r} contains NUL"
            )
        if size > rule.max_value_bytes:
            bad = True
            yield _res(
                "env.limits",
                mode,
                False,
                f"$.env.{name}",
                size,
                {"max_value_bytes": rule.max_value_bytes},
                f"value of {name!r} is {size} bytes; at most {rule.max_value_bytes} allowed",
            )
    if len(env) > rule.max_count:
        bad = True
        yield _res(
            "env.limits",
            mode,
            False,
            "$.env",
            len(env),
            {"max_count": rule.max_count},
            f"{len(env)} variables; at most {rule.max_count} allowed",
        )
    if total > rule.max_total_bytes:
        bad = True
        yield _res(
            "env.limits",
            mode,
            False,
            "$.env",
            total,
            {"max_total_bytes": rule.max_total_bytes},
            f"environment totals {total} bytes; at most {rule.max_total_bytes} allowed",
        )
    if not bad:
        yield _res(
            "env.limits",
            mode,
            True,
            "$.env",
            len(env),
            {"max_count": rule.max_count},
            f"{len(env)} variable(s), {total} bytes",
        )


_RULES: tuple[_Rule, ...] = (
    _Rule("language.supported", lambda p: p.languages.mode, _language),
    _Rule("images.allowlist", lambda p: p.images.mode, _images),
    _Rule("limits", lambda _p: "enforce", _limits),
    _Rule("files.path", lambda p: p.files.mode, _files),
    _Rule("network.mode", lambda p: p.network.mode, _network),
    _Rule("runtime.allowed", lambda p: p.runtime.mode, _runtime),
    _Rule("user.non_root", lambda _p: "enforce", _user),
    _Rule("mounts", lambda p: p.mounts.mode, _mounts),
    _Rule("env", lambda p: p.env.mode, _env),
)


def default_audit_dir() -> str:
    """``GATEWAY_AUDIT_DIR`` if set, else ``audit/`` under the current directory."""
    return os.environ.get("GATEWAY_AUDIT_DIR") or str(Path.cwd() / "audit")


def _new_id() -> str:
    # 128 random bits as 32 hex characters (the shape of uuid4().hex, at a fraction of the cost).
    return os.urandom(16).hex()


def evaluate(
    policy: Policy,
    request: ExecutionRequest,
    *,
    request_id: str | None = None,
    decision_id: str | None = None,
    audit_dir: str | os.PathLike[str] | None = None,
) -> Decision:
    """Judge ``request`` under ``policy``: every rule runs, every result is kept; assemble options if allowed.

    ``audit_dir`` is never mountable (default :func:`default_audit_dir`). Never raises for a bad request:
    a rule that crashes is an ``error`` result and a deny.
    """
    decision_id = decision_id or _new_id()
    request_id = request_id or _new_id()
    ref = PolicyRef(policy.name, policy.sha256, policy.source)
    results: list[RuleResult] = []
    try:
        spec = resolve(policy, request)
    except Exception as exc:  # noqa: BLE001 - any failure to resolve is a deny with the reason recorded
        results.append(
            RuleResult("engine.resolve", "error", "enforce", "$", None, None, f"{type(exc).__name__}: {exc}")
        )
        return Decision(decision_id, request_id, False, ref, tuple(results), None, None)
    audit = ""
    if spec.mounts:
        audit = os.path.realpath(os.fspath(audit_dir) if audit_dir is not None else default_audit_dir())
    ctx = _Ctx(policy, request, spec, audit)
    for rule in _RULES:
        try:
            mode = rule.mode(policy)
            results.extend(rule.check(ctx, mode))
        except Exception as exc:  # noqa: BLE001 - a crashing rule denies; it never allows
            results.append(
                RuleResult(rule.rule, "error", "enforce", "$", None, None, f"rule crashed: {type(exc).__name__}: {exc}")
            )
    denied = any(r.status == "error" or (r.status == "fail" and r.mode == "enforce") for r in results)
    if denied:
        return Decision(decision_id, request_id, False, ref, tuple(results), None, None)
    try:
        options = build_options(spec, policy_ref=policy.ref, decision_id=decision_id, request_id=request_id)
        guard(options, denied_paths=(audit,) if audit else ())
    except UnsafeOptionsError as exc:
        detail = "; ".join(str(p) for p in exc.problems) or exc.message
        results.append(
            RuleResult("assembly.guard", "error", "enforce", "$", None, None, f"unsafe options refused: {detail}")
        )
        return Decision(decision_id, request_id, False, ref, tuple(results), None, None)
    except Exception as exc:  # noqa: BLE001
        results.append(
            RuleResult("assembly.build", "error", "enforce", "$", None, None, f"{type(exc).__name__}: {exc}")
        )
        return Decision(decision_id, request_id, False, ref, tuple(results), None, None)
    plan = Plan(
        image=spec.image,
        runtime=spec.runtime,
        network=spec.network,
        timeout_s=spec.timeout_s,
        output_bytes=spec.output_bytes,
        output_files_bytes=spec.output_files_bytes,
        pull=spec.pull,
        language=spec.language,
        code_bytes=spec.code_bytes,
        files_bytes=spec.files_bytes,
    )
    return Decision(decision_id, request_id, True, ref, tuple(results), options, plan)

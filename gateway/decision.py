"""Decisions: every rule judges the request, every result is kept, and the decision explains itself.

Rules are small functions (in the style of jsonschema's keyword functions): each takes the evaluation
context and appends its :class:`RuleResult` objects to the decision's list. The engine runs them all, so
*every* violation is reported, not just the first. A rule that raises adds an ``error`` result (after any it
had already added), and an error always denies. A rule in ``audit`` mode has its failures downgraded to
``warn``: recorded, but the request proceeds. What a rule needs from the policy (allowed lists, expected
values, results that depend only on the policy and the judged value) is derived once per policy object,
not per request; the check itself runs on every request.

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
from dataclasses import asdict, dataclass
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, Literal, NamedTuple

from gateway.assembly import RunSpec, build_options, guard, resolve
from gateway.errors import UnsafeOptionsError
from gateway.policy.images import image_allowed
from gateway.policy.loader import MIN_MEMORY, RUNSC_MIN_PIDS
from gateway.policy.model import EnvRule, ImagesRule, Limit, Mode, MountRoot, MountsRule, Policy, RuntimeRule, UserSpec
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


_new = tuple.__new__
"""``_new(RuleResult, (rule, status, ...))`` builds exactly ``RuleResult(rule, status, ...)`` without the
NamedTuple's Python-level ``__new__``: used where results are built per request."""


@dataclass(frozen=True, slots=True)
class PolicyRef:
    name: str
    sha256: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
        return asdict(self)


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
#
# Each rule is a pair: ``prepare(policy)`` derives the rule's per-policy constants (allowed lists, expected
# values, result objects that depend only on the policy and the judged value), once per policy object;
# ``check(ctx, constants, out)`` judges one request and appends its results to ``out``. Both run inside the
# engine's ``try``, so a rule whose preparation or check crashes is an ``error`` result and a deny, and a
# preparation that crashes is retried (and fails again) on the next request rather than cached.
#
# Results are immutable NamedTuples; the ``expected`` lists shared between decisions are the policy's, and
# ``RuleResult.to_dict()`` hands out copies.


class _Ctx(NamedTuple):
    policy: Policy
    request: ExecutionRequest
    spec: RunSpec
    audit_dir: str


_Out = list[RuleResult]


class _Rule:
    """A rule id, its per-policy preparation and its per-request check."""

    __slots__ = ("check", "prepare", "rule")

    def __init__(self, rule: str, prepare: Callable[[Policy], Any], check: Callable[[_Ctx, Any, _Out], None]):
        self.rule = rule
        self.prepare = prepare
        self.check = check


def _fail_status(mode: Mode) -> Status:
    return "warn" if mode == "audit" else "fail"


def _res(rule: str, mode: Mode, ok: bool, path: str, got: Any, expected: Any, message: str) -> RuleResult:  # noqa: PLR0917
    status: Status = "pass" if ok else ("warn" if mode == "audit" else "fail")
    return _new(RuleResult, (rule, status, mode, path, got, expected, message))


def _skip(rule: str, mode: Mode, path: str, message: str) -> RuleResult:
    return RuleResult(rule, "skip", mode, path, None, None, message)


class _LanguageConst(NamedTuple):
    mode: Mode
    allowed: list[str]
    passes: dict[str, RuleResult]


def _prepare_language(policy: Policy) -> _LanguageConst:
    mode = policy.languages.mode
    allowed = list(policy.languages.allowed)
    passes = {
        name: RuleResult(
            "language.supported", "pass", mode, "$.language", name, allowed, f"language {name!r} is supported"
        )
        for name in allowed
    }
    return _LanguageConst(mode, allowed, passes)


def _language(ctx: _Ctx, c: _LanguageConst, out: _Out) -> None:
    got = ctx.spec.language
    hit = c.passes.get(got) if type(got) is str else None
    if hit is not None:
        out.append(hit)
        return
    allowed = c.allowed
    ok = got in allowed
    out.append(
        _res(
            "language.supported",
            c.mode,
            ok,
            "$.language",
            got,
            allowed,
            f"language {got!r} is supported" if ok else f"language {got!r} is not supported (allowed: {allowed})",
        )
    )


class _ImagesConst(NamedTuple):
    rule: ImagesRule
    mode: Mode
    fail: Status
    expected: list[dict[str, Any]] | None


def _images_expected(rule: ImagesRule) -> list[dict[str, Any]]:
    return [{"repository": e.repository, "tags": list(e.tags), "digests": list(e.digests)} for e in rule.allow]


def _prepare_images(policy: Policy) -> _ImagesConst:
    rule = policy.images
    mode = rule.mode
    try:
        expected: list[dict[str, Any]] | None = _images_expected(rule)
    except Exception:  # noqa: BLE001 - not a loadable policy: derived per request, after the check, as always
        expected = None
    return _ImagesConst(rule, mode, _fail_status(mode), expected)


def _images(ctx: _Ctx, c: _ImagesConst, out: _Out) -> None:
    image = ctx.spec.image
    why = image_allowed(c.rule, image)
    expected = c.expected if c.expected is not None else _images_expected(c.rule)
    if why is None:
        out.append(
            _new(
                RuleResult,
                ("images.allowlist", "pass", c.mode, "$.image", image, expected, f"image {image!r} is allowed"),
            )
        )
    else:
        out.append(_new(RuleResult, ("images.allowlist", c.fail, c.mode, "$.image", image, expected, why)))


class _LimitConst(NamedTuple):
    rule: str
    field: str
    mode: Mode
    fail: Status
    maximum: float
    floor: float | None
    size: bool
    path: str
    expected: dict[str, Any]


def _limit_const(rule: str, field: str, limit: Limit, *, size: bool, floor: float | None = None) -> _LimitConst:
    expected = {"max": limit.max} if floor is None else {"max": limit.max, "min": floor}
    return _LimitConst(
        rule, field, limit.mode, _fail_status(limit.mode), limit.max, floor, size, f"$.limits.{field}", expected
    )


class _SizeConst(NamedTuple):
    maximum: int
    mode: Mode
    expected: dict[str, int]


def _limit_steps(policy: Policy, runsc: bool) -> Iterator[Any]:
    """The limits rule's constants in the order it judges them: seven :class:`_LimitConst` (the order of
    :data:`_LIMIT_VALUES`), then the code and files :class:`_SizeConst`.

    A generator, so that on a policy the loader could not have produced (a field missing or of the wrong
    type) the rule, run step by step, records the same results up to the same crash as it always did.
    """
    lim = policy.limits
    pids_floor = RUNSC_MIN_PIDS if runsc and lim.pids.max >= RUNSC_MIN_PIDS else None
    yield _limit_const("limits.memory", "memory", lim.memory, size=True, floor=MIN_MEMORY)
    yield _limit_const("limits.cpus", "cpus", lim.cpus, size=False)
    yield _limit_const("limits.pids", "pids", lim.pids, size=False, floor=pids_floor)
    yield _limit_const("limits.timeout", "timeout_s", lim.timeout_s, size=False)
    yield _limit_const("limits.output_bytes", "output_bytes", lim.output_bytes, size=True)
    yield _limit_const("limits.output_files_bytes", "output_files_bytes", lim.output_files_bytes, size=True)
    yield _limit_const("limits.tmpfs", "tmpfs", lim.tmpfs, size=True, floor=1024 * 1024)
    code_max = int(lim.code_size.max)
    yield _SizeConst(code_max, lim.code_size.mode, {"max": code_max})
    files_max = int(lim.files_size.max)
    yield _SizeConst(files_max, lim.files_size.mode, {"max": files_max})


class _LimitsConst(NamedTuple):
    plain: tuple[Any, ...] | None
    """``_limit_steps(policy, False)``, or None when deriving them fails (then they are derived per request)."""
    runsc: tuple[Any, ...] | None
    """The same under runsc (with a pids floor when the ceiling allows it)."""


_LIMIT_VALUES = attrgetter("memory", "cpus", "pids", "timeout_s", "output_bytes", "output_files_bytes", "tmpfs")
"""The limit values, by name, of a :class:`RunSpec` and of a :class:`RequestLimits` alike."""


def _prepare_limits(policy: Policy) -> _LimitsConst:
    steps: list[tuple[Any, ...] | None] = []
    for runsc in (False, True):
        try:
            steps.append(tuple(_limit_steps(policy, runsc)))
        except Exception:  # noqa: BLE001 - not a loadable policy: _limits derives the steps per request and fails there
            steps.append(None)
    return _LimitsConst(*steps)


def _show(value: float, size: bool) -> str:
    return format_size(int(value)) if size else f"{value:g}"


def _limits(ctx: _Ctx, c: _LimitsConst, out: _Out) -> None:
    spec = ctx.spec
    append = out.append
    runsc = spec.runtime == "runsc"
    steps = c.runsc if runsc else c.plain
    it = iter(steps) if steps is not None else _limit_steps(ctx.policy, runsc)
    # The values come first in zip, so it stops before taking an eighth step from ``it``.
    for value, asked, (rule, field, mode, fail, maximum, floor, size, path, expected) in zip(
        _LIMIT_VALUES(spec), _LIMIT_VALUES(ctx.request.limits), it, strict=False
    ):
        if value > maximum:
            message = f"{field} {_show(value, size)} is above the ceiling {_show(maximum, size)}"
            append(_new(RuleResult, (rule, fail, mode, path, value, expected, message)))
        elif floor is not None and value < floor:
            message = f"{field} {_show(value, size)} is below the minimum {_show(floor, size)}"
            append(_new(RuleResult, (rule, fail, mode, path, value, expected, message)))
        else:
            message = "requested value within the ceiling" if asked is not None else "policy default within the ceiling"
            append(_new(RuleResult, (rule, "pass", mode, path, value, expected, message)))
    code: _SizeConst = next(it)
    code_bytes = spec.code_bytes
    ok = code_bytes <= code.maximum
    append(
        _res(
            "limits.code_size", code.mode, ok, "$.code", code_bytes, code.expected,
            "code within ceiling" if ok else f"code is {code_bytes} bytes; the ceiling is {format_size(code.maximum)}",
        )
    )  # fmt: skip
    files: _SizeConst = next(it)
    files_bytes = spec.files_bytes
    ok = files_bytes <= files.maximum
    append(
        _res(
            "limits.files_size", files.mode, ok, "$.files", files_bytes, files.expected,
            "files within ceiling" if ok
            else f"files total {files_bytes} bytes; the ceiling is {format_size(files.maximum)}",
        )
    )  # fmt: skip


_CONTROL_CHAR = re.compile("[\x00-\x1f]")


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
    if ".." in parts:
        return "file name contains '..'"
    if "" in parts or "." in parts:
        return "file name has an empty or '.' component"
    if _CONTROL_CHAR.search(name) is not None:
        return "file name contains a control character"
    return None


_FILES_EXPECTED = "relative path without '..', NUL, backslash or empty components"


class _FilesConst(NamedTuple):
    mode: Mode
    max_count: int
    skip: RuleResult


def _prepare_files(policy: Policy) -> _FilesConst:
    mode = policy.files.mode
    return _FilesConst(mode, policy.files.max_count, _skip("files.path", mode, "$.files", "no files sent"))


def _files(ctx: _Ctx, c: _FilesConst, out: _Out) -> None:
    files = ctx.request.files
    if not files:
        out.append(c.skip)
        return
    mode = c.mode
    expected = _FILES_EXPECTED
    bad = False
    for name in files:
        problem = _file_name_problem(name)
        if problem is not None:
            bad = True
            out.append(_res("files.path", mode, False, f"$.files[{name!r}]", name, expected, f"{problem}: {name!r}"))
    count = len(files)
    if count > c.max_count:
        bad = True
        out.append(
            _res(
                "files.path",
                mode,
                False,
                "$.files",
                count,
                {"max_count": c.max_count},
                f"{count} files sent; at most {c.max_count} allowed",
            )
        )
    if not bad:
        out.append(
            _new(RuleResult, ("files.path", "pass", mode, "$.files", count, expected, f"{count} file name(s) are safe"))
        )


def _never_network(name: str) -> bool:
    return name == "host" or name.startswith("container:")


class _ChoiceConst(NamedTuple):
    mode: Mode
    allowed: list[str]
    passes: dict[str, tuple[RuleResult, ...]]
    """The results for each allowed value: they depend on nothing else."""


def _prepare_network(policy: Policy) -> _ChoiceConst:
    mode = policy.network.mode
    allowed = list(policy.network.allowed)
    passes: dict[str, tuple[RuleResult, ...]] = {
        name: (RuleResult("network.mode", "pass", mode, "$.network", name, allowed, f"network {name!r} is allowed"),)
        for name in allowed
        if not _never_network(name)
    }
    return _ChoiceConst(mode, allowed, passes)


def _network(ctx: _Ctx, c: _ChoiceConst, out: _Out) -> None:
    got = ctx.spec.network
    hit = c.passes.get(got) if type(got) is str else None
    if hit is not None:
        out.extend(hit)
        return
    mode = c.mode
    allowed = c.allowed
    if got == "host" or got.startswith("container:"):
        out.append(
            _res("network.mode", "enforce", False, "$.network", got, allowed, f"network {got!r} can never be allowed")
        )
        return
    ok = got in allowed
    message = f"network {got!r} is allowed" if ok else f"network {got!r} is not allowed (allowed: {allowed})"
    out.append(_res("network.mode", mode, ok, "$.network", got, allowed, message))


def _runtime_required(rule: RuntimeRule, mode: Mode, got: str) -> RuleResult:
    if rule.required is None:
        return _skip("runtime.required", mode, "$.runtime", "the policy requires no particular runtime")
    ok = got == rule.required
    return _res(
        "runtime.required",
        mode,
        ok,
        "$.runtime",
        got,
        rule.required,
        f"runtime {got!r} {'is' if ok else 'is not'} the required {rule.required!r}",
    )


class _RuntimeConst(NamedTuple):
    rule: RuntimeRule
    choice: _ChoiceConst


def _prepare_runtime(policy: Policy) -> _RuntimeConst:
    rule = policy.runtime
    mode = rule.mode
    allowed = list(rule.allowed)
    passes: dict[str, tuple[RuleResult, ...]] = {
        name: (
            RuleResult("runtime.allowed", "pass", mode, "$.runtime", name, allowed, f"runtime {name!r} is allowed"),
            _runtime_required(rule, mode, name),
        )
        for name in allowed
    }
    return _RuntimeConst(rule, _ChoiceConst(mode, allowed, passes))


def _runtime(ctx: _Ctx, c: _RuntimeConst, out: _Out) -> None:
    got = ctx.spec.runtime
    hit = c.choice.passes.get(got) if type(got) is str else None
    if hit is not None:
        out.extend(hit)
        return
    mode = c.choice.mode
    allowed = c.choice.allowed
    ok = got in allowed
    message = f"runtime {got!r} is allowed" if ok else f"runtime {got!r} is not allowed (allowed: {allowed})"
    out.append(_res("runtime.allowed", mode, ok, "$.runtime", got, allowed, message))
    out.append(_runtime_required(c.rule, mode, got))


class _UserConst(NamedTuple):
    user: UserSpec
    non_root: RuleResult
    root: RuleResult


def _prepare_user(policy: Policy) -> _UserConst:
    user = policy.user
    got = f"{user.uid}:{user.gid}"
    return _UserConst(
        user,
        RuleResult("user.non_root", "pass", "enforce", "$", got, "uid and gid not 0", "runs as a non-root user"),
        RuleResult("user.non_root", "fail", "enforce", "$", got, "uid and gid not 0", "the policy user is root"),
    )


def _user(_ctx: _Ctx, c: _UserConst, out: _Out) -> None:
    user = c.user
    out.append(c.non_root if user.uid != 0 and user.gid != 0 else c.root)


def _matching_root(roots: tuple[MountRoot, ...], canonical: str) -> MountRoot | None:
    for root in roots:
        if is_within(canonical, root.root):
            return root
    return None


class _MountsConst(NamedTuple):
    rule: MountsRule
    mode: Mode
    skips: tuple[RuleResult, ...]


def _prepare_mounts(policy: Policy) -> _MountsConst:
    mode = policy.mounts.mode
    skips = tuple(
        _skip(rid, mode, "$.mounts", "no mounts requested")
        for rid in ("mounts.allowlist", "mounts.denied_path", "mounts.target")
    )
    return _MountsConst(policy.mounts, mode, skips)


def _mounts(ctx: _Ctx, c: _MountsConst, out: _Out) -> None:
    mounts = ctx.spec.mounts
    if not mounts:
        out.extend(c.skips)
        return
    rule = c.rule
    mode = c.mode
    roots = [r.root for r in rule.allow]
    if not rule.allow:
        out.append(_res("mounts.allowlist", mode, False, "$.mounts", len(mounts), [], "this policy allows no mounts"))
    elif len(mounts) > rule.max_count:
        out.append(
            _res(
                "mounts.allowlist",
                mode,
                False,
                "$.mounts",
                len(mounts),
                {"max_count": rule.max_count},
                f"{len(mounts)} mounts requested; at most {rule.max_count} allowed",
            )
        )
    extra = (ctx.audit_dir,)
    seen_targets: set[str] = set()
    for index, m in enumerate(mounts):
        path = f"$.mounts[{index}]"
        # Denied paths first, on the canonical path: a symlink inside an allowed root cannot smuggle the socket.
        reason = denied_host_reason(m.canonical, extra=extra)
        if reason is None and m.canonical != m.source:
            reason = denied_host_reason(posixpath.normpath(m.source), extra=extra)
        out.append(
            _res(
                "mounts.denied_path",
                "enforce",
                reason is None,
                f"{path}.source",
                m.canonical,
                "not a system path, engine socket or the audit directory",
                reason or f"{m.canonical} is not a denied path",
            )
        )
        root = _matching_root(rule.allow, m.canonical)
        if rule.allow:
            if not os.path.exists(m.canonical):
                out.append(
                    _res(
                        "mounts.allowlist",
                        mode,
                        False,
                        f"{path}.source",
                        m.source,
                        roots,
                        f"mount source {m.source!r} does not exist",
                    )
                )
            elif root is None:
                shown = m.source if m.canonical == m.source else f"{m.source} (resolves to {m.canonical})"
                out.append(
                    _res(
                        "mounts.allowlist",
                        mode,
                        False,
                        f"{path}.source",
                        m.canonical,
                        roots,
                        f"mount source {shown} is not inside an allowlisted root",
                    )
                )
            elif m.mode not in root.modes:
                out.append(
                    _res(
                        "mounts.allowlist",
                        mode,
                        False,
                        f"{path}.mode",
                        m.mode,
                        list(root.modes),
                        f"mode {m.mode!r} is not allowed under {root.root} (allowed: {list(root.modes)})",
                    )
                )
            else:
                out.append(
                    _res(
                        "mounts.allowlist",
                        mode,
                        True,
                        f"{path}.source",
                        m.canonical,
                        roots,
                        f"{m.canonical} lies inside {root.root} ({m.mode})",
                    )
                )
        problem = target_problem(m.target)
        targets = list(root.targets) if root is not None else sorted({t for r in rule.allow for t in r.targets})
        if problem is None and not any(is_within(m.target, t) for t in targets):
            problem = f"target {m.target} is not one of the allowed targets {targets}"
        if problem is None and m.target in seen_targets:
            problem = f"target {m.target} is used by more than one mount"
        seen_targets.add(m.target)
        out.append(
            _res(
                "mounts.target",
                mode,
                problem is None,
                f"{path}.target",
                m.target,
                targets,
                problem or f"target {m.target} is allowed",
            )
        )


def _glob_matcher(patterns: tuple[str, ...]) -> Callable[[str], object]:
    """One compiled regex for a set of shell globs (compiled once per policy, not per request)."""
    if not patterns:
        return lambda _name: None
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)).match


class _EnvFast(NamedTuple):
    allowed: list[str]
    matches: Callable[[str], object]
    allow_dangerous: list[str]
    """``sorted(rule.allow_dangerous)``."""
    count_expected: dict[str, int]


class _EnvConst(NamedTuple):
    rule: EnvRule
    mode: Mode
    skips: tuple[RuleResult, ...]
    dangerous: Callable[[str], object]
    fast: _EnvFast | None
    """None when deriving it fails (not a loadable policy): then each part is derived where it is used."""


def _prepare_env(policy: Policy) -> _EnvConst:
    rule = policy.env
    mode = rule.mode
    skips = tuple(
        _skip(rid, mode, "$.env", "no environment variables requested")
        for rid in ("env.allowed", "env.dangerous", "env.limits")
    )
    try:
        fast: _EnvFast | None = _EnvFast(
            list(rule.allowed),
            _glob_matcher(rule.allowed),
            sorted(rule.allow_dangerous),
            {"max_count": rule.max_count},
        )
    except Exception:  # noqa: BLE001 - derived per request instead, failing where the rule always failed
        fast = None
    return _EnvConst(rule, mode, skips, _glob_matcher(DANGEROUS_ENV), fast)


def _env(ctx: _Ctx, c: _EnvConst, out: _Out) -> None:
    env = ctx.request.env
    if not env:
        out.extend(c.skips)
        return
    rule = c.rule
    mode = c.mode
    fast = c.fast
    if fast is not None:
        allowed = fast.allowed
        matches = fast.matches
    else:
        allowed = list(rule.allowed)
        matches = _glob_matcher(rule.allowed)
    allow_dangerous = rule.allow_dangerous
    not_allowed = [n for n in env if matches(n) is None and n not in allow_dangerous]
    for name in not_allowed:
        out.append(
            _res(
                "env.allowed",
                mode,
                False,
                f"$.env.{name}",
                name,
                allowed,
                f"variable {name!r} is not allowed" + ("" if allowed else " (this policy allows none)"),
            )
        )
    if not not_allowed:
        out.append(
            _new(
                RuleResult,
                ("env.allowed", "pass", mode, "$.env", sorted(env), allowed, "every variable name is allowed"),
            )
        )
    is_dangerous = c.dangerous
    dangerous = [n for n in env if is_dangerous(n) is not None and n not in allow_dangerous]
    for name in dangerous:
        out.append(
            _res(
                "env.dangerous",
                "enforce",
                False,
                f"$.env.{name}",
                name,
                fast.allow_dangerous if fast is not None else sorted(allow_dangerous),
                f"variable {name!r} changes how the interpreter or loader behaves; it must be listed in "
                "env.allow_dangerous",
            )
        )
    if not dangerous:
        out.append(
            _new(
                RuleResult,
                (
                    "env.dangerous",
                    "pass",
                    mode,
                    "$.env",
                    sorted(env),
                    fast.allow_dangerous if fast is not None else sorted(allow_dangerous),
                    "no dangerous variables",
                ),
            )
        )
    total = 0
    bad = False
    max_value_bytes = rule.max_value_bytes
    for name, value in env.items():
        size = len(value) if type(value) is str and value.isascii() else len(value.encode("utf-8", "surrogatepass"))
        total += size + len(name)
        if "\x00" in value:
            bad = True
            out.append(
                _res(
                    "env.limits",
                    mode,
                    False,
                    f"$.env.{name}",
                    name,
                    "no NUL characters",
                    f"value of {name!r} contains NUL",
                )
            )
        if size > max_value_bytes:
            bad = True
            out.append(
                _res(
                    "env.limits",
                    mode,
                    False,
                    f"$.env.{name}",
                    size,
                    {"max_value_bytes": max_value_bytes},
                    f"value of {name!r} is {size} bytes; at most {max_value_bytes} allowed",
                )
            )
    count = len(env)
    if count > rule.max_count:
        bad = True
        out.append(
            _res(
                "env.limits",
                mode,
                False,
                "$.env",
                count,
                {"max_count": rule.max_count},
                f"{count} variables; at most {rule.max_count} allowed",
            )
        )
    if total > rule.max_total_bytes:
        bad = True
        out.append(
            _res(
                "env.limits",
                mode,
                False,
                "$.env",
                total,
                {"max_total_bytes": rule.max_total_bytes},
                f"environment totals {total} bytes; at most {rule.max_total_bytes} allowed",
            )
        )
    if not bad:
        out.append(
            _new(
                RuleResult,
                (
                    "env.limits",
                    "pass",
                    mode,
                    "$.env",
                    count,
                    fast.count_expected if fast is not None else {"max_count": rule.max_count},
                    f"{count} variable(s), {total} bytes",
                ),
            )
        )


_RULES: tuple[_Rule, ...] = (
    _Rule("language.supported", _prepare_language, _language),
    _Rule("images.allowlist", _prepare_images, _images),
    _Rule("limits", _prepare_limits, _limits),
    _Rule("files.path", _prepare_files, _files),
    _Rule("network.mode", _prepare_network, _network),
    _Rule("runtime.allowed", _prepare_runtime, _runtime),
    _Rule("user.non_root", _prepare_user, _user),
    _Rule("mounts", _prepare_mounts, _mounts),
    _Rule("env", _prepare_env, _env),
)

_UNPREPARED: Any = object()


class _Compiled:
    """What one policy object contributes to every decision, derived on its first decision."""

    __slots__ = ("consts", "label", "ref")

    def __init__(self, policy: Policy) -> None:
        self.ref = PolicyRef(policy.name, policy.sha256, policy.source)
        self.label = policy.ref
        self.consts: list[Any] = [_UNPREPARED] * len(_RULES)
        """Each rule's constants, or ``_UNPREPARED`` until its preparation has succeeded once."""


def _compiled(policy: Policy) -> _Compiled:
    compiled = policy._compiled
    if type(compiled) is not _Compiled:
        compiled = _Compiled(policy)
        object.__setattr__(policy, "_compiled", compiled)  # a cache on a frozen object; see Policy._compiled
    return compiled


def default_audit_dir() -> str:
    """``GATEWAY_AUDIT_DIR`` if set, else ``audit/`` under the current directory."""
    return os.environ.get("GATEWAY_AUDIT_DIR") or str(Path.cwd() / "audit")


def _new_id() -> str:
    # 128 random bits as 32 hex characters (the shape of uuid4().hex, at a fraction of the cost).
    return os.urandom(16).hex()


_STATUS = itemgetter(1)


_DENYING_STATUSES = frozenset({"error", "fail"})


def _denies(results: list[RuleResult]) -> bool:
    """Whether any result denies: an error in any mode, or an enforce-mode failure."""
    if _DENYING_STATUSES.isdisjoint(map(_STATUS, results)):  # the common case, scanned in C
        return False
    return any(r.status == "error" or (r.status == "fail" and r.mode == "enforce") for r in results)


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
    if not decision_id or not request_id:
        fresh = os.urandom(32).hex()  # two ids of 128 random bits from one system call
        decision_id = decision_id or fresh[:32]
        request_id = request_id or fresh[32:]
    compiled = _compiled(policy)
    ref = compiled.ref
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
    consts = compiled.consts
    for index, rule in enumerate(_RULES):
        try:
            const = consts[index]
            if const is _UNPREPARED:
                const = rule.prepare(policy)
                consts[index] = const
            rule.check(ctx, const, results)
        except Exception as exc:  # noqa: BLE001 - a crashing rule denies; it never allows
            results.append(
                RuleResult(rule.rule, "error", "enforce", "$", None, None, f"rule crashed: {type(exc).__name__}: {exc}")
            )
    if _denies(results):
        return Decision(decision_id, request_id, False, ref, tuple(results), None, None)
    try:
        options = build_options(spec, policy_ref=compiled.label, decision_id=decision_id, request_id=request_id)
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
        spec.image,
        spec.runtime,
        spec.network,
        spec.timeout_s,
        spec.output_bytes,
        spec.output_files_bytes,
        spec.pull,
        spec.language,
        spec.code_bytes,
        spec.files_bytes,
    )
    return Decision(decision_id, request_id, True, ref, tuple(results), options, plan)

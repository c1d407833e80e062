"""Session decisions: whether a principal may create a session, with which fixed profile, how long and how large.

:func:`decide_session` composes the execution decision with the session rules: the profile (image, runtime,
network, limits, mounts) is decided by :func:`~gateway.decision.evaluate` exactly as an execution's would be
(exceptions, audit mode, the shadow policy and the backend's guard included), and the session rules
(:mod:`gateway.decision.rules.sessions`) judge the mode, the principal's live sessions, the idle timeout, the
lifetime and the workspace size. :func:`within_session` is the rule that an execution in a session asks for no
more than the session's profile, and :func:`decide_in_session` decides such an execution. All three are pure:
the session manager counts live sessions and keeps each session's :class:`SessionSettings`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any

from gateway.decision.engine import Assembler, assemble, evaluate, judge
from gateway.decision.model import Decision, RuleResult
from gateway.decision.rules.sessions import SESSION_RULES, SessionContext
from gateway.decision.settings import SandboxSettings, pick
from gateway.policy.compiled import CompiledPolicy, compile_policy
from gateway.policy.model import Policy, SessionsRule
from gateway.request import ExecutionRequest, MountRequest, RequestLimits, SessionRequest
from gateway.sizes import format_size

__all__ = [
    "KERNEL_MARGIN_S",
    "SESSION_PROFILE_RULE",
    "SessionDecision",
    "SessionSettings",
    "bind_to_session",
    "decide_in_session",
    "decide_session",
    "within_session",
]

KERNEL_MARGIN_S = 60.0
"""Added to a kernel session's lifetime for its sandbox's own deadline (counted from the hand-over, before
*ready*): the session manager ends the session at its lifetime; the sandbox's deadline (a Kubernetes Pod's
``activeDeadlineSeconds``, fixed at creation) is only the backstop behind it."""

SESSION_PROFILE_RULE = "sessions.profile"
"""The rule id of :func:`within_session`: an execution in a session asks for no more than the session's profile."""


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """Everything resolved for one session: its mode, its bounds, and its fixed profile."""

    mode: str
    """``workspace`` or ``kernel``."""
    idle_s: float
    """A session unused this long is removed (``session.expired``)."""
    lifetime_s: float
    """A session is removed this long after it became *ready* (not after it was asked for), used or not."""
    workspace_size: int
    """Bytes: the hard bound of the session's ``/workspace`` (enforced by the kernel, not checked afterwards)."""
    sandbox: SandboxSettings
    """The fixed profile, decided as an execution's would be: image, runtime, network, memory, CPU, pids and tmpfs
    of its sandbox, its mounts, and the default and ceiling of each execution's timeout and output caps."""

    def to_dict(self) -> dict[str, Any]:
        """The session's settings as JSON data (for the ``session.created`` record and responses)."""
        return {
            "mode": self.mode,
            "idle_s": self.idle_s,
            "lifetime_s": self.lifetime_s,
            "workspace_size": self.workspace_size,
            "profile": asdict(self.sandbox.profile),
            "plan": self.sandbox.plan(),
        }


@dataclass(frozen=True, slots=True)
class SessionDecision:
    """What the policy made of one session request: one :class:`Decision` (the session rules' results first,
    then the profile's, then the shadow policy's warnings) and, when it could be resolved, the session."""

    decision: Decision
    """Allowed only when the profile and every session rule allow; ``run`` holds the guarded options of the
    profile (what a workspace-mode execution with the session's defaults would get), ``None`` when denied."""
    settings: SessionSettings | None
    """The resolved session; ``None`` when the policy allows no sessions or the profile could not be resolved."""

    @property
    def allowed(self) -> bool:
        return self.decision.allowed

    @property
    def violations(self) -> tuple[RuleResult, ...]:
        return self.decision.violations

    @property
    def warnings(self) -> tuple[RuleResult, ...]:
        return self.decision.warnings

    def to_dict(self) -> dict[str, Any]:
        """The decision record (``schemas/decision.schema.json``) plus ``session``: the resolved settings."""
        return self.decision.to_dict() | {"session": None if self.settings is None else self.settings.to_dict()}


def _resolve(
    section: SessionsRule | None, request: SessionRequest, sandbox: SandboxSettings | None
) -> SessionSettings | None:
    if section is None or sandbox is None:
        return None
    return SessionSettings(
        mode=request.mode,
        idle_s=float(pick(request.idle_s, section.idle_s)),
        lifetime_s=float(pick(request.lifetime_s, section.lifetime_s)),
        workspace_size=int(pick(request.workspace_size, section.workspace_size)),
        sandbox=sandbox,
    )


def decide_session(
    policy: CompiledPolicy | Policy,
    request: SessionRequest,
    *,
    live_sessions: int,
    assembler: Assembler,
    denied_paths: Sequence[str] = (),
    request_id: str | None = None,
    decision_id: str | None = None,
    now: datetime | None = None,
) -> SessionDecision:
    """Judge a session request under ``policy``; ``live_sessions``: how many live sessions its principal holds.

    The profile is :func:`~gateway.decision.evaluate`'s decision on :meth:`SessionRequest.profile_request`
    (with ``assembler``, ``denied_paths``, the ids and ``now`` as there); the session rules' results come first.
    A policy without ``spec.sessions`` denies with ``sessions.enabled``. Never raises for a bad request or policy
    object: a rule that crashes is an ``error`` result and a deny.
    """
    profile = _without_approvals(evaluate(
        policy, request.profile_request(), assembler=assembler, denied_paths=denied_paths,
        request_id=request_id, decision_id=decision_id, now=now,
    ))  # fmt: skip
    if profile.settings is None:  # a policy object that cannot be resolved: an engine.resolve error, a deny
        return SessionDecision(profile, None)
    compiled = policy if isinstance(policy, CompiledPolicy) else compile_policy(policy)
    results = [_denying(r) for r in judge(SessionContext(compiled, request, live_sessions), SESSION_RULES)]
    shadow: tuple[RuleResult, ...] = ()
    if compiled.shadow is not None:
        note = f"the audit policy {compiled.shadow.name!r} would deny: "
        shadow = tuple(
            RuleResult(f"shadow:{r.rule}", "fail", "audit", r.path, r.got, r.expected, note + r.message)
            for r in judge(SessionContext(compiled.shadow, request, live_sessions), SESSION_RULES)
            if r.denies
        )
    allowed = profile.allowed and not any(r.denies for r in results)
    decision = replace(
        profile,
        allowed=allowed,
        results=(*results, *profile.results, *shadow),
        run=profile.run if allowed else None,
        recorded_options=profile.recorded_options if allowed else None,
    )
    session = _resolve(compiled.policy.sessions, request, profile.settings)
    if decision.allowed and session is not None and session.mode == "kernel":
        decision = _kernel_lifetime(decision, session, assembler, denied_paths)
    return SessionDecision(decision, session)


def _kernel_lifetime(
    decision: Decision, session: SessionSettings, assembler: Assembler, denied_paths: Sequence[str]
) -> Decision:
    """A kernel session's decision with its sandbox assembled for the session's lifetime (plus
    :data:`KERNEL_MARGIN_S`) instead of one execution's timeout: the options are the exact sandbox the decision
    records, and a backend fixes the deadline in them (a Pod's ``activeDeadlineSeconds`` can only shrink)."""
    lasting = replace(session.sandbox, timeout_s=session.lifetime_s + KERNEL_MARGIN_S)
    assembled = assemble(
        assembler, lasting, denied_paths=denied_paths, decision_id=decision.decision_id,
        request_id=decision.request_id,
    )  # fmt: skip
    if isinstance(assembled, RuleResult):
        return replace(decision, allowed=False, results=(*decision.results, assembled), run=None, recorded_options=None)
    run, recorded = assembled
    return replace(decision, run=run, recorded_options=recorded)


_NO_APPROVALS = "; sessions have no approvals, so approve mode denies here"


def _denying(result: RuleResult) -> RuleResult:
    """An approve-mode failure as the enforce-mode failure it is in a session (nothing would approve it)."""
    return replace(result, mode="enforce", message=result.message + _NO_APPROVALS) if result.holds else result


def _without_approvals(decision: Decision) -> Decision:
    """``decision`` with its approve-mode failures denying: a session, and an execution in one, waits for no
    approval (a held request would otherwise be neither run nor denied with a reason)."""
    if decision.request_digest is None:
        return decision
    results = tuple(_denying(r) for r in decision.results)
    return replace(decision, allowed=False, results=results, run=None, recorded_options=None, request_digest=None)


def _violation(path: str, got: Any, expected: Any, message: str) -> RuleResult:
    return RuleResult(SESSION_PROFILE_RULE, "fail", "enforce", path, got, expected, message)


_PER_EXECUTION = ("timeout_s", "output_bytes", "output_files_bytes", "output_files")
_SIZES = frozenset(("memory", "tmpfs", "output_bytes", "output_files_bytes"))


def _session_limits(sandbox: SandboxSettings) -> dict[str, Any]:
    p = sandbox.profile
    return {
        "memory": p.memory, "cpus": p.cpus, "pids": p.pids, "tmpfs": p.tmpfs, "timeout_s": sandbox.timeout_s,
        "output_bytes": sandbox.output_bytes, "output_files_bytes": sandbox.output_files_bytes,
        "output_files": sandbox.output_files,
    }  # fmt: skip


def _session_mounts(sandbox: SandboxSettings) -> tuple[MountRequest, ...]:
    return tuple(MountRequest(m.source, m.target, m.mode) for m in sandbox.mounts)


def within_session(session: SessionSettings, request: ExecutionRequest) -> tuple[RuleResult, ...]:
    """The violations (rule ``sessions.profile``, always enforced) of an execution in ``session`` that asks for
    more than the session's profile; empty when it asks for no more.

    Language, image, runtime and network, when the execution names them, are the session's; each mount it names
    is one of the session's (``ro`` may narrow ``rw``); each limit it gives is at most the session's; it lists no
    packages (they are installed before a sandbox is made). What it omits is the session's
    (:func:`bind_to_session`). Audit mode does not apply: the session's sandbox exists with that profile, and
    more cannot be given.
    """
    sandbox = session.sandbox
    out: list[RuleResult] = []
    fixed = {
        "language": sandbox.language, "image": sandbox.profile.image, "runtime": sandbox.profile.runtime,
        "network": sandbox.profile.network,
    }  # fmt: skip
    for name, value in fixed.items():
        asked = getattr(request, name)
        if asked is not None and asked != value:
            message = f"{name} {asked!r} is not the session's {value!r}; a session's profile is fixed at creation"
            out.append(_violation(f"$.{name}", asked, value, message))
    ceilings = _session_limits(sandbox)
    for name, asked in request.limits.to_dict().items():
        most = ceilings[name]
        if asked > most:
            shown = (format_size(int(asked)), format_size(int(most))) if name in _SIZES else (f"{asked:g}", f"{most:g}")
            message = f"{name} {shown[0]} is above the session's {shown[1]}; an execution asks for no more"
            out.append(_violation(f"$.limits.{name}", asked, {"max": most}, message))
    allowed = {(m.source, m.target): m.mode for m in _session_mounts(sandbox)}
    expected = [{"source": s, "target": t, "mode": mode} for (s, t), mode in allowed.items()]
    for index, mount in enumerate(request.mounts):
        mode = allowed.get((mount.source, mount.target))
        if mode is None or (mount.mode == "rw" and mode == "ro"):
            message = f"mount {mount.source}:{mount.target}:{mount.mode} is not one of the session's mounts"
            got = {"source": mount.source, "target": mount.target, "mode": mount.mode}
            out.append(_violation(f"$.mounts[{index}]", got, expected, message))
    if request.packages:
        message = (
            "packages are installed before a run's sandbox is made; the session's sandbox exists already, so an "
            "execution in it cannot add any"
        )
        out.append(_violation("$.packages", list(request.packages), [], message))
    return tuple(out)


def bind_to_session(session: SessionSettings, request: ExecutionRequest) -> ExecutionRequest:
    """``request`` with every profile field it omits taken from ``session`` (language, image, runtime, network,
    mounts, each limit), so the policy decides it in the session's profile. Check :func:`within_session` first."""
    sandbox = session.sandbox
    given = request.limits.to_dict()
    limits = RequestLimits(**(_session_limits(sandbox) | given))
    return replace(
        request,
        language=request.language or sandbox.language,
        image=request.image or sandbox.profile.image,
        runtime=request.runtime or sandbox.profile.runtime,
        network=request.network or sandbox.profile.network,
        mounts=request.mounts or _session_mounts(sandbox),
        limits=limits,
    )


def decide_in_session(
    policy: CompiledPolicy | Policy,
    session: SessionSettings,
    request: ExecutionRequest,
    *,
    assembler: Assembler,
    denied_paths: Sequence[str] = (),
    request_id: str | None = None,
    decision_id: str | None = None,
    now: datetime | None = None,
) -> Decision:
    """Decide an execution in ``session``: :func:`within_session`'s result first (a ``sessions.profile`` pass, or
    its violations, which deny), then every execution rule on the request bound to the session's profile
    (:func:`bind_to_session`), under the policy as it is now."""
    violations = within_session(session, request)
    admission = violations or (
        RuleResult(SESSION_PROFILE_RULE, "pass", "enforce", "$", None, None, "within the session's profile"),
    )
    return _without_approvals(evaluate(
        policy, bind_to_session(session, request), assembler=assembler, denied_paths=denied_paths,
        admission=admission, request_id=request_id, decision_id=decision_id, now=now,
    ))  # fmt: skip

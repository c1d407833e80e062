"""The engine: every rule judges the request, every result is kept, and an allowed request is assembled.

1. :func:`~gateway.decision.settings.resolve` decides every setting (request value or policy default).
2. Every registered rule judges those settings; the engine stamps each finding with the rule's id, mode and
   status. A rule that raises is an ``error`` result under its own id; an error always denies, and so does
   an enforce-mode failure.
3. When nothing denies, the backend's :class:`Assembler` turns the very same settings into its options and
   its guard re-checks them; a guard refusal is an ``assembly.guard`` error and a deny.

The engine reads no environment and no working directory: whatever must never be mounted besides the
built-in list comes in as ``denied_paths`` (the Gateway passes its audit sink's).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from gateway.decision.model import Decision, PolicyRef, RuleResult, ShadowVerdict, Status, request_digest
from gateway.decision.rules import RULES, Context, Finding
from gateway.decision.rules.base import RuleOf
from gateway.decision.settings import BackendLimits, SandboxSettings, resolve
from gateway.errors import UnsafeOptionsError
from gateway.policy.compiled import CompiledPolicy, compile_policy
from gateway.policy.model import Mode, Policy
from gateway.request import ExecutionRequest
from gateway.runspec import HostMount, RunSpec

if TYPE_CHECKING:
    from gateway.egress.proxy import EgressPlan

__all__ = ["Assembler", "assemble", "evaluate", "judge", "stamp"]


class Assembler(Protocol):
    """A backend's option builder and invariant guard (the Docker backend's is ``DockerAssembler``)."""

    @property
    def backend(self) -> str:
        """The backend's name, e.g. ``docker``."""
        ...

    def build(self, settings: SandboxSettings, *, decision_id: str, request_id: str) -> dict[str, Any]:
        """The backend's run options for ``settings``, hardened baseline always on."""
        ...

    def guard(self, options: Mapping[str, Any], *, denied_paths: Sequence[str] = ()) -> None:
        """Raise :class:`~gateway.errors.UnsafeOptionsError` listing every broken invariant of ``options``."""
        ...

    def recorded(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` as records and responses show them: a copy, with content the backend ships and names by
        digest (the Docker seccomp profile) shown by that name."""
        ...

    @property
    def limits(self) -> BackendLimits:
        """What this backend can give one sandbox (the rules deny more, before anything is created)."""
        ...


def stamp(rule_id: str, mode: Mode, finding: Finding) -> RuleResult:
    """The result of one finding of rule ``rule_id`` judged in ``mode``: the rule never labels itself."""
    status: Status
    if finding.ok is None:
        status = "skip"
    elif finding.ok:
        status = "pass"
    elif finding.never_relaxed:
        status, mode = "fail", "enforce"
    else:
        status = "warn" if mode == "audit" else "fail"  # approve mode: a failure that holds (RuleResult.holds)
    return RuleResult(rule_id, status, mode, finding.path, finding.got, finding.expected, finding.message)


class _Judged(Protocol):
    @property
    def policy(self) -> Policy: ...


J = TypeVar("J", bound=_Judged)


def judge(ctx: J, rules: Iterable[RuleOf[J]]) -> list[RuleResult]:
    """Every finding of ``rules`` on ``ctx``, stamped; a rule that raises is an ``error`` result (it denies)."""
    results: list[RuleResult] = []
    for rule in rules:
        try:
            mode = rule.mode(ctx.policy)
            results.extend(stamp(rule.id, mode, finding) for finding in rule.check(ctx))
        except Exception as exc:  # noqa: BLE001 - a crashing rule denies; it never allows
            message = f"rule crashed: {type(exc).__name__}: {exc}"
            results.append(RuleResult(rule.id, "error", "enforce", rule.path, None, None, message))
    return results


def _host_mounts(settings: SandboxSettings) -> tuple[HostMount, ...]:
    """The judged directories of an allowed decision (every one was opened below its root and identified)."""
    out = []
    for m in settings.mounts:
        if m.root is None or m.identity is None:
            raise ValueError(f"mount source {m.canonical} was allowed without being opened below a root")
        out.append(HostMount(m.root, m.canonical, m.identity.device, m.identity.inode, m.target, m.mode == "ro"))
    return tuple(out)


def _utc(now: datetime | None) -> datetime:
    """The decision time in UTC: the current time for ``None``; a naive time is taken as UTC."""
    if now is None:
        return datetime.now(UTC)
    return now.replace(tzinfo=UTC) if now.tzinfo is None else now.astimezone(UTC)


def _error(rule: str, message: str) -> RuleResult:
    return RuleResult(rule, "error", "enforce", "$", None, None, message)


def _egress_plan(settings: SandboxSettings) -> EgressPlan | None:
    """What the run's proxy is given (``RunSpec.egress``): the resolved destinations and limits; None without egress."""
    if settings.egress is None:
        return None
    # Imported here: gateway.egress loads asyncio and ssl, which only a run with egress needs.
    from gateway.egress.proxy import EgressPlan  # noqa: PLC0415

    return EgressPlan(settings.egress.destinations, settings.egress.proxy_limits(), settings.egress.secrets)


def assemble(
    assembler: Assembler, settings: SandboxSettings, *, denied_paths: Sequence[str], decision_id: str, request_id: str
) -> tuple[RunSpec, dict[str, Any]] | RuleResult:
    """The guarded run of ``settings`` and its options as records show them; or, when the guard refuses the
    options (``assembly.guard``) or the assembler fails (``assembly.build``), the ``error`` result that denies."""
    try:
        options = assembler.build(settings, decision_id=decision_id, request_id=request_id)
        assembler.guard(options, denied_paths=denied_paths)
        run = RunSpec(
            options=options,
            timeout_s=settings.timeout_s,
            output_bytes=settings.output_bytes,
            output_files_bytes=settings.output_files_bytes,
            output_files=settings.output_files,
            pull=settings.profile.pull,
            backend=assembler.backend,
            mounts=_host_mounts(settings),
            egress=_egress_plan(settings),
        )
        return run, assembler.recorded(run.options)
    except UnsafeOptionsError as exc:
        detail = "; ".join(str(p) for p in exc.problems) or exc.message
        return _error("assembly.guard", f"unsafe options refused: {detail}")
    except Exception as exc:  # noqa: BLE001 - an assembler that fails denies
        return _error("assembly.build", f"{type(exc).__name__}: {exc}")


def evaluate(
    policy: CompiledPolicy | Policy,
    request: ExecutionRequest,
    *,
    assembler: Assembler,
    denied_paths: Sequence[str] = (),
    admission: Sequence[RuleResult] = (),
    request_id: str | None = None,
    decision_id: str | None = None,
    now: datetime | None = None,
    approved: Collection[str] = (),
) -> Decision:
    """Judge ``request`` under ``policy``; assemble the backend's options if nothing denies.

    ``policy`` is best given compiled (a :class:`~gateway.policy.PolicySet` compiles each policy once); a
    plain :class:`Policy` is compiled for this one call. ``admission`` results (from the Gateway's admission
    hook) come first in the decision and deny like any other. ``now`` is the decision time (UTC; ``None``:
    the current time; a naive time is read as UTC): the policy's exceptions that match the principal and have
    not expired by then widen the policy for this request, and the decision lists their ids. A shadow policy
    (``spec.audit_policy``) judges the same request; its failures join the results as ``shadow:<rule id>``
    failures in mode ``audit``, which never deny. A request that only approve-mode rules fail is held
    (``Decision.approval_required``, nothing assembled) unless its :func:`request_digest` is in ``approved`` (the
    digests an operator approved); either way the decision carries that digest. Never raises for a bad request or a
    broken policy object: every failure is an ``error`` result and a deny.
    """
    decision_id = decision_id or uuid.uuid4().hex
    request_id = request_id or uuid.uuid4().hex
    moment = _utc(now)
    decision = _evaluate(
        policy, request, assembler=assembler, denied_paths=denied_paths, admission=admission,
        request_id=request_id, decision_id=decision_id, now=moment, approved=approved,
    )  # fmt: skip
    shadow = policy.shadow if isinstance(policy, CompiledPolicy) else None
    if shadow is None and isinstance(policy, Policy) and policy.audit_policy is not None:
        shadow = compile_policy(policy.audit_policy)
    if shadow is None:
        return decision
    verdict = evaluate(
        shadow, request, assembler=assembler, denied_paths=denied_paths, request_id=request_id,
        decision_id=decision_id, now=moment,
    )  # fmt: skip
    note = f"the audit policy {shadow.name!r} would deny: "
    warnings = tuple(
        RuleResult(f"shadow:{r.rule}", "fail", "audit", r.path, r.got, r.expected, note + r.message)
        for r in verdict.violations
    )
    return replace(
        decision,
        results=decision.results + warnings,
        shadow=ShadowVerdict(shadow.name, shadow.sha256, verdict.allowed),
    )


def _evaluate(
    policy: CompiledPolicy | Policy,
    request: ExecutionRequest,
    *,
    assembler: Assembler,
    denied_paths: Sequence[str],
    admission: Sequence[RuleResult],
    request_id: str,
    decision_id: str,
    now: datetime,
    approved: Collection[str],
) -> Decision:
    raw = policy.policy if isinstance(policy, CompiledPolicy) else policy
    ref = PolicyRef(raw.name, raw.sha256, raw.source)
    results = list(admission)
    used: tuple[str, ...] = ()
    try:
        compiled = policy if isinstance(policy, CompiledPolicy) else compile_policy(policy)
        applied = compiled.exceptions_for(request.principal, now)
        used = tuple(exc.id for exc in applied)
        compiled = compiled.relaxed(applied)
        settings = resolve(compiled.policy, request)
    except Exception as exc:  # noqa: BLE001 - a policy object that cannot be resolved is a deny with the reason
        results.append(_error("engine.resolve", f"{type(exc).__name__}: {exc}"))
        return Decision(decision_id, request_id, False, ref, tuple(results), exceptions=used)
    try:
        backend = assembler.limits
    except Exception:  # noqa: BLE001 - a backend that cannot say what it can give is judged on the policy alone
        backend = BackendLimits()
    ctx = Context(compiled, request, settings, tuple(denied_paths), backend, now=now)
    results.extend(judge(ctx, RULES))
    if any(r.denies for r in results):
        return Decision(decision_id, request_id, False, ref, tuple(results), settings, exceptions=used)
    digest = request_digest(request, settings) if any(r.holds for r in results) else None
    if digest is not None and digest not in approved:
        return Decision(
            decision_id, request_id, False, ref, tuple(results), settings, exceptions=used, request_digest=digest
        )
    assembled = assemble(
        assembler, settings, denied_paths=ctx.denied_paths, decision_id=decision_id, request_id=request_id
    )
    if isinstance(assembled, RuleResult):
        results.append(assembled)
        return Decision(
            decision_id, request_id, False, ref, tuple(results), settings, exceptions=used, request_digest=digest
        )
    run, recorded = assembled
    return Decision(
        decision_id, request_id, True, ref, tuple(results), settings, run, exceptions=used, recorded_options=recorded,
        request_digest=digest,
    )  # fmt: skip

"""The Gateway: the one object every interface (CLI, Python API, LLM tool, HTTP service, MCP) calls.

Request path, one named stage each: intake (parse and validate) → decide (the principal's policy, the
admission hook, every rule, the backend's assembler and guard) → record the decision (durable before anything
runs: fail closed) → run (the decision's own run specification, handed to the runner unchanged) → record the
outcome. The runner, the audit sink and the tracer come in through the constructor; nothing here is global,
and the decision sees no environment: the paths it must protect come from the audit sink itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from gateway.audit import AuditSink, JsonlAuditTrail
from gateway.audit.approvals import ApprovalStore
from gateway.audit.interrupted import mark_interrupted
from gateway.decision import Assembler, Decision, RuleResult, evaluate
from gateway.errors import (
    AuditUnavailableError,
    AuthenticationError,
    CancelledRunError,
    ContractError,
    GatewayError,
    PackageInstallError,
    PolicyError,
    PrincipalMismatchError,
    Problem,
    RequestError,
    SandboxError,
)
from gateway.packages import Installed, Installer, installer_for
from gateway.policy import CompiledPolicy, Policy, PolicySet, load_policy
from gateway.policy.model import PoolConfig
from gateway.request import ExecutionRequest, parse_request
from gateway.resources import policy_path_from_env
from gateway.result import ExecutionResult, connection_data, outcome_data, raw_bytes
from gateway.runner import Outcome, Payload, Runner, RunSpec
from gateway.runner.interface import OnOutput, PoolingRunner, PoolStatus
from gateway.runner.pool import Lease, WarmPool
from gateway.sessions import SessionManager
from gateway.slots import HostSlots, Slot
from gateway.telemetry import (
    SPAN_AUDIT,
    SPAN_EXECUTE,
    SPAN_POLICY,
    SPAN_SANDBOX,
    annotate_decision,
    annotate_error,
    annotate_outcome,
    get_tracer,
)

if TYPE_CHECKING:
    from gateway.egress import EgressReport

__all__ = ["Admission", "Caller", "Gateway", "RawRequest"]

RawRequest = Mapping[str, Any] | str | bytes | ExecutionRequest
"""A request as an interface hands it over: parsed JSON, JSON text or bytes, or an already parsed request."""

Admission = Callable[[ExecutionRequest, Policy], Iterable[RuleResult]]
"""Called before the decision with the parsed request and the policy that applies to its principal. It
returns results that join the decision (a ``fail`` in ``enforce`` mode denies, like any rule's): quotas plug
in here. A hook that raises denies the request with an ``admission`` error."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who an interface authenticated (the HTTP service: the bearer token's principal and public token id).

    Given to :meth:`Gateway.execute` / :meth:`Gateway.decide`, it *is* the request's principal: a request that
    names another one is refused (:class:`PrincipalMismatchError`, audited as ``request.invalid``), one that
    names none is attributed to it, and every record of the request carries ``principal`` = its name and
    ``data.caller`` = ``{"principal", "token_id"}``. The token itself never reaches the Gateway."""

    principal: str
    token_id: str

    def to_dict(self) -> dict[str, str]:
        return {"principal": self.principal, "token_id": self.token_id}


def _ref(policy: Policy) -> dict[str, str]:
    return {"name": policy.name, "sha256": policy.sha256}


class Gateway:
    """Decides and executes requests under a policy set, auditing every step.

    Construct it with :meth:`from_env` for the embedded defaults, or pass a policy (or :class:`PolicySet`), a
    runner and an audit sink (tests pass a fake runner and an in-memory sink). Use it as a context manager so
    that the trail records the gateway's start and stop (and, at the start, an interrupted outcome for each run
    a killed gateway left open: :mod:`gateway.audit.interrupted`). :meth:`close` closes only what the Gateway itself
    created (:meth:`from_env` creates its trail and runner); a runner or sink passed in stays its owner's.
    ``slots`` bounds concurrent sandboxes host-wide (default: :meth:`HostSlots.from_env`, shared by every
    gateway process on the host).

    ``pool``: keep a warm pool of single-use sandboxes (``gateway.runner.pool``): ``True`` sizes it by each
    policy's ``spec.pool``, a :class:`PoolConfig` sizes it the same for every policy, a :class:`WarmPool` is
    used as it is (and closed with the Gateway). The runner must be a ``PoolingRunner`` (the Docker runner
    is). Off by default: a one-shot CLI run never starts containers it will not use. :meth:`close` destroys
    the pool's containers.

    ``packages``: the install phase of runs whose request lists packages (:class:`gateway.packages.Installer`;
    :meth:`from_env` gives a Docker runner's, caching in ``GATEWAY_PACKAGES_DIR``). Without one such a run fails
    closed (``packages.install_failed``).

    ``defer_removal``: a cold run's result is returned before its container's removal is confirmed (the
    runner confirms it in the background and frees the host slot then; a failure is audited as
    ``container.left``). Pooled runs always work this way. Off by default for cold runs: a failed removal then
    stays the run's own error, and the container is gone when ``execute`` returns.
    """

    def __init__(
        self,
        policies: Policy | PolicySet,
        *,
        runner: Runner,
        audit: AuditSink,
        assembler: Assembler | None = None,
        admission: Admission | None = None,
        slots: HostSlots | None = None,
        tracer: trace.Tracer | None = None,
        pool: bool | PoolConfig | WarmPool | None = None,
        defer_removal: bool = False,
        packages: Installer | None = None,
        approvals: ApprovalStore | None = None,
    ) -> None:
        self._policies = policies if isinstance(policies, PolicySet) else PolicySet.single(policies)
        self.runner = runner
        self.audit = audit
        self.assembler = assembler if assembler is not None else runner.assembler
        self.admission = admission
        self.slots = slots if slots is not None else HostSlots.from_env()
        """Host-wide execution slots (``GATEWAY_SLOTS`` etc.): every run holds one while its sandbox exists."""
        self._tracer = tracer or get_tracer()
        self._owned: list[Callable[[], None]] = []
        self.defer_removal = defer_removal
        """Cold runs too return before their container's removal is confirmed (pooled runs always do)."""
        self.pool: WarmPool | None = _make_pool(pool, runner, self.slots)
        """The warm pool, when this Gateway keeps one (see ``pool``)."""
        if self.pool is not None:
            self._owned.append(self.pool.close)
            self.pool.configure(c.policy for c in self._policies)
        self.packages = packages
        """Installs a run's packages (``spec.packages``) before it starts; None: such a run fails closed."""
        self.approvals = approvals if approvals is not None else ApprovalStore(audit)
        """The approvals of requests held by approve-mode rules (``gateway.audit.approvals``), rebuilt from the trail
        when the Gateway is entered."""
        self.sessions = SessionManager(self)
        """The live sessions (``gateway.sessions``): create, list, get, execute in, close; closed with the Gateway."""

    @property
    def policies(self) -> PolicySet:
        """The policy set requests are decided under. Assigning a new one (a reload) rebuilds the warm pool:
        containers made under a policy that is no longer served are destroyed, never used."""
        return self._policies

    @policies.setter
    def policies(self, policies: PolicySet) -> None:
        self._policies = policies
        if self.pool is not None:
            self.pool.configure(c.policy for c in policies)

    @property
    def policy(self) -> Policy:
        """The default policy (the only one, in the simple case)."""
        return self.policies.default.policy

    # -- construction ----------------------------------------------------------------------------------

    @classmethod
    def from_env(
        cls,
        policy_path: str | os.PathLike[str] | None = None,
        audit_dir: str | os.PathLike[str] | None = None,
        *,
        runner: Runner | None = None,
        tracer: trace.Tracer | None = None,
        pool: bool | PoolConfig | None = None,
        defer_removal: bool = False,
    ) -> Gateway:
        """Policy from ``policy_path``/``GATEWAY_POLICY``/default; trail from ``audit_dir``/``GATEWAY_AUDIT_DIR``/
        ``./audit``; the Docker engine from ``DOCKER_HOST`` as docker-py reads it. ``pool``: as for the
        constructor.

        A policy that fails to load is recorded as ``policy.rejected`` and raised: nothing can run without one.
        """
        sink = JsonlAuditTrail.from_env(Path(audit_dir) if audit_dir is not None else None)
        path = policy_path_from_env(policy_path)
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            try:
                problems = [str(p) for p in exc.problems] or [exc.message]
                sink.append("policy.rejected", {"source": str(path), "problems": problems})
            finally:
                sink.close()
            raise
        owned_runner = runner is None
        if runner is None:
            from gateway.runner.docker.runner import DockerRunner  # noqa: PLC0415 - docker-py only when needed

            runner = DockerRunner()
        gateway = cls(
            policy, runner=runner, audit=sink, tracer=tracer, pool=pool, defer_removal=defer_removal,
            packages=installer_for(runner),
        )  # fmt: skip
        # Closed in reverse: the pool (added by the constructor) before the runner, the trail last.
        gateway._owned.insert(0, sink.close)
        if owned_runner:
            gateway._owned.insert(1, runner.close)
        return gateway

    def __enter__(self) -> Gateway:
        default = self.policy
        self._append("gateway.start", {"policy_source": default.source}, policy=_ref(default))
        for compiled in self.policies:
            ref = _ref(compiled.policy)
            self._append("policy.loaded", {**ref, "source": compiled.policy.source}, policy=ref)
        if isinstance(self.audit, JsonlAuditTrail):
            mark_interrupted(self.audit)  # the runs a killed gateway left without an outcome
            self.approvals.load_trail(self.audit.directory)  # pending and granted approvals survive a restart
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every live session, destroy the warm pool, wait for the removals still under way (their failures
        are audited), record the stop (best effort), then close what this Gateway created, in reverse order."""
        try:
            self.sessions.close_all()  # each recorded as session.closed (gateway_stop), before the stop record
            if self.pool is not None:
                self.pool.close()
            settle = getattr(self.runner, "settle", None)
            if callable(settle):
                settle(30.0)
            self._append("gateway.stop", {"policy_source": self.policy.source}, policy=_ref(self.policy))
        except GatewayError:
            pass  # the stop record is best effort; every request already failed closed on its own
        finally:
            owned, self._owned = self._owned, []
            _close_all(reversed(owned))

    # -- the request path ------------------------------------------------------------------------------

    def decide(self, request: RawRequest, *, caller: Caller | None = None) -> ExecutionResult:
        """Decide without running anything (``gateway check``). The decision is audited as a dry run."""
        return self._handle(request, run=False, caller=caller)

    def intake(self, request: RawRequest, *, caller: Caller | None = None) -> ExecutionResult | None:
        """Check a request as :meth:`execute` does first, and nothing more: ``None`` when it is valid (nothing
        is recorded; execute it), else the result of the invalid request, audited as ``request.invalid``. The
        service checks an execution's body this way in a decision worker, so that its own process parses only
        valid requests, whose size the request schema bounds. One check more than :meth:`execute` makes: code
        larger than any policy of the set accepts (:attr:`PolicySet.code_size_ceiling`) is refused here (413
        ``request.code_too_large``), so that it never waits for a slot to be denied."""
        checked = self._intake(request, uuid.uuid4().hex, caller, max_code_bytes=self.policies.code_size_ceiling)
        return checked if isinstance(checked, ExecutionResult) else None

    def execute(
        self, request: RawRequest, *, on_output: OnOutput | None = None, cancel: threading.Event | None = None,
        caller: Caller | None = None,
    ) -> ExecutionResult:  # fmt: skip
        """Decide, audit, run if allowed, audit the outcome. Never raises for gateway failures: the result
        carries the error (and ``exit_status``) so that every interface reports it the same way.

        ``on_output(stream, data)`` receives the program's output live, in this thread, as the runner collects
        it (``stream`` is ``"stdout"`` or ``"stderr"``); the chunks joined are exactly the result's output, and
        the caps, deadline and audit are unchanged. A callback that raises stops the run: the sandbox is killed
        and removed and the result carries ``OutputCallbackError`` (``gateway.output_callback``).

        ``cancel``: set it (from any thread) to abandon the run, e.g. when a client disconnects: the sandbox is
        killed and removed within a bounded poll interval, and the result (and the ``execution.outcome``
        record) carries ``CancelledRunError`` (``gateway.cancelled``). Set before the run, nothing runs.

        ``caller``: the authenticated principal (see :class:`Caller`)."""
        return self._handle(request, run=True, on_output=on_output, cancel=cancel, caller=caller)

    def reap(self, *, everything: bool = False, expired_only: bool = False) -> list[str]:
        """Remove containers left behind by a crashed gateway (this instance's and expired ones; ``everything``:
        every gateway container on the backend; ``expired_only``: only those past their deadline, what a
        starting gateway does before its first run), then the workspaces of this instance (unless
        ``expired_only``) and of dead instances (all with ``everything``); audited (an expired-only sweep that
        found nothing is not)."""
        if self.pool is not None and not expired_only:
            # The pool's containers are this instance's: destroyed with the rest, refilled afterwards.
            with self.pool.paused():
                self.pool.drain()
                ids = self.runner.reap(everything=everything, expired_only=expired_only)
        else:
            ids = self.runner.reap(everything=everything, expired_only=expired_only)
        # After the containers: a workspace is freed once no container holds it.
        reap_workspaces = getattr(self.runner, "reap_workspaces", None)
        spaces = [] if reap_workspaces is None else reap_workspaces(everything=everything, expired_only=expired_only)
        if ids or spaces or not expired_only:
            data: dict[str, Any] = {"container_ids": ids, "everything": everything, "expired_only": expired_only}
            if spaces:
                data["workspaces"] = spaces
            self._append("containers.reaped", data)
        return ids

    def _handle(
        self, raw: RawRequest, *, run: bool, on_output: OnOutput | None = None, cancel: threading.Event | None = None,
        caller: Caller | None = None,
    ) -> ExecutionResult:  # fmt: skip
        request_id = uuid.uuid4().hex
        with self._tracer.start_as_current_span(SPAN_EXECUTE) as span:
            span.set_attribute("gateway.request.id", request_id)
            span.set_attribute("gateway.dry_run", not run)
            result = self._stages(
                raw, request_id, run=run, span=span, on_output=on_output, cancel=cancel, caller=caller
            )
            span.set_attribute("gateway.decision.allowed", result.allowed)
            if result.error is not None:
                annotate_error(span, result.error)
            return result

    def _stages(
        self, raw: RawRequest, request_id: str, *, run: bool, span: trace.Span, on_output: OnOutput | None,
        cancel: threading.Event | None, caller: Caller | None,
    ) -> ExecutionResult:  # fmt: skip
        request = self._intake(raw, request_id, caller)
        if isinstance(request, ExecutionResult):
            return request
        try:
            compiled = self.policies.for_principal(request.principal)
        except AuthenticationError as exc:  # a strict set (the service's) does not serve this principal
            return self._refused(exc, request_id, request.principal, caller)
        ref = _ref(compiled.policy)
        records: dict[str, Any] = {
            "request_id": request_id, "principal": request.principal, "policy": ref, "caller": caller,
        }  # fmt: skip
        if request.principal:
            span.set_attribute("enduser.id", request.principal)
        try:
            # Not waited for: the decision's record, appended next and before anything runs, flushes both.
            self._append("request.received", {"request": request.to_dict()}, durable=False, **records)
        except GatewayError as exc:
            return ExecutionResult(request_id, None, error=exc, audit_ok=False)
        approved = self.approvals.usable(request.principal) if run else frozenset()
        decision = self._decide(compiled, request, request_id, span, approved)
        try:
            self._record_decision(decision, dry_run=not run, records=records)
        except GatewayError as exc:
            return ExecutionResult(request_id, decision, error=exc, audit_ok=False)
        if run and (decision.approval_required or (decision.allowed and decision.request_digest is not None)):
            return self._approval(decision, request, records, on_output=on_output, cancel=cancel)
        if not run or not decision.allowed:
            return ExecutionResult(request_id, decision)
        return self._execute_allowed(decision, request, records, on_output=on_output, cancel=cancel)

    def _approval(
        self, decision: Decision, request: ExecutionRequest, records: Mapping[str, Any], *,
        on_output: OnOutput | None, cancel: threading.Event | None,
    ) -> ExecutionResult:  # fmt: skip
        """A request that approve-mode rules held: pending (``approval.requested``, nothing runs), or, allowed by
        its approval, one use recorded (``approval.used``) before it runs. Fails closed on an unwritable trail."""
        request_id = decision.request_id
        fields = {k: v for k, v in records.items() if k != "caller"}
        try:
            if decision.approval_required:
                rules = [r.rule for r in decision.approvals]
                held = self.approvals.hold(
                    decision.request_digest or "", principal=request.principal, rules=rules, request=request.to_dict(),
                    request_id=request_id, decision_id=decision.decision_id, policy=records.get("policy"),
                )  # fmt: skip
                return ExecutionResult(request_id, decision, approval_id=held.approval_id)
            used = self.approvals.use(decision.request_digest or "", request.principal, fields)
        except AuditUnavailableError as exc:
            return ExecutionResult(request_id, decision, error=exc, audit_ok=False)
        except GatewayError as exc:
            return ExecutionResult(request_id, decision, error=exc)
        result = self._execute_allowed(decision, request, records, on_output=on_output, cancel=cancel)
        return dataclasses.replace(result, approval_id=used.approval_id)

    def _execute_allowed(
        self, decision: Decision, request: ExecutionRequest, records: Mapping[str, Any], *,
        on_output: OnOutput | None, cancel: threading.Event | None,
    ) -> ExecutionResult:  # fmt: skip
        request_id = decision.request_id
        installed, error = self._install(decision, records)
        outcome: Outcome | None = None
        if error is None:
            outcome, error = self._run(decision, request, on_output, cancel, records, installed=installed)
        audit_ok = True
        try:
            self._record_outcome(decision, outcome, error, records=records, installed=installed)
        except GatewayError as exc:
            audit_ok = False
            error = error or _unrecorded(exc, ran=outcome is not None)
        return ExecutionResult(request_id, decision, outcome=outcome, error=error, audit_ok=audit_ok)

    # -- stages ----------------------------------------------------------------------------------------

    def _intake(
        self, raw: RawRequest, request_id: str, caller: Caller | None = None, *, max_code_bytes: int | None = None
    ) -> ExecutionRequest | ExecutionResult:
        """The parsed request (attributed to ``caller``), or the result of an invalid one (``request.invalid``)."""
        try:
            request = raw if isinstance(raw, ExecutionRequest) else parse_request(raw, max_code_bytes=max_code_bytes)
            if caller is not None:
                if request.principal not in (None, caller.principal):
                    problem = Problem(
                        f"the request names principal {request.principal!r} but the caller authenticated as "
                        f"{caller.principal!r}",
                        path="$.principal",
                    )
                    raise PrincipalMismatchError(
                        f"principal {request.principal!r} is not the authenticated principal {caller.principal!r}",
                        problems=[problem],
                    )
                request = dataclasses.replace(request, principal=caller.principal)
        except RequestError as exc:
            return ExecutionResult(
                request_id, None, error=exc, audit_ok=self._record_invalid(raw, exc, request_id, caller)
            )
        return request

    def _record_invalid(self, raw: object, error: RequestError, request_id: str, caller: Caller | None) -> bool:
        """Record a request that did not parse or validate (``request.invalid``: every problem with its path,
        the digest and size of the raw body, never the body); whether the record was written."""
        data = raw_bytes(raw)
        invalid = {
            "problems": [{"path": p.path, "message": p.message} for p in error.problems]
            or [{"path": "$", "message": error.message}],
            "raw_sha256": hashlib.sha256(data).hexdigest(),
            "raw_bytes": len(data),
        }
        principal = caller.principal if caller is not None else None
        try:
            self._append(
                "request.invalid", invalid, request_id=request_id, principal=principal, policy=_ref(self.policy),
                caller=caller,
            )  # fmt: skip
        except GatewayError:
            return False
        return True

    def _refused(
        self, error: AuthenticationError, request_id: str, principal: str | None, caller: Caller | None
    ) -> ExecutionResult:
        """A request refused before its decision (its principal is no longer served): ``request.refused``,
        nothing decided, nothing ran."""
        data = {"count": 1, "summary": False, "code": error.code, "message": error.message}
        try:
            self._append("request.refused", data, request_id=request_id, principal=principal, caller=caller)
        except GatewayError:
            return ExecutionResult(request_id, None, error=error, audit_ok=False)
        return ExecutionResult(request_id, None, error=error)

    def _decide(
        self, compiled: CompiledPolicy, request: ExecutionRequest, request_id: str, span: trace.Span,
        approved: frozenset[str] = frozenset(),
    ) -> Decision:  # fmt: skip
        """Admission, then every rule, then assembly and guard by the runner's own assembler."""
        with self._tracer.start_as_current_span(SPAN_POLICY) as pspan:
            decision = evaluate(
                compiled,
                request,
                assembler=self.assembler,
                denied_paths=self.audit.protected_paths,
                admission=self._admit(request, compiled.policy),
                request_id=request_id,
                now=datetime.now(UTC),
                approved=approved,
            )
            annotate_decision(pspan, span, decision)
        return decision

    def _admit(self, request: ExecutionRequest, policy: Policy) -> tuple[RuleResult, ...]:
        if self.admission is None:
            return ()
        try:
            return tuple(self.admission(request, policy))
        except Exception as exc:  # noqa: BLE001 - a failing admission hook denies; it never admits
            message = f"admission hook failed: {type(exc).__name__}: {exc}"
            return (RuleResult("admission", "error", "enforce", "$", None, None, message),)

    def _record_decision(self, decision: Decision, *, dry_run: bool, records: Mapping[str, Any]) -> None:
        # Shared, not copied: the sink copies the record's data into plain JSON before it redacts anything.
        decision_data = decision.to_dict(shared=True)
        data = {"decision": decision_data, "options_sha256": decision.options_sha256, "dry_run": dry_run}
        self._append("policy.decision", data, **records)

    def _install(self, decision: Decision, records: Mapping[str, Any]) -> tuple[Installed | None, GatewayError | None]:
        """The install phase of a run whose decision lists packages (cached, or installed in a sandbox of its own
        whose only destination is the policy's index); nothing for a run without. A failure is the run's error:
        the run does not start."""
        settings = decision.settings
        if settings is not None and settings.npm is not None:
            asked = ", ".join(str(s) for s in settings.npm.specs)
        elif settings is not None and settings.packages is not None:
            asked = ", ".join(str(r) for r in settings.packages.requirements)
        else:
            return None, None
        if self.packages is None:
            return None, PackageInstallError(f"this gateway has no package installer, so {asked} cannot be installed; "
                                             "nothing ran")  # fmt: skip
        try:
            return self.packages.install(settings, request_id=records["request_id"], slots=self.slots), None
        except GatewayError as exc:
            return None, exc
        except Exception as exc:  # noqa: BLE001 - an installer bug must come back as an audited failure, not a crash
            error = PackageInstallError(f"installing {asked} failed unexpectedly: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            return None, error

    def _run(
        self, decision: Decision, request: ExecutionRequest, on_output: OnOutput | None,
        cancel: threading.Event | None, records: Mapping[str, Any], *, installed: Installed | None = None,
    ) -> tuple[Outcome | None, GatewayError | None]:  # fmt: skip
        """Hand the decision's run specification (with the installed packages, if any) and the payload to the
        runner; every failure comes back."""
        spec, settings = decision.run, decision.settings
        if spec is None or settings is None:
            return None, ContractError("an allowed decision carries no run specification")
        if installed is not None:
            assert self.packages is not None  # noqa: S101 -- it installed them
            try:
                spec = self.packages.apply(spec, installed)
            except GatewayError as exc:
                return None, exc
        with self._tracer.start_as_current_span(SPAN_SANDBOX) as sspan:
            outcome: Outcome | None = None
            error: GatewayError | None = None
            status: PoolStatus = "cold"
            try:
                sspan.set_attribute("container.image.name", settings.profile.image)
                sspan.set_attribute("container.runtime", settings.profile.runtime)
                payload = Payload(code=request.code, language=settings.language, files=request.file_contents())
                _check_not_cancelled(cancel)
                lease = self.pool.claim(settings, spec) if self.pool is not None else Lease("cold")
                status = lease.status
                sspan.set_attribute("gateway.pool", status)
                outcome = self._hand_over(lease, spec, payload, on_output=on_output, cancel=cancel, records=records)
                outcome = dataclasses.replace(outcome, pool=status)
            except GatewayError as exc:
                error = exc
                outcome = exc.outcome  # what ran before the failure (output so far, the container), if anything
                if outcome is not None:
                    outcome = dataclasses.replace(outcome, pool=status)
            except Exception as exc:  # noqa: BLE001 - a runner bug must come back as an audited failure, not a crash
                error = SandboxError(f"the runner failed unexpectedly: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
            if error is not None:
                annotate_error(sspan, error)
            if outcome is not None:
                annotate_outcome(sspan, outcome)
        return outcome, error

    def _hand_over(
        self, lease: Lease, spec: RunSpec, payload: Payload, *, on_output: OnOutput | None,
        cancel: threading.Event | None, records: Mapping[str, Any],
    ) -> Outcome:  # fmt: skip
        """Run in the claimed sandbox, or cold in a new one, holding one host slot until the sandbox is gone.
        A pooled run (and a cold one with ``defer_removal``) returns before the removal is confirmed: the runner
        confirms it in the background and calls ``gone`` then."""
        slot: Slot | None
        if lease.sandbox is not None:
            slot, lease.slot = lease.slot, None
        else:
            slot = self.pool.cold_slot() if self.pool is not None else self.slots.take()
        if not (self.defer_removal or lease.sandbox is not None) and slot is not None:
            with slot:  # removed before this returns; a failed removal is the run's error
                _check_not_cancelled(cancel)  # abandoned while waiting for a slot: nothing runs
                return self.runner.execute(spec, payload, on_output=on_output, cancel=cancel)
        gone = _Gone(slot, self, records)
        try:
            if lease.sandbox is not None:
                return self.runner.run(lease.sandbox, payload, on_output=on_output, cancel=cancel, on_gone=gone)
            if cancel is not None and cancel.is_set():
                gone(None)
                _check_not_cancelled(cancel)  # abandoned while waiting for a slot: nothing runs
            return self.runner.execute(spec, payload, on_output=on_output, cancel=cancel, on_gone=gone)
        except GatewayError:
            raise
        except BaseException:
            gone(None)  # a runner bug may never call it: the slot is freed (a later call does nothing)
            raise

    def _record_outcome(
        self, decision: Decision, outcome: Outcome | None, error: GatewayError | None, *, records: Mapping[str, Any],
        installed: Installed | None = None,
    ) -> None:  # fmt: skip
        image = decision.settings.profile.image if decision.settings is not None else ""
        if outcome is not None and outcome.pulled:
            self._append("image.pulled", {"image": image, "image_id": outcome.image_id}, **records)
        self._record_connections(outcome.egress if outcome is not None else None, records)
        data = outcome_data(image, outcome, error)
        if installed is not None:
            data = {**data, "packages": installed.to_record()}
        self._append("execution.outcome", data, **records)

    def _record_connections(self, egress: EgressReport | None, records: Mapping[str, Any]) -> None:
        """One ``network.connection`` record per connection in ``egress`` (a run's or a session execution's report,
        or what a kernel's end cut), appended without waiting: the caller's next record (``execution.outcome``, or
        the session's end) makes them durable together."""
        if egress is not None:
            for connection in egress.records:
                self._append("network.connection", connection_data(connection), durable=False, **records)

    def _append(self, event_type: str, data: Mapping[str, Any], *, caller: Caller | None = None, **kw: Any) -> None:
        if caller is not None:
            data = {**data, "caller": caller.to_dict()}
        with self._tracer.start_as_current_span(SPAN_AUDIT, attributes={"gateway.audit.event_type": event_type}):
            self.audit.append(event_type, data, **kw)


class _Gone:
    """A run's ``on_gone``: frees its host slot once its sandbox no longer exists, and audits a container that
    could not be removed (``container.left``: labelled, it ends itself at its deadline and ``gateway reap``
    removes it). Called at most once to effect."""

    def __init__(self, slot: Slot | None, gateway: Gateway, records: Mapping[str, Any]) -> None:
        self._slot: Slot | None = slot
        self._gateway = gateway
        self._records = records

    def __call__(self, error: GatewayError | None) -> None:
        slot, self._slot = self._slot, None
        if slot is None:
            return
        slot.release()
        if error is not None:
            data = {"error": {"code": error.code, "message": error.message}}
            with contextlib.suppress(GatewayError):
                self._gateway._append("container.left", data, **self._records)


def _make_pool(pool: bool | PoolConfig | WarmPool | None, runner: Runner, slots: HostSlots) -> WarmPool | None:
    if pool is None or pool is False:
        return None
    if isinstance(pool, WarmPool):
        return pool
    if not isinstance(runner, PoolingRunner):
        raise ContractError(
            f"a warm pool needs a runner that can prepare pooled sandboxes; {type(runner).__name__} cannot"
        )
    return WarmPool(runner, slots, override=pool if isinstance(pool, PoolConfig) else None)


def _check_not_cancelled(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise CancelledRunError("the run was cancelled by its caller before it started; nothing ran")


def _unrecorded(exc: GatewayError, *, ran: bool) -> GatewayError:
    """The error for an outcome record that could not be written, saying whether the program ran."""
    if not ran:
        return exc
    error = AuditUnavailableError(
        f"the program ran, but its outcome could not be recorded: {exc.message}",
        hint="the run happened (its output and exit code are in this result) but the trail lacks its outcome; "
        "fix the audit directory (GATEWAY_AUDIT_DIR) before running anything else",
    )
    error.__cause__ = exc
    return error


def _close_all(closers: Iterable[Callable[[], None]]) -> None:
    """Call every closer even when one fails; re-raise the first failure."""
    first: BaseException | None = None
    for close in closers:
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - the others must still close; the first failure is re-raised
            first = first or exc
    if first is not None:
        raise first

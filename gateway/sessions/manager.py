"""The session manager: the live sessions of one Gateway, each a principal's own sandbox state.

A session is created under its principal's policy (:func:`~gateway.decision.decide_session`, with the principal's
live-session count, counted and reserved under one lock so that two concurrent creations cannot both pass
``max_per_principal``); its profile is fixed then. Every execution in it is a request decided again under the
current policy (:func:`~gateway.decision.decide_in_session`) and recorded like any execution, with its
``session_id``. A session ends exactly once, with one record: ``session.closed`` (its owner, an operator, the
Gateway's stop), ``session.expired`` (idle, or past its lifetime counted from *ready*: a :class:`Ticker` sweeps)
or ``session.killed`` (its kernel died: the reason). Another principal's session id gets the very error of an
unknown one (:class:`SessionNotFoundError`); an ended one, :class:`SessionGoneError` naming how it ended.

Kernel mode: one long-lived container with a persistent interpreter (``KernelRunner.open_kernel``), an execution
is a cell. Workspace mode: a size-bounded workspace (the runner's ``workspaces`` store), each execution a fresh
single-use container with it at ``/workspace`` (with a warm pool, made ahead while the one before runs:
``gateway.sessions.ahead``); it is destroyed when the session ends (after the execution using it, if one is,
and after every container that held it). A backend without kernels or workspaces refuses the mode after its decision
(:class:`SessionUnavailableError`). A session belongs to the gateway instance that made it: its kernel ends when
that process does (the kernel's connection closes), and the start-up reap removes what is left (containers and
workspaces of dead instances).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import secrets
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gateway._ticker import Ticker
from gateway.decision import Decision, decide_in_session, decide_session
from gateway.decision.sessions import SessionSettings
from gateway.decision.settings import SandboxSettings
from gateway.errors import (
    AuthenticationError,
    CancelledRunError,
    GatewayError,
    PrincipalMismatchError,
    Problem,
    RequestError,
    SandboxError,
    SessionBusyError,
    SessionGoneError,
    SessionNotFoundError,
    SessionUnavailableError,
)
from gateway.payload import Payload
from gateway.request import SessionRequest, parse_session_request
from gateway.result import ExecutionResult, outcome_data
from gateway.runner.interface import CellResult, Kernel, KernelRunner, OnOutput, Outcome, RunSpec
from gateway.runner.workspace import Workspace, WorkspaceListing, Workspaces
from gateway.sessions import files
from gateway.sessions.ahead import AheadRunner, NextContainers, ttl_for
from gateway.sessions.files import SessionFile
from gateway.sessions.model import END_EVENTS, SessionInfo, SessionResult, SessionState, utc
from gateway.slots import Slot
from gateway.telemetry import SPAN_EXECUTE, annotate_error

if TYPE_CHECKING:
    from gateway._gateway import Caller, Gateway, RawRequest
    from gateway.egress import EgressReport

__all__ = ["MAX_ENDED", "SWEEP_EVERY_S", "RawSessionRequest", "SessionManager"]

RawSessionRequest = Mapping[str, Any] | str | bytes | SessionRequest
"""A session request as an interface hands it over: parsed JSON, JSON text or bytes, or a parsed request."""

SWEEP_EVERY_S = 5.0
"""How often the sweeper looks for idle and expired sessions."""
MAX_ENDED = 4096
"""How many ended sessions are remembered (to answer :class:`SessionGoneError` rather than not-found)."""


@dataclasses.dataclass(eq=False)
class _Session:
    """A live session's mutable state, guarded by the manager's lock."""

    session_id: str
    principal: str | None
    settings: SessionSettings
    policy: dict[str, str]
    caller: Caller | None
    kernel: Kernel | None = None
    workspace: Workspace | None = None
    """Workspace mode: the session's size-bounded workspace (each execution a fresh container over it)."""
    destroy_pending: bool = False
    """Ended while an execution used its workspace: that execution's end destroys it."""
    ready_at: float = 0.0
    last_used_at: float = 0.0
    executions: int = 0
    busy: bool = False
    state: SessionState | None = None
    """None while it opens; ``ready`` / ``busy``; then how it ended."""
    ended: str | None = None

    @property
    def lifetime_ends_at(self) -> float:
        return self.ready_at + self.settings.lifetime_s

    @property
    def expires_at(self) -> float:
        return min(self.last_used_at + self.settings.idle_s, self.lifetime_ends_at)

    def info(self) -> SessionInfo:
        state: SessionState = self.state or "ready"
        if state == "ready" and self.busy:
            state = "busy"
        return SessionInfo(
            session_id=self.session_id, principal=self.principal, mode=self.settings.mode, state=state,
            ready_at=self.ready_at, last_used_at=self.last_used_at, expires_at=self.expires_at,
            lifetime_ends_at=self.lifetime_ends_at, executions=self.executions, settings=self.settings,
            container_id=self.kernel.container_id if self.kernel is not None else None, ended=self.ended,
        )  # fmt: skip


class SessionManager:
    """The live sessions of ``gateway`` (its :attr:`~gateway.Gateway.sessions`); see the module.

    ``clock``: unix time (a test passes its own); ``sweep_every_s``: the sweeper's period (it starts with the
    first session and stops at :meth:`close_all`). Methods that take ``principal`` answer only for that
    principal's sessions (None: the sessions made without one, as a local Gateway's are) unless ``operator`` is
    set (the service's operator role). ``gateway.client.Client.sessions`` has the same methods remotely."""

    def __init__(
        self, gateway: Gateway, *, clock: Callable[[], float] = time.time, sweep_every_s: float = SWEEP_EVERY_S
    ) -> None:
        self._gateway = gateway
        self._clock = clock
        self._lock = threading.Lock()
        self._live: dict[str, _Session] = {}
        self._ended: OrderedDict[str, tuple[str | None, str, str]] = OrderedDict()
        """session id -> (principal, final state, reason), the newest :data:`MAX_ENDED`."""
        self._sweeper = Ticker("gateway-sessions", sweep_every_s, self._sweep_quietly)
        self._sweeping = False
        self._closed = False
        """Set by :meth:`close_all`: no session is created after it."""
        self._ahead = _next_containers(gateway)
        """Workspace sessions' next containers, made ahead (``gateway.sessions.ahead``); None without a warm pool."""

    # -- create ----------------------------------------------------------------------------------------

    def create(self, request: RawSessionRequest, *, caller: Caller | None = None) -> SessionResult:
        """Decide a session request and, when allowed, open its sandbox (kernel mode: a live interpreter). A
        denial is a result with the decision's violations (rule ids ``sessions.*`` and the profile's); an
        invalid request, a principal the policy set does not serve or a failure is a result with ``error``.
        Recorded: ``policy.decision`` (with ``session``, the resolved settings), then ``session.created`` (or an
        ``execution.outcome`` with the error when the sandbox could not be opened)."""
        gw = self._gateway
        request_id = uuid.uuid4().hex
        parsed = self._intake(request, request_id, caller)
        if isinstance(parsed, SessionResult):
            return parsed
        try:
            compiled = gw.policies.for_principal(parsed.principal)
        except AuthenticationError as exc:
            refused = gw._refused(exc, request_id, parsed.principal, caller)
            return SessionResult(request_id, None, error=exc, audit_ok=refused.audit_ok)
        policy = {"name": compiled.policy.name, "sha256": compiled.policy.sha256}
        records: dict[str, Any] = {
            "request_id": request_id, "principal": parsed.principal, "policy": policy, "caller": caller,
        }  # fmt: skip
        session_id = new_session_id()
        with self._lock:  # counted and reserved at once: two creations cannot both pass the limit
            live = sum(1 for s in self._live.values() if s.principal == parsed.principal)
            decided = decide_session(
                compiled, parsed, live_sessions=live, assembler=gw.assembler, denied_paths=gw.audit.protected_paths,
                request_id=request_id, now=datetime.now(UTC),
            )  # fmt: skip
            if decided.allowed and decided.settings is not None and not self._closed:
                self._live[session_id] = _Session(session_id, parsed.principal, decided.settings, policy, caller)
        decision = decided.decision
        data: dict[str, Any] = {
            "decision": decision.to_dict(shared=True), "options_sha256": decision.options_sha256, "dry_run": False,
            "session_request": _decimals(parsed.to_dict()),
            "session": None if decided.settings is None else _decimals(decided.settings.to_dict()),
        }  # fmt: skip
        if decided.allowed:
            data["session_id"] = session_id
        try:
            gw._append("policy.decision", data, **records)
        except GatewayError as exc:
            self._forget(session_id)
            return SessionResult(request_id, decision, error=exc, audit_ok=False)
        if not decided.allowed or decided.settings is None:
            return SessionResult(request_id, decision)
        session = self._live.get(session_id)
        if session is None:  # the Gateway closed meanwhile
            return self._failed(decided.settings, session_id, decision, records, SessionUnavailableError(
                "the gateway is stopping; no session is created", hint="retry against a running gateway"
            ))  # fmt: skip
        return self._open(session, decision, records)

    def _intake(self, raw: RawSessionRequest, request_id: str, caller: Caller | None) -> SessionRequest | SessionResult:
        try:
            request = _attributed(raw if isinstance(raw, SessionRequest) else parse_session_request(raw), caller)
        except RequestError as exc:
            audit_ok = self._gateway._record_invalid(raw, exc, request_id, caller)
            return SessionResult(request_id, None, error=exc, audit_ok=audit_ok)
        return request

    def _open(self, session: _Session, decision: Decision, records: Mapping[str, Any]) -> SessionResult:
        """Open the allowed session's sandbox and announce it (``session.created``); on failure the reservation
        is dropped and the decision closed by an ``execution.outcome`` with the error."""
        gw = self._gateway
        request_id = str(records["request_id"])
        settings = session.settings
        error: GatewayError | None = None
        kernel: Kernel | None = None
        workspace: Workspace | None = None
        try:
            if settings.mode == "workspace":
                profile = settings.sandbox.profile
                workspace = _workspace_store(gw.runner).create(settings.workspace_size, profile.uid, profile.gid)
            else:
                runner, spec = _kernel_spec(gw.runner, decision)
                profile = settings.sandbox.profile
                store = getattr(gw.runner, "workspaces", None)
                # The kernel's /workspace is the session's bounded workspace (with its files API) where there is one.
                shape = None if store is None else (settings.workspace_size, profile.uid, profile.gid)
                ready = gw.pool.claim_kernel(spec, profile.policy, shape) if gw.pool is not None else None
                if ready is not None:  # opened ahead for exactly this spec and workspace; never used before
                    kernel, workspace = ready
                else:
                    if store is not None:
                        workspace = store.create(settings.workspace_size, profile.uid, profile.gid)
                        spec = dataclasses.replace(spec, workspace=workspace)
                    slot = gw.pool.cold_slot() if gw.pool is not None else gw.slots.take()
                    kernel = runner.open_kernel(spec, slot=slot)
        except GatewayError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - every failure is audited and returned, never a crash
            error = SandboxError(f"opening the kernel failed: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
        if error is not None:
            self._forget(session.session_id)
            self._discard(None, workspace)  # a workspace made for a kernel that did not open
            return self._failed(settings, session.session_id, decision, records, error)
        with self._lock:
            stopped = self._closed
            if not stopped:
                session.kernel, session.workspace = kernel, workspace
                session.ready_at = session.last_used_at = self._clock()
                session.state = "ready"
                info = session.info()
        if stopped:  # close_all ran while the sandbox opened: it never becomes a session
            self._forget(session.session_id)
            self._discard(kernel, workspace)
            error = SessionUnavailableError("the gateway is stopping; no session is created")
            return self._failed(settings, session.session_id, decision, records, error)
        created = {
            "session_id": session.session_id, "mode": settings.mode,
            "container_id": kernel.container_id if kernel is not None else None,
            "expires_at": utc(info.expires_at), "lifetime_ends_at": utc(info.lifetime_ends_at),
            "settings": _decimals(settings.to_dict()),
        }  # fmt: skip
        try:
            gw._append("session.created", created, **records)
        except GatewayError as exc:  # never announced, so never used: gone again
            self._forget(session.session_id)
            self._discard(kernel, workspace)
            return SessionResult(request_id, decision, error=exc, audit_ok=False)
        self._start_sweeper()
        if workspace is not None and kernel is None:
            self._prepare_next(session, settings.sandbox)
        return SessionResult(request_id, decision, session=info)

    def _discard(self, kernel: Kernel | None, workspace: Workspace | None) -> None:
        """Remove a sandbox that never became a session (best effort: the reaper removes what is left)."""
        with contextlib.suppress(Exception):
            if kernel is not None:
                kernel.close()
            if workspace is not None:
                _workspace_store(self._gateway.runner).destroy(workspace)

    def _failed(
        self, settings: SessionSettings, session_id: str, decision: Decision, records: Mapping[str, Any],
        error: GatewayError,
    ) -> SessionResult:  # fmt: skip
        """An allowed session that could not be opened: its decision closed by an ``execution.outcome`` with the
        error (what ran, if anything, and the session id it would have had)."""
        outcome = error.outcome if isinstance(error.outcome, Outcome) else None
        data = outcome_data(settings.sandbox.profile.image, outcome, error) | {"session_id": session_id}
        try:
            self._gateway._record_connections(outcome.egress if outcome is not None else None, records)
            self._gateway._append("execution.outcome", data, **records)
        except GatewayError:
            return SessionResult(str(records["request_id"]), decision, error=error, audit_ok=False)
        return SessionResult(str(records["request_id"]), decision, error=error)

    def _forget(self, session_id: str) -> None:
        with self._lock:
            self._live.pop(session_id, None)

    # -- look up ---------------------------------------------------------------------------------------

    def list(self, *, principal: str | None = None, operator: bool = False) -> builtins.list[SessionInfo]:
        """The live sessions of ``principal`` (every one with ``operator``), oldest first."""
        with self._lock:
            found = [s for s in self._live.values() if s.state is not None and (operator or s.principal == principal)]
            return sorted((s.info() for s in found), key=lambda i: i.ready_at)

    def get(self, session_id: str, *, principal: str | None = None, operator: bool = False) -> SessionInfo:
        """The live session ``session_id`` of ``principal``; :class:`SessionNotFoundError` for an unknown id and
        another principal's alike, :class:`SessionGoneError` for one that ended."""
        self._expire_due(session_id)
        with self._lock:
            return self._find(session_id, principal, operator).info()

    def _find(self, session_id: str, principal: str | None, operator: bool) -> _Session:
        """Under the lock."""
        session = self._live.get(session_id)
        if session is not None and session.state is not None and (operator or session.principal == principal):
            return session
        ended = self._ended.get(session_id)
        if ended is not None and (operator or ended[0] == principal):
            state, reason = ended[1], ended[2]
            raise SessionGoneError(f"session {session_id} has ended: {state} ({reason}); its state is gone")
        raise SessionNotFoundError(f"no session {session_id} of principal {principal!r}")

    # -- files (workspace mode) -------------------------------------------------------------------------

    def put_file(
        self, session_id: str, path: str, data: bytes, *, principal: str | None = None, operator: bool = False,
        caller: Caller | None = None, request_id: str | None = None,
    ) -> SessionFile:  # fmt: skip
        """Write ``data`` at ``path`` (relative to ``/workspace``) in a workspace-mode session, replacing a file
        there; at most the owner's policy's ``limits.files_size`` ceiling (else
        :class:`~gateway.errors.WorkspaceFileTooLargeError`). Recorded as ``session.file.put`` (path, bytes,
        sha256). Refused: a bad name, a symlink on the way, a full workspace (:mod:`gateway.sessions.files`); a
        kernel-mode session (:class:`SessionUnavailableError`); one busy with an execution
        (:class:`SessionBusyError`); not found and gone as for :meth:`get`."""
        with self._using(session_id, principal, operator, caller, request_id) as target:
            return files.put_file(self._gateway, target, path, data)

    def get_file(
        self, session_id: str, path: str, *, principal: str | None = None, operator: bool = False,
        caller: Caller | None = None, request_id: str | None = None,
    ) -> bytes:  # fmt: skip
        """The content of the regular file at ``path`` in a workspace-mode session, at most the owner's policy's
        ``limits.output_files_bytes`` ceiling; recorded as ``session.file.get`` before it is returned. Refused as
        for :meth:`put_file` (and :class:`~gateway.errors.WorkspaceFileNotFoundError` when nothing is there)."""
        with self._using(session_id, principal, operator, caller, request_id) as target:
            return files.get_file(self._gateway, target, path)

    def list_files(self, session_id: str, *, principal: str | None = None, operator: bool = False) -> WorkspaceListing:
        """The regular files of a workspace-mode session's workspace (not recorded: it moves no content)."""
        with self._using(session_id, principal, operator, None, None) as target:
            return files.list_files(target)

    @contextlib.contextmanager
    def _using(
        self, session_id: str, principal: str | None, operator: bool, caller: Caller | None, request_id: str | None
    ) -> Iterator[files.Target]:
        session = self._take(session_id, principal, operator)
        try:
            store = _workspace_store(self._gateway.runner) if session.workspace is not None else None
            yield files.Target(
                session_id, session.principal, session.workspace, store, caller, request_id or uuid.uuid4().hex
            )
        finally:
            self._release(session)

    # -- execute ---------------------------------------------------------------------------------------

    def execute(
        self, session_id: str, request: RawRequest, *, caller: Caller | None = None,
        on_output: OnOutput | None = None, cancel: threading.Event | None = None,
    ) -> ExecutionResult:  # fmt: skip
        """Decide an execution in the session under the current policy (at most the session's profile: rule
        ``sessions.profile``) and, when allowed, run it there (kernel: one cell). Recorded like any execution
        (``request.received``, ``policy.decision``, ``execution.outcome``, each with ``session_id``). Never raises
        for gateway failures: the result carries the error (:class:`SessionNotFoundError`,
        :class:`SessionGoneError`, :class:`SessionBusyError`: another execution runs in it). A kernel killed
        during the cell ends the session (``session.killed``; ``session_ended`` in the result says why).
        ``on_output``, ``cancel`` and ``caller`` as for :meth:`Gateway.execute`; a cancel kills the kernel."""
        gw = self._gateway
        request_id = uuid.uuid4().hex
        parsed = gw._intake(request, request_id, caller)
        if isinstance(parsed, ExecutionResult):
            return parsed
        try:
            session = self._take(session_id, parsed.principal, operator=False)
        except GatewayError as exc:
            return ExecutionResult(request_id, None, error=exc)
        try:
            with gw._tracer.start_as_current_span(SPAN_EXECUTE) as span:
                span.set_attribute("gateway.request.id", request_id)
                span.set_attribute("gateway.session.mode", session.settings.mode)
                result = self._execute(session, parsed, request_id, caller=caller, on_output=on_output, cancel=cancel)
                span.set_attribute("gateway.decision.allowed", result.allowed)
                if result.error is not None:
                    annotate_error(span, result.error)
                return result
        finally:
            self._release(session)

    def _take(self, session_id: str, principal: str | None, operator: bool) -> _Session:
        """The live session, now busy: one execution or file transfer at a time in a session; another meanwhile
        is refused (:class:`SessionBusyError`), never queued. :meth:`_release` gives it back."""
        self._expire_due(session_id)
        with self._lock:
            session = self._find(session_id, principal, operator)
            if session.busy:
                raise SessionBusyError(
                    f"an execution or a file transfer is already running in session {session_id}; a session "
                    "serves them one at a time"
                )
            session.busy = True
        return session

    def _release(self, session: _Session) -> None:
        """The end of what :meth:`_take` began: the session is used now (its idle time counts from here), and a
        session that ended meanwhile loses its workspace."""
        with self._lock:
            session.busy = False
            session.last_used_at = self._clock()
            destroy, session.destroy_pending = session.destroy_pending, False
        if destroy:  # ended while this execution or transfer used its workspace
            self._destroy_workspace(session)

    def _execute(
        self, session: _Session, request: Any, request_id: str, *, caller: Caller | None,
        on_output: OnOutput | None, cancel: threading.Event | None,
    ) -> ExecutionResult:  # fmt: skip
        gw = self._gateway
        sid = session.session_id
        try:
            compiled = gw.policies.for_principal(request.principal)
        except AuthenticationError as exc:
            return dataclasses.replace(gw._refused(exc, request_id, request.principal, caller), session_id=sid)
        policy = {"name": compiled.policy.name, "sha256": compiled.policy.sha256}
        records: dict[str, Any] = {
            "request_id": request_id, "principal": request.principal, "policy": policy, "caller": caller,
        }  # fmt: skip
        try:
            gw._append("request.received", {"request": request.to_dict(), "session_id": sid}, durable=False, **records)
        except GatewayError as exc:
            return ExecutionResult(request_id, None, error=exc, audit_ok=False, session_id=sid)
        decision = decide_in_session(
            compiled, session.settings, request, assembler=gw.assembler, denied_paths=gw.audit.protected_paths,
            request_id=request_id, now=datetime.now(UTC),
        )  # fmt: skip
        with self._lock:
            session.executions += 1
        data = {
            "decision": decision.to_dict(shared=True), "options_sha256": decision.options_sha256, "dry_run": False,
            "session_id": sid,
        }  # fmt: skip
        try:
            gw._append("policy.decision", data, **records)
        except GatewayError as exc:
            return ExecutionResult(request_id, decision, error=exc, audit_ok=False, session_id=sid)
        if not decision.allowed or decision.settings is None:
            return ExecutionResult(request_id, decision, session_id=sid)
        if session.kernel is None:  # workspace mode: a fresh container over the workspace
            cell = None
            outcome, error = self._run_over_workspace(session, request, decision, on_output, cancel)
        else:
            cell, outcome, error = self._cell(session, request, decision.settings.timeout_s, on_output, cancel)
        killed = session.kernel.killed if session.kernel is not None else None
        image = decision.settings.profile.image
        record = outcome_data(image, outcome, error) | {"session_id": sid}
        if cell is not None:
            record |= {"cell_interrupted": cell.interrupted, "value_truncated": cell.value_truncated}
        if killed is not None and killed != "closed":
            record["session_killed"] = killed
        audit_ok = True
        try:
            gw._record_connections(outcome.egress if outcome is not None else None, records)
            gw._append("execution.outcome", record, **records)
        except GatewayError as exc:
            audit_ok = False
            error = error or exc
        if killed is not None and killed != "closed":
            self._end(session, "killed", killed)
        return ExecutionResult(
            request_id, decision, outcome=outcome, error=error, audit_ok=audit_ok, session_id=sid,
            value=cell.value if cell is not None else None, value_truncated=bool(cell and cell.value_truncated),
            interrupted=bool(cell and cell.interrupted),
            session_ended=killed if killed is not None and killed != "closed" else None,
        )  # fmt: skip

    def _run_over_workspace(
        self, session: _Session, request: Any, decision: Decision, on_output: OnOutput | None,
        cancel: threading.Event | None,
    ) -> tuple[Outcome | None, GatewayError | None]:  # fmt: skip
        """One execution in a fresh single-use container with the session's workspace at ``/workspace``, holding
        a host slot until the container is gone. With containers made ahead (``gateway.sessions.ahead``): the
        session's next container when it was made for this decision's profile, and the next one's begun as soon
        as this one has its container; otherwise a cold one, removed before this returns."""
        gw = self._gateway
        if decision.run is None or decision.settings is None:
            return None, SessionGoneError(f"session {session.session_id}: an allowed decision without a run")
        settings = decision.settings
        spec = dataclasses.replace(decision.run, workspace=session.workspace)
        payload = Payload(code=request.code, language=settings.language, files=request.file_contents())
        if cancel is not None and cancel.is_set():
            return None, CancelledRunError("the run was cancelled by its caller before it started; nothing ran")
        ahead = self._ahead if not settings.mounts else None  # judged mounts are staged per decision: never ahead
        records: dict[str, Any] = {
            "request_id": decision.request_id, "principal": session.principal, "caller": session.caller,
            "policy": {"name": decision.policy.name, "sha256": decision.policy.sha256},
        }  # fmt: skip

        def left(error: GatewayError) -> None:  # labelled, it ends itself at its deadline; `gateway reap` removes it
            gw._append("container.left", {"error": {"code": error.code, "message": error.message}}, **records)

        def cold_slot() -> Slot:
            return gw.pool.cold_slot() if gw.pool is not None else gw.slots.take()

        try:
            if ahead is not None:
                outcome = ahead.execute(
                    session.session_id, settings, spec, payload, cold_slot=cold_slot, on_left=left,
                    then=lambda: self._prepare_next(session, settings), on_output=on_output, cancel=cancel,
                )  # fmt: skip
                return outcome, None
            with cold_slot():
                return gw.runner.execute(spec, payload, on_output=on_output, cancel=cancel), None
        except GatewayError as exc:
            return (exc.outcome if isinstance(exc.outcome, Outcome) else None), exc
        except Exception as exc:  # noqa: BLE001 - a runner bug comes back as an audited failure, not a crash
            error = SandboxError(f"the runner failed unexpectedly: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            return None, error

    def _prepare_next(self, session: _Session, settings: SandboxSettings) -> None:
        """Begin making ``session``'s next container ahead (``gateway.sessions.ahead``) with ``settings``' profile,
        while the session lives: checked and begun under the lock, so that a session that ends afterwards finds
        it and removes it before its workspace (:meth:`_destroy_workspace`)."""
        ahead, workspace = self._ahead, session.workspace
        if ahead is None or workspace is None or settings.mounts:
            return
        with self._lock:
            if session.state == "ready":
                ahead.prepare(session.session_id, settings.profile, workspace, ttl_s=ttl_for(session.settings))

    def _cell(
        self, session: _Session, request: Any, timeout_s: float, on_output: OnOutput | None,
        cancel: threading.Event | None,
    ) -> tuple[CellResult | None, Outcome | None, GatewayError | None]:  # fmt: skip
        kernel = session.kernel
        if kernel is None:
            return None, None, SessionGoneError(f"session {session.session_id} has no kernel")
        try:
            cell = kernel.execute(
                request.code, timeout_s=timeout_s, files=request.file_contents(), env=dict(request.env),
                on_output=on_output, cancel=cancel,
            )  # fmt: skip
        except GatewayError as exc:
            return None, exc.outcome if isinstance(exc.outcome, Outcome) else None, exc
        except Exception as exc:  # noqa: BLE001 - a kernel bug comes back as an audited failure, not a crash
            error = SandboxError(f"the kernel failed unexpectedly: {type(exc).__name__}: {exc}")
            error.__cause__ = exc
            return None, None, error
        return cell, cell.outcome, None

    # -- the end ---------------------------------------------------------------------------------------

    def close(self, session_id: str, *, principal: str | None = None, operator: bool = False) -> None:
        """Close the session: its sandbox is removed (the container is gone when this returns, or the error that
        kept it is recorded as ``container.left``), then ``session.closed`` (reason ``owner`` or ``operator``).
        Not found and gone as for :meth:`get`. Returns nothing, as ``DELETE /v1/sessions/{id}`` (204)."""
        with self._lock:
            session = self._find(session_id, principal, operator)
        own = session.principal == principal
        self._end(session, "closed", "owner" if own else "operator")

    def sweep(self) -> builtins.list[str]:
        """End every session idle past its ``idle_s`` or past its lifetime (``session.expired``, reason
        ``idle`` / ``lifetime``); a busy one is left to its execution's end. Returns the ids ended."""
        now = self._clock()
        with self._lock:
            due = [s for s in self._live.values() if s.state == "ready" and not s.busy and now >= s.expires_at]
        for session in due:
            self._end(session, "expired", "lifetime" if now >= session.lifetime_ends_at else "idle")
        return [s.session_id for s in due]

    def _expire_due(self, session_id: str) -> None:
        """End ``session_id`` now if it is due (the sweep may not have come by yet)."""
        now = self._clock()
        with self._lock:
            session = self._live.get(session_id)
            due = session is not None and session.state == "ready" and not session.busy and now >= session.expires_at
        if due and session is not None:
            self._end(session, "expired", "lifetime" if now >= session.lifetime_ends_at else "idle")

    def close_all(self, reason: str = "gateway_stop") -> None:
        """Stop the sweeper and close every live session (``session.closed`` with ``reason``); no session is
        created after this (:class:`SessionUnavailableError`)."""
        self._stop_sweeper()
        with self._lock:
            self._closed = True
            live = [s for s in self._live.values() if s.state is not None]
        for session in live:
            self._end(session, "closed", reason)
        if self._ahead is not None:  # what the executions still under way made ahead (nothing is made after this)
            self._ahead.close()

    def _end(self, session: _Session, state: SessionState, reason: str) -> None:
        """End ``session`` once (the first caller wins): remove its sandbox, remember it, record the end."""
        with self._lock:
            if session.state not in ("ready", "busy"):
                return
            session.state, session.ended = state, reason
            defer = session.busy and session.workspace is not None
            session.destroy_pending = defer
            self._live.pop(session.session_id, None)
            self._ended[session.session_id] = (session.principal, state, reason)
            while len(self._ended) > MAX_ENDED:
                self._ended.popitem(last=False)
        gw = self._gateway
        records: dict[str, Any] = {"principal": session.principal, "policy": session.policy, "caller": session.caller}
        if self._ahead is not None:  # nothing is made ahead for it any more: its slot is free at once
            self._ahead.drop(session.session_id)
        kernel = session.kernel
        cut: EgressReport | None = None
        if kernel is not None:
            try:
                kernel.close()
            except GatewayError as exc:
                with contextlib.suppress(GatewayError):
                    gw._append("container.left", {"error": {"code": exc.code, "message": exc.message}}, **records)
            # A kernel with egress: the connections its end cut (run-ended) are no cell's; recorded before the end.
            take_egress = getattr(kernel, "take_egress", None)
            cut = take_egress() if take_egress is not None else None
        data: dict[str, Any] = {
            "session_id": session.session_id, "mode": session.settings.mode, "reason": reason,
            "container_id": kernel.container_id if kernel is not None else None, "executions": session.executions,
        }  # fmt: skip
        if session.workspace is not None and not defer:
            left = self._destroy_workspace(session)
            if left is not None:
                data["workspace_left"] = {"code": left.code, "message": left.message}
        with contextlib.suppress(GatewayError):  # the end is best effort: the sandbox is already gone
            gw._record_connections(cut, records)
            gw._append(END_EVENTS[state], data, **records)

    def _destroy_workspace(self, session: _Session) -> GatewayError | None:
        """Remove the session's next container made ahead and wait until its executions' containers are gone, then
        its workspace (a container holding the workspace's file system would keep it mounted); the error that kept
        the workspace (left for ``gateway reap``), if any."""
        if session.workspace is None:
            return None
        if self._ahead is not None:
            self._ahead.drop(session.session_id)
            self._ahead.settle(session.session_id)
        try:
            _workspace_store(self._gateway.runner).destroy(session.workspace)
        except GatewayError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - reported in the end record, never a crash
            return SandboxError(f"removing the workspace failed: {type(exc).__name__}: {exc}")
        return None

    # -- the sweeper -----------------------------------------------------------------------------------

    def _start_sweeper(self) -> None:
        with self._lock:
            if self._sweeping:
                return
            self._sweeping = True
        self._sweeper.start()

    def _stop_sweeper(self) -> None:
        with self._lock:
            sweeping, self._sweeping = self._sweeping, False
        if sweeping:
            self._sweeper.stop()

    def _sweep_quietly(self) -> None:
        with contextlib.suppress(Exception):  # one failed sweep must not end the sweeper
            self.sweep()


def _attributed(request: SessionRequest, caller: Caller | None) -> SessionRequest:
    """``request`` attributed to ``caller`` (as :meth:`Gateway.execute` does); one naming another principal is
    refused."""
    if caller is None:
        return request
    if request.principal not in (None, caller.principal):
        problem = Problem(
            f"the request names principal {request.principal!r} but the caller authenticated as {caller.principal!r}",
            path="$.principal",
        )
        raise PrincipalMismatchError(
            f"principal {request.principal!r} is not the authenticated principal {caller.principal!r}",
            problems=[problem],
        )
    return dataclasses.replace(request, principal=caller.principal)


def new_session_id() -> str:
    """An unguessable session id (192 random bits, URL-safe base64, 32 characters) that never starts with ``-``,
    so that no shell tool or argument parser reads it as an option (one id in 64 would)."""
    while (session_id := secrets.token_urlsafe(24)).startswith("-"):
        continue
    return session_id


def _workspace_store(runner: object) -> Workspaces:
    """The runner's workspace store; :class:`SessionUnavailableError` when its backend has none."""
    store = getattr(runner, "workspaces", None)
    if store is None:
        raise SessionUnavailableError(
            f"the {type(runner).__name__} backend cannot keep workspaces; nothing was created",
            hint="create a kernel session (mode: kernel), or run the Docker backend",
        )
    workspaces: Workspaces = store
    return workspaces


def _kernel_spec(runner: object, decision: Decision) -> tuple[KernelRunner, RunSpec]:
    """The runner as a kernel runner and the kernel's run specification: the decision's, assembled for the
    session's lifetime (:func:`~gateway.decision.sessions.decide_session`); :class:`SessionUnavailableError`
    when the backend has no kernels."""
    if not isinstance(runner, KernelRunner) or decision.run is None:
        raise SessionUnavailableError(f"the {type(runner).__name__} backend cannot run kernels; nothing was created")
    return runner, decision.run


def _decimals(value: Any) -> Any:
    """``value`` with every float as its shortest round-trip decimal string (``0.5`` -> ``"0.5"``), as the trail
    stores a request's floats: audit records hold no floats."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        return {key: _decimals(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_decimals(item) for item in value]
    return value


def _next_containers(gateway: Gateway) -> NextContainers | None:
    """The workspace sessions' next containers of ``gateway``: made ahead when it keeps a warm pool (it makes
    single-use containers ahead for its runs too) and its runner can bind a workspace into one."""
    runner = gateway.runner
    if gateway.pool is None or not isinstance(runner, AheadRunner) or getattr(runner, "workspaces", None) is None:
        return None
    return NextContainers(runner, gateway.slots)

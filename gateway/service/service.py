"""The service: one :class:`~gateway.Gateway` for the principals of a principals file, with what serving it
needs around it (quotas, decision workers, metrics, bounded refusal records, anchors, the runs in flight).

:class:`Service` knows nothing of HTTP; :func:`gateway.service.app.build_app` serves it (``app.state.service``,
read back by :meth:`Service.of`).

Reload (SIGHUP or ``POST /v1/reload``, :meth:`Service.reload`) re-reads the principals file and every policy it
names (plus the default policy). A principals file that fails validation rejects the whole reload: the last good
principals and policies stay active. A policy file that fails (``policy.rejected``) does not hold back the principals'
token changes: the policy it would replace stays active (a new principal without one is refused). Both
outcomes are audited as ``policy.reloaded`` (``ok`` true with the new default policy's name and sha256, every
policy loaded and the ``kept`` ones; ``ok`` false with the rejected ``source`` and its ``problems``).

A request is decided only for a caller that still exists: the policy set is strict (a principal it does not
list is refused, never decided under the default), the caller's token is checked again after every wait
(:meth:`Service.refuse_gone` after the queue, :meth:`Service.execute` before the Gateway decides), and a good
reload refuses the queued requests of removed principals and revoked tokens at once (401 ``auth.failed``,
audited as ``request.refused``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from gateway import Caller, ExecutionResult, Gateway, PolicySet
from gateway.audit import AuditSink, JsonlAuditTrail
from gateway.audit.jsonl import read_tail
from gateway.errors import (
    AuditError,
    AuditUnavailableError,
    AuthenticationError,
    GatewayError,
    PolicyError,
    PrincipalsError,
    PrincipalsNotFoundError,
    ServerConfigError,
    http_status_for,
)
from gateway.packages import installer_for
from gateway.policy import CompiledPolicy, Policy, load_policy
from gateway.resources import policy_path_from_env
from gateway.runner import Runner
from gateway.runner.interface import OnOutput
from gateway.service.authlog import AuthFailures, ForbiddenCalls
from gateway.service.bodies import BodyBudget, default_body_budget
from gateway.service.config import ServerConfig
from gateway.service.decisions import DecisionWorkers, default_decision_workers
from gateway.service.lifecycle import Inflight, anchor_writer, reap_stale
from gateway.service.metrics import ServiceMetrics
from gateway.service.principals import (
    DEFAULT_QUOTAS,
    Principals,
    Quotas,
    load_principals,
    principals_path_from_env,
)
from gateway.service.quotas import QuotaGate, Refusals, default_global_bound
from gateway.service.readiness import EngineState, ask_engine, trail_check
from gateway.service.trailbudget import TrailBudget, TrailMeter, TrailTail

if TYPE_CHECKING:
    from starlette.requests import HTTPConnection

__all__ = ["Service", "policy_set"]

_log = logging.getLogger("gateway.service")


class Service:
    """What the application serves: the configuration, the principals, one Gateway and the auth-failure log.

    Build it with :meth:`from_config`; :meth:`start` and :meth:`close` are the application's lifespan."""

    def __init__(
        self,
        config: ServerConfig,
        *,
        principals: Principals,
        gateway: Gateway,
        auth_failures: AuthFailures,
        owned: tuple[Callable[[], None], ...] = (),
        runner: Callable[[], Runner] | None = None,
    ) -> None:
        self.config = config
        self.principals = principals
        self.gateway = gateway
        self.auth_failures = auth_failures
        self._owned = owned
        self.inflight = Inflight()
        """The running executions' cancel events: what shutdown cancels after the grace."""
        self.metrics = ServiceMetrics()
        """``GET /metrics``."""
        self.quota_gate = QuotaGate(
            config.max_concurrent_executions or default_global_bound(), queue_wait_s=config.queue_wait_s
        )
        """Quotas and the global bound, enforced before any work starts (:mod:`gateway.service.quotas`)."""
        self.metrics.queue_depth.set_function(self.quota_gate.waiting)
        self.bodies = BodyBudget(
            config.max_body_bytes_in_flight or default_body_budget(config.max_body_bytes, self.quota_gate.global_bound),
            largest=config.max_body_bytes,
        )
        """The bytes of request bodies held at once (:mod:`gateway.service.bodies`)."""
        self.metrics.body_bytes_in_flight.set_function(lambda: self.bodies.held)
        if gateway.pool is not None:
            self.metrics.watch_pool(gateway.pool)
        if isinstance(gateway.audit, JsonlAuditTrail):
            gateway.audit.on_low_space = self.metrics.low_space
        self.refusals = Refusals(gateway.audit, interval_s=config.auth_failure_interval_s)
        self.forbidden = ForbiddenCalls(gateway.audit, interval_s=config.auth_failure_interval_s)
        """``auth.forbidden``, summarised per principal and path (:mod:`gateway.service.authlog`)."""
        self.trail_budget = TrailBudget(config.trail_bytes_per_minute)
        """Each principal's trail bytes per minute (:mod:`gateway.service.trailbudget`), charged by the meter."""
        self._trail_meter: TrailMeter | None = None
        self.anchors = anchor_writer(config, gateway.audit)
        """Writes the trail's head every N records or T seconds when the configuration asks (``audit_anchor``)."""
        workers = config.decision_workers if config.decision_workers is not None else default_decision_workers()
        self.decisions = DecisionWorkers(gateway, runner, workers, refusal=self.refusal_of)
        """Where dry runs are decided (:mod:`gateway.service.decisions`); a caller gone while its job waited is
        refused there (:meth:`refusal_of`)."""
        self.engine_state = EngineState(lambda images: ask_engine(self.gateway.runner, images))
        """The engine's part of :meth:`readiness`, asked at most once a second."""
        self.draining = False
        """Set at SIGTERM for ``drain_s`` (``gateway serve``): ``GET /readyz`` answers 503 ``service.draining``
        while every request, new ones too, is still served, so that a load balancer stops sending first."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """The event loop serving the service (:meth:`running`): where :attr:`quota_gate` lives."""
        self._reload_lock = threading.Lock()
        self.on_reload: list[Callable[[], None]] = []
        """Called on the event loop after each good reload (``/mcp`` ends the MCP sessions of removed principals
        and revoked tokens, :meth:`gateway.service.mcp_http.McpEndpoint.end_revoked`)."""

    @classmethod
    def from_config(cls, config: ServerConfig, *, runner: Callable[[], Runner]) -> Service:
        """Load the principals (refusing a file where no principal holds a token), each principal's policy and
        the default one, open the trail, then make the runner (``gateway serve``: the Docker runner); the
        service owns and closes both. A policy that does not load is recorded as ``policy.rejected`` and
        raised: the service does not start. So is a trail that would refuse the first record
        (:func:`_check_trail`)."""
        principals_file = config.principals or principals_path_from_env()
        try:
            principals = load_principals(principals_file)
        except PrincipalsNotFoundError as exc:
            raise ServerConfigError(
                f"no principals file at {principals_file}: the service has no unauthenticated mode",
                hint="add a principal first: `gateway principals add NAME --policy policies/default.yaml`",
            ) from exc
        if not any(p.tokens for p in principals):
            raise ServerConfigError(
                f"no principal in {principals_file} holds a token (there are {len(principals)}; revoked principals "
                "cannot authenticate): the service has no unauthenticated mode",
                hint="`gateway principals add NAME --policy P` or `gateway principals rotate NAME` issues a token",
            )
        # Many requests at once: one fsync makes every record written meanwhile durable (group commit); each
        # request still waits until its own record is on disk, so nothing runs or answers before it is recorded.
        sink = JsonlAuditTrail.from_env(config.audit_dir, group_commit=True)
        try:
            _check_trail(sink)
            policies, _ = policy_set(config, principals, sink)
            backend = runner()
        except BaseException:
            sink.close()
            raise
        try:
            packages = installer_for(backend)
            gateway = Gateway(policies, runner=backend, audit=sink, pool=config.pool or None, packages=packages)
        except BaseException:
            backend.close()
            sink.close()
            raise
        auth = AuthFailures(sink, interval_s=config.auth_failure_interval_s)
        return cls(
            config, principals=principals, gateway=gateway, auth_failures=auth, owned=(backend.close, sink.close),
            runner=runner,
        )  # fmt: skip

    @staticmethod
    def of(conn: HTTPConnection) -> Service:
        """The service of a request's application (``app.state.service``, set by ``build_app``)."""
        service: Service = conn.app.state.service
        return service

    def quotas_of(self, caller: Caller) -> Quotas:
        """The caller's quotas: its principal's own, the service's defaults for the fields it does not set."""
        return self.principals.get(caller.principal).effective_quotas(self.config.quotas)

    def start(self) -> None:
        """Record the start (``gateway.start``, ``policy.loaded`` for each policy), start the auth log and the
        trail meter."""
        self.gateway.__enter__()
        self._warn_of_shares()
        if self.anchors is not None:
            self.anchors.start()
        self.auth_failures.start()
        if isinstance(self.gateway.audit, JsonlAuditTrail):
            self._trail_meter = TrailMeter(TrailTail(self.gateway.audit.directory), self.trail_budget)
            self._trail_meter.start()
        reap_stale(self.gateway)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The service's part of the application's lifespan: :meth:`start` (in a worker thread), reload on SIGHUP,
        the decision workers; on the way out the decision workers, then :meth:`close`."""
        await anyio.to_thread.run_sync(self.start)
        self._loop = asyncio.get_running_loop()
        self._reload_on_sighup()
        try:
            await self.decisions.start()
            yield
        finally:
            try:
                await self.decisions.close()
            finally:
                await anyio.to_thread.run_sync(self.close)

    def _reload_on_sighup(self) -> None:
        """Reload on SIGHUP (in a worker thread, so the event loop keeps serving); only in the main thread."""
        if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGHUP"):
            return
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, lambda: loop.run_in_executor(None, self.reload))

    def refusal_of(self, principal: str, token_id: str | None) -> AuthenticationError | None:
        """Why a request of ``principal`` with token ``token_id`` may no longer be decided (its principal was
        removed or its token revoked since it authenticated), or None when it still may."""
        holder = self.principals.by_token_id.get(token_id) if token_id is not None else None
        if holder is not None and holder[0].name == principal:
            return None
        return AuthenticationError(
            f"the token {token_id} of principal {principal!r} was revoked, or the principal removed, while its "
            "request waited; the request is refused, never decided under another policy; nothing ran",
            hint="ask the operator for a token of a current principal (`gateway principals add|rotate`)",
        )

    def refuse_gone(self, caller: Caller, *, request_id: str, path: str | None) -> None:
        """After a wait: :class:`AuthenticationError` (401, audited as ``request.refused``) when the caller's
        principal was removed or its token revoked meanwhile (:meth:`refusal_of`)."""
        error = self.refusal_of(caller.principal, caller.token_id)
        if error is not None:
            self.refusals.note(
                error, principal=caller.principal, token_id=caller.token_id, request_id=request_id, path=path
            )
            raise error

    def execute(
        self, body: bytes, caller: Caller, *, cancel: threading.Event | None = None, on_output: OnOutput | None = None
    ) -> ExecutionResult:
        """Run in a worker thread, registered in :attr:`inflight` for as long as the thread runs (the request's
        task may be cancelled at shutdown; the run is then cancelled by :meth:`close`, not abandoned). ``cancel``:
        the caller's own event (its client went away), which shutdown sets too. A caller removed or revoked
        while the request waited for this thread is refused (:meth:`refuse_gone`), and nothing is decided."""
        request_id = uuid.uuid4().hex
        try:
            self.refuse_gone(caller, request_id=request_id, path=None)
        except AuthenticationError as exc:
            return ExecutionResult(request_id, None, error=exc)
        with self.inflight.run(cancel) as event:
            result = self.gateway.execute(body, caller=caller, cancel=event, on_output=on_output)
        self.metrics.ran(result)  # streamed or not, every run's result passes here
        return result

    def execute_in_session(
        self, session_id: str, body: bytes, caller: Caller, *, cancel: threading.Event | None = None,
        on_output: OnOutput | None = None,
    ) -> ExecutionResult:  # fmt: skip
        """An execution in the caller's session ``session_id`` (:meth:`SessionManager.execute
        <gateway.sessions.SessionManager.execute>`), in a worker thread, exactly as :meth:`execute`."""
        request_id = uuid.uuid4().hex
        try:
            self.refuse_gone(caller, request_id=request_id, path=None)
        except AuthenticationError as exc:
            return ExecutionResult(request_id, None, error=exc)
        with self.inflight.run(cancel) as event:
            return self.gateway.sessions.execute(session_id, body, caller=caller, cancel=event, on_output=on_output)

    def reload(self) -> bool:
        """SIGHUP: reload the principals and policies (see the module); True when the new ones are active."""
        return bool(self.reload_report()["ok"])

    def reload_report(self) -> dict[str, Any]:
        """Reload (see the module), one reload at a time (else an older file read last could undo a revocation);
        the ``policy.reloaded`` record's data (``ok``: the new ones are active). The decision workers get the new
        policies. A file where no token is left is applied too (unlike at start): revoking every token is an
        incident response, and everyone then gets 401."""
        with self._reload_lock:
            return self._reload()

    def _reload(self) -> dict[str, Any]:
        gateway = self.gateway
        source = str(self.config.principals or principals_path_from_env())
        try:
            principals = load_principals(source)  # with no token left, everyone gets 401: a revocation applies
            policies, kept = policy_set(self.config, principals, gateway.audit, last_good=gateway.policies)
        except (PolicyError, PrincipalsError, GatewayError) as exc:
            rejected = getattr(exc, "source", None) or source
            problems = [str(p) for p in exc.problems] or [exc.message]
            _log.warning("reload rejected (%s): the last good principals and policies stay active", exc.message)
            data: dict[str, Any] = {"ok": False, "source": str(rejected), "problems": problems}
            self._audit_reload(data)
            return data
        self.principals = principals
        gateway.policies = policies
        self._warn_of_shares()
        if self._loop is not None:  # the quota gate lives on the event loop's thread
            self._loop.call_soon_threadsafe(self.quota_gate.refuse_waiting, self.refusal_of)
            for hook in self.on_reload:
                self._loop.call_soon_threadsafe(hook)
        default = policies.default.policy
        loaded = [{"name": c.policy.name, "sha256": c.policy.sha256, "source": c.policy.source} for c in policies]
        data = {"ok": True, "source": source, "name": default.name, "sha256": default.sha256, "policies": loaded}
        if kept:  # the token changes apply; a file that failed (policy.rejected) leaves its last good policy
            data["kept"] = kept
            _log.warning("reload: %d policy file(s) failed; their last good policies stay active", len(kept))
        policy = {"name": default.name, "sha256": default.sha256}
        self._audit_reload({**data, "principals": len(principals)}, policy=policy)
        _log.info("reloaded %d principal(s) and %d policy(ies) from %s", len(principals), len(loaded), source)
        self.decisions.policies_changed(policies)
        return {**data, "principals": len(principals)}

    def _warn_of_shares(self) -> None:
        """Log (at start and reload) the principals whose configured ``max_concurrent`` the quota gate cuts to
        its share, because it is at or above the global bound
        (:meth:`~gateway.service.quotas.QuotaGate.share_warning`). The built-in default (8) is not named, where
        it comes from: it means as many as the share allows, so a small host's default start stays quiet."""
        effective = {principal.name: principal.effective_quotas(self.config.quotas) for principal in self.principals}
        quotas = {
            name: given for name, given in effective.items() if given.max_concurrent != DEFAULT_QUOTAS.max_concurrent
        }
        warning = self.quota_gate.share_warning(quotas)
        if warning is not None:
            _log.warning("%s", warning)

    def _audit_reload(self, data: dict[str, Any], **extra: Any) -> None:
        try:
            self.gateway.audit.append("policy.reloaded", data, **extra)
        except GatewayError as exc:
            _log.error("the reload could not be audited: %s", exc.message)

    def readiness(self) -> dict[str, tuple[bool, str]]:
        """``GET /readyz``: each check's outcome and, when it failed, why (for the log): the engine answers,
        every policy's default images (each language's too) are present (both
        :class:`~gateway.service.readiness.EngineState`), the trail is writable and above its free-space watermark
        (:func:`~gateway.service.readiness.trail_check`). Blocking: call it in a worker thread."""
        images = sorted({image for compiled in self.gateway.policies for image in compiled.policy.default_images})
        checks = self.engine_state(images)  # remembered for a second: /readyz is open to anyone
        checks["audit"] = trail_check(self.gateway.audit)
        return checks

    def connection_refused(self, error: GatewayError, request_id: str) -> None:
        """A connection over ``max_connections`` (503) or with a head over ``max_header_bytes`` (431) was
        answered and closed (:mod:`gateway.service.deadlines`):
        counted in ``/metrics`` (endpoint ``connection``) and audited, summarised (``request.refused``)."""
        self.metrics.request("connection", http_status_for(error))
        self.refusals.note(error, principal=None, token_id=None, request_id=request_id, path=None)

    def close(self) -> None:
        """Cancel the runs still in flight (the grace is over) and wait for their sandboxes to be removed, write
        the last auth-failure summary and the stop record, then close the engine and the trail."""
        if self.inflight.cancel_all():
            self.inflight.wait_idle(timeout_s=60.0)
        try:
            self.refusals.stop()
            self.forbidden.stop()
            self.auth_failures.stop()
            if self._trail_meter is not None:
                self._trail_meter.stop()
        finally:
            try:
                self.gateway.close()
                if self.anchors is not None:
                    self.anchors.stop()  # after the stop record: the last anchor covers the whole run
            finally:
                for close in self._owned:
                    with contextlib.suppress(Exception):
                        close()


def _check_trail(sink: JsonlAuditTrail) -> None:
    """Refuse a trail whose end does not take the configured key (written without one, with another, or keyed
    while none is set) or is broken: raised here, before anything starts, rather than by the start record."""
    if not sink.directory.is_dir():
        return  # a new trail: its first record creates it
    try:
        read_tail(sink.directory, sink.key)
    except OSError as exc:
        raise AuditUnavailableError(f"cannot read the audit trail in {sink.directory}: {exc.strerror or exc}") from exc
    except AuditError as exc:
        why = exc.__cause__.message if isinstance(exc.__cause__, AuditError) else exc.message  # the integrity error
        raise AuditUnavailableError(
            f"the audit trail in {sink.directory} cannot be extended: {why}",
            hint="start with the key it was written with (GATEWAY_AUDIT_KEY_FILE or GATEWAY_AUDIT_KEY) or a new "
            "audit directory (--audit-dir); `gateway audit verify` locates a break",
        ) from exc


def policy_set(
    config: ServerConfig, principals: Principals, sink: AuditSink, *, last_good: PolicySet | None = None
) -> tuple[PolicySet, list[dict[str, str]]]:
    """``PolicySet.of(default, {name: policy}, strict=True)``, each file loaded once (strict: a principal not
    in the file is refused, never decided under the default); a policy that does not load is recorded as
    ``policy.rejected`` and its :class:`PolicyError` raised. With ``last_good`` (a reload), it leaves the policy
    it replaces in place instead (a principal that had none is left out: refused), so that token changes apply
    whatever the policy files hold; each such case is listed (``principal``, none for the default, and
    ``source``) beside the set."""
    loaded: dict[Path, Policy] = {}
    failed: dict[Path, PolicyError] = {}
    kept: list[dict[str, str]] = []

    def load(path: Path) -> Policy:
        if path in failed:
            raise failed[path]
        if path not in loaded:
            try:
                loaded[path] = load_policy(path)
            except PolicyError as exc:
                failed[path] = exc
                problems = [str(p) for p in exc.problems] or [exc.message]
                with contextlib.suppress(GatewayError):
                    sink.append("policy.rejected", {"source": str(path), "problems": problems})
                raise
        return loaded[path]

    def load_or_keep(path: Path, who: str | None, previous: CompiledPolicy | None) -> Policy | None:
        try:
            return load(path)
        except PolicyError:
            if last_good is None:
                raise
            kept.append({"principal": who, "source": str(path)} if who else {"source": str(path)})
            return previous.policy if previous is not None else None

    default_path = policy_path_from_env(config.policy)
    default = load_or_keep(default_path, None, last_good.default if last_good is not None else None)
    assert default is not None  # noqa: S101 - a reload always has the last good default to keep
    by_name: dict[str, Policy] = {}
    for principal in principals:
        previous = last_good.by_principal.get(principal.name) if last_good is not None else None
        policy = load_or_keep(principal.policy, principal.name, previous)
        if policy is not None:
            by_name[principal.name] = policy
    return PolicySet.of(default, by_name, strict=True), kept

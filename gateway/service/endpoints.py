"""The HTTP service's endpoints: module-level functions of a request, each reading its :class:`Service` from
the application (:meth:`Service.of`), and the decorators that make a ``/v1`` endpoint of a handler (:func:`v1`)
and count every endpoint's answers in ``GET /metrics`` (:func:`counted`).

A ``/v1`` handler gets the request, its authenticated :class:`~gateway.Caller` and a new request id; any
:class:`~gateway.errors.GatewayError` it raises is answered with its error body. A request the service refuses
before any work (a body it cannot take, a quota, a job its decision worker did not answer) is recorded as
``request.refused`` (:class:`~gateway.service.quotas.Refusals`). The ``mcp_*`` functions are the hooks of
``/mcp`` (:class:`~gateway.service.mcp_http.McpEndpoint`): the same bounds, quotas and error bodies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway import Caller, ExecutionResult
from gateway.audit.approvals import State
from gateway.errors import (
    ApprovalNotFoundError,
    AuthenticationError,
    BodiesInFlightError,
    DecisionWorkerError,
    GatewayError,
    MalformedRequestError,
    OverQuotaError,
    Problem,
    RequestError,
)
from gateway.policy import Policy
from gateway.service.auth import caller_of
from gateway.service.bodies import JSON_MEDIA_TYPE, BodyHold, read_json_body
from gateway.service.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.service.openapi import openapi_document
from gateway.service.operator import (
    NDJSON,
    audit_filters,
    audit_lines,
    is_operator,
    reload_answer,
    require_operator,
)
from gateway.service.principals import Quotas
from gateway.service.replies import Reply, error_reply, gateway_error_reply
from gateway.service.service import Service
from gateway.service.streaming import EventStreamExecution, Execute, execute_watched, wants_events
from gateway.sessions import SessionResult
from gateway.tool import tool_definitions

T = TypeVar("T")

__all__ = [
    "admit",
    "audit_records",
    "counted",
    "decisions",
    "executions",
    "healthz",
    "http_error",
    "mcp_admission",
    "mcp_body",
    "mcp_error",
    "metrics",
    "note_refused",
    "openapi",
    "policy",
    "policy_summary",
    "readyz",
    "session",
    "session_executions",
    "sessions",
    "tools",
    "tools_for",
    "unexpected",
    "v1",
]

_log = logging.getLogger("gateway.service")

Endpoint = Callable[[Request], Awaitable[Response]]
Handler = Callable[[Request, Caller, str], Awaitable[Response]]
"""A ``/v1`` handler: the request, its authenticated caller, its request id."""


# --- responses -----------------------------------------------------------------------------------------------


def new_request_id() -> str:
    return uuid.uuid4().hex


def respond(reply: Reply) -> JSONResponse:
    return JSONResponse(reply.body, status_code=reply.status, headers=reply.header_map())


def _json(status: int, body: dict[str, Any], request_id: str) -> JSONResponse:
    return respond(Reply(status, body, request_id))


def _error(
    status: int, code: str, message: str, request_id: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return respond(error_reply(status, code, message, request_id, headers=headers, **extra))


def error_response(exc: GatewayError, request_id: str, **extra: Any) -> JSONResponse:
    """The error body of ``exc`` (:func:`~gateway.service.replies.gateway_error_reply`)."""
    return respond(gateway_error_reply(exc, request_id, **extra))


def _denied(result: ExecutionResult, body: dict[str, Any]) -> JSONResponse:
    violations = body["violations"]
    policy = body["policy"]["name"] if body["policy"] else "?"
    message = f"denied by policy {policy}: {len(violations)} violation(s)"
    extra = {"violations": violations, "warnings": body["warnings"], "decision_id": body["decision_id"]}
    return _error(403, "policy.denied", message, result.request_id, policy=body["policy"], **extra)


def _execution_response(result: ExecutionResult) -> JSONResponse:
    body = result.to_dict()
    if result.error is not None:
        extra = {"result": body} if result.outcome is not None else {}
        return error_response(result.error, result.request_id, **extra)
    if result.pending:  # held for an operator's approval: the body carries approval_id; poll /v1/approvals/{id}
        return _json(202, body, result.request_id)
    if result.decision is not None and not result.decision.allowed:
        return _denied(result, body)
    return _json(200, body, result.request_id)


# --- decorators ----------------------------------------------------------------------------------------------


def v1(handler: Handler) -> Endpoint:
    """The endpoint of a ``/v1`` handler (and of ``/metrics``): a new request id, the caller its bearer token
    authenticated (:func:`~gateway.service.auth.caller_of`: 401 otherwise), any :class:`GatewayError` answered
    with its error body."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        request_id = new_request_id()
        try:
            return await handler(request, caller_of(request), request_id)
        except GatewayError as exc:
            return error_response(exc, request_id)

    return endpoint


def counted(name: str) -> Callable[[Endpoint], Endpoint]:
    """Count each answer of the endpoint in ``GET /metrics`` under ``name`` (its route's path) and status.
    Answers made outside an endpoint are counted by the exception handlers (``other``); ``/mcp``, an ASGI
    application, is not counted."""

    def decorate(endpoint: Endpoint) -> Endpoint:
        @functools.wraps(endpoint)
        async def counting(request: Request) -> Response:
            response = await endpoint(request)
            Service.of(request).metrics.request(name, response.status_code)
            return response

        return counting

    return decorate


# --- refusals before any work ------------------------------------------------------------------------------------


def note_refused(exc: GatewayError, request: Request, caller: Caller, request_id: str) -> None:
    """A request the service refuses before any work (a body it cannot take: 400, 408, 413, 415; over a quota:
    429; a job its decision worker did not answer: 503; a caller a reload removed or revoked while its request
    waited: 401), audited as ``request.refused``."""
    Service.of(request).refusals.note(
        exc, principal=caller.principal, token_id=caller.token_id, request_id=request_id, path=request.url.path
    )


async def _read_body(
    request: Request, caller: Caller, request_id: str, *, check_json: bool = True
) -> tuple[bytes, BodyHold]:
    """The JSON body and its hold of the service's body budget (release it once the request no longer holds
    the body); one it cannot take, or one the budget has no room for, is refused (:func:`note_refused`).
    ``check_json=False``: whether it is JSON is left to a decision worker (:func:`_checked`)."""
    service = Service.of(request)
    config = service.config

    def hold(size: int) -> BodyHold:
        return service.bodies.take(caller.principal, size)

    try:
        return await read_json_body(
            request, config.max_body_bytes, config.body_read_s, hold=hold, check_json=check_json
        )
    except (RequestError, OverQuotaError, BodiesInFlightError) as exc:
        note_refused(exc, request, caller, request_id)
        raise


async def _checked(job: Awaitable[T], request: Request, caller: Caller, request_id: str) -> T:
    """A decision worker's job on a body read with ``check_json=False``: a body it finds not JSON is refused
    (400, :func:`note_refused`), as :func:`_read_body` would have. A job its worker did not answer (it ended,
    or was killed for taking too long: the records it built for its batch went with it) is a 503, recorded
    the same way (``request.refused``, code ``service.decision_failed``), and so is a caller a reload removed or
    revoked while its job waited for its turn (401 ``auth.failed``)."""
    try:
        return await job
    except (MalformedRequestError, DecisionWorkerError, AuthenticationError) as exc:
        note_refused(exc, request, caller, request_id)
        raise


def admit(request: Request, caller: Caller, request_id: str, quotas: Quotas) -> Response | None:
    """Count the request against the caller's rpm (before its body is read); over it, or over the caller's
    trail byte budget, the 429."""
    service = Service.of(request)
    try:
        service.trail_budget.check(caller.principal)
        service.quota_gate.count_request(caller.principal, quotas)
    except OverQuotaError as exc:
        return _over_quota(exc, request, caller, request_id)
    return None


def _over_quota(exc: OverQuotaError, request: Request, caller: Caller, request_id: str) -> Response:
    note_refused(exc, request, caller, request_id)
    return error_response(exc, request_id, quota=exc.quota, retry_after_s=exc.retry_after_s)


# --- /v1 -------------------------------------------------------------------------------------------------------


@counted("/v1/executions")
@v1
async def executions(request: Request, caller: Caller, request_id: str) -> Response:
    service = Service.of(request)
    quotas = service.quotas_of(caller)
    if (over := admit(request, caller, request_id, quotas)) is not None:
        return over
    body, held = await _read_body(request, caller, request_id, check_json=False)
    streaming = False
    try:
        response = await _execute(request, caller, request_id, quotas=quotas, body=body, held=held)
        streaming = isinstance(response, EventStreamExecution)  # its stream releases the body when its run ends
        return response
    finally:
        if not streaming:
            held.release()


async def _execute(
    request: Request, caller: Caller, request_id: str, *, quotas: Quotas, body: bytes, held: BodyHold,
    run: Execute | None = None,
) -> Response:  # fmt: skip
    """An execution whose body was read: its intake, a slot, the run (``run``: :meth:`Service.execute`, or an
    execution in a session); ``held`` is released by a streamed response when its run ends (by the caller
    otherwise)."""
    service = Service.of(request)
    run = run or service.execute
    metrics, started = service.metrics, time.perf_counter()
    # Parsed and checked in a decision worker: this process parses only valid requests (bounded by the schema).
    invalid = await _checked(service.decisions.intake(body, caller), request, caller, request_id)
    if invalid is not None:
        metrics.execution_seconds.labels(str(invalid.status)).observe(time.perf_counter() - started)
        return Response(
            invalid.content, status_code=invalid.status, headers=invalid.headers, media_type=JSON_MEDIA_TYPE
        )
    admitted = service.quota_gate.execution(caller.principal, quotas, token_id=caller.token_id)
    try:
        await admitted.__aenter__()  # a slot of the principal and of the service, or 429
    except OverQuotaError as exc:
        return _over_quota(exc, request, caller, request_id)
    except AuthenticationError as exc:  # a reload removed or revoked the caller while it waited (refuse_waiting)
        note_refused(exc, request, caller, request_id)
        raise
    try:  # the caller may have gone while the body was read or the request waited
        service.refuse_gone(caller, request_id=request_id, path=request.url.path)
    except AuthenticationError:
        await admitted.__aexit__(None, None, None)
        raise
    metrics.running_executions.inc()
    if wants_events(request):
        # The stream runs after this handler returns: it holds the slot until its run has ended.
        async def run_ended() -> None:
            held.release()
            metrics.running_executions.dec()
            await admitted.__aexit__(None, None, None)

        return EventStreamExecution(
            run, body, caller, _execution_response, release=run_ended,
            stall_s=service.config.stream_stall_s,
        )  # fmt: skip
    try:
        result = await execute_watched(request, run, body, caller)
    finally:
        metrics.running_executions.dec()
        await admitted.__aexit__(None, None, None)
    response = _execution_response(result)
    metrics.execution_seconds.labels(str(response.status_code)).observe(time.perf_counter() - started)
    if result.error is None and result.decision is not None and not result.decision.allowed and not result.pending:
        metrics.denied(result.decision.to_dict()["violations"], dry_run=False)
    return response


# --- /v1/approvals ---------------------------------------------------------------------------------------------

_APPROVAL_STATES = ("pending", "granted", "denied", "used", "expired")


@counted("/v1/approvals")
@v1
async def approvals(request: Request, caller: Caller, request_id: str) -> Response:
    """Operators only: the approvals in ``?state=`` (default ``pending``; ``all`` for every one), each with the
    request it holds and the rules that asked."""
    service = Service.of(request)
    await run_in_threadpool(require_operator, service, caller, request.url.path, request_id)
    state = request.query_params.get("state", "pending")
    if state not in (*_APPROVAL_STATES, "all"):
        allowed = ", ".join((*_APPROVAL_STATES, "all"))
        problem = Problem(f"state {state!r} is not one of {allowed}", path="$.query.state")
        raise RequestError(f"unknown approval state {state!r}", problems=[problem])
    store = service.gateway.approvals
    found = store.list(state=None if state == "all" else cast(State, state))  # checked above
    now = store.clock()
    return _json(200, {"approvals": [a.to_dict(now) for a in found]}, request_id)


@counted("/v1/approvals/{approval_id}")
@v1
async def approval(request: Request, caller: Caller, request_id: str) -> Response:
    """One approval, for its requester (to poll it) or an operator; anyone else's id is ``approval.not_found``,
    like an unknown one."""
    service = Service.of(request)
    store = service.gateway.approvals
    approval_id = request.path_params["approval_id"]
    found = store.get(approval_id)
    if found.principal != caller.principal and not is_operator(service, caller):
        raise ApprovalNotFoundError(f"no approval {approval_id!r} of principal {caller.principal!r}")
    return _json(200, found.to_dict(store.clock()), request_id)


async def _verdict(request: Request, caller: Caller, request_id: str, *, approve: bool) -> Response:
    """Operators only: approve or deny a pending approval; the body is ``{"reason": ...}`` (approve: ``uses``,
    default 1; both: ``digest``, the request digest the operator checked). The approver is the caller."""
    service = Service.of(request)
    await run_in_threadpool(require_operator, service, caller, request.url.path, request_id)
    body, held = await _read_body(request, caller, request_id)
    try:
        doc = json.loads(body)
    finally:
        held.release()
    reason, uses, digest = _verdict_fields(doc, approve=approve)
    store = service.gateway.approvals
    approval_id = request.path_params["approval_id"]
    if approve:
        decided = await run_in_threadpool(
            functools.partial(store.grant, approval_id, approver=caller.principal, reason=reason, uses=uses,
                              digest=digest)
        )  # fmt: skip
    else:
        decided = await run_in_threadpool(
            functools.partial(store.deny, approval_id, approver=caller.principal, reason=reason, digest=digest)
        )
    return _json(200, decided.to_dict(store.clock()), request_id)


def _verdict_fields(doc: Any, *, approve: bool) -> tuple[str, int, str | None]:
    """``reason`` (a non-empty string), ``uses`` (approve only: an integer from 1, default 1) and ``digest`` (64
    hex) of a verdict's body; every problem at once as a 422."""
    problems: list[Problem] = []
    if not isinstance(doc, dict):
        raise RequestError("the body must be a JSON object", problems=[Problem("expected an object", path="$")])
    known = {"reason", "digest", *(("uses",) if approve else ())}
    problems.extend(Problem(f"unknown field {k!r}", path=f"$.{k}") for k in sorted(set(doc) - known))
    reason = doc.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        problems.append(Problem("reason is required: a non-empty string saying why", path="$.reason"))
    uses = doc.get("uses", 1)
    if not isinstance(uses, int) or isinstance(uses, bool) or not 1 <= uses <= 1000:
        problems.append(Problem("uses must be an integer from 1 to 1000", path="$.uses"))
    digest = doc.get("digest")
    if digest is not None and (not isinstance(digest, str) or re.fullmatch(r"[0-9a-f]{64}", digest) is None):
        problems.append(Problem("digest must be 64 lower-case hex digits (sha256)", path="$.digest"))
    if problems:
        raise RequestError("invalid approval verdict", problems=problems)
    return str(reason), int(uses), digest


@counted("/v1/approvals/{approval_id}/approve")
@v1
async def approve(request: Request, caller: Caller, request_id: str) -> Response:
    return await _verdict(request, caller, request_id, approve=True)


@counted("/v1/approvals/{approval_id}/deny")
@v1
async def deny(request: Request, caller: Caller, request_id: str) -> Response:
    return await _verdict(request, caller, request_id, approve=False)


# --- /v1/sessions ----------------------------------------------------------------------------------------------


def _session_created(result: SessionResult) -> JSONResponse:
    """``POST /v1/sessions``' answer: 201 with the session, 403 ``policy.denied`` with every violation (the
    ``sessions.*`` rules' and the profile's), or the error's body (422 invalid, 501 a mode this backend lacks,
    503 ...)."""
    body = result.to_dict()
    if result.error is not None:
        return error_response(result.error, result.request_id)
    if result.decision is not None and not result.decision.allowed:
        message = f"denied by policy {body['policy']['name']}: {len(body['violations'])} violation(s)"
        extra = {"violations": body["violations"], "warnings": body["warnings"], "decision_id": body["decision_id"]}
        return _error(403, "policy.denied", message, result.request_id, policy=body["policy"], **extra)
    return _json(201, body, result.request_id)


@counted("/v1/sessions")
async def sessions(request: Request) -> Response:
    """``GET /v1/sessions`` and ``POST /v1/sessions`` share one path (and so one route)."""
    if request.method == "POST":
        return await _sessions_create(request)
    return await _sessions_list(request)


@v1
async def _sessions_create(request: Request, caller: Caller, request_id: str) -> Response:
    """Create a session: counted against the caller's rpm like an execution; the body checked by a decision
    worker as JSON of at most MESSAGE_MAX_VALUES values (as /mcp's), then parsed, decided and opened by the
    session manager in a worker thread (its ``request.invalid`` or ``policy.decision`` and ``session.created``
    records name the caller). A kernel session's container takes a host slot for as long as it lives, not an
    execution slot: its executions take those."""
    service = Service.of(request)
    if (over := admit(request, caller, request_id, service.quotas_of(caller))) is not None:
        return over
    body, held = await _read_body(request, caller, request_id, check_json=False)
    try:
        await _checked(service.decisions.message(body, caller), request, caller, request_id)
        service.refuse_gone(caller, request_id=request_id, path=request.url.path)
        result = await run_in_threadpool(service.gateway.sessions.create, body, caller=caller)
    finally:
        held.release()
    return _session_created(result)


@v1
async def _sessions_list(request: Request, caller: Caller, request_id: str) -> Response:
    """The caller's live sessions; ``?all=true``: every principal's, for operators only (403 otherwise)."""
    service = Service.of(request)
    every = _all_parameter(request)
    if every:
        await run_in_threadpool(require_operator, service, caller, request.url.path, request_id)
    found = service.gateway.sessions.list(principal=caller.principal, operator=every)
    return _json(200, {"sessions": [info.to_dict() for info in found]}, request_id)


def _all_parameter(request: Request) -> bool:
    """``GET /v1/sessions``' one query parameter, ``all`` (``true`` or ``false``); anything else is a 422."""
    params = request.query_params
    problems = [
        Problem("unknown parameter; the only one is all (true or false)", path=f"$.query.{name}")
        for name in sorted(set(params.keys()) - {"all"})
    ]
    values = params.getlist("all")
    if len(values) > 1 or (values and values[0] not in ("true", "false")):
        problems.append(Problem("all is true or false, given once", path="$.query.all"))
    if problems:
        raise RequestError(f"{len(problems)} invalid query parameter(s) of {request.url.path}", problems=problems)
    return values == ["true"]


@counted("/v1/sessions/{session_id}")
@v1
async def session(request: Request, caller: Caller, request_id: str) -> Response:
    """``GET`` a session of the caller (an operator: any); ``DELETE`` closes it (its sandbox is gone when the 204
    is sent). Another principal's id is the 404 of an unknown one; an ended one, 410."""
    service = Service.of(request)
    session_id = request.path_params["session_id"]
    manager, operator = service.gateway.sessions, is_operator(service, caller)
    if request.method == "DELETE":  # blocking: close removes the sandbox
        await run_in_threadpool(manager.close, session_id, principal=caller.principal, operator=operator)
        return Response(status_code=204, headers={"X-Request-Id": request_id})
    info = await run_in_threadpool(manager.get, session_id, principal=caller.principal, operator=operator)
    return _json(200, info.to_dict(), request_id)


@counted("/v1/sessions/{session_id}/executions")
@v1
async def session_executions(request: Request, caller: Caller, request_id: str) -> Response:
    """An execution in the caller's session, exactly as ``POST /v1/executions``: rpm, the body's bounds, its
    intake in a decision worker (the same execution request schema), an execution slot of the principal and of
    the service, the run in a worker thread (server-sent events with ``Accept: text/event-stream``), and its
    answer (plus ``session_id`` and, for a kernel cell, ``value``). The session's own errors: 404
    ``session.not_found`` (unknown, or another principal's), 410 ``session.gone``, 409 ``session.busy`` (one
    runs already: executions of a session are refused, not queued)."""
    service = Service.of(request)
    quotas = service.quotas_of(caller)
    if (over := admit(request, caller, request_id, quotas)) is not None:
        return over
    session_id = request.path_params["session_id"]
    body, held = await _read_body(request, caller, request_id, check_json=False)
    run = functools.partial(service.execute_in_session, session_id)
    streaming = False
    try:
        response = await _execute(request, caller, request_id, quotas=quotas, body=body, held=held, run=run)
        streaming = isinstance(response, EventStreamExecution)
        return response
    finally:
        if not streaming:
            held.release()


@counted("/v1/decisions")
@v1
async def decisions(request: Request, caller: Caller, request_id: str) -> Response:
    service = Service.of(request)
    if (over := admit(request, caller, request_id, service.quotas_of(caller))) is not None:
        return over
    body, held = await _read_body(request, caller, request_id, check_json=False)  # a worker parses it
    try:
        service.refuse_gone(caller, request_id=request_id, path=request.url.path)  # gone while the body was read?
        started = time.perf_counter()
        answer = await _checked(service.decisions.decide(body, caller), request, caller, request_id)
    finally:
        held.release()
    service.metrics.decision_seconds.labels(str(answer.status)).observe(time.perf_counter() - started)
    if answer.violations is not None:
        service.metrics.denied(answer.violations, dry_run=True)
    return Response(answer.content, status_code=answer.status, headers=answer.headers, media_type=JSON_MEDIA_TYPE)


@counted("/v1/policy")
@v1
async def policy(request: Request, caller: Caller, request_id: str) -> Response:
    compiled = Service.of(request).gateway.policies.for_principal(caller.principal)
    return _json(200, {"principal": caller.principal, **policy_summary(compiled.policy)}, request_id)


@counted("/v1/tools")
@v1
async def tools(request: Request, caller: Caller, request_id: str) -> Response:
    compiled = Service.of(request).gateway.policies.for_principal(caller.principal)
    return _json(200, {"tools": tools_for(compiled.policy)}, request_id)


@counted("/v1/audit/records")
@v1
async def audit_records(request: Request, caller: Caller, request_id: str) -> Response:
    service = Service.of(request)
    await run_in_threadpool(require_operator, service, caller, request.url.path, request_id)
    lines = audit_lines(service, audit_filters(request.query_params))
    return StreamingResponse(lines, media_type=NDJSON, headers={"X-Request-Id": request_id})


@counted("/v1/reload")
@v1
async def reload(request: Request, caller: Caller, request_id: str) -> Response:
    service = Service.of(request)
    await run_in_threadpool(require_operator, service, caller, request.url.path, request_id)
    return _json(200, await run_in_threadpool(reload_answer, service), request_id)


@counted("/metrics")
@v1
async def metrics(request: Request, caller: Caller, request_id: str) -> Response:
    service = Service.of(request)
    await run_in_threadpool(require_operator, service, caller, request.url.path, request_id)
    headers = {"X-Request-Id": request_id}
    return Response(service.metrics.render(), media_type=METRICS_CONTENT_TYPE, headers=headers)


# --- open endpoints --------------------------------------------------------------------------------------------


@counted("/healthz")
async def healthz(request: Request) -> Response:
    return _json(200, {"status": "ok"}, new_request_id())


@counted("/readyz")
async def readyz(request: Request) -> Response:
    request_id = new_request_id()
    service = Service.of(request)
    if service.draining:  # SIGTERM: out of rotation while everything is still served (gateway serve's drain_s)
        message = "draining: the server is stopping and still serves what it gets; send new requests elsewhere"
        return _error(503, "service.draining", message, request_id)
    checks = await run_in_threadpool(service.readiness)
    if all(ok for ok, _ in checks.values()):
        return _json(200, {"status": "ready", "checks": dict.fromkeys(checks, "ok")}, request_id)
    for name, (ok, why) in checks.items():
        if not ok:
            _log.warning("not ready: %s: %s", name, why)
    failed = sorted(name for name, (ok, _) in checks.items() if not ok)
    shown = {name: "ok" if ok else "failed" for name, (ok, _) in checks.items()}
    message = f"not ready: {', '.join(failed)} failed (details in the server log)"
    return _error(503, "service.not_ready", message, request_id, checks=shown)


@counted("/openapi.json")
async def openapi(request: Request) -> Response:
    document = openapi_document(mcp_sessions=Service.of(request).config.mcp.session is not None)
    return _json(200, document, new_request_id())


# --- /mcp's hooks ----------------------------------------------------------------------------------------------


async def mcp_body(request: Request, caller: Caller) -> tuple[bytes, BodyHold]:
    """An MCP message's body: read with the /v1 bounds, then checked by a decision worker (JSON, at most
    MESSAGE_MAX_VALUES values) before the SDK parses it in this event loop; and its hold of the body budget,
    which the endpoint releases when the request ends."""
    request_id = new_request_id()
    body, held = await _read_body(request, caller, request_id, check_json=False)
    try:
        await _checked(Service.of(request).decisions.message(body, caller), request, caller, request_id)
    except BaseException:
        held.release()
        raise
    return body, held


@contextlib.asynccontextmanager
async def mcp_admission(request: Request, caller: Caller) -> AsyncIterator[None]:
    """A tool call over /mcp counts against the caller's rpm and holds one of its execution slots, exactly
    like ``POST /v1/executions``; a refusal is recorded the same way and answered as a tool error."""
    service = Service.of(request)
    quotas = service.quotas_of(caller)
    try:
        service.trail_budget.check(caller.principal)
        service.quota_gate.count_request(caller.principal, quotas)
        async with service.quota_gate.execution(caller.principal, quotas, token_id=caller.token_id):
            yield
    except (OverQuotaError, AuthenticationError) as exc:  # 401: a reload removed or revoked it while it waited
        service.refusals.note(
            exc, principal=caller.principal, token_id=caller.token_id, request_id=new_request_id(), path="/mcp"
        )
        raise


def mcp_error(exc: GatewayError) -> Response:
    """The answer to an /mcp request refused before the MCP layer saw it (401, a body it cannot take)."""
    return error_response(exc, new_request_id())


# --- exception handlers ----------------------------------------------------------------------------------------


async def http_error(request: Request, exc: Exception) -> Response:
    """A path or method no route takes (404, 405): the error body, counted as ``other``."""
    assert isinstance(exc, HTTPException)  # noqa: S101 - registered for HTTPException only
    code = {404: "http.not_found", 405: "http.method_not_allowed"}.get(exc.status_code, "http.error")
    Service.of(request).metrics.request("other", exc.status_code)
    return _error(exc.status_code, code, str(exc.detail), new_request_id(), headers=dict(exc.headers or {}))


async def unexpected(request: Request, exc: Exception) -> Response:
    """Any other exception: logged with its traceback, answered with a plain 500 body (never the traceback)."""
    request_id = new_request_id()
    _log.error("request %s failed unexpectedly", request_id, exc_info=exc)
    Service.of(request).metrics.request("other", 500)
    return _error(500, "gateway.internal", "the server failed unexpectedly; see its log", request_id)


# --- what the read-only endpoints say ------------------------------------------------------------------------


def policy_summary(policy: Policy) -> dict[str, Any]:
    """``GET /v1/policy``: the policy's name and sha256, what a request gets when it asks for nothing
    (defaults) and the most it may ask for (ceilings)."""
    limits = {f.name: getattr(policy.limits, f.name) for f in dataclasses.fields(policy.limits)}
    return {
        "policy": {"name": policy.name, "sha256": policy.sha256},
        "defaults": {
            "language": policy.languages.default,
            "image": policy.images.default,
            "network": policy.network.default,
            "runtime": policy.runtime.default,
            "limits": {name: limit.default for name, limit in limits.items() if hasattr(limit, "default")},
        },
        "ceilings": {
            "languages": list(policy.languages.allowed),
            "networks": list(policy.network.allowed),
            "runtimes": list(policy.runtime.allowed),
            "limits": {name: limit.max for name, limit in limits.items() if hasattr(limit, "max")},
        },
    }


def tools_for(policy: Policy) -> list[dict[str, Any]]:
    """The tools of a caller under ``policy`` (:func:`gateway.tool.tool_definitions`: one per language it allows,
    its timeout ceiling as each schema's maximum, its ceilings in each description so that the model does not
    ask for more), each saying which ``POST /v1/executions`` body it stands for."""
    tools = tool_definitions(policy)
    for tool, language in zip(tools, policy.languages.allowed, strict=True):
        packages = ', "packages": packages' if "packages" in tool["function"]["parameters"]["properties"] else ""
        tool["function"]["description"] += (
            f' Call it through POST /v1/executions with {{"code": code, "language": "{language}", '
            f'"limits": {{"timeout_s": timeout}}{packages}}}.'
        )
    return tools

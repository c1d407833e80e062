"""The HTTP service: a Starlette application in front of one :class:`Gateway`.

Every ``/v1`` call carries ``Authorization: Bearer <token>``; the token's principal *is* the request's
principal (:class:`gateway.Caller`): its policy decides, and every audit record of the request names the
principal (``principal``) and the token's public id (``data.caller.token_id``), never the token. A body that
names another ``principal`` is refused with 403 ``auth.principal_mismatch``: a token speaks only for its own
principal, and a silent re-attribution would hide a confused or hostile client.

Bodies are bounded before they are parsed: the media type first (only ``application/json``, 415), then
``Content-Length`` against ``max_body_bytes`` before reading and the running total while reading a chunked
body (413), the whole body within ``body_read_s`` (408 ``request.timeout``), then JSON (400
``request.malformed``); each such refusal is audited (``request.refused``, summarised per principal and code).
The Gateway's own intake does the rest (422 with every JSON path). ``/mcp`` bodies get the same bounds.
Quotas (:mod:`gateway.service.quotas`): each ``POST`` counts against the principal's requests per
minute before its body is read; an execution, once read, takes a slot of the principal and of the service's
global bound before the Gateway sees it, waiting in the principal's bounded queue if it must; over either,
429 ``service.over_quota`` with ``Retry-After``.
Executions run in a worker thread, so the event loop keeps answering while sandboxes run; the
policy's deadline bounds every run whatever the client does. Every error body is ``{"code", "message",
"request_id"}`` (+ ``violations`` / ``errors``), statuses from :func:`gateway.errors.http_status_for`; an
unexpected exception is logged with its traceback and answered with a plain 500 body, never the traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, request_response

from gateway import Caller, ExecutionResult
from gateway.errors import (
    AuthenticationError,
    BodyTimeoutError,
    BodyTooLargeError,
    DecisionWorkerError,
    GatewayError,
    MalformedRequestError,
    OverQuotaError,
    RequestError,
    UnsupportedMediaTypeError,
)
from gateway.policy import Policy
from gateway.service.authlog import FailureReason, presented_token_id
from gateway.service.mcp_http import McpEndpoint
from gateway.service.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from gateway.service.openapi import openapi_document
from gateway.service.operator import NDJSON, audit_filters, audit_lines, require_operator
from gateway.service.principals import Quotas
from gateway.service.replies import Reply, check_json_body, error_reply, gateway_error_reply
from gateway.service.service import Service
from gateway.service.streaming import EventStreamExecution, execute_watched, wants_events
from gateway.tool import tool_definition

T = TypeVar("T")

__all__ = ["build_app"]

_log = logging.getLogger("gateway.service")
JSON_MEDIA_TYPE = "application/json"


# --- responses -----------------------------------------------------------------------------------------


def _new_request_id() -> str:
    return uuid.uuid4().hex


def _json(status: int, body: dict[str, Any], request_id: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return _respond(Reply(status, body, request_id, headers or {}))


def _respond(reply: Reply) -> JSONResponse:
    return JSONResponse(reply.body, status_code=reply.status, headers=reply.header_map())


def _error(
    status: int, code: str, message: str, request_id: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return _respond(error_reply(status, code, message, request_id, headers=headers, **extra))


def _gateway_error(exc: GatewayError, request_id: str, **extra: Any) -> JSONResponse:
    return _respond(gateway_error_reply(exc, request_id, **extra))


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
        return _gateway_error(result.error, result.request_id, **extra)
    if result.decision is not None and not result.decision.allowed:
        return _denied(result, body)
    return _json(200, body, result.request_id)


# --- the request's body ----------------------------------------------------------------------------------


def _media_type(header: str | None) -> tuple[str, dict[str, str]]:
    """``type/subtype`` (lowercase) and the parameters of a Content-Type header (RFC 9110 media-type)."""
    if not header:
        return "", {}
    kind, *params = header.split(";")
    parsed: dict[str, str] = {}
    for param in params:
        name, sep, value = param.strip().partition("=")
        if sep:
            parsed[name.strip().lower()] = value.strip().strip('"')
    return kind.strip().lower(), parsed


async def _read_json_body(request: Request, limit: int, deadline_s: float, *, check_json: bool = True) -> bytes:
    """The body, checked for media type, size, arrival within ``deadline_s`` and JSON; the Gateway's intake
    validates it."""
    kind, params = _media_type(request.headers.get("content-type"))
    if kind != JSON_MEDIA_TYPE:
        got = repr(kind) if kind else "no Content-Type"
        raise UnsupportedMediaTypeError(f"the body must be {JSON_MEDIA_TYPE}; got {got}")
    charset = params.get("charset", "utf-8").lower()
    if charset not in ("utf-8", "utf8"):
        raise UnsupportedMediaTypeError(f"the body must be UTF-8 JSON; got charset {charset!r}")
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise MalformedRequestError(f"Content-Length {declared!r} is not a number of bytes")
        if int(declared) > limit:
            raise BodyTooLargeError(f"the body is {int(declared)} bytes; this server accepts at most {limit}")
    body = bytearray()
    try:
        with anyio.fail_after(deadline_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise BodyTooLargeError(f"the body is more than {limit} bytes, the most this server accepts")
    except TimeoutError:
        raise BodyTimeoutError(
            f"the body did not arrive within {deadline_s:g} s ({len(body)} bytes received)"
        ) from None
    data = bytes(body)
    if check_json:
        check_json_body(data)
    return data


# --- the application ---------------------------------------------------------------------------------------

Handler = Callable[[Request, Caller, str], Awaitable[Response]]


def build_app(service: Service) -> Starlette:
    """The Starlette application serving ``service``; its lifespan starts and closes the service."""
    gateway = service.gateway

    async def authenticate(request: Request) -> Caller:
        header = request.headers.get("authorization")
        reason: FailureReason
        token = ""
        if header is None:
            reason = "missing"
        else:
            scheme, _, token = header.strip().partition(" ")
            token = token.strip()
            reason = "malformed" if scheme.lower() != "bearer" or not token else "unknown"
        if reason == "unknown":
            found = service.principals.authenticate(token)
            if found is not None:
                return Caller(found[0].name, found[1])
            if presented_token_id(token) is None:
                reason = "malformed"
        client = request.client.host if request.client is not None else None
        token_id = presented_token_id(token) if token else None
        await run_in_threadpool(
            service.auth_failures.note, reason, token_id=token_id, client=client, path=request.url.path
        )
        raise AuthenticationError(
            "no bearer token" if reason == "missing" else "the bearer token is not valid (unknown, rotated or revoked)"
        )

    @contextlib.asynccontextmanager
    async def mcp_admission(caller: Caller) -> AsyncIterator[None]:
        """A tool call over /mcp counts against the caller's rpm and holds one of its execution slots, exactly
        like ``POST /v1/executions``; a refusal is recorded the same way and answered as a tool error."""
        quotas = service.quotas_of(caller)
        try:
            service.admission.count_request(caller.principal, quotas)
            async with service.admission.execution(caller.principal, quotas):
                yield
        except OverQuotaError as exc:
            service.refusals.note(
                exc, principal=caller.principal, token_id=caller.token_id, request_id=_new_request_id(), path="/mcp"
            )
            raise

    def note_refused(exc: GatewayError, request: Request, caller: Caller, request_id: str) -> None:
        """A request the service refuses before any work (a body it cannot take: 400, 408, 413, 415; over a quota:
        429; a job its decision worker did not answer: 503), audited as ``request.refused``."""
        service.refusals.note(
            exc, principal=caller.principal, token_id=caller.token_id, request_id=request_id, path=request.url.path
        )

    async def read_body(request: Request, caller: Caller, request_id: str, *, check_json: bool = True) -> bytes:
        """The JSON body; one it cannot take is refused (:func:`note_refused`). ``check_json=False``: whether it
        is JSON is left to a decision worker (:func:`checked`)."""
        try:
            return await _read_json_body(
                request, service.config.max_body_bytes, service.config.body_read_s, check_json=check_json
            )
        except RequestError as exc:
            note_refused(exc, request, caller, request_id)
            raise

    async def checked(job: Awaitable[T], request: Request, caller: Caller, request_id: str) -> T:
        """A decision worker's job on a body read with ``check_json=False``: a body it finds not JSON is refused
        (400, :func:`note_refused`), as :func:`read_body` would have. A job its worker did not answer (it ended,
        or was killed for taking too long: the records it built for its batch went with it) is a 503, recorded
        the same way (``request.refused``, code ``service.decision_failed``)."""
        try:
            return await job
        except (MalformedRequestError, DecisionWorkerError) as exc:
            note_refused(exc, request, caller, request_id)
            raise

    async def mcp_body(request: Request, caller: Caller) -> bytes:
        """An MCP message's body: read with the /v1 bounds, then checked by a decision worker (JSON, at most
        MESSAGE_MAX_VALUES values) before the SDK parses it in this event loop."""
        request_id = _new_request_id()
        body = await read_body(request, caller, request_id, check_json=False)
        await checked(service.decisions.message(body, caller), request, caller, request_id)
        return body

    mcp = McpEndpoint(
        gateway,
        authenticate=authenticate,
        read_body=mcp_body,
        error=lambda exc: _gateway_error(exc, _new_request_id()),
        admit=mcp_admission,
    )

    def v1(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            request_id = _new_request_id()
            try:
                caller = await authenticate(request)
                return await handler(request, caller, request_id)
            except GatewayError as exc:
                return _gateway_error(exc, request_id)

        return endpoint

    def counted(
        name: str, handler: Callable[[Request], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            response = await handler(request)
            service.metrics.request(name, response.status_code)
            return response

        return endpoint

    def count_denial(result: ExecutionResult, *, dry_run: bool) -> None:
        if result.error is None and result.decision is not None and not result.decision.allowed:
            service.metrics.denied(result.decision.to_dict()["violations"], dry_run=dry_run)

    async def executions(request: Request, caller: Caller, request_id: str) -> Response:
        quotas = service.quotas_of(caller)
        if (over := admit(request, caller, request_id, quotas)) is not None:
            return over
        body = await read_body(request, caller, request_id, check_json=False)
        metrics, started = service.metrics, time.perf_counter()
        # Parsed and checked in a decision worker: this process parses only valid requests (bounded by the schema).
        invalid = await checked(service.decisions.intake(body, caller), request, caller, request_id)
        if invalid is not None:
            metrics.execution_seconds.labels(str(invalid.status)).observe(time.perf_counter() - started)
            return Response(
                invalid.content, status_code=invalid.status, headers=invalid.headers, media_type=JSON_MEDIA_TYPE
            )
        admitted = service.admission.execution(caller.principal, quotas)
        try:
            await admitted.__aenter__()  # a slot of the principal and of the service, or 429
        except OverQuotaError as exc:
            return refused(exc, request, caller, request_id)
        metrics.running_executions.inc()
        if wants_events(request):
            # The stream runs after this handler returns: it holds the slot until its run has ended.
            async def run_ended() -> None:
                metrics.running_executions.dec()
                await admitted.__aexit__(None, None, None)

            return EventStreamExecution(
                service.execute, body, caller, _execution_response, release=run_ended,
                stall_s=service.config.stream_stall_s,
            )  # fmt: skip
        try:
            result = await execute_watched(request, service.execute, body, caller)
        finally:
            metrics.running_executions.dec()
            await admitted.__aexit__(None, None, None)
        response = _execution_response(result)
        metrics.execution_seconds.labels(str(response.status_code)).observe(time.perf_counter() - started)
        count_denial(result, dry_run=False)
        return response

    async def decisions(request: Request, caller: Caller, request_id: str) -> Response:
        if (over := admit(request, caller, request_id, service.quotas_of(caller))) is not None:
            return over
        body = await read_body(request, caller, request_id, check_json=False)  # a worker parses it
        started = time.perf_counter()
        answer = await checked(service.decisions.decide(body, caller), request, caller, request_id)
        service.metrics.decision_seconds.labels(str(answer.status)).observe(time.perf_counter() - started)
        if answer.violations is not None:
            service.metrics.denied(answer.violations, dry_run=True)
        return Response(answer.content, status_code=answer.status, headers=answer.headers, media_type=JSON_MEDIA_TYPE)

    async def metrics(request: Request, caller: Caller, request_id: str) -> Response:
        await run_in_threadpool(require_operator, service, caller, request.url.path, request_id)
        headers = {"X-Request-Id": request_id}
        return Response(service.metrics.render(), media_type=METRICS_CONTENT_TYPE, headers=headers)

    async def audit_records(request: Request, caller: Caller, request_id: str) -> Response:
        await run_in_threadpool(require_operator, service, caller, request.url.path, request_id)
        lines = audit_lines(service, audit_filters(request.query_params))
        return StreamingResponse(lines, media_type=NDJSON, headers={"X-Request-Id": request_id})

    def admit(request: Request, caller: Caller, request_id: str, quotas: Quotas) -> Response | None:
        """Count the request against the caller's rpm (before its body is read); over it, the 429."""
        try:
            service.admission.count_request(caller.principal, quotas)
        except OverQuotaError as exc:
            return refused(exc, request, caller, request_id)
        return None

    def refused(exc: OverQuotaError, request: Request, caller: Caller, request_id: str) -> Response:
        note_refused(exc, request, caller, request_id)
        return _gateway_error(exc, request_id, quota=exc.quota, retry_after_s=exc.retry_after_s)

    async def policy(request: Request, caller: Caller, request_id: str) -> Response:
        compiled = gateway.policies.for_principal(caller.principal)
        return _json(200, {"principal": caller.principal, **policy_summary(compiled.policy)}, request_id)

    async def tools(request: Request, caller: Caller, request_id: str) -> Response:
        compiled = gateway.policies.for_principal(caller.principal)
        return _json(200, {"tools": [tool_for(compiled.policy)]}, request_id)

    async def healthz(request: Request) -> Response:
        request_id = _new_request_id()
        return _json(200, {"status": "ok"}, request_id)

    async def readyz(request: Request) -> Response:
        request_id = _new_request_id()
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

    async def openapi(request: Request) -> Response:
        return _json(200, openapi_document(), _new_request_id())

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)  # noqa: S101 - registered for HTTPException only
        code = {404: "http.not_found", 405: "http.method_not_allowed"}.get(exc.status_code, "http.error")
        service.metrics.request("other", exc.status_code)
        return _error(exc.status_code, code, str(exc.detail), _new_request_id(), headers=dict(exc.headers or {}))

    async def unexpected(request: Request, exc: Exception) -> Response:
        request_id = _new_request_id()
        _log.error("request %s failed unexpectedly", request_id, exc_info=exc)
        service.metrics.request("other", 500)
        return _error(500, "gateway.internal", "the server failed unexpectedly; see its log", request_id)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await run_in_threadpool(service.start)
        _on_sighup(service)
        try:
            await service.decisions.start()
            async with mcp.run():
                yield
        finally:
            try:
                await service.decisions.close()
            finally:
                await run_in_threadpool(service.close)

    routes = [
        Route("/v1/executions", v1(executions), methods=["POST"]),
        Route("/v1/decisions", v1(decisions), methods=["POST"]),
        Route("/v1/policy", v1(policy), methods=["GET"]),
        Route("/v1/tools", v1(tools), methods=["GET"]),
        Route("/v1/audit/records", v1(audit_records), methods=["GET"]),
        Route("/metrics", v1(metrics), methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        # POST only: the stateless transport has no server-to-client stream (GET) and no sessions (DELETE); the
        # SDK would answer a GET with an event stream that never ends. Anything else is the 405 error body.
        Route("/mcp", mcp, methods=["POST"]),
    ]
    for route in routes:  # requests by endpoint and outcome (GET /metrics); /mcp is an ASGI app, not counted
        if route.endpoint is not mcp:
            route.app = request_response(counted(route.path, route.endpoint))
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error, Exception: unexpected},
    )


def _on_sighup(service: Service) -> None:
    """Reload on SIGHUP (in a worker thread, so the event loop keeps serving); only in the main thread."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGHUP"):
        return
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, lambda: loop.run_in_executor(None, service.reload))


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


def tool_for(policy: Policy) -> dict[str, Any]:
    """The ``execute_python`` definition for a caller under ``policy``: its timeout ceiling as the schema's
    maximum, and its ceilings stated in the description so that the model does not ask for more."""
    definition = tool_definition(float(policy.limits.timeout_s.max))
    limits = policy.limits
    function = definition["function"]
    function["description"] += (
        f" Limits of this caller (policy {policy.name}): at most {limits.timeout_s.max} s wall clock "
        f"(default {limits.timeout_s.default} s), {limits.memory.max} bytes of memory, {limits.cpus.max} CPUs, "
        f"{limits.output_bytes.max} bytes of output per stream; network {'/'.join(policy.network.allowed)}."
        f' Call it through POST /v1/executions with {{"code": code, "limits": {{"timeout_s": timeout}}}}.'
    )
    return definition

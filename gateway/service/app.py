"""The HTTP service: a Starlette application in front of one :class:`~gateway.service.service.Service`; its
routes, their middleware and the lifespan. The endpoints are :mod:`gateway.service.endpoints`.

Every ``/v1`` call carries ``Authorization: Bearer <token>``; the token's principal *is* the request's principal
(:class:`gateway.Caller`, found by :mod:`gateway.service.auth`): its policy decides, and every audit record of
the request names the principal (``principal``) and the token's public id (``data.caller.token_id``), never the
token. A body that names another ``principal`` is refused with 403 ``auth.principal_mismatch``: a token speaks
only for its own principal, and a silent re-attribution would hide a confused or hostile client.

Bodies are bounded before they are parsed (:mod:`gateway.service.bodies`): the media type first
(``application/json``; a session file's upload ``application/octet-stream``, :mod:`.session_files`; 415), then
``Content-Length`` against ``max_body_bytes`` before reading and the running total while reading a chunked body
(413), the whole body within ``body_read_s`` (408 ``request.timeout``), then
JSON (400 ``request.malformed``); each such refusal is audited (``request.refused``, summarised per principal
and code). The Gateway's own intake does the rest (422 with every JSON path). ``/mcp`` bodies get the same
bounds. Quotas (:mod:`gateway.service.quotas`): each ``POST`` counts against the principal's requests per minute
before its body is read; an execution, once read, takes a slot of the principal and of the service's global
bound before the Gateway sees it, waiting in the principal's bounded queue if it must; over either, 429
``service.over_quota`` with ``Retry-After``. Executions run in a worker thread, so the event loop keeps
answering while sandboxes run; the policy's deadline bounds every run whatever the client does. Every error body
is ``{"code", "message", "request_id"}`` (+ ``violations`` / ``errors``), statuses from
:func:`gateway.errors.http_status_for`; an unexpected exception is logged with its traceback and answered with a
plain 500 body, never the traceback. A client that leaves before its body has arrived is no failure of the
service: counted (status 499, nginx's "client closed request") and logged in one line. A request still in flight
when a stop's grace is over is cancelled by uvicorn and answered 503 ``service.stopping`` (uvicorn itself would
answer a bare text 500). A path with a trailing slash is a 404: Starlette's redirect would build its Location
from the client's ``Host`` header.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import Caller
from gateway.errors import GatewayError, ServiceStoppingError
from gateway.service import endpoints, session_files
from gateway.service.auth import BearerTokens
from gateway.service.mcp_http import McpEndpoint
from gateway.service.replies import gateway_error_reply, render_json
from gateway.service.service import Service

__all__ = ["CLIENT_CLOSED_REQUEST", "build_app"]

_log = logging.getLogger("gateway.service")

CLIENT_CLOSED_REQUEST = 499
"""The status a client that left before its request was read is counted with (nginx's convention)."""


def build_app(service: Service) -> Starlette:
    """The Starlette application serving ``service`` (``app.state.service``); its lifespan starts and closes
    the service. Routes that need a bearer token have :class:`~gateway.service.auth.BearerTokens`; the others
    are open."""
    bearer = [Middleware(AuthenticationMiddleware, backend=BearerTokens())]
    mcp = McpEndpoint(
        service.gateway, read_body=endpoints.mcp_body, admit=endpoints.mcp_admission, error=endpoints.mcp_error,
        settings=service.config.mcp, refused=functools.partial(_mcp_refused, service),
        still_valid=lambda caller: service.refusal_of(caller.principal, caller.token_id) is None,
    )  # fmt: skip
    service.on_reload.append(mcp.end_revoked)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with service.running(), mcp.run():
            yield

    routes = [
        Route("/v1/executions", endpoints.executions, methods=["POST"], middleware=bearer),
        Route("/v1/decisions", endpoints.decisions, methods=["POST"], middleware=bearer),
        Route("/v1/sessions", endpoints.sessions, methods=["GET", "POST"], middleware=bearer),
        Route("/v1/sessions/{session_id}", endpoints.session, methods=["GET", "DELETE"], middleware=bearer),
        Route(
            "/v1/sessions/{session_id}/executions", endpoints.session_executions, methods=["POST"], middleware=bearer
        ),
        Route("/v1/policy", endpoints.policy, methods=["GET"], middleware=bearer),
        Route("/v1/tools", endpoints.tools, methods=["GET"], middleware=bearer),
        Route("/v1/audit/records", endpoints.audit_records, methods=["GET"], middleware=bearer),
        Route("/v1/reload", endpoints.reload, methods=["POST"], middleware=bearer),
        Route("/v1/approvals", endpoints.approvals, methods=["GET"], middleware=bearer),
        Route("/v1/approvals/{approval_id}", endpoints.approval, methods=["GET"], middleware=bearer),
        Route("/v1/approvals/{approval_id}/approve", endpoints.approve, methods=["POST"], middleware=bearer),
        Route("/v1/approvals/{approval_id}/deny", endpoints.deny, methods=["POST"], middleware=bearer),
        Route("/metrics", endpoints.metrics, methods=["GET"], middleware=bearer),
        Route("/v1/sessions/{session_id}/files", session_files.list_files, methods=["GET"], middleware=bearer),
        Route(
            "/v1/sessions/{session_id}/files/{path:path}", session_files.put_file, methods=["PUT"], middleware=bearer
        ),
        Route(
            "/v1/sessions/{session_id}/files/{path:path}", session_files.get_file, methods=["GET"], middleware=bearer
        ),
        Route("/healthz", endpoints.healthz, methods=["GET"]),
        Route("/readyz", endpoints.readyz, methods=["GET"]),
        Route("/openapi.json", endpoints.openapi, methods=["GET"]),
        # POST, and DELETE when MCP sessions are kept (mcp.session): never GET, which the SDK would answer with an
        # event stream that never ends (and that keeps its session from going idle). Else the 405 error body.
        Route("/mcp", mcp, methods=mcp.methods, middleware=bearer),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(_AnswerWhenCancelled)],
        lifespan=lifespan,
        exception_handlers={
            HTTPException: endpoints.http_error, ClientDisconnect: _client_gone, Exception: endpoints.unexpected,
        },
    )  # fmt: skip
    app.router.redirect_slashes = False  # its redirect's Location would be built from the client's Host header
    app.state.service = service
    return app


def _mcp_refused(service: Service, error: GatewayError, caller: Caller) -> None:
    """An ``initialize`` over the MCP session bounds, in the ``request.refused`` summaries like every refusal."""
    service.refusals.note(
        error, principal=caller.principal, token_id=caller.token_id, request_id=uuid.uuid4().hex, path="/mcp"
    )


async def _client_gone(request: Request, exc: Exception) -> Response:
    """A client that left while its body was read: counted, logged in one line, answered to no one."""
    _log.info("%s %s: the client left before its body had arrived", request.method, request.url.path)
    Service.of(request).metrics.request("other", CLIENT_CLOSED_REQUEST)
    return Response(status_code=CLIENT_CLOSED_REQUEST)


class _AnswerWhenCancelled:
    """Answers 503 ``service.stopping`` for a request uvicorn cancels at the end of a stop's grace, before its
    answer began; the cancellation ends there (the request's task ends with it), so uvicorn neither logs a
    traceback nor answers its bare text 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if started:
                raise
            error = ServiceStoppingError("the service stopped and its grace for requests in flight was over")
            reply = gateway_error_reply(error, uuid.uuid4().hex)
            response = Response(
                render_json(reply.body), reply.status, headers=reply.header_map(), media_type="application/json"
            )
            await response(scope, receive, send)

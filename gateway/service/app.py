"""The HTTP service: a Starlette application in front of one :class:`~gateway.service.service.Service`; its
routes, their middleware and the lifespan. The endpoints are :mod:`gateway.service.endpoints`.

Every ``/v1`` call carries ``Authorization: Bearer <token>``; the token's principal *is* the request's principal
(:class:`gateway.Caller`, found by :mod:`gateway.service.auth`): its policy decides, and every audit record of
the request names the principal (``principal``) and the token's public id (``data.caller.token_id``), never the
token. A body that names another ``principal`` is refused with 403 ``auth.principal_mismatch``: a token speaks
only for its own principal, and a silent re-attribution would hide a confused or hostile client.

Bodies are bounded before they are parsed (:mod:`gateway.service.bodies`): the media type first (only
``application/json``, 415), then ``Content-Length`` against ``max_body_bytes`` before reading and the running
total while reading a chunked body (413), the whole body within ``body_read_s`` (408 ``request.timeout``), then
JSON (400 ``request.malformed``); each such refusal is audited (``request.refused``, summarised per principal
and code). The Gateway's own intake does the rest (422 with every JSON path). ``/mcp`` bodies get the same
bounds. Quotas (:mod:`gateway.service.quotas`): each ``POST`` counts against the principal's requests per minute
before its body is read; an execution, once read, takes a slot of the principal and of the service's global
bound before the Gateway sees it, waiting in the principal's bounded queue if it must; over either, 429
``service.over_quota`` with ``Retry-After``. Executions run in a worker thread, so the event loop keeps
answering while sandboxes run; the policy's deadline bounds every run whatever the client does. Every error body
is ``{"code", "message", "request_id"}`` (+ ``violations`` / ``errors``), statuses from
:func:`gateway.errors.http_status_for`; an unexpected exception is logged with its traceback and answered with a
plain 500 body, never the traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route

from gateway.service import endpoints
from gateway.service.auth import BearerTokens
from gateway.service.mcp_http import McpEndpoint
from gateway.service.service import Service

__all__ = ["build_app"]


def build_app(service: Service) -> Starlette:
    """The Starlette application serving ``service`` (``app.state.service``); its lifespan starts and closes
    the service. Routes that need a bearer token have :class:`~gateway.service.auth.BearerTokens`; the others
    are open."""
    bearer = [Middleware(AuthenticationMiddleware, backend=BearerTokens())]
    mcp = McpEndpoint(
        service.gateway, read_body=endpoints.mcp_body, admit=endpoints.mcp_admission, error=endpoints.mcp_error
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with service.running(), mcp.run():
            yield

    routes = [
        Route("/v1/executions", endpoints.executions, methods=["POST"], middleware=bearer),
        Route("/v1/decisions", endpoints.decisions, methods=["POST"], middleware=bearer),
        Route("/v1/policy", endpoints.policy, methods=["GET"], middleware=bearer),
        Route("/v1/tools", endpoints.tools, methods=["GET"], middleware=bearer),
        Route("/v1/audit/records", endpoints.audit_records, methods=["GET"], middleware=bearer),
        Route("/metrics", endpoints.metrics, methods=["GET"], middleware=bearer),
        Route("/healthz", endpoints.healthz, methods=["GET"]),
        Route("/readyz", endpoints.readyz, methods=["GET"]),
        Route("/openapi.json", endpoints.openapi, methods=["GET"]),
        # POST only: the stateless transport has no server-to-client stream (GET) and no sessions (DELETE); the
        # SDK would answer a GET with an event stream that never ends. Anything else is the 405 error body.
        Route("/mcp", mcp, methods=["POST"], middleware=bearer),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: endpoints.http_error, Exception: endpoints.unexpected},
    )
    app.state.service = service
    return app

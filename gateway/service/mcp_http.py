"""``/mcp``: the ``execute_python`` tool over MCP's streamable HTTP transport, inside ``gateway serve``.

The same server as ``gateway mcp`` (:func:`gateway.service.mcp.build_server`, one tool definition, one
handler), but each HTTP request is its caller's: the endpoint authenticates the bearer token exactly like a
``/v1`` call (401 with the error body and ``WWW-Authenticate`` before the MCP layer sees anything, failures in
the ``auth.failed`` summaries), its body is read with the same bounds (``max_body_bytes``, ``body_read_s``,
JSON; refusals audited as ``request.refused``) before the SDK sees it, and the tool's calls run through the
service's Gateway with that :class:`~gateway.Caller`, so they are decided under the principal's own policy,
pass the same checks (quotas included) and are audited with the principal and its token id. ``tools/list``
states the caller's ceilings.

The transport runs stateless (the SDK's ``StreamableHTTPSessionManager(stateless=True)``): every POST carries
its token and is authenticated on its own; no session outlives a request, so a rotated or revoked token stops
working at once. A call whose HTTP request goes away cancels its run (the sandbox is killed and removed,
``gateway.cancelled``), as in the stdio server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from mcp.server import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from gateway import Caller, Gateway
from gateway.errors import GatewayError
from gateway.service.mcp import build_server
from gateway.tool import ToolHandler

__all__ = ["CALLER_STATE", "McpEndpoint"]

CALLER_STATE = "gateway_caller"
"""The key of the authenticated caller in the request's state (``scope["state"]``)."""

Authenticate = Callable[[Request], Awaitable[Caller]]
ReadBody = Callable[[Request, Caller], Awaitable[bytes]]
ErrorResponse = Callable[[GatewayError], Response]


def _caller(ctx: ServerRequestContext[Any]) -> Caller:
    """The authenticated caller of one MCP request (set by :meth:`McpEndpoint.__call__`)."""
    request = ctx.request
    caller = getattr(request.state, CALLER_STATE, None) if isinstance(request, Request) else None
    if not isinstance(caller, Caller):  # cannot happen behind __call__; refuse rather than run unattributed
        raise GatewayError("an MCP request reached the tool without an authenticated caller")
    return caller


class McpEndpoint:
    """The ASGI application at ``/mcp``; :meth:`run` is its part of the application's lifespan."""

    def __init__(
        self, gateway: Gateway, *, authenticate: Authenticate, read_body: ReadBody, error: ErrorResponse,
        admit: Callable[[Caller], AbstractAsyncContextManager[None]] | None = None,
    ) -> None:  # fmt: skip
        self._authenticate = authenticate
        self._read_body = read_body
        self._error = error

        def handler_for(ctx: ServerRequestContext[Any]) -> ToolHandler:
            return ToolHandler(gateway, caller=_caller(ctx))

        server = build_server(
            handler_for,
            admit=(lambda ctx: admit(_caller(ctx))) if admit is not None else None,
            max_concurrent=None,
            instructions="Runs Python in a hardened single-use sandbox as the principal of your bearer token.",
        )
        self._manager = StreamableHTTPSessionManager(server, stateless=True)

    def run(self) -> AbstractAsyncContextManager[None]:
        return self._manager.run()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            caller = await self._authenticate(request)
            # Read here, bounded like every /v1 body (size, deadline, JSON): the SDK would read any size.
            body = await self._read_body(request, caller)
        except GatewayError as exc:
            await self._error(exc)(scope, receive, send)
            return
        scope.setdefault("state", {})[CALLER_STATE] = caller
        await self._manager.handle_request(scope, _replay(body, receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands over the already read ``body`` once, then waits on the client's (for its
    disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed

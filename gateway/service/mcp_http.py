"""``/mcp``: the ``execute_python`` tool over MCP's streamable HTTP transport, inside ``gateway serve``.

The same server as ``gateway mcp`` (:func:`gateway.service.mcp.build_server`, one tool definition, one handler),
but each HTTP request is its caller's: the route authenticates the bearer token exactly like a ``/v1`` call
(:mod:`gateway.service.auth`; 401 with the error body and ``WWW-Authenticate`` before the MCP layer sees
anything, failures in the ``auth.failed`` summaries), its body is read with the same bounds (``max_body_bytes``,
``body_read_s``, JSON, the body budget until the request ends; refusals audited as ``request.refused``) before the
SDK sees it, and the tool's calls run through the service's Gateway with that :class:`~gateway.Caller`, so they
are decided under the principal's own policy, pass the same checks (quotas included) and are audited with the
principal and its token id.
``tools/list`` states the caller's ceilings.

The transport runs stateless (the SDK's ``StreamableHTTPSessionManager(stateless=True)``): every POST carries
its token and is authenticated on its own; no session outlives a request, so a rotated or revoked token stops
working at once. A call whose HTTP request goes away cancels its run (the sandbox is killed and removed,
``gateway.cancelled``), as in the stdio server.

No gateway session lives here (``gateway mcp --session`` is stdio only): with no MCP session there is nothing to
hang one on. Keeping state would take the SDK's stateful transport, an MCP session id bound to the principal and
token that opened it (another token's request with that id: the 404 of an unknown one), a tool handler with its
gateway session per MCP session, closed on ``DELETE``, on the principal's revocation and on expiry, and tests of
isolation between MCP sessions and between principals. Until then an HTTP client keeps state through
``/v1/sessions``.
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
from gateway.service.auth import caller_of
from gateway.service.bodies import BodyHold
from gateway.service.mcp import build_server
from gateway.tool import ToolHandler

__all__ = ["McpEndpoint"]

ReadBody = Callable[[Request, Caller], Awaitable[tuple[bytes, BodyHold]]]
"""The body, read and checked, and its hold of the service's body budget (released when the request ends)."""
Admit = Callable[[Request, Caller], AbstractAsyncContextManager[None]]
ErrorResponse = Callable[[GatewayError], Response]


def _request(ctx: ServerRequestContext[Any]) -> Request:
    """The HTTP request of one MCP request (the SDK's, over the scope :meth:`McpEndpoint.__call__` handed on)."""
    if not isinstance(ctx.request, Request):  # cannot happen over HTTP; refuse rather than run unattributed
        raise GatewayError("an MCP request reached the tool without its HTTP request")
    return ctx.request


class McpEndpoint:
    """The ASGI application at ``/mcp`` (behind :class:`~gateway.service.auth.BearerTokens`); :meth:`run` is its
    part of the application's lifespan."""

    def __init__(self, gateway: Gateway, *, read_body: ReadBody, admit: Admit, error: ErrorResponse) -> None:
        self._read_body = read_body
        self._error = error

        def handler_for(ctx: ServerRequestContext[Any]) -> ToolHandler:
            return ToolHandler(gateway, caller=caller_of(_request(ctx)))

        def admit_call(ctx: ServerRequestContext[Any]) -> AbstractAsyncContextManager[None]:
            request = _request(ctx)
            return admit(request, caller_of(request))

        server = build_server(
            handler_for,
            admit=admit_call,
            max_concurrent=None,
            instructions="Runs Python in a hardened single-use sandbox as the principal of your bearer token.",
        )
        self._manager = StreamableHTTPSessionManager(server, stateless=True)

    def run(self) -> AbstractAsyncContextManager[None]:
        return self._manager.run()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            caller = caller_of(request)  # 401 for a token that did not authenticate
            # Read here, bounded like every /v1 body (size, deadline, JSON): the SDK would read any size.
            body, held = await self._read_body(request, caller)
        except GatewayError as exc:
            await self._error(exc)(scope, receive, send)
            return
        try:  # the SDK holds the message until the request ends (a tool call: its run, its wait for a slot)
            await self._manager.handle_request(scope, _replay(body, receive), send)
        finally:
            held.release()


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands over the already read ``body`` once, then waits on the client's (for its
    disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed

"""``/mcp``: the LLM tools (one per language the caller's policy allows) over MCP's streamable HTTP transport,
inside ``gateway serve``: stateless by default; with ``mcp.session`` (server config), one MCP session per
client, each with its own gateway session, so that a model's consecutive ``execute_python`` calls share state.

The same server as ``gateway mcp`` (:func:`gateway.service.mcp.build_server`, one tool definition, one handler),
but each HTTP request is its caller's: the route authenticates the bearer token exactly like a ``/v1`` call
(:mod:`gateway.service.auth`; 401 with the error body and ``WWW-Authenticate`` before the MCP layer sees
anything, failures in the ``auth.failed`` summaries), its body is read with the same bounds (``max_body_bytes``,
``body_read_s``, JSON, the body budget until the request ends; refusals audited as ``request.refused``) before the
SDK sees it, and the tool's calls run through the service's Gateway with that :class:`~gateway.Caller`, so they
are decided under the principal's own policy, pass the same checks (quotas included) and are audited with the
principal and its token id.
``tools/list`` offers the tools of the caller's policy (``execute_python``, and ``execute_shell`` /
``execute_javascript`` where it allows those languages), each stating the caller's ceilings. A call whose HTTP
request goes away cancels its run (the sandbox is killed and removed, ``gateway.cancelled``), as in the stdio
server.

Stateless (the default): the SDK's ``StreamableHTTPSessionManager(stateless=True)``; no MCP session outlives a
request and each call starts from nothing. An HTTP client keeps state through ``/v1/sessions`` instead.

Stateful (``mcp: {session: kernel|workspace}``): the SDK's stateful transport. An ``initialize`` opens an MCP
session (its id in the ``Mcp-Session-Id`` answer header) that belongs to the caller that sent it: its principal
*and* its token id. Every later request is still authenticated on its own (a revoked token stops at once, 401),
then must come from that same caller: another principal's token with the id, and also another token of the same
principal, gets the 404 of an unknown id, word for word (an id is no credential, and one token's session stays
attributed to that token in the trail). Each MCP session has its own :class:`~gateway.tool.ToolHandler` with
``session=<mode>``: its gateway session opens at the first tool call, under the principal's policy (a policy that
allows no such session answers that call with the denial and its rule ids, ``sessions.enabled``), and is closed
(``session.closed``) when the MCP session ends: on the client's ``DELETE``, after ``mcp.idle_s`` without a
request, when a reload removes the principal or revokes the token (:meth:`McpEndpoint.end_revoked`), and when
the service stops. Live MCP sessions are bounded, in all (``mcp.max_sessions``) and per principal
(``mcp.max_sessions_per_principal``): one more ``initialize`` is refused with 429 ``service.over_quota`` (quota
``mcp_sessions``), audited as ``request.refused``. ``GET`` (the server-to-client stream) stays 405: the tool sends
nothing unasked, and an open stream would keep a session from ever going idle.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
from mcp.server import ServerRequestContext
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import INVALID_REQUEST, ErrorData, JSONRPCError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from gateway import Caller, Gateway
from gateway.errors import GatewayError, MalformedRequestError, OverQuotaError
from gateway.service.auth import caller_of
from gateway.service.bodies import BodyHold
from gateway.service.config import McpSettings
from gateway.service.mcp import build_server
from gateway.tool import ToolHandler

__all__ = ["McpEndpoint"]

_log = logging.getLogger("gateway.service")

ReadBody = Callable[[Request, Caller], Awaitable[tuple[bytes, BodyHold]]]
"""The body, read and checked, and its hold of the service's body budget (released when the request ends)."""
Admit = Callable[[Request, Caller], AbstractAsyncContextManager[None]]
ErrorResponse = Callable[[GatewayError], Response]
Refused = Callable[[GatewayError, Caller], None]
"""Records a refusal of the endpoint's own (the MCP session bounds) as ``request.refused``; blocking."""
StillValid = Callable[[Caller], bool]
"""Whether a caller's principal and token still exist (after a reload)."""


def _request(ctx: ServerRequestContext[Any]) -> Request:
    """The HTTP request of one MCP request (the SDK's, over the scope :meth:`McpEndpoint.__call__` handed on)."""
    if not isinstance(ctx.request, Request):  # cannot happen over HTTP; refuse rather than run unattributed
        raise GatewayError("an MCP request reached the tool without its HTTP request")
    return ctx.request


@dataclass(eq=False)
class _McpSession:
    """One MCP session of the stateful transport: whose it is, its tool handler (and so its gateway session)."""

    caller: Caller
    handler: ToolHandler
    session_id: str | None = None
    """Set when the SDK's answer to the ``initialize`` carries it."""
    last_seen: float = 0.0
    in_flight: int = 0


def _unknown_session() -> Response:
    """What the SDK answers for an unknown or expired ``Mcp-Session-Id`` (the same status, media type and body)."""
    body = JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=INVALID_REQUEST, message="Session not found"))
    return Response(
        body.model_dump_json(by_alias=True, exclude_unset=True), status_code=404, media_type="application/json"
    )


class McpEndpoint:
    """The ASGI application at ``/mcp`` (behind :class:`~gateway.service.auth.BearerTokens`); :meth:`run` is its
    part of the application's lifespan."""

    def __init__(
        self,
        gateway: Gateway,
        *,
        read_body: ReadBody,
        admit: Admit,
        error: ErrorResponse,
        settings: McpSettings = McpSettings(),  # noqa: B008 - frozen
        refused: Refused | None = None,
        still_valid: StillValid | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._gateway = gateway
        self._read_body = read_body
        self._error = error
        self._settings = settings
        self._refused = refused
        self._still_valid = still_valid
        self._clock = clock
        self._live: dict[str, _McpSession] = {}
        """The stateful transport's MCP sessions by id, from the answer that gave the id to their end."""
        self._opening: set[_McpSession] = set()
        """Sessions whose ``initialize`` is being answered (counted against the bounds already)."""
        self._tasks: anyio.abc.TaskGroup | None = None
        mode = settings.session

        def handler_for(ctx: ServerRequestContext[Any]) -> ToolHandler:
            request = _request(ctx)
            if mode is None:
                return ToolHandler(gateway, caller=caller_of(request))
            live = self._live.get(request.headers.get(MCP_SESSION_ID_HEADER, ""))
            if live is None:  # __call__ let only a live session's own caller through; it ended meanwhile
                raise GatewayError("the MCP session ended while this request was on its way; open a new one")
            return live.handler

        def admit_call(ctx: ServerRequestContext[Any]) -> AbstractAsyncContextManager[None]:
            request = _request(ctx)
            return admit(request, caller_of(request))

        server = build_server(
            handler_for,
            admit=admit_call,
            max_concurrent=None,
            instructions="Runs code (one tool per language your policy allows) in a hardened single-use sandbox as "
            "the principal of your bearer token."
            if mode is None
            else f"Runs code as the principal of your bearer token; Python in one persistent {mode} session per MCP "
            "session: state is kept between the execute_python calls of this MCP session.",
        )
        self._manager = (
            StreamableHTTPSessionManager(server, stateless=True)
            if mode is None
            else StreamableHTTPSessionManager(
                server,
                # A backstop: the endpoint ends idle sessions itself (closing their gateway sessions) first.
                session_idle_timeout=2 * settings.idle_s,
                max_sessions=settings.max_sessions,
            )
        )

    @property
    def methods(self) -> list[str]:
        """The HTTP methods the route takes: ``POST``, and ``DELETE`` (end an MCP session) when stateful."""
        return ["POST"] if self._settings.session is None else ["POST", "DELETE"]

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The SDK's session manager, and (stateful) the sweep of idle MCP sessions; at the end, every MCP
        session's gateway session is closed."""
        try:
            async with self._manager.run(), anyio.create_task_group() as tasks:
                self._tasks = tasks
                if self._settings.session is not None:
                    tasks.start_soon(self._sweep)
                try:
                    yield
                finally:
                    self._tasks = None
                    tasks.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as closing:  # side by side: each removes a sandbox
                    for live in [*self._live.values()]:
                        closing.start_soon(self._close, live)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        opening: _McpSession | None = None
        try:
            caller = caller_of(request)  # 401 for a token that did not authenticate
        except GatewayError as exc:
            await self._error(exc)(scope, receive, send)
            return
        session_id = request.headers.get(MCP_SESSION_ID_HEADER) if self._settings.session else None
        live = self._live.get(session_id) if session_id is not None else None
        if session_id is not None and (live is None or live.caller != caller):
            await _unknown_session()(scope, receive, send)  # unknown, ended, or another caller's
            return
        if request.method == "DELETE":  # the route takes DELETE only when stateful
            await self._delete(live, scope, receive, send)
            return
        try:
            # Read here, bounded like every /v1 body (size, deadline, JSON): the SDK would read any size.
            body, held = await self._read_body(request, caller)
        except GatewayError as exc:
            await self._error(exc)(scope, receive, send)
            return
        if self._settings.session is not None and session_id is None:
            try:
                opening = self._open(caller)
            except OverQuotaError as exc:
                held.release()
                if self._refused is not None:
                    await anyio.to_thread.run_sync(self._refused, exc, caller)
                await self._error(exc)(scope, receive, send)
                return
        if live is not None:
            live.in_flight += 1
        try:  # the SDK holds the message until the request ends (a tool call: its run, its wait for a slot)
            answer = send if opening is None else self._binding(opening, send)
            await self._manager.handle_request(scope, _replay(body, receive), answer)
        finally:
            held.release()
            if opening is not None:
                self._opening.discard(opening)
            if live is not None:
                live.in_flight -= 1
                live.last_seen = self._clock()

    async def _delete(self, live: _McpSession | None, scope: Scope, receive: Receive, send: Send) -> None:
        """The client ends its MCP session: the SDK's answer is held until the gateway session is closed too, so
        that when the client has it, the trail has ``session.closed``."""
        if live is None:
            refusal = MalformedRequestError(
                "DELETE /mcp without an Mcp-Session-Id header: name the MCP session to end (the id its initialize "
                "answer gave)"
            )
            await self._error(refusal)(scope, receive, send)
            return
        held: list[Message] = []

        async def hold(message: Message) -> None:
            held.append(message)

        await self._manager.handle_request(scope, receive, hold)
        await self._end(live)
        for message in held:
            await send(message)

    # -- the MCP sessions (stateful) ----------------------------------------------------------------------

    def _open(self, caller: Caller) -> _McpSession:
        """Count a new MCP session against the bounds (:class:`OverQuotaError` past one) and hold its place while
        its ``initialize`` is answered."""
        sessions = [*self._live.values(), *self._opening]
        mine = sum(1 for s in sessions if s.caller.principal == caller.principal)
        settings = self._settings
        retry = int(min(settings.idle_s, 60))
        end_one = (
            f"end one (DELETE /mcp with its Mcp-Session-Id) or wait until one has been idle for {settings.idle_s:g} s"
        )
        if mine >= settings.max_sessions_per_principal:
            raise OverQuotaError(
                f"principal {caller.principal!r} holds {mine} live MCP sessions, the most one principal may "
                f"(mcp.max_sessions_per_principal); no MCP session was opened: {end_one}",
                retry_after_s=retry, quota="mcp_sessions",
            )  # fmt: skip
        if len(sessions) >= settings.max_sessions:
            raise OverQuotaError(
                f"the service holds {len(sessions)} live MCP sessions, its bound (mcp.max_sessions); no MCP session "
                f"was opened: {end_one}, or ask the operator for a larger mcp.max_sessions",
                retry_after_s=retry, quota="mcp_sessions",
            )  # fmt: skip
        handler = ToolHandler(self._gateway, caller=caller, session=settings.session)
        opening = _McpSession(caller, handler, last_seen=self._clock())
        self._opening.add(opening)
        return opening

    def _binding(self, opening: _McpSession, send: Send) -> Send:
        """``send`` for the request that opens ``opening``: an answer that gives the client a session id makes
        the session live under that id before the client can use it."""

        async def bound(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:  # as the SDK keeps a session
                session_id = Headers(raw=message["headers"]).get(MCP_SESSION_ID_HEADER)
                if session_id is not None:
                    opening.session_id = session_id
                    self._live[session_id] = opening
            await send(message)

        return bound

    async def _end(self, live: _McpSession) -> None:
        """End an MCP session: its id answers 404 from now on, the SDK's transport is terminated (a call still in
        flight is cancelled, its sandbox removed), then its gateway session is closed (``session.closed``)."""
        if live.session_id is None or self._live.get(live.session_id) is not live:
            return  # already ended
        del self._live[live.session_id]
        delete = {
            "type": "http", "method": "DELETE", "path": "/mcp", "raw_path": b"/mcp", "query_string": b"",
            "headers": [(MCP_SESSION_ID_HEADER.encode(), live.session_id.encode())], "http_version": "1.1",
            "scheme": "http", "root_path": "", "server": None, "client": None,
        }  # fmt: skip

        async def nothing_more() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def discard(message: Message) -> None:
            pass

        with anyio.CancelScope(shield=True):
            with contextlib.suppress(RuntimeError):  # the manager has stopped: its transports are gone already
                await self._manager.handle_request(delete, nothing_more, discard)  # 404 if the client ended it
            await self._close(live)

    async def _close(self, live: _McpSession) -> None:
        self._live.pop(live.session_id or "", None)
        try:
            await anyio.to_thread.run_sync(live.handler.close)
        except GatewayError as exc:
            _log.warning("MCP session %s: its gateway session could not be closed: %s", live.session_id, exc.message)

    async def _sweep(self) -> None:
        """End the MCP sessions that have had no request in flight for ``mcp.idle_s``."""
        idle_s = self._settings.idle_s
        while True:
            await anyio.sleep(min(idle_s / 2, 5.0))
            for live in self.idle():
                await self._end(live)

    def idle(self) -> list[_McpSession]:
        """The live MCP sessions past ``mcp.idle_s`` without a request in flight (the clock's time)."""
        now = self._clock()
        idle_s = self._settings.idle_s
        return [s for s in self._live.values() if not s.in_flight and now - s.last_seen >= idle_s]

    def end_revoked(self) -> None:
        """After a reload (on the event loop): end the MCP sessions whose principal was removed or whose token
        was revoked."""
        if self._tasks is None or self._still_valid is None:
            return
        for live in [*self._live.values()]:
            if not self._still_valid(live.caller):
                _log.info("MCP session %s: principal %s or its token is gone; ending it", live.session_id,
                          live.caller.principal)  # fmt: skip
                self._tasks.start_soon(self._end, live)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands over the already read ``body`` once, then waits on the client's (for its
    disconnect)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed

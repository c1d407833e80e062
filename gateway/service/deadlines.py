"""A deadline for each request's head (request line and headers), and a bound on open connections, which
uvicorn does not have.

uvicorn bounds the idle time *between* requests (``timeout_keep_alive``), but that timer is reset by every
byte received and is not armed at all on a fresh connection: a client that connects and sends nothing, or
trickles its headers a byte at a time, holds a connection (and a file descriptor) for as long as it likes
(uvicorn issue #157). Starlette sees a request only once its head is complete, so no middleware can help.

:func:`http_protocol` returns uvicorn's httptools protocol with one timer more: armed when a connection opens
and again when a response has been sent on a kept-alive connection, disarmed when a request's head is
complete. When it fires, the connection is closed and the event logged (there is no principal to audit yet:
the ``Authorization`` header itself may not have arrived). The body has its own deadline (``body_read_s``,
:mod:`gateway.service.bodies`); a running request is never cut by this one.

The same protocol bounds the connections the service holds at once (``max_connections``): uvicorn has no such
bound (its ``limit_concurrency`` answers a plain-text 503, not the gateway's error body), so a client opening
connections faster than the head deadline closes them could use up the file descriptors that the audit trail,
the engine connections and the workers need. A connection beyond the bound is answered 503
``service.too_many_connections`` with ``Retry-After`` and closed before anything of it is read, and reported to
``on_refused`` (the service audits it, summarised: :class:`gateway.service.quotas.Refusals`).

It also bounds each request's head (``max_header_bytes``): neither uvicorn nor httptools has such a bound, and
httptools keeps a header however long it grows (a 64 MB header was read and held). The bytes received while a
head is incomplete are counted; a head that passes the bound is answered 431 ``request.header_too_large`` and
closed, without the parser seeing more than the bound, and reported to ``on_refused`` like a refused connection.

Connections still without a complete request head (fresh ones, and ones dribbling a head) have their own,
smaller bound (``max_headless_connections``, :class:`Headless`): a client holding idle connections would
otherwise fill ``max_connections`` and every new client would get 503 (4,096 idle connections got 71-87 of 92
authenticated requests refused). One more than the bound makes the *oldest* of them give way (closed without an
answer: it has sent no request), so a new client always gets in and an attacker holds at most the bound. A
connection that has sent a whole head is never closed for this (between requests on a kept-alive connection it
has the head deadline only).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from gateway.errors import GatewayError, HeadTooLargeError, ServerConfigError, TooManyConnectionsError
from gateway.service.config import DEFAULT_MAX_HEADER_BYTES
from gateway.service.replies import gateway_error_reply, render_json

__all__ = [
    "Headless", "default_max_connections", "default_max_headless_connections", "http_protocol", "refusal_response",
]  # fmt: skip

_log = logging.getLogger("gateway.service")

RETRY_AFTER_S = 1
"""The ``Retry-After`` of a connection refused for the bound: connections come and go within seconds."""
EVICTION_LOG_S = 10.0
"""Connections closed to make room for newer ones are logged at most once per this many seconds, counted."""


def default_max_connections() -> int:
    """A quarter of this process's file descriptors (its soft ``RLIMIT_NOFILE``), between 64 and 4096: the
    other three quarters stay for the trail, the engine, the workers and the sandboxes' streams."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(64, min(4096, soft // 4))


def default_max_headless_connections(max_connections: int) -> int:
    """A quarter of ``max_connections``: a real client's connection is without a head for milliseconds, and
    the other three quarters stay for requests under way."""
    return max(1, max_connections // 4)


class Headless:
    """The connections of one server still without a complete request head, oldest first, at most ``bound``:
    :meth:`add` past the bound closes the oldest (``close`` of each is called once), and the closing is logged,
    counted, at most once per :data:`EVICTION_LOG_S` of ``clock``."""

    def __init__(self, bound: int, clock: Callable[[], float]) -> None:
        self.bound = bound
        self._clock = clock
        self._waiting: dict[object, Callable[[], None]] = {}  # insertion order: oldest first
        self._closed_unlogged = 0
        self._logged_at: float | None = None

    def add(self, connection: object, close: Callable[[], None]) -> None:
        """``connection`` waits for a head; past the bound the oldest waiting one is closed."""
        self._waiting[connection] = close
        while len(self._waiting) > self.bound:
            oldest = next(iter(self._waiting))
            self._waiting.pop(oldest)()
            self._closed_unlogged += 1
        if self._closed_unlogged:
            self._log()

    def discard(self, connection: object) -> None:
        """``connection`` has sent a whole head, or is gone."""
        self._waiting.pop(connection, None)

    def _log(self) -> None:
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < EVICTION_LOG_S:
            return
        _log.warning(
            "closed %d connection(s) without a complete request head to make room for newer ones: more than "
            "max_headless_connections (%d) were open at once; a client may be holding connections idle",
            self._closed_unlogged, self.bound,
        )  # fmt: skip
        self._closed_unlogged = 0
        self._logged_at = now


def refusal_response(error: GatewayError, request_id: str) -> bytes:
    """The whole HTTP/1.1 answer to a connection refused before its request was read: ``error``'s body, closed
    (and ``Retry-After`` for a connection beyond the bound, which may come back shortly)."""
    reply = gateway_error_reply(error, request_id)
    body = render_json(reply.body)
    retry = {"Retry-After": str(RETRY_AFTER_S)} if isinstance(error, TooManyConnectionsError) else {}
    headers = {
        "Content-Type": "application/json", "Content-Length": str(len(body)), **reply.header_map(), **retry,
        "Connection": "close",
    }  # fmt: skip
    head = f"HTTP/1.1 {reply.status} {HTTPStatus(reply.status).phrase}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return (head + "\r\n").encode("ascii") + body


def http_protocol(
    header_read_s: float,
    *,
    max_connections: int | None = None,
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
    max_headless_connections: int | None = None,
    on_refused: Callable[[GatewayError, str], None] | None = None,
) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (``uvicorn.Config(http=...)``) with a ``header_read_s`` deadline per request head,
    heads of at most ``max_header_bytes``, at most ``max_connections`` connections (default
    :func:`default_max_connections`) of which at most ``max_headless_connections`` without a complete head
    (default :func:`default_max_headless_connections`; past it the oldest is closed); a refused connection's
    error is passed to ``on_refused`` with its request id."""
    bound = default_max_connections() if max_connections is None else max_connections
    headless_bound = (
        default_max_headless_connections(bound) if max_headless_connections is None else max_headless_connections
    )
    headless = Headless(headless_bound, time.monotonic)
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # noqa: PLC0415 - only when serving
    except ImportError as exc:
        raise ServerConfigError(
            f"gateway serve needs httptools for its request deadlines: {exc}",
            hint="install the service extra (pip install 'agent-exec-gateway[service]'), or run bash scripts/setup.sh",
        ) from exc

    class HeadDeadlineProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None
        _refused = False
        _head_bytes: int | None = 0
        """Bytes received of the current request's head; None once it is complete (its body is not counted)."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)  # counts this connection in self.connections (all of the server's)
            if len(self.connections) > bound:
                self._refuse(
                    TooManyConnectionsError(
                        f"the service holds its limit of {bound} open connections; retry in {RETRY_AFTER_S} s"
                    )
                )
                return
            self._arm_head_deadline()
            headless.add(self, self.transport.close)

        def data_received(self, data: bytes) -> None:
            if self._refused:  # a refused connection's request is never read
                return
            if self._head_bytes is None:
                super().data_received(data)
                return
            room = max_header_bytes - self._head_bytes
            if len(data) <= room:
                self._head_bytes += len(data)
                super().data_received(data)
                return
            self._head_bytes = max_header_bytes
            super().data_received(data[:room])  # the parser sees at most the bound of a head
            if self._head_bytes != max_header_bytes:  # the head ended within the bound: go on with the rest
                self.data_received(data[room:])
            elif not self.transport.is_closing():
                self._refuse(HeadTooLargeError(f"the request head is longer than {max_header_bytes} bytes"))

        def _refuse(self, error: GatewayError) -> None:
            self._refused = True
            self._disarm_head_deadline()
            request_id = uuid.uuid4().hex
            self.transport.write(refusal_response(error, request_id))
            self.transport.close()
            if on_refused is not None:
                on_refused(error, request_id)

        def on_headers_complete(self) -> None:
            self._head_bytes = None
            headless.discard(self)  # never closed for the bound from now on
            self._disarm_head_deadline()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._head_bytes = 0  # what follows is the next request's head
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self.pipeline:  # waiting for the next request's head
                self._arm_head_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head_deadline()
            headless.discard(self)
            super().connection_lost(exc)

        def _arm_head_deadline(self) -> None:
            self._disarm_head_deadline()
            self._head_timer = self.loop.call_later(header_read_s, self._head_deadline_passed)

        def _disarm_head_deadline(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_deadline_passed(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                client: Any = self.client
                where = "%s:%d" % client if client else "a client"  # noqa: UP031 - the address pair as uvicorn logs it
                _log.warning("closing the connection of %s: no complete request head within %g s", where, header_read_s)
                self.transport.close()

    return HeadDeadlineProtocol

"""A deadline for each request's head (request line and headers), which uvicorn does not have.

uvicorn bounds the idle time *between* requests (``timeout_keep_alive``), but that timer is reset by every
byte received and is not armed at all on a fresh connection: a client that connects and sends nothing, or
trickles its headers a byte at a time, holds a connection (and a file descriptor) for as long as it likes
(uvicorn issue #157). Starlette sees a request only once its head is complete, so no middleware can help.

:func:`http_protocol` returns uvicorn's httptools protocol with one timer more: armed when a connection opens
and again when a response has been sent on a kept-alive connection, disarmed when a request's head is
complete. When it fires, the connection is closed and the event logged (there is no principal to audit yet:
the ``Authorization`` header itself may not have arrived). The body has its own deadline (``body_read_s``,
:mod:`gateway.service.app`); a running request is never cut by this one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.errors import ServerConfigError

__all__ = ["http_protocol"]

_log = logging.getLogger("gateway.service")


def http_protocol(header_read_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (``uvicorn.Config(http=...)``) with a ``header_read_s`` deadline per request head."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # noqa: PLC0415 - only when serving
    except ImportError as exc:
        raise ServerConfigError(
            f"gateway serve needs httptools for its request deadlines: {exc}",
            hint="install the service extra (pip install 'agent-exec-gateway[service]'), or run bash scripts/setup.sh",
        ) from exc

    class HeadDeadlineProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_head_deadline()

        def on_headers_complete(self) -> None:
            self._disarm_head_deadline()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and not self.pipeline:  # waiting for the next request's head
                self._arm_head_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_head_deadline()
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

"""The access log of ``gateway serve``: one line per HTTP request, through :mod:`logging` (``gateway.access``).

A pure ASGI middleware around the application, so it sees every answer, errors included, and the time until a
streamed answer's last byte.

Each line holds the time the request arrived (UTC, ISO 8601, milliseconds), its request id (the response's
``X-Request-Id``; a response without one gets one, so that the client and the log name the request alike), the
principal the service authenticated (``-``/``null`` when none: no token, a bad one, an open endpoint), the
method, the path as sent (percent-encoded, without the query: a query can carry what does not belong in a log),
the status (``-``/``null`` when the application sent none: its client went away first) and the duration in
milliseconds until the application was done. ``text`` (the default)::

    2025-06-01T12:00:00.123Z 3f0c9e... alice POST /v1/executions 200 812.4

``json``: the same fields as one object per line (``time``, ``request_id``, ``principal``, ``method``, ``path``,
``status``, ``duration_ms``). Nothing here configures logging: ``gateway serve`` gives the logger its handler.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ACCESS_LOGGER", "FORMATS", "AccessLog", "AccessRecord", "scope_principal"]

ACCESS_LOGGER: Final = "gateway.access"
"""The logger's name."""
FORMATS: Final = ("text", "json")
"""The formats of a line."""

_REQUEST_ID: Final = b"x-request-id"


@dataclass(frozen=True, slots=True)
class AccessRecord:
    """One request as the access log states it."""

    time: str
    """When the request arrived: UTC, ISO 8601 with milliseconds (``2025-06-01T12:00:00.123Z``)."""
    request_id: str
    """The response's ``X-Request-Id``."""
    principal: str | None
    """The authenticated principal; None when the request had none."""
    method: str
    path: str
    """Percent-encoded as sent, without the query; no space, quote, backslash or control character."""
    status: int | None
    """None when the application sent no response (its client went away first)."""
    duration_ms: float
    """From the request's arrival until the application was done with it (a streamed answer: its last byte)."""

    def line(self, format: str) -> str:
        """The log line in ``format`` (one of :data:`FORMATS`)."""
        if format == "json":
            return json.dumps(asdict(self), separators=(",", ":"))
        status = "-" if self.status is None else str(self.status)
        fields = (self.time, self.request_id, self.principal or "-", self.method, self.path, status)
        return " ".join(fields) + f" {self.duration_ms:.1f}"


def scope_principal(scope: Scope) -> str | None:
    """The principal the service authenticated for this request: the ``principal`` of ``scope["user"]``."""
    principal = getattr(scope.get("user"), "principal", None)
    return principal if isinstance(principal, str) else None


def _printable(raw: bytes) -> str:
    """``raw`` with every byte that could break a line or its fields (space, quote, backslash, control, not
    ASCII) percent-encoded: a client's path cannot forge a log line."""
    return "".join(chr(b) if 0x21 <= b <= 0x7E and b not in b'"\\' else f"%{b:02X}" for b in raw)


def _utc_iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AccessLog:
    """The ASGI middleware: ``AccessLog(app, format="json")``. ``clock`` (the arrival time), ``timer`` (the
    duration, seconds) and ``principal`` (where the scope holds it) are the seams for tests."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        format: str = "text",
        logger: logging.Logger | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        timer: Callable[[], float] = time.perf_counter,
        principal: Callable[[Scope], str | None] = scope_principal,
    ) -> None:
        if format not in FORMATS:
            raise ValueError(f"access log format {format!r}: expected one of {', '.join(FORMATS)}")
        self.app = app
        self.format = format
        self._logger = logger if logger is not None else logging.getLogger(ACCESS_LOGGER)
        self._clock = clock
        self._timer = timer
        self._principal = principal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan (and websockets, which the service has none of)
            await self.app(scope, receive, send)
            return
        arrived, started = self._clock(), self._timer()
        method = _printable(scope["method"].encode("latin-1"))
        path = _printable(scope.get("raw_path") or scope["path"].encode("utf-8"))
        status: int | None = None
        request_id = ""

        async def send_stamped(message: Message) -> None:
            nonlocal status, request_id
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
                found = next((value for name, value in headers if name.lower() == _REQUEST_ID), None)
                if found is None:
                    request_id = uuid.uuid4().hex
                    message = {**message, "headers": [*headers, (_REQUEST_ID, request_id.encode("ascii"))]}
                else:
                    request_id = _printable(found)
            await send(message)

        try:
            await self.app(scope, receive, send_stamped)
        finally:
            record = AccessRecord(
                time=_utc_iso(arrived),
                request_id=request_id or "-",
                principal=self._principal(scope),
                method=method,
                path=path,
                status=status,
                duration_ms=round((self._timer() - started) * 1000, 1),
            )
            self._logger.info("%s", record.line(self.format))

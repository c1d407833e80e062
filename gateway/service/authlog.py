"""Failed authentication and forbidden calls on the trail, bounded: one record at the first of an interval, one
with the count of the rest after the interval (and at stop).

A client with bad tokens can fail thousands of times a second; writing (and fsyncing) one record each would
let it fill the disk and slow every honest request. The first failure of a quiet period is recorded at once,
with its reason, client and the public token id it presented (never the token), so an operator sees the attack
start; the rest are counted and summarised. At most two records per interval, whatever the rate.

An authenticated agent calling an operator-only endpoint (403 ``auth.forbidden``) is summarised the same way,
per principal and path (:class:`ForbiddenCalls`): one agent made 2,283 such records a second before.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from gateway._ticker import Ticker
from gateway.audit import AuditSink
from gateway.errors import GatewayError

__all__ = ["AuthFailures", "FailureReason", "ForbiddenCalls", "presented_token_id"]

FailureReason = Literal["missing", "malformed", "unknown"]
_TOKEN_ID_RE = re.compile(r"agw_([0-9a-f]{8})_[A-Za-z0-9_-]{43}")


def presented_token_id(token: str) -> str | None:
    """The public id inside a token of the gateway's format, else None (nothing else of a token is recorded)."""
    match = _TOKEN_ID_RE.fullmatch(token) if len(token) <= 256 else None
    return match.group(1) if match else None


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AuthFailures:
    """Counts failed authentications and writes ``auth.failed`` records, at most two per interval.

    Thread-safe. :meth:`start` runs a small daemon thread that writes each interval's summary when the interval
    ends; :meth:`stop` writes the last one. A record that cannot be written is dropped (the failure was refused
    anyway; authentication never depends on the trail)."""

    def __init__(self, audit: AuditSink, *, interval_s: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.audit = audit
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None
        """Start of the open interval (the time of its first failure), None when none is open."""
        self._rest = 0
        self._ticker = Ticker("gateway-auth-failures", min(interval_s / 4, 1.0), self.flush)

    def note(self, reason: FailureReason, *, token_id: str | None, client: str | None, path: str) -> None:
        """One failure: recorded at once when it opens an interval, else counted."""
        now = self._clock()
        with self._lock:
            if self._since is not None:
                self._rest += 1
                return
            self._since = now
        data = {
            "count": 1,
            "summary": False,
            "reason": reason,
            "token_id": token_id,
            "client": client,
            "path": path,
            "interval_ms": round(self.interval_s * 1000),
        }
        self._write(data)

    def flush(self, *, final: bool = False) -> None:
        """Close the open interval if it has ended (or ``final``): write the count of the failures after its first."""
        now = self._clock()
        with self._lock:
            if self._since is None or (not final and now - self._since < self.interval_s):
                return
            since, rest = self._since, self._rest
            self._since, self._rest = None, 0
        if rest:
            self._write(
                {"count": rest, "summary": True, "since": _rfc3339(since), "interval_ms": round(self.interval_s * 1000)}
            )

    def start(self) -> None:
        self._ticker.start()

    def stop(self) -> None:
        self._ticker.stop()
        self.flush(final=True)

    def _write(self, data: dict[str, Any]) -> None:
        # refused either way; the trail's own failure is reported by /readyz and by every request
        with contextlib.suppress(GatewayError):
            self.audit.append("auth.failed", data)


class ForbiddenCalls:
    """``auth.forbidden`` records, at most two per principal and path per interval: the first call of an interval
    at once (``count`` 1, ``summary`` false, with the role and token id), the number of the rest when the
    interval has passed (written with the next such call, or at :meth:`stop`; ``summary`` true). The paths are
    the operator-only routes, so the keys are bounded by the principals. Thread-safe."""

    def __init__(self, audit: AuditSink, *, interval_s: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.audit = audit
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._open: dict[tuple[str, str], tuple[float, int, str]] = {}
        """(principal, path) -> (start of its open interval, calls counted after the first, the first's role)."""

    def note(self, *, principal: str, role: str, token_id: str | None, path: str, request_id: str) -> None:
        """One forbidden call: recorded at once when it opens an interval, else counted. Blocking (a record is
        durable before the answer); a record that cannot be written is dropped (the call is refused anyway)."""
        now = self._clock()
        key = (principal, path)
        with self._lock:
            since, rest, first_role = self._open.get(key, (None, 0, role))
            if since is not None and now - since < self.interval_s:
                self._open[key] = (since, rest + 1, first_role)
                return
            self._open[key] = (now, 0, role)
        if since is not None and rest:
            self._summary(key, since, rest, first_role)
        data = {"count": 1, "summary": False, **self._fields(role, path), "token_id": token_id}
        self._write(data, principal=principal, request_id=request_id)

    def stop(self) -> None:
        """Write the count of every open interval's calls after its first."""
        with self._lock:
            pending, self._open = self._open, {}
        for key, (since, rest, role) in pending.items():
            if rest:
                self._summary(key, since, rest, role)

    def _fields(self, role: str, path: str) -> dict[str, Any]:
        return {"role": role, "required_role": "operator", "path": path, "interval_ms": round(self.interval_s * 1000)}

    def _summary(self, key: tuple[str, str], since: float, rest: int, role: str) -> None:
        principal, path = key
        data = {"count": rest, "summary": True, **self._fields(role, path), "since": _rfc3339(since)}
        self._write(data, principal=principal, request_id=None)

    def _write(self, data: dict[str, Any], *, principal: str, request_id: str | None) -> None:
        with contextlib.suppress(GatewayError):  # refused either way; /readyz reports the trail
            self.audit.append("auth.forbidden", data, principal=principal, request_id=request_id)

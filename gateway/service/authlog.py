"""Failed authentication on the trail, bounded: one record at the first failure of an interval, one with the
count of the rest at the end of the interval (and at stop).

A client with bad tokens can fail thousands of times a second; writing (and fsyncing) one record each would
let it fill the disk and slow every honest request. The first failure of a quiet period is recorded at once,
with its reason, client and the public token id it presented (never the token), so an operator sees the attack
start; the rest are counted and summarised. At most two records per interval, whatever the rate.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

from gateway.audit import AuditSink
from gateway.errors import GatewayError

__all__ = ["AuthFailures", "FailureReason", "presented_token_id"]

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
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

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
        self._thread = threading.Thread(target=self._loop, name="gateway-auth-failures", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.flush(final=True)

    def _loop(self) -> None:
        tick = min(self.interval_s / 4, 1.0)
        while not self._stopped.wait(tick):
            self.flush()

    def _write(self, data: dict[str, Any]) -> None:
        # refused either way; the trail's own failure is reported by /readyz and by every request
        with contextlib.suppress(GatewayError):
            self.audit.append("auth.failed", data)

"""Each principal's trail bytes per minute: measured from the trail's own lines, and bounded, so that no principal
can make the trail grow faster than its budget (past it, new work is refused with 429 ``trail_bytes``).

The records of one request are written by the service and by its decision workers (other processes, dry runs),
so the bytes are measured where they all meet: :class:`TrailTail` reads the lines appended to the trail's
segments since the service started (from the page cache, a second read of bytes just written) and charges each
to the principal in its envelope; records of nobody (failed authentication, connections) are charged to no one.
:class:`TrailMeter` does that every half second in a thread of its own; :class:`TrailBudget` keeps a sliding
minute per principal. The budget is checked before a request is counted against its rpm; a request admitted
while its principal is just under the budget may take it over by its own records (one request, at most the
code cap plus a bounded rest): the bound is the budget plus one request's records, measured a tick late.

The default, :data:`DEFAULT_TRAIL_BYTES_PER_MINUTE` (16 MiB), does not bite normal use: an execution of
``print(1)`` writes about 9.2 KB (request 1.0, decision 6.7, outcome 1.5), one with 4 KiB of code 14 KB, so a
principal at the default rpm (600) writes 5.5 to 8.4 MB a minute. With the stored code capped (64 KiB as
stored) and the request's other strings cut, one request writes at most about 100 KB: at 600 rpm, 60 MB a
minute; the budget holds such a principal to 16 MiB.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Final

from gateway._ticker import Ticker
from gateway.audit.segments import list_segments, segment_name
from gateway.errors import OverQuotaError

__all__ = ["DEFAULT_TRAIL_BYTES_PER_MINUTE", "WINDOW_S", "TrailBudget", "TrailMeter", "TrailTail"]

DEFAULT_TRAIL_BYTES_PER_MINUTE: Final = 16 << 20
"""16 MiB: twice what a principal writes at the default rpm with 4 KiB of code per request (see the module)."""
WINDOW_S: Final = 60.0
"""The budget's sliding window."""
_READ: Final = 1 << 20
_PRINCIPAL: Final = b'"principal":'


class TrailBudget:
    """Trail bytes charged to each principal in the last :data:`WINDOW_S` seconds, and the check against
    ``limit`` bytes. Thread-safe (charged by the meter's thread, checked on the event loop)."""

    def __init__(self, limit: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1:
            raise ValueError(f"the trail byte budget must be at least 1 byte a minute, got {limit}")
        self.limit = limit
        self._clock = clock
        self._lock = threading.Lock()
        self._charged: dict[str, deque[tuple[float, int]]] = {}
        """principal -> (when, bytes) of its charges in the window, oldest first (one per meter tick)."""

    def charge(self, charges: dict[str, int]) -> None:
        """Charge each principal the bytes of its lines the meter read now."""
        now = self._clock()
        with self._lock:
            for principal, size in charges.items():
                self._charged.setdefault(principal, deque()).append((now, size))

    def used(self, principal: str) -> int:
        """The bytes charged to ``principal`` in the window."""
        with self._lock:
            return sum(size for _, size in self._window(principal))

    def check(self, principal: str) -> None:
        """:class:`OverQuotaError` (``trail_bytes``) when ``principal`` has written its budget in the window;
        ``retry_after_s``: until enough of its charges leave the window to bring it under."""
        with self._lock:
            window = self._window(principal)
            used = sum(size for _, size in window)
            if used < self.limit:
                return
            now, left, frees_in = self._clock(), used, WINDOW_S
            for when, size in window:  # the oldest charges leave first
                left -= size
                if left < self.limit:
                    frees_in = when + WINDOW_S - now
                    break
        raise OverQuotaError(
            f"{principal!r} made the audit trail grow by {used} bytes in the last minute; its budget is "
            f"{self.limit} bytes a minute (trail_bytes_per_minute); send smaller requests or fewer",
            retry_after_s=max(1, math.ceil(frees_in)),
            quota="trail_bytes",
        )

    def _window(self, principal: str) -> deque[tuple[float, int]]:
        charged = self._charged.get(principal)
        if charged is None:
            return deque()
        now = self._clock()
        while charged and now - charged[0][0] >= WINDOW_S:
            charged.popleft()
        if not charged:
            del self._charged[principal]
        return charged


def _principal(line: bytes) -> str | None:
    """The envelope's principal of a sealed line (canonical JSON, keys sorted): the last ``"principal":`` key is
    the envelope's (it comes after ``data``, and no member after it holds an object). A quote inside a string
    is escaped, so the text cannot appear inside a value."""
    at = line.rfind(_PRINCIPAL)
    if at < 0:
        return None
    start = at + len(_PRINCIPAL)
    if line[start : start + 1] != b'"':
        return None  # null
    end = line.find(b'"', start + 1)
    return line[start + 1 : end].decode("utf-8", "replace") if end > start else None


class TrailTail:
    """The lines appended to a trail directory's segments since this was made, read as they come, across
    segments (a full segment is read to its end before the next one: once the next exists, no writer appends
    to it)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        segments = list_segments(directory) if directory.is_dir() else []
        self._index, self._offset = (segments[-1][0], segments[-1][1].stat().st_size) if segments else (1, 0)
        self._partial = b""

    def read(self) -> dict[str, int]:
        """Bytes of the complete lines appended since the last call, by their principal (lines of nobody left
        out)."""
        charges: dict[str, int] = {}
        while True:
            self._drain(charges)
            if not (self.directory / segment_name(self._index + 1)).exists():
                return charges
            self._drain(charges)  # written before the next segment was started: all of it is there now
            self._index, self._offset, self._partial = self._index + 1, 0, b""

    def _drain(self, charges: dict[str, int]) -> None:
        try:
            fd = os.open(self.directory / segment_name(self._index), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            while data := os.pread(fd, _READ, self._offset):
                self._offset += len(data)
                *lines, self._partial = (self._partial + data).split(b"\n")
                for line in lines:
                    principal = _principal(line)
                    if principal is not None:
                        charges[principal] = charges.get(principal, 0) + len(line) + 1
        finally:
            os.close(fd)


class TrailMeter:
    """Charges :class:`TrailBudget` with what :class:`TrailTail` reads, every ``tick_s`` in a daemon thread."""

    def __init__(self, tail: TrailTail, budget: TrailBudget, *, tick_s: float = 0.5) -> None:
        self.tail = tail
        self.budget = budget
        self.tick_s = tick_s
        self._ticker = Ticker("gateway-trail-meter", tick_s, self._tick_quietly)

    def tick(self) -> None:
        """Read what was appended and charge it (what the thread does every ``tick_s``)."""
        charges = self.tail.read()
        if charges:
            self.budget.charge(charges)

    def start(self) -> None:
        self._ticker.start()

    def stop(self) -> None:
        self._ticker.stop()

    def _tick_quietly(self) -> None:
        with contextlib.suppress(OSError):  # the trail's own failures are the writers' and /readyz's to report
            self.tick()

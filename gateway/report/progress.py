"""Progress of a report on a terminal's stderr: what is being verified, then the records read so far."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Progress on a terminal's stderr (at most twice a second); silent when stderr is not a TTY."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._last = 0.0
        self._shown = False

    def say(self, text: str) -> None:
        if self.enabled:
            self.stream.write(f"\r\x1b[K{text}")
            self.stream.flush()
            self._shown = True

    def tick(self, records: int, done: int, total: int, *, others: int = 0) -> None:
        """``records`` read so far, ``done`` of ``total`` (a percentage when ``total``); ``others``: worker
        processes read the rest of the trail alongside this one."""
        now = time.monotonic()
        if not self.enabled or now - self._last < 0.5:
            return
        self._last = now
        share = f" ({100 * done // total}%)" if total else ""
        if others:
            self.say(f"report: {records:,} records read here{share}, {others} worker process(es) reading the rest")
        else:
            self.say(f"report: {records:,} records read{share}")

    def done(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

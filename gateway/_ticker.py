"""Ticker: a function called every few seconds in a daemon thread, from ``start()`` until ``stop()``.

The service's background chores (auth-failure summaries, the trail byte meter, the anchor writer) each run one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Ticker"]


class Ticker:
    """Calls ``tick`` every ``every_s`` seconds in a daemon thread named ``name``; :meth:`stop` ends the thread
    (waiting at most ``join_s``; a tick under way finishes first). ``tick`` handles its own errors: one that
    escapes ends the thread."""

    def __init__(self, name: str, every_s: float, tick: Callable[[], object], *, join_s: float | None = None) -> None:
        if every_s <= 0:
            raise ValueError(f"a ticker's period must be positive, got {every_s}")
        self.name = name
        self.every_s = every_s
        self._tick = tick
        self._join_s = join_s
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopped.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(self._join_s)
            self._thread = None

    def _loop(self) -> None:
        while not self._stopped.wait(self.every_s):
            self._tick()

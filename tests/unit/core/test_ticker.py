"""Ticker: calls its function in a daemon thread until stopped, and no more after."""

from __future__ import annotations

import threading

import pytest

from gateway._ticker import Ticker


def test_it_ticks_until_stopped_and_not_after() -> None:
    ticked = threading.Event()
    calls: list[int] = []

    def tick() -> None:
        calls.append(1)
        ticked.set()

    ticker = Ticker("test-ticker", 0.01, tick)
    ticker.start()
    assert ticked.wait(10), "no tick within 10 s"
    ticker.stop()
    after_stop = len(calls)
    assert not any(t.name == "test-ticker" for t in threading.enumerate())  # the thread is gone
    assert len(calls) == after_stop


def test_a_period_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="must be positive, got 0"):
        Ticker("never", 0, lambda: None)

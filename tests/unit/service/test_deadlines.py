"""The bound on connections without a complete request head (``gateway.service.deadlines.Headless``): the oldest
gives way, a connection that has sent its head is out of reach, and the closings are logged, summarised; and its
setting in the server configuration."""

from __future__ import annotations

import logging

import pytest

from gateway.errors import ServerConfigError
from gateway.service.config import load_server_config_text
from gateway.service.deadlines import EVICTION_LOG_S, Headless, default_max_headless_connections


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _add(headless: Headless, closed: list[str], *names: str) -> None:
    for name in names:
        headless.add(name, lambda name=name: closed.append(name))  # type: ignore[misc]


def test_past_the_bound_the_oldest_connection_without_a_head_is_closed() -> None:
    closed: list[str] = []
    headless = Headless(2, Clock())
    _add(headless, closed, "a", "b")
    assert closed == []
    _add(headless, closed, "c", "d")
    assert closed == ["a", "b"]  # oldest first, each once
    headless.discard("c")  # c sent its whole head: never closed for the bound
    _add(headless, closed, "e", "f")
    assert closed == ["a", "b", "d"]
    headless.discard("gone")  # a connection never added (refused) or already closed: nothing happens
    _add(headless, closed, "g")
    assert closed == ["a", "b", "d", "e"]


def test_closings_are_logged_counted_at_most_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    headless = Headless(1, clock)
    closed: list[str] = []
    with caplog.at_level(logging.WARNING, logger="gateway.service"):
        _add(headless, closed, "a", "b")  # a closed: logged at once
        _add(headless, closed, "c", "d", "e")  # within the interval: counted, not logged
        clock.now = EVICTION_LOG_S
        _add(headless, closed, "f")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert messages[0].startswith("closed 1 connection(s) without a complete request head")
    assert messages[1].startswith("closed 4 connection(s)")
    assert "max_headless_connections (1)" in messages[1]


def test_max_headless_connections_is_read_checked_and_defaults_to_a_quarter_of_max_connections() -> None:
    head = "apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\n"
    assert load_server_config_text(head + "max_headless_connections: 50\n").max_headless_connections == 50
    assert load_server_config_text(head).max_headless_connections is None  # the protocol takes the default
    for bad in ("0", "-1", "many", "1.5"):
        with pytest.raises(ServerConfigError) as refused:
            load_server_config_text(head + f"max_headless_connections: {bad}\n")
        assert [p.path for p in refused.value.problems] == ["$.max_headless_connections"]
    assert [default_max_headless_connections(n) for n in (1, 3, 4, 64, 4096)] == [1, 1, 1, 16, 1024]

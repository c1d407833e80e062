"""gateway.cli.serve_cmd without serving: the SIGTERM drain of the uvicorn server (an injected clock), the
listener bound before anything starts, the flags of the drain and the access log, the exit statuses in --help."""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from gateway.cli import build_parser, main
from gateway.cli.serve_cmd import (
    EXIT_STATUSES,
    AddressUnavailableError,
    _server_class,
    config_from_args,
    listen,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _nothing(scope: Any, receive: Any, send: Any) -> None:
    return None


def server(drain_s: float, clock: Clock, drained: list[bool]) -> Any:
    cls = _server_class(uvicorn.Server, drain_s=drain_s, on_drain=lambda: drained.append(True), clock=clock)
    return cls(uvicorn.Config(_nothing, lifespan="off"))


def tick(srv: Any) -> bool:
    result: bool = asyncio.run(srv.on_tick(1))
    return result


def test_sigterm_drains_then_stops_and_the_exit_is_clean() -> None:
    clock, drained = Clock(), []
    srv = server(5.0, clock, drained)
    srv.handle_exit(signal.SIGTERM, None)
    assert drained == [True]
    assert not srv.should_exit  # still serving: the listener stays open while /readyz says 503
    clock.now += 4.9
    assert tick(srv) is False
    clock.now += 0.2
    assert tick(srv) is True
    assert srv.should_exit
    assert signal.SIGTERM not in srv._captured_signals  # not re-raised after the shutdown: exit 0


def test_a_second_sigterm_or_a_sigint_ends_the_drain_at_once() -> None:
    for second in (signal.SIGTERM, signal.SIGINT):
        clock, drained = Clock(), []
        srv = server(5.0, clock, drained)
        srv.handle_exit(signal.SIGTERM, None)
        srv.handle_exit(second, None)
        assert srv.should_exit
        assert drained == [True]


def test_drain_zero_stops_at_once_as_before() -> None:
    clock, drained = Clock(), []
    srv = server(0.0, clock, drained)
    srv.handle_exit(signal.SIGTERM, None)
    assert srv.should_exit
    assert drained == []


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def test_a_port_in_use_is_one_line_naming_the_address_and_what_to_do(taken: int) -> None:
    with pytest.raises(AddressUnavailableError) as caught:
        listen("127.0.0.1", taken)
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith(f"error[service.address_unavailable]: cannot listen on 127.0.0.1:{taken}: ")
    assert "--port" in line


def test_an_address_of_no_interface_is_refused_with_what_to_fix() -> None:
    with pytest.raises(AddressUnavailableError, match=r"cannot listen on 192\.0\.2\.1:0: .*--host"):
        listen("192.0.2.1", 0)  # TEST-NET-1: on no interface of this host


def test_listen_binds_and_listens_before_the_server_starts() -> None:
    (sock,) = listen("127.0.0.1", 0)
    with sock, socket.create_connection(sock.getsockname(), timeout=5):
        pass  # accepted by the kernel's backlog: a client connecting during start-up waits, it is not refused


def test_the_drain_and_access_log_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\ndrain_s: 0\naccess_log: {format: json}\n")
    args = build_parser("serve").parse_args(["serve", "--config", str(path)])
    assert isinstance(args, argparse.Namespace)
    config = config_from_args(args)
    assert (config.drain_s, config.access_log_format) == (0.0, "json")
    args = build_parser("serve").parse_args(
        ["serve", "--config", str(path), "--drain", "7.5", "--access-log-format", "text"]
    )
    assert (config_from_args(args).drain_s, config_from_args(args).access_log_format) == (7.5, "text")


def test_an_unknown_access_log_format_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--access-log-format", "xml"]) == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err


def test_help_lists_every_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    for code, meaning in EXIT_STATUSES:
        assert f"{code} {meaning}" in shown

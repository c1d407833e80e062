"""The proxies of a runner's runs on one event-loop thread: each run's private directory and socket, its report, and
everything closed when the run (or the runner) ends. Loopback only, with a fake resolver."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.egress import Destination, EgressLimits, EgressPlan
from gateway.egress.host import SOCKET_NAME, EgressHost
from tests.egress_support import loopback_resolver

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")
SANDBOX = (65534, 65534)


class Upstream:
    """A server on 127.0.0.1 that answers each request with ``answer`` (None: reads and never answers), and
    notes when a client's connection reached its end (EOF)."""

    def __init__(self, answer: bytes | None) -> None:
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.eof = threading.Event()
        self.got = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            self.got.set()
            if self.answer is not None:
                conn.sendall(self.answer)
                return
            while conn.recv(65536):
                pass
            self.eof.set()


@pytest.fixture
def root(short_dir: Path) -> Path:
    return short_dir / "egress"


@pytest.fixture
def host(root: Path) -> Iterator[EgressHost]:
    made = EgressHost(root, resolver=loopback_resolver("mirror.internal"), max_records=2)
    yield made
    made.close()


def plan(port: int) -> EgressPlan:
    return EgressPlan((Destination("mirror.internal", ports=(port,), cidrs=(LOOPBACK,)),), EgressLimits())


def request(directory: Path, target: str, *, wait: bool = True) -> tuple[socket.socket, bytes]:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.settimeout(10)
    client.connect(str(directory / SOCKET_NAME))
    host = target.split("/")[2]
    client.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    if not wait:
        return client, b""
    chunks = []
    while chunk := client.recv(65536):
        chunks.append(chunk)
    client.close()
    return client, b"".join(chunks)


def test_each_run_has_a_private_directory_only_the_sandbox_user_reaches(host: EgressHost) -> None:
    run = host.open(plan(1), uid=SANDBOX[0], gid=SANDBOX[1])
    other = host.open(plan(1), uid=SANDBOX[0], gid=SANDBOX[1])
    try:
        assert run.directory.parent == host.root
        assert run.directory != other.directory
        assert len(run.directory.name) == 32  # 128 random bits: not guessable
        assert stat.S_IMODE(host.root.stat().st_mode) == 0o700
        assert host.root.stat().st_uid == os.geteuid()
        sock = (run.directory / SOCKET_NAME).stat()
        assert stat.S_ISSOCK(sock.st_mode)
        if os.geteuid() == 0:
            info = run.directory.stat()
            assert (stat.S_IMODE(info.st_mode), info.st_uid, info.st_gid) == (0o700, *SANDBOX)
            assert (stat.S_IMODE(sock.st_mode), sock.st_uid, sock.st_gid) == (0o600, *SANDBOX)
    finally:
        run.close()
        other.close()
    assert list(host.root.iterdir()) == []


def test_a_run_reaches_its_destination_and_its_report_has_the_records(host: EgressHost) -> None:
    upstream = Upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    run = host.open(plan(upstream.port), uid=SANDBOX[0], gid=SANDBOX[1])
    _, answer = request(run.directory, f"http://mirror.internal:{upstream.port}/simple/")
    assert answer.endswith(b"\r\n\r\nok")
    _, denied = request(run.directory, f"http://elsewhere.example:{upstream.port}/")
    assert denied.startswith(b"HTTP/1.1 403 ")
    assert b"\r\n\r\nnetwork.egress.host\n" in denied
    report = run.close()
    assert not run.directory.exists()
    assert (report.connections, report.denied, report.dropped) == (1, 1, 0)
    allowed, refused = report.records
    assert (allowed.host, allowed.port, allowed.address, allowed.allowed, allowed.ended) == (
        "mirror.internal",
        upstream.port,
        "127.0.0.1",
        True,
        "closed",
    )
    assert allowed.bytes_in == len(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    assert report.bytes_in == allowed.bytes_in
    assert report.bytes_out == allowed.bytes_out > 0
    assert (refused.host, refused.allowed, refused.rule, refused.ended) == (
        "elsewhere.example",
        False,
        "network.egress.host",
        "denied",
    )
    assert run.close() is report  # idempotent


def test_closing_a_run_ends_the_connections_it_still_holds(host: EgressHost) -> None:
    upstream = Upstream(None)
    run = host.open(plan(upstream.port), uid=SANDBOX[0], gid=SANDBOX[1])
    client, _ = request(run.directory, f"http://mirror.internal:{upstream.port}/slow", wait=False)
    assert upstream.got.wait(10)
    report = run.close()
    assert upstream.eof.wait(10)  # the upstream saw the proxy's side end
    assert client.recv(1) == b""
    client.close()
    (record,) = report.records
    assert (record.allowed, record.ended) == (True, "run-ended")


def test_a_report_keeps_a_bounded_number_of_records_and_counts_the_rest(host: EgressHost) -> None:
    run = host.open(plan(1), uid=SANDBOX[0], gid=SANDBOX[1])
    for _ in range(5):
        request(run.directory, "http://elsewhere.example:1/")
    report = run.close()
    assert (len(report.records), report.dropped, report.denied) == (2, 3, 5)


def test_closing_the_host_closes_every_open_run(root: Path) -> None:
    host = EgressHost(root, resolver=loopback_resolver("mirror.internal"))
    upstream = Upstream(None)
    run = host.open(plan(upstream.port), uid=SANDBOX[0], gid=SANDBOX[1])
    client, _ = request(run.directory, f"http://mirror.internal:{upstream.port}/", wait=False)
    assert upstream.got.wait(10)
    host.close()
    assert upstream.eof.wait(10)
    assert not run.directory.exists()
    assert not any(t.name == "gateway-egress" and t.is_alive() for t in threading.enumerate())
    assert run.close().records[0].ended == "run-ended"
    client.close()


def test_each_take_has_what_ended_since_the_last_and_the_limits_stay_the_whole_lifes(root: Path) -> None:
    """A kernel's proxy: each cell takes the connections that ended since the cell before and the totals' growth;
    its limits count the whole life; closing leaves the connections it cut to take."""
    host = EgressHost(root, resolver=loopback_resolver("mirror.internal"), max_records=2)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    upstream = Upstream(answer)
    limits = EgressLimits(connections=2)
    whole_life = EgressPlan((Destination("mirror.internal", ports=(upstream.port,), cidrs=(LOOPBACK,)),), limits)
    run = host.open(whole_life, uid=SANDBOX[0], gid=SANDBOX[1])
    try:
        url = f"http://mirror.internal:{upstream.port}/"
        assert request(run.directory, url)[1].endswith(b"ok")
        first = run.take()
        assert [(r.allowed, r.ended) for r in first.records] == [(True, "closed")]
        assert (first.connections, first.denied, first.bytes_in) == (1, 0, len(answer))
        empty = run.take()
        assert (empty.records, empty.connections, empty.bytes_in, empty.bytes_out) == ((), 0, 0, 0)
        assert request(run.directory, url)[1].endswith(b"ok")
        _, third = request(run.directory, url)  # past the whole life's two connections
        assert third.startswith(b"HTTP/1.1 403 ")
        second = run.take()
        assert [r.allowed for r in second.records] == [True, False]
        assert (second.connections, second.denied) == (1, 1)
        for _ in range(3):  # the record cap counts afresh for each take
            request(run.directory, "http://elsewhere.example:1/")
        capped = run.take()
        assert (len(capped.records), capped.dropped, capped.denied) == (2, 1, 3)
        holder = Upstream(None)
        held = EgressPlan((Destination("mirror.internal", ports=(holder.port,), cidrs=(LOOPBACK,)),), EgressLimits())
        other = host.open(held, uid=SANDBOX[0], gid=SANDBOX[1])
        client, _ = request(other.directory, f"http://mirror.internal:{holder.port}/", wait=False)
        assert holder.got.wait(10)
        assert other.take().records == ()  # still open: not recorded yet
        left = other.close()
        assert [(r.allowed, r.ended) for r in left.records] == [(True, "run-ended")]
        assert other.take().records == ()  # each once
        client.close()
    finally:
        run.close()
        host.close()

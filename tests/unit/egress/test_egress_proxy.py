"""The egress proxy over a real unix socket, against upstream servers on 127.0.0.1 started by the tests.

Names resolve through a fake resolver only (nothing outside loopback is ever resolved or reached); the test upstreams
are allowed through an explicit CIDR on the `mirror.internal` entry, the way an operator allows an internal mirror.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import re
import ssl
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trustme

from gateway.egress import ConnectionRecord, Destination, EgressLimits, EgressProxy, EgressRules, splice
from tests.egress_support import TableResolver

LOOPBACK_NET = ipaddress.ip_network("127.0.0.0/8")
RULE_REQUEST = "network.egress.request"
GUARD = 10.0  # a guard against a hung test, never a timing assert


def client_hello(server_name: str) -> bytes:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@dataclass
class Upstream:
    """A server on 127.0.0.1: what it received, how many connections it accepted."""

    port: int = 0
    received: bytearray = field(default_factory=bytearray)
    connections: int = 0
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a connection's handler has closed its socket (the sending upstream's only)."""


@contextlib.asynccontextmanager
async def echo_upstream() -> AsyncIterator[Upstream]:
    upstream = Upstream()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream.connections += 1
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                upstream.received += data
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    async with server:
        yield upstream


@contextlib.asynccontextmanager
async def http_upstream(body: bytes = b"") -> AsyncIterator[Upstream]:
    """Answers the first request (read whole) with its head, then ``body``; keeps what else arrives before the close."""
    upstream = Upstream()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream.connections += 1
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
            upstream.received += head + await reader.readexactly(int(length[1]) if length else 0)
            payload = head + body
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload)
            await writer.drain()
            writer.write_eof()  # the answer is whole; whatever else the proxy forwarded arrives before its close
            upstream.received += await reader.read()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    async with server:
        yield upstream


@contextlib.asynccontextmanager
async def tls_upstream(ca: trustme.CA) -> AsyncIterator[Upstream]:
    """A TLS echo server for mirror.internal, its certificate signed by the test's own CA."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("mirror.internal").configure_cert(context)
    async with contextlib.AsyncExitStack() as stack:
        upstream = Upstream()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            upstream.connections += 1
            with contextlib.suppress(OSError, ssl.SSLError):
                line = await reader.readline()
                upstream.received += line
                writer.write(line.upper())
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
        await stack.enter_async_context(server)
        upstream.port = server.sockets[0].getsockname()[1]
        yield upstream


class Proxy:
    """A running proxy and the records it produced."""

    proxy: EgressProxy

    def __init__(self, path: Path, resolver: TableResolver) -> None:
        self.path, self.resolver = path, resolver
        self.records: list[ConnectionRecord] = []
        self._arrived = asyncio.Event()

    def record(self, record: ConnectionRecord) -> None:
        self.records.append(record)
        self._arrived.set()

    async def wait_records(self, count: int) -> list[ConnectionRecord]:
        while len(self.records) < count:
            self._arrived.clear()
            await asyncio.wait_for(self._arrived.wait(), GUARD)
        return self.records

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(str(self.path))

    async def exchange(self, data: bytes) -> bytes:
        """Sends ``data`` and returns everything the proxy answers until it closes."""
        reader, writer = await self.open()
        writer.write(data)
        answer = await asyncio.wait_for(reader.read(), GUARD)
        writer.close()
        return answer

    async def connect(self, authority: str) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
        """Sends a CONNECT and returns the proxy's answer head and the open streams."""
        reader, writer = await self.open()
        writer.write(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD)
        return head, reader, writer


@contextlib.asynccontextmanager
async def running_proxy(
    tmp_path: Path,
    destinations: Sequence[Destination] | None = None,
    *,
    answers: dict[str, Sequence[Sequence[str]]] | None = None,
    limits: EgressLimits | None = None,
    clock: Callable[[], float] | None = None,
) -> AsyncIterator[Proxy]:
    resolver = TableResolver(answers if answers is not None else {"mirror.internal": [["127.0.0.1"]]})
    if destinations is None:
        destinations = [Destination("mirror.internal", ports=tuple(range(1024, 65536)), cidrs=(LOOPBACK_NET,))]
    harness = Proxy(tmp_path / "egress.sock", resolver)
    harness.proxy = EgressProxy(
        EgressRules(destinations),
        on_record=harness.record,
        limits=limits,
        resolver=resolver,
        clock=clock or (lambda: 0.0),
    )
    await harness.proxy.start(harness.path)
    try:
        yield harness
    finally:
        await harness.proxy.close()


def rule_of(answer: bytes) -> str:
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith((b"HTTP/1.1 403", b"HTTP/1.1 502")), answer
    return rest.partition(b"\r\n\r\n")[2].split(b"\n")[0].decode()


def test_an_allowed_connect_carries_a_real_tls_session(tmp_path: Path) -> None:
    ca = trustme.CA()

    async def scenario() -> None:
        async with tls_upstream(ca) as upstream, running_proxy(tmp_path) as proxy:
            head, reader, writer = await proxy.connect(f"mirror.internal:{upstream.port}")
            assert head.startswith(b"HTTP/1.1 200")
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ca.configure_trust(context)
            await writer.start_tls(context, server_hostname="mirror.internal")
            writer.write(b"ping\n")
            assert await asyncio.wait_for(reader.readline(), GUARD) == b"PING\n"
            writer.close()
            (record,) = await proxy.wait_records(1)
            assert proxy.resolver.calls == ["mirror.internal"]
        assert record.allowed
        assert (record.method, record.host, record.port, record.address) == (
            "CONNECT",
            "mirror.internal",
            upstream.port,
            "127.0.0.1",
        )
        assert record.rule == "network.egress.allowed"
        assert record.bytes_out > 0
        assert record.bytes_in > 0
        assert record.ended == "closed"
        assert proxy.proxy.stats.connections == 1
        assert proxy.proxy.stats.bytes_in == record.bytes_in

    asyncio.run(scenario())


def test_the_client_hello_is_forwarded_unchanged(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with echo_upstream() as upstream, running_proxy(tmp_path) as proxy:
            head, reader, writer = await proxy.connect(f"MIRROR.internal.:{upstream.port}")
            assert head.startswith(b"HTTP/1.1 200")
            hello = client_hello("mirror.internal")
            writer.write(hello)
            assert await asyncio.wait_for(reader.readexactly(len(hello)), GUARD) == hello
            writer.close()
            await proxy.wait_records(1)
        assert bytes(upstream.received) == hello

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("request_head", "rule"),
    [
        (b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n", "network.egress.host"),
        (b"CONNECT mirror.internal:22 HTTP/1.1\r\n\r\n", "network.egress.port"),
        (b"GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n", "network.egress.host"),
        (b"GET http://mirror.internal:22/ HTTP/1.1\r\nHost: mirror.internal:22\r\n\r\n", "network.egress.port"),
        (b"GET http://mirror.internal:8080/ HTTP/1.1\r\nHost: evil.example\r\n\r\n", "network.egress.host-mismatch"),
        (b"GET http://mirror.internal:8080/ HTTP/1.1\r\nHost: mirror.internal\r\n\r\n", "network.egress.host-mismatch"),
        (b"GET http://mirror.internal:8080/ HTTP/1.1\r\n\r\n", "network.egress.host-mismatch"),
        (
            b"GET http://mirror.internal:8080/ HTTP/1.1\r\nHost: mirror.internal:8080\r\nHost: evil.example\r\n\r\n",
            "network.egress.host-mismatch",
        ),
        (b"CONNECT mirror.internal:8080 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n", "network.egress.host-mismatch"),
        (b"GET /relative HTTP/1.1\r\nHost: mirror.internal\r\n\r\n", "network.egress.request"),
        (b"GET https://mirror.internal:8080/ HTTP/1.1\r\nHost: mirror.internal:8080\r\n\r\n", RULE_REQUEST),
        (b"GET http://u@mirror.internal:8080/ HTTP/1.1\r\nHost: mirror.internal:8080\r\n\r\n", RULE_REQUEST),
        (b"CONNECT mirror.internal HTTP/1.1\r\n\r\n", "network.egress.request"),
        (b"garbage\r\n\r\n", "network.egress.request"),
        (
            b"GET http://mirror.internal:8080/ HTTP/1.1\r\nHost: mirror.internal:8080\r\n"
            b"X: a\nHost: evil.example\r\n\r\n",  # a bare LF smuggling a second Host
            "network.egress.request",
        ),
        (
            b"POST http://mirror.internal:8080/ HTTP/1.1\r\nHost: mirror.internal:8080\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n",
            "network.egress.request",
        ),
    ],
)
def test_disallowed_and_malformed_requests_get_403_with_the_rule_id(
    tmp_path: Path, request_head: bytes, rule: str
) -> None:
    async def scenario() -> None:
        async with running_proxy(tmp_path) as proxy:
            assert rule_of(await proxy.exchange(request_head)) == rule
            (record,) = await proxy.wait_records(1)
            assert not record.allowed
            assert record.rule == rule
            assert record.ended == "denied"
            assert record.address is None
            assert proxy.proxy.stats.denied == 1
            assert proxy.proxy.stats.connections == 0

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "2130706433", "0177.0.0.1", "0x7f.1", "127.1", "[::ffff:127.0.0.1]", "[::1]", "[fe80::1%25lo]"],
)
def test_ip_literals_are_refused_whatever_their_encoding(tmp_path: Path, host: str) -> None:
    async def scenario() -> None:
        async with echo_upstream() as upstream, running_proxy(tmp_path) as proxy:
            connect = await proxy.exchange(f"CONNECT {host}:{upstream.port} HTTP/1.1\r\n\r\n".encode())
            plain = await proxy.exchange(
                f"GET http://{host}:{upstream.port}/ HTTP/1.1\r\nHost: {host}:{upstream.port}\r\n\r\n".encode()
            )
            assert rule_of(connect) == rule_of(plain) == "network.egress.literal"
            assert proxy.resolver.calls == []
        assert upstream.connections == 0

    asyncio.run(scenario())


def test_a_literal_named_as_its_own_host_is_reached_without_resolving(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with http_upstream() as upstream:
            destinations = [Destination("127.0.0.1", ports=(upstream.port,))]
            async with running_proxy(tmp_path, destinations) as proxy:
                target, host = f"http://2130706433:{upstream.port}/", f"127.0.0.1:{upstream.port}"
                answer = await proxy.exchange(f"GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                assert answer.startswith(b"HTTP/1.1 200")
                assert proxy.resolver.calls == []

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("name", "address", "rule"),
    [
        ("localhost", "127.0.0.1", "network.egress.address.loopback"),
        ("metadata.google.internal", "169.254.169.254", "network.egress.address.link-local"),
        ("metadata", "169.254.169.254", "network.egress.address.link-local"),
        ("internal.example.com", "10.0.0.5", "network.egress.address.private"),
        ("v6.example.com", "fd00::5", "network.egress.address.unique-local"),
        ("mapped.example.com", "::ffff:127.0.0.1", "network.egress.address.loopback"),
    ],
)
def test_names_resolving_to_refused_addresses_are_refused_even_when_listed(
    tmp_path: Path, name: str, address: str, rule: str
) -> None:
    async def scenario() -> None:
        destinations = [Destination(name, ports=(443, 80))]
        async with running_proxy(tmp_path, destinations, answers={name: [[address]]}) as proxy:
            connect = await proxy.exchange(f"CONNECT {name}:443 HTTP/1.1\r\n\r\n".encode())
            plain = await proxy.exchange(f"GET http://{name}/ HTTP/1.1\r\nHost: {name}\r\n\r\n".encode())
            assert rule_of(connect) == rule_of(plain) == rule
            records = await proxy.wait_records(2)
        assert [r.address for r in records] == [None, None]

    asyncio.run(scenario())


def test_unlisted_localhost_and_metadata_names_are_refused_before_resolving(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running_proxy(tmp_path) as proxy:
            for name in ("localhost", "metadata.google.internal", "169.254.169.254"):
                answer = await proxy.exchange(f"CONNECT {name}:443 HTTP/1.1\r\n\r\n".encode())
                assert rule_of(answer) in ("network.egress.host", "network.egress.literal")
            assert proxy.resolver.calls == []

    asyncio.run(scenario())


def test_a_rebinding_resolver_gains_nothing(tmp_path: Path) -> None:
    """First answer an address the entry's CIDR allows, then a private one: one lookup per connection, checked."""

    async def scenario() -> None:
        async with echo_upstream() as upstream:
            answers = {"mirror.internal": [["127.0.0.1"], ["10.0.0.1"]]}
            async with running_proxy(tmp_path, answers=answers) as proxy:
                head, reader, writer = await proxy.connect(f"mirror.internal:{upstream.port}")
                assert head.startswith(b"HTTP/1.1 200")
                hello = client_hello("mirror.internal")
                writer.write(hello)
                assert await asyncio.wait_for(reader.readexactly(len(hello)), GUARD) == hello
                writer.close()
                await proxy.wait_records(1)
                second = await proxy.exchange(f"CONNECT mirror.internal:{upstream.port} HTTP/1.1\r\n\r\n".encode())
                assert rule_of(second) == "network.egress.address.private"
                records = await proxy.wait_records(2)
                assert proxy.resolver.calls == ["mirror.internal", "mirror.internal"]
        assert upstream.connections == 1
        assert [r.address for r in records] == ["127.0.0.1", None]

    asyncio.run(scenario())


def test_a_mixed_answer_with_one_private_address_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        answers = {"pypi.org": [["93.184.216.34", "169.254.169.254"]]}
        async with running_proxy(tmp_path, [Destination("pypi.org")], answers=answers) as proxy:
            answer = await proxy.exchange(b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n")
            assert rule_of(answer) == "network.egress.address.link-local"

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "first_bytes",
    [
        client_hello("evil.example"),  # domain fronting
        client_hello("sub.mirror.internal"),
        b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n",  # plain HTTP inside a tunnel
    ],
)
def test_a_tunnel_whose_hello_names_another_server_is_closed_unforwarded(tmp_path: Path, first_bytes: bytes) -> None:
    async def scenario() -> None:
        async with echo_upstream() as upstream, running_proxy(tmp_path) as proxy:
            head, reader, writer = await proxy.connect(f"mirror.internal:{upstream.port}")
            assert head.startswith(b"HTTP/1.1 200")
            writer.write(first_bytes)
            assert await asyncio.wait_for(reader.read(), GUARD) == b""
            writer.close()
            (record,) = await proxy.wait_records(1)
        assert upstream.received == b""
        assert not record.allowed
        assert record.rule == "network.egress.sni"
        assert record.ended == "denied"
        assert record.bytes_out == 0

    asyncio.run(scenario())


def test_plain_http_is_forwarded_in_origin_form_one_request_only(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with http_upstream() as upstream, running_proxy(tmp_path) as proxy:
            authority = f"mirror.internal:{upstream.port}"
            answer = await proxy.exchange(
                f"GET http://{authority}/simple/pkg/?a=1 HTTP/1.1\r\nHost: {authority}\r\n"
                "Proxy-Authorization: Basic c2VjcmV0\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n".encode()
            )
            (record,) = await proxy.wait_records(1)
        assert answer.startswith(b"HTTP/1.1 200")
        forwarded = bytes(upstream.received).decode()
        assert forwarded.startswith("GET /simple/pkg/?a=1 HTTP/1.1\r\n")
        assert f"Host: {authority}\r\n" in forwarded
        assert "Connection: close\r\n" in forwarded
        assert "Accept: */*\r\n" in forwarded
        assert "Proxy-Authorization" not in forwarded
        assert "keep-alive" not in forwarded
        assert (record.method, record.allowed, record.ended) == ("GET", True, "closed")
        assert record.bytes_in == len(answer)

    asyncio.run(scenario())


def test_a_second_pipelined_request_never_reaches_the_upstream(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with http_upstream() as upstream, running_proxy(tmp_path) as proxy:
            authority = f"mirror.internal:{upstream.port}"
            first = f"GET http://{authority}/ HTTP/1.1\r\nHost: {authority}\r\n\r\n"
            second = "GET /admin HTTP/1.1\r\nHost: evil.example\r\n\r\n"
            await proxy.exchange((first + second).encode())
            (record,) = await proxy.wait_records(1)
        assert b"evil.example" not in upstream.received
        assert record.rule == "network.egress.request"
        assert not record.allowed

    asyncio.run(scenario())


def test_a_connection_flood_meets_the_rate_limit_then_recovers(tmp_path: Path) -> None:
    now = [0.0]

    async def scenario() -> None:
        limits = EgressLimits(rate=3, rate_window=1.0)
        async with running_proxy(tmp_path, limits=limits, clock=lambda: now[0]) as proxy:
            rules = [rule_of(await proxy.exchange(b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n")) for _ in range(5)]
            assert rules == ["network.egress.host"] * 3 + ["network.egress.limit.rate"] * 2
            now[0] = 1.0
            assert rule_of(await proxy.exchange(b"CONNECT evil.example:443 HTTP/1.1\r\n\r\n")) == "network.egress.host"
            assert proxy.proxy.stats.limited == 2

    asyncio.run(scenario())


def test_the_run_may_open_only_its_connections(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with http_upstream() as upstream, running_proxy(tmp_path, limits=EgressLimits(connections=2)) as proxy:
            authority = f"mirror.internal:{upstream.port}"
            request = f"GET http://{authority}/ HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()
            answers = [await proxy.exchange(request) for _ in range(3)]
        assert [a[:12] for a in answers[:2]] == [b"HTTP/1.1 200"] * 2
        assert rule_of(answers[2]) == "network.egress.limit.connections"
        assert upstream.connections == 2

    asyncio.run(scenario())


def test_bytes_in_are_capped_per_run(tmp_path: Path) -> None:
    async def scenario() -> None:
        limits = EgressLimits(bytes_in=10_000)
        async with http_upstream(body=b"x" * 100_000) as upstream, running_proxy(tmp_path, limits=limits) as proxy:
            authority = f"mirror.internal:{upstream.port}"
            answer = await proxy.exchange(f"GET http://{authority}/ HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
            (record,) = await proxy.wait_records(1)
        assert len(answer) <= 10_000
        assert (record.ended, record.rule) == ("limit", "network.egress.limit.bytes-in")
        assert record.bytes_in <= 10_000
        assert proxy.proxy.stats.limited == 1

    asyncio.run(scenario())


def test_bytes_out_are_capped_per_run(tmp_path: Path) -> None:
    async def scenario() -> None:
        limits = EgressLimits(bytes_out=50_000)
        async with echo_upstream() as upstream, running_proxy(tmp_path, limits=limits) as proxy:
            _head, reader, writer = await proxy.connect(f"mirror.internal:{upstream.port}")
            writer.write(client_hello("mirror.internal") + b"y" * 100_000)
            with contextlib.suppress(OSError):
                await writer.drain()
                await asyncio.wait_for(reader.read(), GUARD)
            writer.close()
            (record,) = await proxy.wait_records(1)
        assert (record.ended, record.rule) == ("limit", "network.egress.limit.bytes-out")
        assert record.bytes_out <= 50_000
        assert len(upstream.received) <= 50_000

    asyncio.run(scenario())


def test_every_connection_is_closed_when_the_run_ends(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with echo_upstream() as upstream, running_proxy(tmp_path) as proxy:
            _head, tunnel_reader, tunnel = await proxy.connect(f"mirror.internal:{upstream.port}")
            hello = client_hello("mirror.internal")
            tunnel.write(hello)
            await asyncio.wait_for(tunnel_reader.readexactly(len(hello)), GUARD)
            idle_reader, idle = await proxy.open()  # never sends its request head
            await proxy.proxy.close()
            assert await asyncio.wait_for(tunnel_reader.read(), GUARD) == b""
            assert await asyncio.wait_for(idle_reader.read(), GUARD) == b""
            tunnel.close()
            idle.close()
            records = await proxy.wait_records(2)
            with pytest.raises(FileNotFoundError):  # the socket file is gone with the run
                await proxy.open()
        assert sorted(r.ended for r in records) == ["run-ended", "run-ended"]
        tunnel_record = next(r for r in records if r.method == "CONNECT")
        assert tunnel_record.allowed
        assert tunnel_record.bytes_out == tunnel_record.bytes_in == len(hello)

    asyncio.run(scenario())


def test_a_plain_http_request_body_is_forwarded_exactly(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with http_upstream() as upstream, running_proxy(tmp_path) as proxy:
            authority = f"mirror.internal:{upstream.port}"
            body = b"name=pkg&version=1"
            answer = await proxy.exchange(
                f"POST http://{authority}/upload HTTP/1.1\r\nHost: {authority}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            (record,) = await proxy.wait_records(1)
        assert answer.startswith(b"HTTP/1.1 200")
        assert bytes(upstream.received).endswith(b"\r\n\r\n" + body)
        assert record.allowed
        assert record.bytes_out == len(upstream.received)

    asyncio.run(scenario())


@contextlib.asynccontextmanager
async def sending_upstream(size: int | None) -> AsyncIterator[Upstream]:
    """Reads the ClientHello, then sends ``size`` bytes and closes (None: sends until the proxy closes)."""
    upstream = Upstream()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream.connections += 1
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            upstream.received += await reader.readexactly(len(client_hello("mirror.internal")))
            sent = 0
            while size is None or sent < size:
                chunk = b"z" * (65536 if size is None else min(65536, size - sent))
                writer.write(chunk)
                await writer.drain()
                sent += len(chunk)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        upstream.finished.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    async with server:
        yield upstream


KERNEL_COPY = pytest.mark.skipif(
    not splice.AVAILABLE, reason="exact to the byte with splice only: the copy through Python stops one read earlier"
)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@KERNEL_COPY
def test_a_tunnel_carries_bytes_in_exactly_to_the_limit(tmp_path: Path) -> None:
    async def scenario() -> None:
        limits = EgressLimits(bytes_in=100_001)
        async with sending_upstream(1_000_000) as upstream, running_proxy(tmp_path, limits=limits) as proxy:
            _head, reader, writer = await proxy.connect(f"mirror.internal:{upstream.port}")
            writer.write(client_hello("mirror.internal"))
            received = await asyncio.wait_for(reader.read(), GUARD)
            writer.close()
            (record,) = await proxy.wait_records(1)
        assert len(received) == record.bytes_in == proxy.proxy.stats.bytes_in == 100_001
        assert (record.ended, record.rule, record.allowed) == ("limit", "network.egress.limit.bytes-in", True)
        assert proxy.proxy.stats.limited == 1

    asyncio.run(scenario())


@KERNEL_COPY
def test_a_tunnel_carries_bytes_out_exactly_to_the_limit(tmp_path: Path) -> None:
    async def scenario() -> None:
        limits = EgressLimits(bytes_out=200_000)
        async with echo_upstream() as upstream, running_proxy(tmp_path, limits=limits) as proxy:
            _head, reader, writer = await proxy.connect(f"mirror.internal:{upstream.port}")
            hello = client_hello("mirror.internal")
            writer.write(hello)
            await asyncio.wait_for(reader.readexactly(len(hello)), GUARD)  # the tunnel copies on its own now
            writer.write(b"y" * 1_000_000)
            with contextlib.suppress(OSError):
                await writer.drain()
                await asyncio.wait_for(reader.read(), GUARD)
            writer.close()
            (record,) = await proxy.wait_records(1)
        assert len(upstream.received) == record.bytes_out == 200_000
        assert (record.ended, record.rule) == ("limit", "network.egress.limit.bytes-out")

    asyncio.run(scenario())


def test_a_tunnel_passes_the_clients_end_upstream_and_the_answer_back(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with echo_upstream() as upstream, running_proxy(tmp_path) as proxy:
            _head, reader, writer = await proxy.connect(f"mirror.internal:{upstream.port}")
            sent = client_hello("mirror.internal") + os.urandom(3_000_000)
            writer.write(sent)
            writer.write_eof()  # the echo answers everything, then closes on seeing the client's end
            received = await asyncio.wait_for(reader.read(), GUARD)
            writer.close()
            (record,) = await proxy.wait_records(1)
        assert received == bytes(upstream.received) == sent
        assert (record.ended, record.bytes_out, record.bytes_in) == ("closed", len(sent), len(sent))

    asyncio.run(scenario())


def test_a_tunnel_ends_closed_when_the_upstream_ends(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sending_upstream(2_000_000) as upstream, running_proxy(tmp_path) as proxy:
            _head, reader, writer = await proxy.connect(f"mirror.internal:{upstream.port}")
            writer.write(client_hello("mirror.internal"))
            received = await asyncio.wait_for(reader.read(), GUARD)  # the client itself never ends its side
            (record,) = await proxy.wait_records(1)
            writer.close()
        assert received == b"z" * 2_000_000
        assert (record.ended, record.bytes_in) == ("closed", 2_000_000)

    asyncio.run(scenario())


def test_a_run_ending_mid_transfer_leaves_no_descriptor_open(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with sending_upstream(None) as upstream:
            before = open_fds()
            async with running_proxy(tmp_path) as proxy:
                _head, reader, writer = await proxy.connect(f"mirror.internal:{upstream.port}")
                writer.write(client_hello("mirror.internal"))
                await asyncio.wait_for(reader.readexactly(1_000_000), GUARD)  # the copy runs; then it stalls
                await proxy.proxy.close()
                (record,) = await proxy.wait_records(1)
                writer.close()
                await writer.wait_closed()
                await asyncio.wait_for(upstream.finished.wait(), GUARD)
            assert open_fds() == before
        assert (record.ended, record.allowed) == ("run-ended", True)
        assert record.bytes_in >= 1_000_000

    asyncio.run(scenario())

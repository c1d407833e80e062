"""The egress proxy sets a secret's header on plain-HTTP requests to its hosts only; the sandbox cannot choose it.

Upstreams are servers on 127.0.0.1 started by the tests; names resolve through a table (nothing outside loopback).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.egress import ConnectionRecord, Destination, EgressHost, EgressLimits, EgressPlan, EgressProxy, EgressRules
from gateway.egress.secrets import Injection, SecretRule
from tests.egress_support import TableResolver

VALUE = "s3cr3t-0123456789abcdef"
INJECTION = Injection("mirror-token", "Authorization", f"Bearer {VALUE}")
GUARD = 10.0  # a guard against a hung test, never a timing assert
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"),)


@dataclass
class Recorder:
    """An HTTP server on 127.0.0.1 that keeps each request head and answers with ``answer``."""

    answer: bytes = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    port: int = 0
    heads: list[bytes] = field(default_factory=list)


@contextlib.asynccontextmanager
async def recorder(answer: bytes | None = None) -> AsyncIterator[Recorder]:
    upstream = Recorder() if answer is None else Recorder(answer)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            upstream.heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(upstream.answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    async with server:
        yield upstream


@contextlib.asynccontextmanager
async def proxy_with_secret(tmp_path: Path) -> AsyncIterator[tuple[Path, list[ConnectionRecord]]]:
    """A proxy allowing mirror.internal (with the secret) and other.internal (without), both on loopback."""
    records: list[ConnectionRecord] = []
    ports = tuple(range(1024, 65536))
    proxy = EgressProxy(
        EgressRules([Destination(host, ports, LOOPBACK) for host in ("mirror.internal", "other.internal")]),
        on_record=records.append,
        resolver=TableResolver({"mirror.internal": [["127.0.0.1"]], "other.internal": [["127.0.0.1"]]}),
        clock=lambda: 0.0,
        injections={"mirror.internal": INJECTION},
    )
    path = tmp_path / "egress.sock"
    await proxy.start(path)
    try:
        yield path, records
    finally:
        await proxy.close()


async def get(path: Path, url: str, authority: str, *extra: str) -> bytes:
    """A plain-HTTP GET through the proxy; everything it answers."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    lines = [f"GET {url} HTTP/1.1", f"Host: {authority}", *extra]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    answer = await asyncio.wait_for(reader.read(), GUARD)
    writer.close()
    return answer


def authorizations(head: bytes) -> list[str]:
    lines = head.decode().split("\r\n")
    return [line for line in lines if line.lower().startswith("authorization:")]


def test_the_secret_replaces_whatever_authorization_the_sandbox_sent(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with recorder() as upstream, proxy_with_secret(tmp_path) as (path, records):
            authority = f"mirror.internal:{upstream.port}"
            chosen = ("authorization: Bearer chosen-by-sandbox", "AUTHORIZATION: Basic b3RoZXI=")
            answer = await get(path, f"http://{authority}/simple/", authority, *chosen)
        assert answer.startswith(b"HTTP/1.1 200")
        (head,) = upstream.heads
        assert authorizations(head) == [f"Authorization: Bearer {VALUE}"]
        (record,) = records
        assert (record.allowed, record.secret) == (True, "mirror-token")
        assert VALUE not in repr(record)

    asyncio.run(scenario())


def test_a_host_without_the_rule_gets_no_header(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with recorder() as upstream, proxy_with_secret(tmp_path) as (path, records):
            authority = f"other.internal:{upstream.port}"
            answer = await get(path, f"http://{authority}/", authority, "Accept: */*")
        assert answer.startswith(b"HTTP/1.1 200")
        (head,) = upstream.heads
        assert authorizations(head) == []
        assert VALUE.encode() not in head
        assert records[0].secret is None

    asyncio.run(scenario())


def test_a_redirect_is_passed_back_and_its_follow_up_carries_no_secret(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with recorder() as other, proxy_with_secret(tmp_path) as (path, records):
            target = f"http://other.internal:{other.port}/landing"
            moved = f"HTTP/1.1 302 Found\r\nLocation: {target}\r\nContent-Length: 0\r\n\r\n".encode()
            async with recorder(moved) as mirror:
                authority = f"mirror.internal:{mirror.port}"
                answer = await get(path, f"http://{authority}/start", authority)
                assert answer == moved  # as the upstream sent it: the proxy follows nothing
                assert other.heads == []
                followed = await get(path, target, f"other.internal:{other.port}")
        assert followed.startswith(b"HTTP/1.1 200")
        assert authorizations(mirror.heads[0]) == [f"Authorization: Bearer {VALUE}"]
        (head,) = other.heads
        assert VALUE.encode() not in head
        assert authorizations(head) == []
        assert [r.secret for r in records] == ["mirror-token", None]

    asyncio.run(scenario())


def test_the_host_spelled_otherwise_still_gets_the_secret(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with recorder() as upstream, proxy_with_secret(tmp_path) as (path, _records):
            authority = f"Mirror.Internal.:{upstream.port}"
            answer = await get(path, f"http://{authority}/", authority)
        assert answer.startswith(b"HTTP/1.1 200")
        assert authorizations(upstream.heads[0]) == [f"Authorization: Bearer {VALUE}"]

    asyncio.run(scenario())


def test_a_plan_without_its_secrets_values_opens_no_proxy_and_leaves_no_directory(short_dir: Path) -> None:
    root = short_dir / "egress"
    host = EgressHost(root)
    plan = EgressPlan(
        (Destination("mirror.internal", (80,), LOOPBACK),),
        EgressLimits(),
        (SecretRule("mirror-token", ("mirror.internal",)),),
    )
    try:
        with pytest.raises(KeyError):
            host.open(plan, uid=os.getuid(), gid=os.getgid())
        assert not root.exists() or list(root.iterdir()) == []
        run = host.open(dataclasses.replace(plan, values={"mirror-token": VALUE}), uid=os.getuid(), gid=os.getgid())
        assert VALUE.encode() not in b"".join(p.name.encode() for p in run.directory.iterdir())
        run.close()
    finally:
        host.close()

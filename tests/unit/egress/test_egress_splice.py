"""The kernel copy between two sockets (`gateway.egress.splice.copy`), on loopback TCP sockets the tests open."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Iterator

import pytest

from gateway.egress import splice

pytestmark = pytest.mark.skipif(not splice.AVAILABLE, reason="os.splice exists on Linux only")
GUARD = 10.0  # a guard against a hung test, never a timing assert


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two connected non-blocking loopback TCP sockets (what a tunnel's upstream is)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        near = socket.create_connection(listener.getsockname())
        far, _address = listener.accept()
    for sock in (near, far):
        sock.setblocking(False)
    return near, far


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


class Copy:
    """``writer`` → ``source`` → copy → ``sink`` → ``reader``, with a budget the test sets; ``moved`` adds up."""

    def __init__(self, budget: int) -> None:
        self.writer, self.source = tcp_pair()
        self.sink, self.reader = tcp_pair()
        self.budget = budget
        self.moved = 0
        self.moving = asyncio.Event()

    def take(self, size: int) -> None:
        self.moved += size
        self.budget -= size
        self.moving.set()

    def run(self) -> asyncio.Task[bool]:
        return asyncio.ensure_future(splice.copy(self.source, self.sink, lambda: self.budget, self.take))

    def sockets(self) -> Iterator[socket.socket]:
        yield from (self.writer, self.source, self.sink, self.reader)

    def close(self) -> None:
        for sock in self.sockets():
            sock.close()


async def send_all(sock: socket.socket, data: bytes) -> None:
    await asyncio.get_running_loop().sock_sendall(sock, data)


async def receive_until_eof(sock: socket.socket) -> bytes:
    received = bytearray()
    while chunk := await asyncio.wait_for(asyncio.get_running_loop().sock_recv(sock, 1 << 20), GUARD):
        received += chunk
    return bytes(received)


def test_the_copy_carries_every_byte_until_the_source_ends() -> None:
    async def scenario() -> None:
        copy = Copy(budget=1 << 30)
        data = os.urandom(3 * 1024 * 1024)
        task = copy.run()
        await send_all(copy.writer, data)
        copy.writer.shutdown(socket.SHUT_WR)
        assert await asyncio.wait_for(task, GUARD) is True
        copy.sink.shutdown(socket.SHUT_WR)
        assert await receive_until_eof(copy.reader) == data
        assert copy.moved == len(data)
        copy.close()

    asyncio.run(scenario())


def test_the_copy_stops_exactly_at_its_budget_when_more_waits() -> None:
    async def scenario() -> None:
        copy = Copy(budget=100_003)
        task = copy.run()
        await send_all(copy.writer, b"x" * 300_000)
        assert await asyncio.wait_for(task, GUARD) is False
        copy.sink.shutdown(socket.SHUT_WR)
        assert len(await receive_until_eof(copy.reader)) == copy.moved == 100_003
        copy.close()

    asyncio.run(scenario())


def test_a_source_ending_exactly_at_the_budget_ends_without_a_limit() -> None:
    async def scenario() -> None:
        copy = Copy(budget=70_000)
        task = copy.run()
        await send_all(copy.writer, b"x" * 70_000)
        copy.writer.shutdown(socket.SHUT_WR)
        assert await asyncio.wait_for(task, GUARD) is True
        assert copy.moved == 70_000
        copy.close()

    asyncio.run(scenario())


def test_a_copy_cancelled_mid_transfer_closes_its_pipe_and_stops_watching() -> None:
    async def scenario() -> None:
        copy = Copy(budget=1 << 30)
        before = open_fds()
        task = copy.run()
        writing = asyncio.ensure_future(send_all(copy.writer, b"x" * (16 * 1024 * 1024)))  # the reader never reads
        await asyncio.wait_for(copy.moving.wait(), GUARD)
        assert open_fds() - before, "the copy holds its pipe while it runs"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        writing.cancel()
        assert open_fds() == before
        loop = asyncio.get_running_loop()
        for sock in copy.sockets():  # nothing is left watching them: the loop may hand them to new watchers
            loop.add_reader(sock.fileno(), lambda: None)
            assert loop.remove_reader(sock.fileno())
        copy.close()

    asyncio.run(scenario())


def test_a_failing_sink_raises_and_closes_the_pipe() -> None:
    async def scenario() -> None:
        copy = Copy(budget=1 << 30)
        copy.reader.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        copy.reader.close()  # with a zero linger, a reset: the sink's writes fail
        before = open_fds()
        task = copy.run()
        writing = asyncio.ensure_future(send_all(copy.writer, b"x" * (16 * 1024 * 1024)))
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            await asyncio.wait_for(task, GUARD)
        writing.cancel()
        assert open_fds() == before
        copy.close()

    asyncio.run(scenario())

"""Copies bytes from one socket to another inside the kernel (Linux ``splice`` through a pipe), on the event loop.

The proxy uses it for a tunnel once its ClientHello passed the checks: from then on the bytes are opaque, so they need
not enter the proxy's memory at all (it costs the proxy about half the CPU per GB of copying them through Python).

The copy waits for its sockets with the loop's ``add_reader``/``add_writer``; both sockets must be non-blocking and
owned by no asyncio transport. `AVAILABLE` is false where ``os.splice`` does not exist (every platform but Linux).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable

__all__ = ["AVAILABLE", "copy"]

AVAILABLE = hasattr(os, "splice")
"""Whether this platform has ``os.splice``; without it the proxy copies tunnels through Python."""
STEP_BYTES = 256 * 1024
"""The most one ``splice`` asks of the source; the pipe's capacity (64 KiB unless the system says otherwise) bounds
what it takes. (A 256 KiB pipe saved a further sixth of the CPU per GB, not worth the pipe memory it pins.)"""


async def copy(
    source: socket.socket, sink: socket.socket, budget: Callable[[], int], moved: Callable[[int], None]
) -> bool:
    """Copies ``source`` to ``sink`` until the source ends (True), or until more bytes wait than ``budget()`` allows.

    Every step takes at most ``budget()`` bytes and reports their number to ``moved`` before they go on to ``sink``.
    When the budget is 0 and a byte still waits at the source, it returns False, having taken nothing more.
    Raises `OSError` when either socket fails; the pipe is closed however it ends.
    """
    loop = asyncio.get_running_loop()
    flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
    readable = _Readiness(loop)
    pipe_out, pipe_in = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    # The source stays watched for the whole copy, as asyncio's own transports watch theirs, except while the sink is
    # full (the source would wake the loop in vain); a wait for it then costs no system call.
    loop.add_reader(source.fileno(), readable.wake)
    try:
        while True:
            allowed = budget()
            try:
                if allowed <= 0:
                    return not source.recv(1, socket.MSG_PEEK)
                taken = os.splice(source.fileno(), pipe_in, min(allowed, STEP_BYTES), flags=flags)
            except BlockingIOError:
                await readable.wait()
                continue
            if taken == 0:
                return True
            moved(taken)
            while taken:
                try:
                    taken -= os.splice(pipe_out, sink.fileno(), taken, flags=flags)
                except BlockingIOError:
                    loop.remove_reader(source.fileno())
                    await _writable(loop, sink)
                    loop.add_reader(source.fileno(), readable.wake)
    finally:
        loop.remove_reader(source.fileno())
        os.close(pipe_out)
        os.close(pipe_in)


class _Readiness:
    """Wakes the copy waiting for its source; the loop calls `wake` whenever the source is readable."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None

    async def wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


async def _writable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Waits until ``sock`` can take more bytes."""
    ready = loop.create_future()
    loop.add_writer(sock.fileno(), _wake, ready)
    try:
        await ready
    finally:
        loop.remove_writer(sock.fileno())


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():  # cancelled meanwhile
        ready.set_result(None)

"""Reading one run's output from Docker's multiplexed attach stream: the supervisor's frames on stdout go to
the frame decoder and ``take_frame`` (``gateway.runner.frames``), anything on stderr is kept as diagnostics.

:class:`~gateway.runner.docker.runner.DockerRunner` drives it; it is unit-tested without an engine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from gateway.runner.frames import Collected, FrameDecoder, read_timeout, take_frame
from gateway.runner.interface import OnOutput, RunSpec

__all__ = ["Demux", "read_frames"]

_RECV = 1 << 16
_DIAG_BYTES = 4096
_MUX_HEADER = 8


class Demux:
    """Docker's multiplexed attach stream (each part: an 8-byte header with the stream number and the part's
    length, then the part) split back into ``(stream, bytes)`` parts; it keeps its place across chunks, so a
    kernel's stream can be read cell after cell."""

    def __init__(self) -> None:
        self._header = bytearray()
        self._stream = 0
        self._left = 0

    def feed(self, chunk: bytes) -> Iterator[tuple[int, bytes]]:
        view = memoryview(chunk)
        while view:
            if self._left == 0:
                need = _MUX_HEADER - len(self._header)
                self._header += view[:need]
                view = view[need:]
                if len(self._header) < _MUX_HEADER:
                    return
                self._stream = self._header[0]
                self._left = int.from_bytes(self._header[4:8], "big")
                self._header.clear()
                continue
            part = bytes(view[: self._left])
            view = view[len(part) :]
            self._left -= len(part)
            yield self._stream, part


def read_frames(
    sock: Any, decoder: FrameDecoder, got: Collected, spec: RunSpec, deadline: float, *,
    on_output: OnOutput | None = None, cancel: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> bool:  # fmt: skip
    """Read until the final frame or EOF. Returns True when the container must be killed.

    ``on_output`` gets every verified stdout/stderr chunk as it arrives (see :func:`take_frame`). ``cancel`` is
    checked before every read, and each read then waits at most ``CANCEL_POLL_S``: once it is set, the reading
    stops (``got.cancelled``) and the caller kills the container. Without ``cancel`` a read waits up to the
    deadline, as it always did. ``deadline`` is a time on ``clock``."""
    demux = Demux()
    while True:
        timeout = read_timeout(got, deadline, cancel, clock)
        if timeout is None:
            return True
        sock.settimeout(timeout)
        if cancel is None:
            chunk = sock.recv(_RECV)
        else:
            try:
                chunk = sock.recv(_RECV)
            except TimeoutError:
                continue  # the loop checks the cancel event and the deadline again
        if not chunk:
            return False
        for stream, part in demux.feed(chunk):
            if stream == 1:
                for frame in decoder.feed(part):
                    if take_frame(frame.kind, frame.data, got, spec, on_output):
                        return True
                    if decoder.finished:
                        return False
            elif len(got.diagnostics) < _DIAG_BYTES:
                got.diagnostics += part[: _DIAG_BYTES - len(got.diagnostics)]

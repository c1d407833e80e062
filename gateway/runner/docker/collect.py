"""Reading one run's output from Docker's multiplexed attach stream: the supervisor's frames on stdout go to
the frame decoder and ``take_frame`` (``gateway.runner.frames``), anything on stderr is kept as diagnostics.

:class:`~gateway.runner.docker.runner.DockerRunner` drives it; it is unit-tested without an engine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gateway.runner.frames import Collected, FrameDecoder, read_timeout, take_frame
from gateway.runner.interface import OnOutput, RunSpec

__all__ = ["read_frames"]

_RECV = 1 << 16
_DIAG_BYTES = 4096
_MUX_HEADER = 8


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
    header = bytearray()
    stream = 0
    left = 0
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
        view = memoryview(chunk)
        while view:
            if left == 0:
                need = _MUX_HEADER - len(header)
                header += view[:need]
                view = view[need:]
                if len(header) < _MUX_HEADER:
                    break
                stream = header[0]
                left = int.from_bytes(header[4:8], "big")
                header.clear()
                continue
            part = bytes(view[:left])
            view = view[len(part) :]
            left -= len(part)
            if stream == 1:
                for frame in decoder.feed(part):
                    if take_frame(frame.kind, frame.data, got, spec, on_output):
                        return True
                    if decoder.finished:
                        return False
            elif len(got.diagnostics) < _DIAG_BYTES:
                got.diagnostics += part[: _DIAG_BYTES - len(got.diagnostics)]

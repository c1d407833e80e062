"""What the audit tests share: a trail's I/O that counts what the tests of batched writes watch (locks taken and
fsyncs, or fails them), and a ``network.connection`` record's data."""

from __future__ import annotations

import errno
import fcntl
import os
from typing import Any

from gateway.audit.segments import AuditIO


class CountingIO(AuditIO):
    """The real I/O, counting exclusive locks and fsyncs; ``fail_fsync``: every fsync fails with EIO."""

    def __init__(self, *, fail_fsync: bool = False) -> None:
        self.fsyncs = 0
        self.locks = 0
        self.fail_fsync = fail_fsync

    def flock(self, fd: int, operation: int) -> None:
        self.locks += operation == fcntl.LOCK_EX
        super().flock(fd, operation)

    def fsync(self, fd: int) -> None:
        if self.fail_fsync:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        self.fsyncs += 1
        super().fsync(fd)


CONNECTION: dict[str, Any] = {
    "host": "mirror.internal",
    "port": 18443,
    "address": "127.0.0.1",
    "method": "CONNECT",
    "decision": "allowed",
    "rule": "network.egress.allowed",
    "bytes_out": 517,
    "bytes_in": 4096,
    "duration_ms": 50,
    "ended": "closed",
}
"""A ``network.connection`` record's data without its caller: a tunnel to the mirror, allowed, closed by the run."""

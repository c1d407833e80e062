"""A trail's I/O that counts what the tests of batched writes watch: locks taken and fsyncs (or fails them)."""

from __future__ import annotations

import errno
import fcntl
import os

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

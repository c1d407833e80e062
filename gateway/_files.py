"""Files that appear whole: written under a temporary name in their own directory, then renamed into place.

Reports, OCSF exports, anchors, SBOMs and the principals file are written this way, so that a reader never
sees half a file under its name and a write that fails leaves the old file (or nothing) there. A failure
of the file itself is an :class:`OSError` naming the file asked for, never the temporary one.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["output_file", "whole_file"]


def _naming(exc: OSError, path: Path) -> OSError:
    """``exc`` as an error about ``path`` (the temporary file's name means nothing to whoever asked)."""
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


@contextlib.contextmanager
def whole_file(path: str | Path, *, sync: bool = False, mode: int = 0o644) -> Iterator[BinaryIO]:
    """A file written in the block and renamed onto ``path`` when it ends (with ``mode``); a block that raises
    leaves nothing. ``sync``: the file, then the rename (its directory), made durable before the block is done.
    Errors of the block itself pass through as they are."""
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise _naming(exc, target) from exc
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as fh:
            yield fh
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        try:
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except OSError as exc:
            raise _naming(exc, target) from exc
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync:
        try:
            dir_fd = os.open(target.parent, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise _naming(exc, target.parent) from exc


@contextlib.contextmanager
def output_file(target: str, *, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Where a command writes its result (``-o``): ``-`` is stdout; an existing file that is not a regular one
    (``/dev/null``, a FIFO, a terminal) is written as it is; anything else is a :func:`whole_file` with
    ``mode``."""
    if target == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    path = Path(target)
    if path.exists() and not path.is_file():
        with path.open("wb", buffering=1 << 20) as fh:
            yield fh
        return
    with whole_file(path, mode=mode) as fh:
        yield fh

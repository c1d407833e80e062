"""Host directories below an allowlisted root, opened so that only what was judged can ever be used.

A path string is judged once and resolved again later by whoever uses it: anything that swaps a component
for a symlink in between (a host process, or a sandbox with an ``rw`` mount above it) changes what the
string means. So a mount source is never passed on as a string. :func:`open_beneath` opens it from the
allowlisted root with ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
RESOLVE_NO_XDEV)``: no symlink anywhere on the way, never above the root, never across a mount point. The
open file descriptor *is* the judged directory; its device and inode (:class:`Identity`) go into the decision,
and a backend binds that descriptor (not the path) and checks the identity again.

:func:`scan` walks what a bind would expose (bounded, through file descriptors, never following a symlink)
and reports sockets, device nodes, FIFOs and mount points below the source. Backend-neutral: the decision
uses it to judge, the Docker backend to stage.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "RESOLVE_NO_LINKS",
    "RESOLVE_STRICT",
    "SCAN_MAX_DEPTH",
    "SCAN_MAX_ENTRIES",
    "HostPathError",
    "Identity",
    "file_system_of",
    "identity_of",
    "mount_points_below",
    "open_beneath",
    "openat2",
    "scan",
]

SCAN_MAX_ENTRIES = 20_000
"""At most this many directory entries are checked below a mount source; a larger source is refused."""
SCAN_MAX_DEPTH = 32
"""At most this many directory levels below a mount source; a deeper one is refused."""

_SYS_OPENAT2 = 437  # the same number on every architecture (the unified syscall table)
_RESOLVE_NO_XDEV = 0x01
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_AT_FDCWD = -100
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


class HostPathError(Exception):
    """A mount source that cannot be opened safely; the message says what and why."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Which directory, whatever its name: the device and inode numbers of an open directory."""

    device: int
    inode: int


def identity_of(fd: int) -> Identity:
    st = os.fstat(fd)
    return Identity(st.st_dev, st.st_ino)


RESOLVE_NO_LINKS = _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
"""No symlink anywhere on the way (magic links included)."""
RESOLVE_STRICT = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_XDEV
"""Below the directory, no symlink on the way (magic links included), never across a mount point."""


def _openat2(dirfd: int, path: str, resolve: int) -> int:
    return openat2(dirfd, path, _DIR_FLAGS, resolve=resolve)


def openat2(dirfd: int, path: str, flags: int, *, mode: int = 0, resolve: int = RESOLVE_STRICT) -> int:
    """``openat2(2)``: ``path`` opened from ``dirfd`` with ``flags`` and the ``RESOLVE_*`` bits of ``resolve``
    (default :data:`RESOLVE_STRICT`). Raises :class:`OSError`; the caller closes the descriptor."""
    libc = ctypes.CDLL(None, use_errno=True)
    how = _OpenHow(flags, mode, resolve)
    fd = libc.syscall(
        ctypes.c_long(_SYS_OPENAT2),
        ctypes.c_int(dirfd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return int(fd)


_WHY = {
    errno.ELOOP: "a component is a symlink (it changed after it was resolved, or points elsewhere)",
    errno.EXDEV: "the path leaves the allowlisted root or crosses a mount point",
    errno.ENOENT: "it does not exist",
    errno.ENOTDIR: "it, or a component of it, is not a directory (or was just replaced by a symlink)",
    errno.EACCES: "permission denied",
    errno.ENOSYS: "the kernel has no openat2 (Linux 5.6 or later is required for mounts)",
}


def open_beneath(root: str, path: str) -> int:
    """An ``O_RDONLY | O_DIRECTORY`` descriptor of ``path`` (absolute, symlink-free) resolved from ``root``.

    Raises :class:`HostPathError` unless ``path`` is ``root`` or lies below it, and every component from the
    root on is a real directory on the root's mount (no symlink, no mount point crossed). The caller closes
    the descriptor.
    """
    rel = os.path.relpath(path, root)
    if rel == ".." or rel.startswith("../") or os.path.isabs(rel):
        raise HostPathError(f"{path} is not inside the allowlisted root {root}")
    try:
        root_fd = _openat2(_AT_FDCWD, root, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    except OSError as exc:
        why = _WHY.get(exc.errno or 0, exc.strerror)
        raise HostPathError(f"the allowlisted root {root} cannot be opened: {why}") from exc
    try:
        return _openat2(
            root_fd, rel, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_XDEV
        )
    except OSError as exc:
        why = _WHY.get(exc.errno or 0, exc.strerror)
        raise HostPathError(f"mount source {path} cannot be opened below {root}: {why}") from exc
    finally:
        os.close(root_fd)


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points_below(path: str, *, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Mount points strictly below ``path`` in this process's mount namespace."""
    prefix = path.rstrip("/") + "/"
    found = []
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split(" ")
            if len(fields) > 4:
                point = _unescape(fields[4])
                if point.startswith(prefix):
                    found.append(point)
    return sorted(found)


def file_system_of(path: str, *, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The type (``ext4``, ``tmpfs``, ...) of the file system holding ``path`` (its nearest existing ancestor:
    ``path`` need not exist yet), as this process's mount namespace has it; ``""`` when no mount holds it."""
    target = os.path.realpath(path)
    best, kind = "", ""
    with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            head, sep, tail = line.partition(" - ")
            fields = head.split(" ")
            if not sep or len(fields) <= 4:
                continue
            point = _unescape(fields[4])
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):  # the later of two mounts at one point is on top
                best, kind = point, tail.split(" ")[0]
    return kind


def _kind(mode: int) -> str | None:
    if stat.S_ISSOCK(mode):
        return "a unix socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return None


def _walk(fd: int, where: str, device: int, depth: int, budget: list[int]) -> Iterator[str]:
    with os.scandir(fd) as entries:
        names = [e.name for e in entries]
    for name in names:
        budget[0] -= 1
        if budget[0] < 0:
            yield (
                f"the mount source holds more than {budget[1]} entries (seen at {where}); every entry below a "
                "mount source is checked for sockets and mount points before it is bound, so mount a narrower "
                "directory"
            )
            return
        shown = f"{where}/{name}"
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while we looked: nothing to expose
        kind = _kind(st.st_mode)
        if kind is not None:
            yield f"{shown} is {kind}; a mount source may hold only directories, regular files and symlinks"
            return
        if not stat.S_ISDIR(st.st_mode):
            continue
        if st.st_dev != device:
            yield f"{shown} is a mount point; a mount source may not have mount points below it"
            return
        if depth >= SCAN_MAX_DEPTH:
            yield f"{shown} is more than {SCAN_MAX_DEPTH} levels deep; mount a narrower directory"
            return
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                continue  # replaced while we looked; the bind exposes the descriptor's tree, checked below
            yield f"{shown} cannot be checked ({exc.strerror})"
            return
        try:
            problem = next(_walk(child, shown, device, depth + 1, budget), None)
        finally:
            os.close(child)
        if problem is not None:
            yield problem
            return


def scan(fd: int, path: str, *, max_entries: int = SCAN_MAX_ENTRIES) -> str | None:
    """Why the directory open as ``fd`` (shown as ``path``) may not be bound, or None.

    Refused: a unix socket, device node or FIFO anywhere below it (a listening socket would answer the
    sandbox, even on a read-only mount), a mount point below it (by ``mountinfo`` and by a device change
    during the walk), more than :data:`SCAN_MAX_ENTRIES` entries or :data:`SCAN_MAX_DEPTH` levels.
    """
    points = mount_points_below(path)
    if points:
        return f"{points[0]} is a mount point below {path}; a mount source may not have mount points below it"
    budget = [max_entries, max_entries]
    return next(_walk(fd, path, os.fstat(fd).st_dev, 1, budget), None)

"""Host-wide execution slots: a bound on concurrent sandboxes shared by every gateway process on the host.

Each request is limited by its policy, but nothing per request stops thirty hostile runs in parallel from
starving the host. :class:`HostSlots` is a counting semaphore made of ``count`` lock files in one directory:
a run holds an exclusive ``flock`` on one of them for as long as its sandbox exists. ``flock`` locks belong to
the open file, so a gateway that is killed (even with SIGKILL) frees its slot the moment the kernel closes its
files: there is nothing to clean up and no stale count. Every gateway process on the host that uses the same
directory and count shares the bound (CLI runs, library users, the service).

When every slot is busy, ``acquire`` waits at most ``wait_s`` seconds, then raises
:class:`~gateway.errors.CapacityError` (nothing ran; the caller retries). While it waits, it says so to every
process on the host: it holds ``waiting.lock`` shared, and :meth:`HostSlots.wanted` sees that. A warm pool
(``gateway.runner.pool``) keeps its idle containers in slots too; when a run waits, it removes an idle one to
free its slot and refills nothing, so idle pooled containers never starve a live run, in any process.

:func:`instance_dead` says whether a gateway instance (``host-pid-random``) of this host is gone: its leftovers
(containers, workspaces) are then anyone's to reap.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from gateway.errors import CapacityError, GatewayError

__all__ = [
    "DEFAULT_SLOT_WAIT_S",
    "HostSlots",
    "Slot",
    "default_runtime_dir",
    "default_slot_count",
    "instance_dead",
]

DEFAULT_SLOT_WAIT_S = 30.0
"""How long a run waits for a free slot by default before it is refused."""
_N = TypeVar("_N", int, float)
_POLL_S = (0.01, 0.02, 0.05, 0.1, 0.2)
"""Back-off between attempts while every slot is busy (then every 0.2 s)."""
_WAITING = "waiting.lock"
"""Held shared by every run that waits for a slot, for as long as it waits (closed, even by SIGKILL: gone)."""
_PROBE = "probe.lock"
"""Taken exclusively for an instant around a probe of ``_WAITING``, so that two probes never see each other."""


def default_slot_count() -> int:
    """Two sandboxes per CPU core: enough to keep the host busy, few enough that a flood cannot starve it."""
    return max(2, 2 * (os.cpu_count() or 1))


def default_runtime_dir() -> Path:
    """Where host-wide runtime state lives: ``/run/agent-gateway`` for root, else under ``$XDG_RUNTIME_DIR``
    (or the temp directory) per user."""
    if os.geteuid() == 0:
        return Path("/run/agent-gateway")
    base = os.environ.get("XDG_RUNTIME_DIR") or os.environ.get("TMPDIR") or "/tmp"  # noqa: S108 - per-user dir below
    return Path(base) / f"agent-gateway-{os.geteuid()}"


def instance_dead(instance: str) -> bool:
    """True when ``instance`` (``host-pid-random``, as ``DockerRunner`` names itself) ran on this host in a
    process that no longer exists: its leftovers (containers, workspaces) are reaped. An instance of another
    host, or an id of another shape, is not known to be dead."""
    parts = instance.rsplit("-", 2)
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    pid = int(parts[1])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Slot:
    """One held slot, released exactly once (``release``, or the end of a ``with`` block).

    A warm pool holds one for each container it keeps ready and hands it to the request that claims the
    container, so a pooled container counts against the host's bound from its creation to its removal."""

    __slots__ = ("_fd", "index")

    def __init__(self, fd: int, index: int) -> None:
        self._fd: int | None = fd
        self.index = index

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the file releases the lock

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass(frozen=True)
class HostSlots:
    """``count`` execution slots in ``directory``, shared by every process that uses the same two values."""

    directory: Path
    count: int
    wait_s: float = DEFAULT_SLOT_WAIT_S

    def __post_init__(self) -> None:
        if self.count < 1:
            raise CapacityError(f"the host slot count must be at least 1, got {self.count}")
        if self.wait_s < 0:
            raise CapacityError(f"the slot wait must be >= 0 seconds, got {self.wait_s}")

    @classmethod
    def from_env(cls) -> HostSlots:
        """``GATEWAY_SLOTS`` (count), ``GATEWAY_SLOT_WAIT`` (seconds), ``GATEWAY_RUNTIME_DIR`` (directory)."""
        directory = os.environ.get("GATEWAY_RUNTIME_DIR")
        return cls(
            directory=(Path(directory) if directory else default_runtime_dir()) / "slots",
            count=_env_number("GATEWAY_SLOTS", int, default_slot_count()),
            wait_s=_env_number("GATEWAY_SLOT_WAIT", float, DEFAULT_SLOT_WAIT_S),
        )

    @contextlib.contextmanager
    def acquire(self) -> Iterator[int]:
        """Hold one slot for the duration of the block; yields its index."""
        with self.take() as slot:
            yield slot.index

    def take(self) -> Slot:
        """One slot, waiting at most ``wait_s`` (then :class:`CapacityError`); release it when done."""
        fd, index = self._take()
        return Slot(fd, index)

    def try_take(self) -> Slot | None:
        """One free slot now, or None when every slot is busy (never waits)."""
        self._prepare()
        for index in range(self.count):
            fd = self._try(index)
            if fd is not None:
                return Slot(fd, index)
        return None

    def wanted(self) -> bool:
        """Whether a run somewhere on the host waits for a slot now (a warm pool then frees one it holds idle).

        False while another process probes at the same instant: the caller asks again at its next poll."""
        self._prepare()
        probe = self._open(self.directory / _PROBE)
        try:
            if not _flock(probe, fcntl.LOCK_EX, self.directory / _PROBE):
                return False
            waiting = self._open(self.directory / _WAITING)
            try:
                return not _flock(waiting, fcntl.LOCK_EX, self.directory / _WAITING)
            finally:
                os.close(waiting)
        finally:
            os.close(probe)

    def _take(self) -> tuple[int, int]:
        self._prepare()
        give_up = time.monotonic() + self.wait_s
        attempt = 0
        waiting: int | None = None
        try:
            while True:
                for index in range(self.count):
                    fd = self._try(index)
                    if fd is not None:
                        return fd, index
                if time.monotonic() >= give_up:
                    raise CapacityError(
                        f"all {self.count} execution slots of this host ({self.directory}) stayed busy for "
                        f"{self.wait_s:g} s; nothing ran"
                    )
                if waiting is None:
                    waiting = self._open(self.directory / _WAITING)
                # Say that a run waits (again at every round: a probe may have held the file for an instant).
                _flock(waiting, fcntl.LOCK_SH, self.directory / _WAITING)
                time.sleep(_POLL_S[min(attempt, len(_POLL_S) - 1)])
                attempt += 1
        finally:
            if waiting is not None:
                os.close(waiting)

    def _prepare(self) -> None:
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise _unusable(self.directory, exc) from exc

    def _try(self, index: int) -> int | None:
        path = self.directory / f"slot-{index}.lock"
        fd = self._open(path)
        try:
            if _flock(fd, fcntl.LOCK_EX, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return None

    def _open(self, path: Path) -> int:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise _unusable(path, exc) from exc


def _flock(fd: int, operation: int, path: Path) -> bool:
    """Take the lock ``operation`` on ``fd`` without waiting; False when another open file holds it."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise _unusable(path, exc) from exc
    return True


def _unusable(path: Path, exc: OSError) -> GatewayError:
    return CapacityError(
        f"the host's execution slots cannot be used ({path}: {exc.strerror or exc}); nothing ran",
        hint="make GATEWAY_RUNTIME_DIR (default /run/agent-gateway) a writable directory of the gateway's user",
    )


def _env_number(name: str, kind: Callable[[str], _N], default: _N) -> _N:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise CapacityError(
            f"{name}={raw!r} is not a valid {'integer' if kind is int else 'number'}",
            hint=f"set {name} to a positive {'integer' if kind is int else 'number of seconds'} or unset it",
        ) from None
    return value

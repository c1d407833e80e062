"""Staged, non-recursive binds: the engine is only ever given a path the gateway owns, holding the judged inode.

Why: a host path handed to the engine is resolved again by the runtime at container start, following
whatever symlink is there by then (issue 14: a ``renameat2(RENAME_EXCHANGE)`` loop got the host root bound).
So, for each judged mount (:class:`~gateway.runner.interface.HostMount`), the runner:

1. opens the source below its allowlisted root with no symlink followed (``gateway.hostfs.open_beneath``)
   and refuses it unless its device and inode are the ones the decision judged;
2. scans it again through that descriptor (no socket, device node, FIFO or mount point below it; bounded);
3. binds *the descriptor* (``/proc/self/fd/N``, ``MS_BIND`` without ``MS_REC``: submounts never come along)
   at ``STAGING_ROOT/<decision id>/<index>`` (a private mount, mode 0700, owned by root), remounts it
   ``nosuid,nodev,noexec`` and read-only for ``ro``, and checks the staged root's identity and flags again.
   One mount alone may be staged without ``noexec`` (``HostMount.exec``): the packages tree, read-only at
   ``PACKAGES_TARGET`` (sealed by the gateway and hash-checked, its wheels' compiled extensions must load);
   exec on any other mount is refused;
4. gives the engine the staging path as a ``bind`` mount with ``BindOptions.NonRecursive``;
5. after start, before the payload is sent, checks the container really has the judged directory at each
   target, by device and inode, under runc and runsc alike (:meth:`Staging.verify`), and kills it otherwise;
6. unmounts and removes the staging directory once the container is removed (always); the reaper removes
   stale staging directories left by a crashed gateway.

Nothing but root can change what a staging path holds, so a swap anywhere in the host's tree after step 1
cannot change what is bound. Without the privilege to mount (not root, or no ``CAP_SYS_ADMIN`` in the
engine's mount namespace) a request with mounts fails closed: there is no fallback to binding the path.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import SandboxError
from gateway.hostfs import HostPathError, Identity, identity_of, open_beneath, scan
from gateway.policy.paths import denied_host_reason
from gateway.runner.interface import HostMount
from gateway.runner.supervisor import PACKAGES_TARGET

__all__ = [
    "STAGING_ROOT",
    "MountStagingError",
    "Staging",
    "engine_mounts",
    "reap_staging",
    "staging_path",
]

STAGING_ROOT = "/run/agent-gateway/staging"
"""Where judged directories are bound for the engine. Root-only; each run has ``<decision id>/<index>``."""

_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_REMOUNT = 0x20
_MS_BIND = 0x1000
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 0x2
_ST_RDONLY = 0x1
_ST_NOEXEC = 0x8
_DECISION_ID = re.compile(r"[0-9a-zA-Z_-]{1,64}")


class MountStagingError(SandboxError):
    """A judged mount could not be staged or verified; nothing ran with it."""


def staging_path(decision_id: str, index: int, *, root: str = STAGING_ROOT) -> str:
    if not _DECISION_ID.fullmatch(decision_id):
        raise ValueError(f"decision id {decision_id!r} cannot name a staging directory")
    return f"{root}/{decision_id}/{index}"


def engine_mounts(
    targets: Sequence[tuple[str, bool]], decision_id: str, *, root: str = STAGING_ROOT
) -> list[dict[str, Any]]:
    """The engine's ``Mounts`` for ``(target, read_only)`` pairs: non-recursive binds of the staging paths."""
    return [
        {
            "Type": "bind",
            "Source": staging_path(decision_id, index, root=root),
            "Target": target,
            "ReadOnly": read_only,
            "BindOptions": {"NonRecursive": True, "Propagation": "rprivate"},
        }
        for index, (target, read_only) in enumerate(targets)
    ]


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, flags: int) -> None:
    src = os.fsencode(source) if source is not None else None
    if _libc().mount(src, os.fsencode(target), None, ctypes.c_ulong(flags), None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), target)


def _umount(target: str) -> None:
    if _libc().umount2(os.fsencode(target), _MNT_DETACH) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), target)


def _is_mount_point(path: str) -> bool:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        return any(line.split(" ")[4] == path for line in f if line.count(" ") > 4)


def _privilege_error(exc: OSError, what: str) -> MountStagingError:
    return MountStagingError(
        f"cannot stage mounts ({what}: {exc.strerror}); requests with mounts need a gateway running as root in "
        "the Docker engine's mount namespace. Nothing was bound and nothing ran",
        hint="run the gateway as root on the engine's host, or remove the mounts from the request",
    )


def _check_owned_by_root(root: str) -> None:
    path = "/"
    for part in root.strip("/").split("/"):
        path = os.path.join(path, part)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise MountStagingError(
                f"staging directory {root} is unsafe: {path} is not a root-owned directory closed to others",
                hint=f"remove {path} or fix its owner and mode; the gateway recreates {root}",
            )


def _ensure_root(root: str) -> None:
    """Create ``root`` (0700, root-owned, every ancestor root-owned and not writable by others) as a private
    mount, so that binds below it propagate nowhere."""
    if os.geteuid() != 0:
        raise _privilege_error(PermissionError(1, "the gateway is not root"), "checking privileges")
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        _check_owned_by_root(root)
        os.chmod(root, 0o700)
        # One gateway process at a time turns the directory into a mount (two binds stacked by a race would
        # hide the first one's staged binds from the engine).
        lock = os.open(os.path.dirname(root), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _is_mount_point(root):
                _mount(root, root, _MS_BIND)
            _mount(None, root, _MS_PRIVATE)
        finally:
            os.close(lock)
    except MountStagingError:
        raise
    except OSError as exc:
        raise _privilege_error(exc, f"preparing {root}") from exc


@dataclass
class Staging:
    """The staged mounts of one run: bound by :meth:`stage`, checked by :meth:`verify`, undone by :meth:`remove`."""

    root: str
    decision_id: str
    mounts: tuple[HostMount, ...]
    staged: list[str] = field(default_factory=list)

    @property
    def directory(self) -> str:
        return f"{self.root}/{self.decision_id}"

    @classmethod
    def stage(cls, mounts: Sequence[HostMount], decision_id: str, *, root: str = STAGING_ROOT) -> Staging:
        """Bind every judged directory below ``root``; on any failure nothing stays bound."""
        for mount in mounts:
            if mount.exec and (mount.target != PACKAGES_TARGET or not mount.read_only):
                raise MountStagingError(
                    f"refusing to stage {mount.path} at {mount.target} without noexec: only the packages tree, "
                    f"read-only at {PACKAGES_TARGET}, may be; nothing was bound",
                    hint="this is a gateway bug: a mount other than the installer's asked for exec",
                )
        _ensure_root(root)
        staging_path(decision_id, 0, root=root)  # refuses a decision id that is not a plain name
        staging = cls(root, decision_id, tuple(mounts))
        try:
            os.mkdir(staging.directory, 0o700)
        except OSError as exc:
            raise MountStagingError(f"cannot create staging directory {staging.directory}: {exc.strerror}") from exc
        try:
            for index, mount in enumerate(mounts):
                try:
                    staging._bind(mount, staging_path(decision_id, index, root=root))
                except OSError as exc:
                    raise MountStagingError(f"staging mount source {mount.path} failed: {exc}; nothing ran") from exc
        except BaseException:
            staging.remove()
            raise
        return staging

    def _bind(self, m: HostMount, dst: str) -> None:
        judged = Identity(m.device, m.inode)
        denied = denied_host_reason(m.path)
        if denied is not None:  # the decision refused it already; a bug there must not bind it
            raise MountStagingError(f"refusing to stage {m.path}: {denied}")
        try:
            fd = open_beneath(m.root, m.path)
        except HostPathError as exc:
            raise MountStagingError(f"{exc}; it changed after the decision, so nothing was bound") from exc
        try:
            found = identity_of(fd)
            if found != judged:
                raise MountStagingError(
                    f"mount source {m.path} is no longer the directory that was judged (device/inode "
                    f"{found.device}/{found.inode}, judged {judged.device}/{judged.inode}); nothing was bound"
                )
            problem = scan(fd, m.path)
            if problem is not None:
                raise MountStagingError(f"mount source {m.path} changed after the decision: {problem}")
            os.mkdir(dst, 0o700)
            try:
                _mount(f"/proc/self/fd/{fd}", dst, _MS_BIND)
            except OSError as exc:
                os.rmdir(dst)
                raise _privilege_error(exc, f"binding {m.path}") from exc
            self.staged.append(dst)
            # Out of the source's peer group: nothing mounted on the host later propagates into the staged bind.
            _mount(None, dst, _MS_PRIVATE)
            flags = _MS_BIND | _MS_REMOUNT | _MS_NOSUID | _MS_NODEV | (_MS_RDONLY if m.read_only else 0)
            _mount(None, dst, flags | (0 if m.exec else _MS_NOEXEC))
        finally:
            os.close(fd)
        st = os.stat(dst)
        if Identity(st.st_dev, st.st_ino) != judged:
            raise MountStagingError(f"the staged bind of {m.path} at {dst} does not hold the judged directory")
        _check_flags(m, dst, "the staged bind of")

    def check_options(self, mounts: object) -> None:
        """The assembled ``mounts`` are exactly the staged binds, with ``ReadOnly`` matching each judged mode."""
        expected = engine_mounts([(m.target, m.read_only) for m in self.mounts], self.decision_id, root=self.root)
        if not isinstance(mounts, list) or mounts != expected:
            raise MountStagingError(
                "the assembled mounts are not the staged binds of the judged directories; nothing ran",
                hint="this is a gateway bug: the options were changed after the decision",
            )

    def verify(self, inspect: Mapping[str, Any], runtime: str) -> None:
        """After start, before the payload: the engine bound exactly the staging paths, each still holds the
        judged directory, and each target in the container's file system (runc: its init's root; runsc: the
        gofer's root, see :func:`_container_root`) is the judged directory, read-only when judged ``ro``, and
        ``noexec`` exactly when staged so (runsc; under runc the exec mount's lack of it only).
        Raises :class:`MountStagingError` otherwise (the runner then removes the container)."""
        got = sorted(
            (str(m.get("Source")), str(m.get("Destination")), bool(m.get("RW")), str(m.get("Type")))
            for m in inspect.get("Mounts") or []
        )
        want = sorted((f"{self.directory}/{i}", m.target, not m.read_only, "bind") for i, m in enumerate(self.mounts))
        if got != want:
            raise MountStagingError(f"the engine's mounts {got} are not the staged binds {want}")
        for i, m in enumerate(self.mounts):
            st = os.stat(f"{self.directory}/{i}")
            if (st.st_dev, st.st_ino) != (m.device, m.inode):
                raise MountStagingError(f"staging {self.directory}/{i} no longer holds the judged {m.path}")
            _check_flags(m, f"{self.directory}/{i}", "the staged bind of")
        pid = int((inspect.get("State") or {}).get("Pid") or 0)
        root = _container_root(pid, runtime, str(inspect.get("Id") or ""))
        for m in self.mounts:
            inside = f"{root}{m.target}"
            try:
                st = os.stat(inside)
                flags = os.statvfs(inside).f_flag
                ro = bool(flags & _ST_RDONLY)
            except OSError as exc:
                raise MountStagingError(f"cannot check {m.target} in the container: {exc.strerror}") from exc
            if (st.st_dev, st.st_ino) != (m.device, m.inode):
                raise MountStagingError(
                    f"{m.target} in the container is not the judged {m.path} (device/inode {st.st_dev}/"
                    f"{st.st_ino}, judged {m.device}/{m.inode}); the container was killed"
                )
            if m.read_only and not ro:
                raise MountStagingError(f"{m.target} in the container is writable but was judged ro")
            # The gofer serves the program's files with its mount's flags: noexec exactly where staged. runc 1.1
            # remounts a read-only bind without the staged nosuid,nodev,noexec (the engine cannot ask for them),
            # so under runc only the exec mount is checked: it must not be noexec, or its extensions cannot load.
            if (runtime == "runsc" or m.exec) and bool(flags & _ST_NOEXEC) == m.exec:
                state = "noexec" if m.exec else "not noexec"
                raise MountStagingError(f"{m.target} in the container is {state}, but was staged with exec={m.exec}")

    def remove(self) -> None:
        """Unmount every staged bind and remove the run's staging directory (idempotent). A directory that
        cannot be removed stays root-only and unused; the reaper retries it."""
        with contextlib.suppress(OSError):
            _remove_tree(self.directory)
        self.staged.clear()


def _check_flags(m: HostMount, path: str, what: str) -> None:
    """``path`` is read-only when ``m`` was judged ``ro``, and ``noexec`` unless ``m`` is the one mount allowed exec."""
    flags = os.statvfs(path).f_flag
    if m.read_only and not flags & _ST_RDONLY:
        raise MountStagingError(f"{what} {m.path} at {path} is not read-only")
    if bool(flags & _ST_NOEXEC) == m.exec:
        state = "noexec" if m.exec else "not noexec"
        raise MountStagingError(f"{what} {m.path} at {path} is {state}, but was staged with exec={m.exec}")


def _container_root(pid: int, runtime: str, container_id: str) -> str:
    """Where the container's file system is seen from the host, with its mounts as the runtime made them.

    runc: the root of the container's init process. runsc: the sentry shows the program virtual device and
    inode numbers, and its own root is not the container's; the gofer (a sibling of the sentry, named
    ``runsc-gofer`` with the container id on its command line) serves every file the program opens from
    its own root, where the binds are the host's, so that root is checked.
    """
    if pid <= 0:
        raise MountStagingError("the engine reports no process for the started container; cannot check its mounts")
    if runtime != "runsc":
        return f"/proc/{pid}/root"
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            parent = f.read().rsplit(")", 1)[1].split()[1]
        with open(f"/proc/{parent}/task/{parent}/children", encoding="ascii") as f:
            siblings = f.read().split()
    except OSError as exc:
        raise MountStagingError(f"cannot find the gVisor gofer of the container: {exc.strerror}") from exc
    for sibling in siblings:
        try:
            with open(f"/proc/{sibling}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0] == b"runsc-gofer" and container_id.encode() in b" ".join(argv):
            return f"/proc/{sibling}/root"
    raise MountStagingError("cannot find the gVisor gofer of the container; its mounts cannot be checked")


def _remove_tree(directory: str) -> None:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        path = f"{directory}/{name}"
        with contextlib.suppress(OSError):
            _umount(path)
        with contextlib.suppress(OSError):
            os.rmdir(path)
    os.rmdir(directory)


def reap_staging(
    live: Iterable[str], *, grace_s: float, gone: Iterable[str] = (), root: str = STAGING_ROOT
) -> list[str]:
    """Remove staging directories of decisions with no container in ``live`` (decision ids) and older than
    ``grace_s`` (a run being prepared right now has staged but not yet created its container); those of
    ``gone`` (decisions whose container was just removed) whatever their age."""
    keep = set(live)
    drop = set(gone)
    removed: list[str] = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    now = time.time()
    for name in names:
        path = f"{root}/{name}"
        if name in keep:
            continue
        try:
            if name not in drop and now - os.lstat(path).st_mtime < grace_s:
                continue
            _remove_tree(path)
        except OSError:
            continue
        removed.append(path)
    return removed

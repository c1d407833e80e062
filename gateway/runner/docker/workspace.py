"""Workspaces on the Docker engine's host: a sparse ext4 image per workspace, loop-mounted by the gateway.

The size bound is the file system's: a program that fills its workspace gets ENOSPC from the kernel, and the
host's disk never holds more than the image's size. Layout, below the workspace directory (a private mount,
root-only, like the staging of judged mounts): ``GATEWAY_WORKSPACE_DIR``, default
``/var/lib/agent-gateway/workspaces`` (on disk: under a tmpfs such as ``/run`` the images would be held in RAM):

``<instance>--<id>/image``
    the sparse image (``mkfs.ext4``, no journal, no reserved blocks), size = the session's ``workspace_size``;
``<instance>--<id>/mnt``
    its mount point (``nosuid,nodev,noexec``, the loop device set to detach itself at the last unmount), whose
    root belongs to the sandbox's ``uid:gid``, mode 0700. The runner binds it (non-recursive) at
    ``/workspace`` in place of the run's tmpfs and checks, after start and before any payload, that the
    container's ``/workspace`` is that root (device and inode, under runc and runsc alike).

The directory's name carries the instance that created it, so ``reap`` finds the leftovers of a gateway that
died (unmount, detach the loop device, delete the image) and never touches a live instance's. Without the
means to mount (not root, no loop device, no ``mkfs.ext4`` or ``losetup``) :meth:`DockerWorkspaces.create`
fails closed with what is missing (:func:`missing`; ``gateway doctor`` reports it too).

The host reads and writes a workspace only through descriptors (``openat2`` with ``RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV``, see :func:`gateway.hostfs.openat2`): no symlink
a program planted is followed, and since the workspace is a file system of its own, nothing outside it can be
reached from its root at all.
"""

from __future__ import annotations

import builtins
import contextlib
import ctypes
import os
import re
import secrets
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from gateway.errors import (
    SandboxError,
    WorkspaceFileNotFoundError,
    WorkspaceFileTooLargeError,
    WorkspaceFullError,
    WorkspacePathError,
)
from gateway.hostfs import RESOLVE_NO_LINKS, file_system_of, openat2
from gateway.payload import file_name_problem
from gateway.runner.docker.mounts import _container_root, _is_mount_point, _mount, _umount
from gateway.runner.supervisor import WORKSPACE
from gateway.runner.workspace import MAX_LISTED, Workspace, WorkspaceFile, WorkspaceListing, path_refusal
from gateway.slots import default_runtime_dir

__all__ = [
    "DEFAULT_ROOT",
    "MIN_SIZE",
    "DockerWorkspaces",
    "WorkspaceError",
    "WorkspaceFileNotFoundError",
    "WorkspaceFullError",
    "WorkspacePathError",
    "backing",
    "bind_workspace",
    "default_root",
    "get",
    "list_files",
    "missing",
    "prepare_for_run",
    "put",
    "verify_workspace",
]

DEFAULT_ROOT = "/var/lib/agent-gateway/workspaces"
"""Where root's gateway keeps workspaces unless ``GATEWAY_WORKSPACE_DIR`` says otherwise."""
MIN_SIZE = 1 << 20
"""The smallest workspace (bytes): ext4's own structures need some room."""

_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_BIND = 0x1000
_MS_PRIVATE = 1 << 18
_INSTANCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_ID = re.compile(r"[0-9a-f]{16}")
_SEP = "--"
_TOOL_TIMEOUT_S = 60.0
_DETACH_WAIT_S = 5.0
"""How long a destroy waits for the kernel to free the loop device after the unmount."""
_REAP_WAIT_S = 1.0
"""The same for a reap: a workspace still held by a live container is left for the next reap."""
_MAX_DEPTH = 32
"""Deeper directories are moved up before they are removed (no recursion, no descriptor per level, unbounded)."""
_AT_FDCWD = -100
_MAX_ROUNDS = 100_000
_FILE_FLAGS = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # with openat2: RESOLVE_NO_SYMLINKS says ELOOP


class WorkspaceError(SandboxError):
    """A workspace could not be created, bound, checked or removed; nothing ran with it."""

    code = "runner.workspace"


def default_root() -> str:
    """``$GATEWAY_WORKSPACE_DIR``, else :data:`DEFAULT_ROOT` for root and ``workspaces`` in the runtime
    directory for any other user (who cannot make workspaces: :func:`missing`)."""
    configured = os.environ.get("GATEWAY_WORKSPACE_DIR")
    if configured:
        return configured
    return DEFAULT_ROOT if os.geteuid() == 0 else str(default_runtime_dir() / "workspaces")


def backing(root: str) -> tuple[str, int]:
    """The type of the file system that holds (or will hold) the workspace directory ``root``, and the bytes
    free on it: a ``tmpfs`` or ``ramfs`` keeps the images in RAM (``gateway doctor`` warns)."""
    existing = os.path.realpath(root)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    fs = os.statvfs(existing)
    return file_system_of(existing), fs.f_bavail * fs.f_frsize


def missing() -> list[str]:
    """What this host lacks to make workspaces (empty when nothing is missing)."""
    lacking = []
    if os.geteuid() != 0:
        lacking.append("root (the gateway mounts each workspace's file system itself)")
    if not os.path.exists("/dev/loop-control"):
        lacking.append("loop devices (/dev/loop-control; modprobe loop)")
    for tool, package in (("mkfs.ext4", "e2fsprogs"), ("losetup", "util-linux")):
        if shutil.which(tool) is None:
            lacking.append(f"{tool} (Debian package {package})")
    return lacking


def _name(instance: str, workspace_id: str) -> str:
    return f"{instance}{_SEP}{workspace_id}"


def _parse(name: str) -> tuple[str, str] | None:
    """``(instance, id)`` of a workspace directory's name, or None for anything else."""
    instance, sep, workspace_id = name.rpartition(_SEP)
    if not sep or not _ID.fullmatch(workspace_id) or not _INSTANCE.fullmatch(instance):
        return None
    return instance, workspace_id


def _tool(*argv: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkspaceError(f"{argv[0]} failed: {exc}") from exc
    if done.returncode != 0:
        raise WorkspaceError(f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr.strip()[:500]}")
    return done.stdout


def _loops_of(image: str) -> list[str]:
    """The loop devices backed by ``image`` (none once it was unlinked or detached)."""
    if not os.path.exists(image):
        return []
    out = _tool("losetup", "--noheadings", "--output", "NAME", "--associated", image)
    return [line.strip() for line in out.splitlines() if line.strip()]


class DockerWorkspaces:
    """The workspaces of one gateway instance on this host (see the module's docstring).

    ``instance`` is the runner's (``DockerRunner.instance``); ``root`` defaults to :func:`default_root`."""

    def __init__(self, instance: str, *, root: str | None = None) -> None:
        if not _INSTANCE.fullmatch(instance):
            raise WorkspaceError(
                f"instance id {instance!r} cannot name a workspace (letters, digits, '.', '_', '-'; at most 128)",
                hint="set GATEWAY_INSTANCE to such a name, or leave it unset for a generated one",
            )
        self.instance = instance
        self.root = root or default_root()

    # -- create / destroy ---------------------------------------------------------------------------------

    def create(self, size: int, uid: int, gid: int) -> Workspace:
        lacking = missing()
        if lacking:
            raise WorkspaceError(
                f"workspace sessions need {', '.join(lacking)}; nothing was created",
                hint="run the gateway as root on the engine's host with loop devices and e2fsprogs, or allow only "
                "kernel sessions in the policy",
            )
        if size < MIN_SIZE or uid <= 0 or gid <= 0:
            raise WorkspaceError(f"a workspace needs at least {MIN_SIZE} bytes and a non-root owner; got "
                                 f"{size} bytes for {uid}:{gid}")  # fmt: skip
        self._ensure_root()
        self._check_room(size)
        workspace_id = secrets.token_hex(8)
        directory = os.path.join(self.root, _name(self.instance, workspace_id))
        os.mkdir(directory, 0o700)
        try:
            return self._make(directory, workspace_id, size, uid, gid)
        except BaseException:
            with contextlib.suppress(Exception):
                _teardown(directory)
            raise

    def _make(self, directory: str, workspace_id: str, size: int, uid: int, gid: int) -> Workspace:
        image, point = f"{directory}/image", f"{directory}/mnt"
        fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, size)  # sparse: blocks are taken as the program writes
        finally:
            os.close(fd)
        _tool("mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-m", "0", "-E", "nodiscard", image)
        os.mkdir(point, 0o700)
        loop = _tool("losetup", "--find", "--show", image).strip()
        try:
            _mount_ext4(loop, point)
        finally:
            # Detach now: the kernel keeps a mounted loop device and frees it at the last unmount (autoclear).
            _tool("losetup", "--detach", loop)
        root = os.open(point, _DIR_OPEN)
        try:
            os.fchown(root, uid, gid)
            os.fchmod(root, 0o700)
            with contextlib.suppress(FileNotFoundError):
                os.rmdir("lost+found", dir_fd=root)
            st = os.fstat(root)
        finally:
            os.close(root)
        return Workspace(workspace_id, self.instance, size, uid, gid, point, st.st_dev, st.st_ino)

    def destroy(self, workspace: Workspace) -> None:
        _teardown(self._directory(workspace))

    def _directory(self, workspace: Workspace) -> str:
        if workspace.instance != self.instance or not _ID.fullmatch(workspace.id):
            raise WorkspaceError(f"workspace {workspace.id!r} belongs to instance {workspace.instance!r}, not this one")
        return os.path.join(self.root, _name(workspace.instance, workspace.id))

    def _ensure_root(self) -> None:
        """Create the root (0700, root-owned) as a private mount, so no workspace mount propagates anywhere."""
        try:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            st = os.lstat(self.root)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
                raise WorkspaceError(
                    f"workspace directory {self.root} is not a root-owned directory",
                    hint=f"remove {self.root}; the gateway recreates it",
                )
            os.chmod(self.root, 0o700)
            if not _is_mount_point(self.root):
                _mount(self.root, self.root, _MS_BIND)
            _mount(None, self.root, _MS_PRIVATE)
        except OSError as exc:
            raise WorkspaceError(f"cannot prepare workspace directory {self.root}: {exc.strerror}") from exc

    def _check_room(self, size: int) -> None:
        """Refuse a workspace the backing file system could not hold once every live sparse image is full:
        the images are sparse, so this is what keeps a full workspace an ENOSPC of its own, not of the host."""
        promised = 0
        for name in os.listdir(self.root):
            with contextlib.suppress(OSError):
                st = os.stat(f"{self.root}/{name}/image")
                promised += max(st.st_size - st.st_blocks * 512, 0)
        fs = os.statvfs(self.root)
        free = fs.f_bavail * fs.f_frsize
        if free - promised < size:
            raise WorkspaceError(
                f"no room for a workspace of {size} bytes in {self.root}: {free} bytes free, {promised} of them "
                "promised to live workspaces; nothing was created",
                hint="free space there, or lower the policy's sessions.workspace_size",
            )

    # -- files --------------------------------------------------------------------------------------------

    def put(self, workspace: Workspace, path: str, data: bytes) -> None:
        put(workspace, path, data)

    def get(self, workspace: Workspace, path: str, max_bytes: int) -> bytes:
        return get(workspace, path, max_bytes)

    def list(self, workspace: Workspace) -> WorkspaceListing:
        return list_files(workspace)

    # -- reap ---------------------------------------------------------------------------------------------

    def reap(self, *, everything: bool = False, expired_only: bool = False,
             dead: Callable[[str], bool] | None = None) -> builtins.list[str]:  # fmt: skip
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []
        removed = []
        for name in names:
            parsed = _parse(name)
            if parsed is None:
                continue
            owner = parsed[0]
            mine = owner == self.instance and not expired_only
            orphan = dead is not None and owner != self.instance and dead(owner)
            if everything or mine or orphan:
                try:
                    _teardown(os.path.join(self.root, name), wait_s=_REAP_WAIT_S)
                except WorkspaceError:
                    continue  # still held by a sandbox: left for the next reap
                removed.append(name)
        return removed


def _mount_ext4(device: str, point: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    flags = ctypes.c_ulong(_MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    if libc.mount(os.fsencode(device), os.fsencode(point), b"ext4", flags, None) != 0:
        code = ctypes.get_errno()
        raise WorkspaceError(f"mounting {device} at {point} failed: {os.strerror(code)}")


def _teardown(directory: str, *, wait_s: float = _DETACH_WAIT_S) -> None:
    """Unmount, detach the loop device, delete the image and the directory (idempotent). Raises
    :class:`WorkspaceError` while a sandbox still holds the file system (the directory then stays for reap)."""
    image, point = f"{directory}/image", f"{directory}/mnt"
    if _is_mount_point(point):
        try:
            _umount(point)
        except OSError as exc:
            raise WorkspaceError(f"cannot unmount workspace {point}: {exc.strerror}") from exc
    give_up = time.monotonic() + wait_s
    loops = _loops_of(image)
    while loops and time.monotonic() < give_up:
        time.sleep(0.05)
        loops = _loops_of(image)
    if loops:
        for loop in loops:
            with contextlib.suppress(WorkspaceError):
                _tool("losetup", "--detach", loop)
        if _loops_of(image):
            raise WorkspaceError(
                f"workspace {directory} is still in use ({', '.join(loops)}): a sandbox still holds it",
                hint="remove the gateway's containers first (`gateway reap`), then reap again",
            )
    for path in (image,):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    for path in (point, directory):
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(path)


# -- the runner's side -----------------------------------------------------------------------------------


def bind_workspace(kwargs: Mapping[str, Any], workspace: Workspace) -> dict[str, Any]:
    """``kwargs`` (guarded create options) with the workspace bound at ``/workspace`` instead of the run's tmpfs,
    and the file-size limit raised to the workspace's size when it is lower (the file system is the bound)."""
    point = os.path.split(workspace.path)
    if point[1] != "mnt" or _parse(os.path.basename(point[0])) != (workspace.instance, workspace.id):
        raise WorkspaceError(f"{workspace.path} is not the mount point of workspace {workspace.id}; nothing ran")
    _root_fd(workspace, check_only=True)
    out = dict(kwargs)
    out["ulimits"] = [
        {**u, "soft": max(u["soft"], workspace.size), "hard": max(u["hard"], workspace.size)}
        if isinstance(u, Mapping) and u.get("name") == "fsize"
        else u
        for u in out.get("ulimits") or []
    ]
    tmpfs = dict(out.get("tmpfs") or {})
    if WORKSPACE not in tmpfs:
        raise WorkspaceError(f"the options have no {WORKSPACE} tmpfs to replace; nothing ran")
    del tmpfs[WORKSPACE]
    out["tmpfs"] = tmpfs
    out["mounts"] = [
        *list(out.get("mounts") or []),
        {
            "Type": "bind",
            "Source": workspace.path,
            "Target": WORKSPACE,
            "ReadOnly": False,
            "BindOptions": {"NonRecursive": True, "Propagation": "rprivate"},
        },
    ]
    return out


def verify_workspace(inspect: Mapping[str, Any], runtime: str, workspace: Workspace) -> dict[str, Any]:
    """After start, before the payload: the engine bound the workspace at ``/workspace`` and the container's
    ``/workspace`` is its root (device and inode). Returns ``inspect`` without that mount (for the staging's
    own check of the judged mounts)."""
    mounts = list(inspect.get("Mounts") or [])
    ours = [m for m in mounts if m.get("Destination") == WORKSPACE]
    if [(m.get("Source"), m.get("RW"), m.get("Type")) for m in ours] != [(workspace.path, True, "bind")]:
        raise WorkspaceError(f"the engine's {WORKSPACE} mounts {ours} are not the workspace {workspace.path}")
    pid = int((inspect.get("State") or {}).get("Pid") or 0)
    inside = f"{_container_root(pid, runtime, str(inspect.get('Id') or ''))}{WORKSPACE}"
    try:
        st = os.stat(inside)
    except OSError as exc:
        raise WorkspaceError(f"cannot check {WORKSPACE} in the container: {exc.strerror}") from exc
    if (st.st_dev, st.st_ino) != (workspace.device, workspace.inode):
        raise WorkspaceError(f"{WORKSPACE} in the container is not the session's workspace; the container was killed")
    return {**inspect, "Mounts": [m for m in mounts if m.get("Destination") != WORKSPACE]}


def prepare_for_run(workspace: Workspace, names: Iterable[str]) -> None:
    """Before a payload: remove ``main.py`` and ``names`` (the request's files replace what is there) and empty
    ``out/``, so the supervisor writes them afresh and the run returns only the files *it* left in ``out/``."""
    with _opened(workspace) as root:
        try:
            for name in ("main.py", "out", *names):
                _remove(root, name)
            os.mkdir("out", 0o700, dir_fd=root)
            os.chown("out", workspace.uid, workspace.gid, dir_fd=root, follow_symlinks=False)
        except OSError as exc:
            raise WorkspaceError(f"cannot prepare workspace {workspace.id} for the run: {exc}; nothing ran") from exc


# -- the file helpers -------------------------------------------------------------------------------------


def _root_fd(workspace: Workspace, *, check_only: bool = False) -> int:
    """The workspace's root, opened without following a symlink, checked to be the root it was created with."""
    try:
        fd = openat2(_AT_FDCWD, workspace.path, _DIR_OPEN, resolve=RESOLVE_NO_LINKS)
    except OSError as exc:
        raise WorkspaceError(
            f"workspace {workspace.id} cannot be opened ({exc.strerror}): it was destroyed or reaped"
        ) from exc
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (workspace.device, workspace.inode):
        os.close(fd)
        raise WorkspaceError(f"workspace {workspace.id} is not mounted any more: it was destroyed or reaped")
    if check_only:
        os.close(fd)
        return -1
    return fd


@contextlib.contextmanager
def _opened(workspace: Workspace) -> Iterator[int]:
    fd = _root_fd(workspace)
    try:
        yield fd
    finally:
        os.close(fd)


def _checked(path: str) -> list[str]:
    why = file_name_problem(path)
    if why is not None:
        raise WorkspacePathError(f"workspace path {path!r} {why}")
    return path.split("/")


def put(workspace: Workspace, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` in the workspace (see :meth:`Workspaces.put`)."""
    parts = _checked(path)
    with _opened(workspace) as root:
        parent = os.dup(root)
        try:
            for part in parts[:-1]:
                try:
                    os.mkdir(part, 0o700, dir_fd=parent)
                    os.chown(part, workspace.uid, workspace.gid, dir_fd=parent, follow_symlinks=False)
                except FileExistsError:
                    pass
                child = openat2(parent, part, _DIR_OPEN)
                os.close(parent)
                parent = child
            fd = openat2(parent, parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _FILE_FLAGS, mode=0o600)
        except OSError as exc:
            raise path_refusal(path, exc) from exc
        finally:
            os.close(parent)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise WorkspacePathError(f"workspace path {path!r} is not a regular file")
            os.fchown(fd, workspace.uid, workspace.gid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            raise path_refusal(path, exc) from exc
        finally:
            os.close(fd)


def get(workspace: Workspace, path: str, max_bytes: int) -> bytes:
    """The content of the regular file at ``path`` (see :meth:`Workspaces.get`)."""
    _checked(path)
    with _opened(workspace) as root:
        try:
            fd = openat2(root, path, os.O_RDONLY | _FILE_FLAGS)
        except OSError as exc:
            raise path_refusal(path, exc) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise WorkspacePathError(f"workspace path {path!r} is not a regular file")
            chunks, total = [], 0
            while total <= max_bytes:
                chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
        finally:
            os.close(fd)
    if total > max_bytes:
        raise WorkspaceFileTooLargeError(f"workspace file {path!r} is larger than the {max_bytes} bytes allowed")
    return b"".join(chunks)


def list_files(workspace: Workspace) -> WorkspaceListing:
    """The regular files in the workspace (see :meth:`Workspaces.list`)."""
    found: list[WorkspaceFile] = []
    budget = [MAX_LISTED]
    with _opened(workspace) as root:
        complete = _walk(root, "", 0, found, budget)
    return WorkspaceListing(tuple(sorted(found, key=lambda f: f.path)), truncated=not complete)


def _walk(fd: int, prefix: str, depth: int, found: list[WorkspaceFile], budget: list[int]) -> bool:
    with os.scandir(fd) as entries:
        names = sorted(e.name for e in entries)
    for name in names:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            found.append(WorkspaceFile(prefix + name, st.st_size))
        elif stat.S_ISDIR(st.st_mode) and depth < _MAX_DEPTH:
            try:
                child = openat2(fd, name, _DIR_OPEN)
            except OSError:
                continue
            try:
                if not _walk(child, f"{prefix}{name}/", depth + 1, found, budget):
                    return False
            finally:
                os.close(child)
    return True


def _remove(root: int, path: str) -> None:
    """Remove whatever is at ``path`` below ``root`` (a file, a symlink itself, a whole tree), following no
    symlink; a path that passes through a symlink or a non-directory has nothing of the workspace to remove."""
    head, _, name = path.rpartition("/")
    try:
        parent = openat2(root, head, _DIR_OPEN) if head else os.dup(root)
    except OSError:
        return
    try:
        _remove_entry(parent, name)
    finally:
        os.close(parent)


def _remove_entry(parent: int, name: str) -> None:
    if not _unlinked(parent, name):
        return
    top = openat2(parent, name, _DIR_OPEN)
    try:
        _empty(top)
    finally:
        os.close(top)
    os.rmdir(name, dir_fd=parent)


def _empty(top: int) -> None:
    """Empty the directory ``top`` without recursion deeper than ``_MAX_DEPTH``: a deeper directory is first
    renamed into ``top`` (same file system) and emptied from there in a later round."""
    for _round in range(_MAX_ROUNDS):
        with os.scandir(top) as entries:
            names = [e.name for e in entries]
        if not names:
            return
        for name in names:
            _clear(top, top, name, 0)
    raise WorkspaceError("a workspace directory could not be emptied (entries keep coming back)")


def _unlinked(parent: int, name: str) -> bool:
    """Unlink ``name`` unless it is a directory: True when it is one (still there), False when it is gone."""
    try:
        os.unlink(name, dir_fd=parent)
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        return True
    except PermissionError:  # some kernels say EPERM for unlink(directory)
        if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
            raise
        return True
    return False


def _clear(top: int, parent: int, name: str, depth: int) -> None:
    if not _unlinked(parent, name):
        return
    if depth >= _MAX_DEPTH:
        os.rename(name, f".gw-{secrets.token_hex(8)}", src_dir_fd=parent, dst_dir_fd=top)
        return
    child = openat2(parent, name, _DIR_OPEN)
    try:
        with os.scandir(child) as entries:
            names = [e.name for e in entries]
        for inner in names:
            _clear(top, child, inner, depth + 1)
    finally:
        os.close(child)
    with contextlib.suppress(OSError):  # not empty: a renamed-up subtree's round removes it later
        os.rmdir(name, dir_fd=parent)

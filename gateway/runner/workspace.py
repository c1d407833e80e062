"""A session's workspace: private, size-bounded storage that fresh single-use sandboxes see at ``/workspace``.

Backend-neutral: :class:`Workspace` (defined in ``gateway.runspec``, re-exported here) names one workspace
(a :class:`~gateway.runner.interface.RunSpec` carries it as ``workspace``) and :class:`Workspaces` is what a
backend's store provides (the Docker backend's is :class:`gateway.runner.docker.workspace.DockerWorkspaces`).

A workspace belongs to the gateway instance that created it (``instance``); after that instance is gone its
leftovers are reaped (and audited by the caller), never adopted by another instance. Each execution with a
workspace still runs in a fresh container; the runner binds the workspace at ``/workspace`` in place of the run's
own tmpfs, removes ``main.py`` and the names of the request's files before the payload (a request's file
replaces the workspace's), and empties ``out/``: the files an execution returns are the ones *it* left in
``out/``; everything else in the workspace persists.
"""

from __future__ import annotations

import builtins
import errno
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.errors import WorkspaceFileNotFoundError, WorkspaceFullError, WorkspacePathError
from gateway.runspec import Workspace

__all__ = ["MAX_LISTED", "Workspace", "WorkspaceFile", "WorkspaceListing", "Workspaces", "path_refusal"]

MAX_LISTED = 10_000
"""At most this many entries are walked by a listing (a larger workspace is listed ``truncated``)."""


@dataclass(frozen=True, slots=True)
class WorkspaceFile:
    """One regular file in a workspace."""

    path: str
    """Relative to the workspace's root, ``/``-separated."""
    size: int


@dataclass(frozen=True, slots=True)
class WorkspaceListing:
    """The regular files of a workspace (symlinks, devices and the like are not listed), sorted by path."""

    files: tuple[WorkspaceFile, ...]
    truncated: bool
    """More than ``MAX_LISTED`` entries were there; the rest were not walked."""


class Workspaces(Protocol):
    """A backend's store of workspaces: create, use through the file helpers, destroy, reap leftovers.

    Every file helper checks its name with :func:`gateway.payload.file_name_problem` and never follows a
    symlink; one that would leave the workspace is refused."""

    instance: str

    def create(self, size: int, uid: int, gid: int) -> Workspace:
        """A new, empty workspace of ``size`` bytes whose root belongs to ``uid:gid``."""
        ...

    def destroy(self, workspace: Workspace) -> None:
        """Remove the workspace and everything in it (idempotent). No sandbox may still use it."""
        ...

    def put(self, workspace: Workspace, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` (replacing a file there), creating its directories."""
        ...

    def get(self, workspace: Workspace, path: str, max_bytes: int) -> bytes:
        """The content of the regular file at ``path``; refused when it is larger than ``max_bytes``."""
        ...

    def list(self, workspace: Workspace) -> WorkspaceListing:
        """The regular files in the workspace."""
        ...

    def reap(self, *, everything: bool = False, expired_only: bool = False,
             dead: Callable[[str], bool] | None = None) -> builtins.list[str]:  # fmt: skip
        """Remove leftover workspaces: this instance's (unless ``expired_only``), those of instances that
        ``dead`` says are gone, or all of them (``everything``). Returns the names of those removed."""
        ...


def path_refusal(path: str, exc: OSError, then: str = "") -> WorkspacePathError:
    """The error for a workspace path the system refused with ``exc`` (following no link, writing no further
    than the workspace's size): the store's file helpers and a kernel cell's files say the same (``then``:
    what follows, appended to the message)."""
    why = {
        errno.ELOOP: "is or passes through a symlink, which is never followed",
        errno.EXDEV: "leaves the workspace",
        errno.ENOENT: "does not exist",
        errno.ENOTDIR: "passes through something that is not a directory",
        errno.EISDIR: "is a directory",
        errno.ENXIO: "is not a regular file",
        errno.ENOSPC: "does not fit: the workspace is full",
        errno.EFBIG: "does not fit: the file is too large",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    kind = {errno.ENOENT: WorkspaceFileNotFoundError, errno.ENOSPC: WorkspaceFullError}
    error = kind.get(exc.errno or 0, WorkspacePathError)(f"workspace path {path!r} {why}{then}")
    error.__cause__ = exc
    return error

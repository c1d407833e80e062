"""The run specification: what a decision hands a sandbox backend.

The decision builds a ``RunSpec`` (with the judged ``HostMount``s; a session adds its ``Workspace``) and a backend
reads it; neither side owns it, so it lives below both (``gateway.runner.interface`` re-exports it with the rest
of the runner interface).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gateway.errors import ContractError, Problem

if TYPE_CHECKING:
    from gateway.egress.proxy import EgressPlan

__all__ = ["PULL_POLICIES", "HostMount", "RunSpec", "Workspace"]

PULL_POLICIES = ("never", "if-missing")
"""``never``: a missing image is an error (the default). ``if-missing``: pull it (allowlisted images only)."""


@dataclass(frozen=True, slots=True)
class HostMount:
    """A judged host directory to bind: a backend binds the directory with this identity, opened below
    ``root`` from ``path`` with no symlink followed, and nothing else (see ``gateway.hostfs``)."""

    root: str
    """The allowlisted root the directory was opened from."""
    path: str
    """The canonical host path that was judged."""
    device: int
    inode: int
    target: str
    """Container path."""
    read_only: bool
    exec: bool = False
    """Staged without ``noexec``: only the packages installer's sealed, hash-checked, read-only tree at
    ``/opt/gateway-packages`` (so a wheel's compiled extension loads); a request's mount never (the decision
    builds those without it, and the runner refuses it anywhere else)."""


@dataclass(frozen=True, slots=True)
class Workspace:
    """A session's workspace, as its store created it (``gateway.runner.workspace``). Only the store that made it
    and its backend read ``path``."""

    id: str
    """Random, 16 hex digits; with ``instance`` it names the workspace's host directory."""
    instance: str
    """The gateway instance that created it (a runner's ``instance``)."""
    size: int
    """Bytes: the hard bound of the file system (the program gets ENOSPC past it)."""
    uid: int
    """Owner of the workspace's root: the sandbox's user (from the decision's profile)."""
    gid: int
    path: str
    """Where the host sees the workspace (a mount point); a backend binds it at ``/workspace``."""
    device: int
    """Device and inode of the workspace's root when it was created: a backend checks them before it binds
    the path and again in the started container."""
    inode: int


_IMMUTABLE_SCALARS = frozenset({str, int, float, bool, type(None)})


def _private_copy(value: Any) -> Any:
    """A deep copy of run options: dicts, lists and scalars (all that JSON-shaped options hold) by a plain walk,
    anything else by :func:`copy.deepcopy`."""
    kind = type(value)
    if kind is dict:
        return {key: _private_copy(item) for key, item in value.items()}
    if kind is list:
        return [_private_copy(item) for item in value]
    if kind in _IMMUTABLE_SCALARS:
        return value
    return copy.deepcopy(value)


@dataclass(frozen=True)
class RunSpec:
    """What a runner receives: the backend options the decision assembled and guarded, and the limits the
    runner itself enforces. The decision builds it; the Gateway hands it over unchanged.

    A run specification that fails its own checks is the gateway's fault (:class:`ContractError`).
    """

    options: Mapping[str, Any]
    """The backend's run options as assembled and guarded (for Docker: ``containers.create`` keyword
    arguments, without the runner's own transport keys). Stored as a read-only copy."""
    timeout_s: float
    """Wall-clock deadline for the program, from the hand-over of the payload."""
    output_bytes: int
    """Cap per stream (stdout, stderr each). Beyond it the output is truncated and the container killed."""
    output_files_bytes: int = 8 << 20
    """Cap on the total size of the files returned from ``/workspace/out``: their contents and the bytes of
    their names (the supervisor also charges every directory entry it walks), so empty files are not free."""
    output_files: int = 256
    """Cap on how many files are returned from ``/workspace/out``; the rest are left out (``files_truncated``)."""
    pull: str = "never"
    """``never`` or ``if-missing`` (see ``PULL_POLICIES``)."""
    backend: str = "docker"
    """Which backend's vocabulary ``options`` are in."""
    mounts: tuple[HostMount, ...] = ()
    """The judged host directories, in the order of the request's mounts: what the backend must bind."""
    workspace: Workspace | None = None
    """A session's workspace (``gateway.runner.workspace``): bound at ``/workspace`` in place of the run's own
    tmpfs. Set by the session manager on the decision's spec; never from a request."""
    egress: EgressPlan | None = None
    """With network ``egress``: the destinations and limits of the run's own proxy (issue 31); None otherwise."""
    packages: bool = False
    """The run's installed packages are among ``mounts`` (read-only at ``/opt/gateway-packages``): the sandbox puts
    them on the program's path. Set by the packages installer (``gateway.packages``) only, never from a request."""

    def __post_init__(self) -> None:
        # A private deep copy: nothing the caller keeps can change what was guarded.
        object.__setattr__(self, "options", MappingProxyType(_private_copy(dict(self.options))))
        problems: list[Problem] = []
        if not (self.timeout_s > 0):
            problems.append(Problem(f"timeout_s must be > 0, got {self.timeout_s!r}", "$.timeout_s"))
        if self.output_bytes < 0:
            problems.append(Problem(f"output_bytes must be >= 0, got {self.output_bytes!r}", "$.output_bytes"))
        if self.output_files_bytes < 0:
            problems.append(
                Problem(f"output_files_bytes must be >= 0, got {self.output_files_bytes!r}", "$.output_files_bytes")
            )
        if self.output_files < 0:
            problems.append(Problem(f"output_files must be >= 0, got {self.output_files!r}", "$.output_files"))
        if self.pull not in PULL_POLICIES:
            problems.append(Problem(f"pull must be one of {PULL_POLICIES}, got {self.pull!r}", "$.pull"))
        if not isinstance(self.options.get("image"), str) or not self.options.get("image"):
            problems.append(Problem("options must name an image", "$.options.image"))
        if problems:
            raise ContractError("invalid run specification", problems=problems)

    @property
    def image(self) -> str:
        image: str = self.options["image"]
        return image

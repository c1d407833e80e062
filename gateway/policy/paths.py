"""Host paths that may never be mounted and container paths a mount may never land on.

These lists are not policy: no policy can allow them. They are checked at policy load (an allowlisted root
may not be or contain one), at decision time (against the canonical source), and again by the invariant
guard on the assembled options.
"""

from __future__ import annotations

import os
import posixpath
import stat
from functools import cache

__all__ = [
    "DENIED_HOST_PATHS",
    "DENIED_TARGET_ROOTS",
    "RESERVED_TARGETS",
    "denied_host_reason",
    "is_within",
    "rw_overlaps",
    "target_problem",
]

DENIED_HOST_PATHS: tuple[str, ...] = (
    "/",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/boot",
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/var/run",
    "/run",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/var/run/docker.sock",
    "/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/var/run/containerd/containerd.sock",
)
"""Never mountable: the source may not be one of these, lie inside one, or contain one (``/`` is only
denied as itself and ancestor-of, otherwise everything would lie inside it)."""

_SOCKET_NAMES = frozenset({"docker.sock", "containerd.sock", "dockershim.sock", "podman.sock", "crio.sock"})

DENIED_TARGET_ROOTS: tuple[str, ...] = (
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/usr",
    "/bin",
    "/sbin",
    "/boot",
    "/var/run",
    "/run",
    "/workspace",
    "/tmp",  # noqa: S108 - a container path that is always tmpfs, not a temp file
)
"""A mount target may not be one of these or lie below one (plus any top-level ``/lib*``)."""

RESERVED_TARGETS: tuple[str, ...] = ("/",)


def is_within(path: str, root: str) -> bool:
    """True when ``path`` is ``root`` or below it, compared by path components (not string prefix)."""
    if root == "/":
        return path.startswith("/")
    return path == root or path.startswith(root + "/")


def _is_lib(path: str) -> bool:
    first = path.split("/", 2)[1] if path.count("/") >= 1 else ""
    return first.startswith("lib")


@cache
def _denied_variants() -> tuple[str, ...]:
    # Each denied path as written and as this host resolves it (/var/run is usually a link to /run).
    out: list[str] = []
    for denied in DENIED_HOST_PATHS[1:]:
        for variant in (denied, os.path.realpath(denied)):
            if variant not in out and variant != "/":
                out.append(variant)
    return tuple(out)


def denied_host_reason(canonical: str, *, extra: tuple[str, ...] = ()) -> str | None:
    """Why ``canonical`` (an absolute, symlink-free path) may never be mounted, or None if it may.

    ``extra`` adds deployment paths such as the gateway's audit directory.
    """
    if canonical == "/" or not canonical.startswith("/"):
        return "the host root filesystem can never be mounted"
    if _is_lib(canonical):
        return f"{canonical} is a system library directory (/lib*) and can never be mounted"
    name = posixpath.basename(canonical)
    if name in _SOCKET_NAMES or name.endswith(".sock"):
        return f"{canonical} is a container-engine socket and can never be mounted"
    for variant in _denied_variants() + extra:
        if is_within(canonical, variant):
            return f"{canonical} is inside {variant}, which can never be mounted"
        if is_within(variant, canonical):
            return f"{canonical} contains {variant}, which can never be mounted"
    try:
        mode = os.stat(canonical).st_mode
    except OSError:
        return None
    if stat.S_ISSOCK(mode):
        return f"{canonical} is a socket and can never be mounted"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return f"{canonical} is a device node and can never be mounted"
    return None


def target_problem(target: str) -> str | None:
    """Why ``target`` is not an acceptable container mount point, or None if it is."""
    if not target.startswith("/"):
        return f"target {target!r} must be an absolute container path"
    if "\x00" in target or "\n" in target:
        return "target contains a NUL or newline character"
    normal = posixpath.normpath(target)
    if normal.startswith("//"):
        normal = "/" + normal.lstrip("/")
    if normal != target.rstrip("/") and target != "/":
        return f"target {target!r} is not normalised (expected {normal!r})"
    if normal in RESERVED_TARGETS:
        return "target '/' would shadow the whole container filesystem"
    if _is_lib(normal):
        return f"target {normal} would shadow a system library directory (/lib*)"
    for root in DENIED_TARGET_ROOTS:
        if is_within(normal, root):
            return f"target {normal} is inside {root}, which a mount may not shadow"
    return None


def rw_overlaps(roots: list[tuple[str, tuple[str, ...]]]) -> list[tuple[int, int]]:
    """Index pairs ``(i, j)``, ``i < j``, of canonical ``(root, modes)`` where one allows ``rw`` and they
    overlap (equal, or one inside the other).

    Such a policy is refused: a sandbox with the ``rw`` mount could rearrange (rename, exchange) the tree
    in which the other root's sources are judged, and create a listening socket there after the check. The
    staged binds make any such change a refusal, never an escape, but a read-only mount would then depend
    on, and could talk to, a concurrent sandbox. Sibling roots (``/srv/in`` ro, ``/srv/out`` rw) give the
    same capability without the coupling.
    """
    found = []
    for i, (a, a_modes) in enumerate(roots):
        for j in range(i + 1, len(roots)):
            b, b_modes = roots[j]
            if ("rw" in a_modes or "rw" in b_modes) and (is_within(a, b) or is_within(b, a)):
                found.append((i, j))
    return found

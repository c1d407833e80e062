"""A workspace session's files: upload, download and list under its workspace, capped by policy and audited.

The session manager (:meth:`~gateway.sessions.SessionManager.put_file` and its siblings) finds the session and
holds it busy; this module does the transfer through the runner's workspace store, whose helpers check each path
with the one name check (:func:`gateway.payload.file_name_problem`: no traversal, no absolute path, no NUL, no
backslash) and never follow a link (``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV``).

Caps, from the session owner's *current* policy (like every execution in a session, decided again): an upload at
most its ``limits.files_size`` ceiling (what a request's files may hold), a download at most its
``limits.output_files_bytes`` ceiling (what a run's ``out/`` files may return); past either, 413
``request.file_too_large`` and nothing moves. Every attempt on a found session is recorded once, after it, before
its answer: ``session.file.put`` / ``session.file.get`` with the path, the bytes and their sha256 (``error`` when
refused). A download's bytes are returned only once its record is written (fail closed). A listing moves no
content across the sandbox's boundary and changes nothing, like an execution's ``ls``: it is not recorded.

On Docker a kernel session's ``/workspace`` is a workspace of the store too, so the file API serves it as it
serves workspace mode. A kernel without one (the Kubernetes backend: its ``/workspace`` is the Pod's own tmpfs,
which the kernel protocol offers no safe way to read or write) has its file requests refused
(:class:`~gateway.errors.SessionUnavailableError`, 501).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.errors import GatewayError, SessionUnavailableError, WorkspaceFileTooLargeError
from gateway.runner.workspace import Workspace, WorkspaceListing, Workspaces

if TYPE_CHECKING:
    from gateway._gateway import Caller, Gateway

__all__ = ["FILE_GET", "FILE_PUT", "SessionFile", "get_file", "list_files", "put_file"]

FILE_PUT = "session.file.put"
FILE_GET = "session.file.get"


@dataclass(frozen=True, slots=True)
class SessionFile:
    """One file moved into or out of a session's workspace, as recorded."""

    path: str
    """Relative to the workspace's root (``/workspace`` in the sandbox), ``/``-separated."""
    bytes: int
    sha256: str
    """Hex sha256 of the content."""

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "bytes": self.bytes, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class Target:
    """What the manager hands over for one file request: the session, its workspace and who asks."""

    session_id: str
    principal: str | None
    """The session's owner: its policy caps the transfer."""
    workspace: Workspace | None
    """None: a session without a workspace of the store (a kernel on Kubernetes)."""
    store: Workspaces | None
    """The runner's workspace store (None: a backend without one, which has no workspace sessions)."""
    caller: Caller | None
    request_id: str
    """The request's id in its record (the service's ``X-Request-Id``)."""


def workspace_of(target: Target) -> tuple[Workspaces, Workspace]:
    """The store and the session's workspace; :class:`SessionUnavailableError` for a session without one."""
    if target.workspace is None or target.store is None:
        raise SessionUnavailableError(
            f"session {target.session_id} has no workspace the gateway can reach: its kernel's /workspace is its "
            "Pod's own tmpfs (the Kubernetes backend); nothing was read or written",
            hint="read and write files from the kernel's cells, or use the Docker backend",
        )
    return target.store, target.workspace


def put_file(gw: Gateway, target: Target, path: str, data: bytes) -> SessionFile:
    """Write ``data`` at ``path`` in the session's workspace (replacing a file there), then record it."""
    store, workspace = workspace_of(target)
    cap = int(gw.policies.for_principal(target.principal).policy.limits.files_size.max)
    done = SessionFile(path, len(data), hashlib.sha256(data).hexdigest())
    try:
        if len(data) > cap:
            raise WorkspaceFileTooLargeError(
                f"the upload to {path!r} is {len(data)} bytes; the policy allows at most {cap} (limits.files_size); "
                "nothing was written"
            )
        store.put(workspace, path, data)
    except GatewayError as exc:
        _record(gw, FILE_PUT, target, done, exc)
        raise
    _record(gw, FILE_PUT, target, done, None)
    return done


def get_file(gw: Gateway, target: Target, path: str) -> bytes:
    """The content of the regular file at ``path`` in the session's workspace, returned once recorded."""
    store, workspace = workspace_of(target)
    cap = int(gw.policies.for_principal(target.principal).policy.limits.output_files_bytes.max)
    try:
        data = store.get(workspace, path, cap)
    except GatewayError as exc:
        _record(gw, FILE_GET, target, SessionFile(path, 0, ""), exc)
        raise
    done = SessionFile(path, len(data), hashlib.sha256(data).hexdigest())
    _record(gw, FILE_GET, target, done, None)
    return data


def list_files(target: Target) -> WorkspaceListing:
    """The regular files of the session's workspace (not recorded: see the module)."""
    store, workspace = workspace_of(target)
    return store.list(workspace)


def _record(gw: Gateway, event: str, target: Target, moved: SessionFile, error: GatewayError | None) -> None:
    """The one record of a file request; raises the trail's error (the request then fails closed)."""
    data: dict[str, Any] = {"session_id": target.session_id, "path": moved.path}
    if error is None or event == FILE_PUT:
        data |= {"bytes": moved.bytes, "sha256": moved.sha256}
    if error is not None:
        data["error"] = {"code": error.code, "message": error.message}
    compiled = gw.policies.for_principal(target.principal)
    gw._append(
        event, data, request_id=target.request_id, principal=target.principal,
        policy={"name": compiled.policy.name, "sha256": compiled.policy.sha256}, caller=target.caller,
    )  # fmt: skip

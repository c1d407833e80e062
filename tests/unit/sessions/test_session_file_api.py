"""The session manager's file API with a fake runner, an in-memory workspace store and an in-memory trail: the
caps, the records, fail-closed downloads, ownership, busy sessions and kernel sessions.

The store's own checks (names, symlinks, a full file system) are the real store's, tested against real
workspaces (tests/integration/test_workspace.py) and over HTTP (tests/integration/test_session_files.py)."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.errors import (
    AuditUnavailableError,
    SessionBusyError,
    SessionNotFoundError,
    SessionUnavailableError,
    WorkspaceFileNotFoundError,
    WorkspaceFileTooLargeError,
    http_status_for,
)
from gateway.policy import load_policy
from gateway.resources import default_policy_path, load_schema
from gateway.runner.fake import FakeRunner
from gateway.runner.interface import RunSpec
from gateway.runner.workspace import Workspace, WorkspaceFile, WorkspaceListing
from gateway.slots import HostSlots
from tests.unit.sessions_support import HeldRun, KernelFakeRunner

SESSIONS_POLICY = default_policy_path().parent / "examples" / "sessions.yaml"
FILES_SIZE = 1 << 20
"""limits.files_size's ceiling in the default policy (which sessions.yaml extends)."""
OUTPUT_FILES_BYTES = 4 << 20
"""limits.output_files_bytes's ceiling there."""


class MemoryWorkspaces:
    """A workspace store holding its files in memory (names are not checked here: see the module)."""

    instance = "fake-instance"

    def __init__(self) -> None:
        self.files: dict[tuple[str, str], bytes] = {}

    def create(self, size: int, uid: int, gid: int) -> Workspace:
        return Workspace("0" * 16, self.instance, size, uid, gid, "/nowhere", 1, 2)

    def destroy(self, workspace: Workspace) -> None:
        self.files = {k: v for k, v in self.files.items() if k[0] != workspace.id}

    def put(self, workspace: Workspace, path: str, data: bytes) -> None:
        self.files[workspace.id, path] = data

    def get(self, workspace: Workspace, path: str, max_bytes: int) -> bytes:
        if (workspace.id, path) not in self.files:
            raise WorkspaceFileNotFoundError(f"workspace path {path!r} does not exist")
        data = self.files[workspace.id, path]
        if len(data) > max_bytes:
            raise WorkspaceFileTooLargeError(f"workspace file {path!r} is larger than the {max_bytes} bytes allowed")
        return data

    def list(self, workspace: Workspace) -> WorkspaceListing:
        found = sorted(WorkspaceFile(p, len(d)) for (w, p), d in self.files.items() if w == workspace.id)
        return WorkspaceListing(tuple(found), truncated=False)


class Runner(FakeRunner):
    def open_kernel(self, spec: RunSpec, **_: Any) -> Any:
        raise AssertionError("no kernel here")


@pytest.fixture
def sink() -> MemoryAuditSink:
    return MemoryAuditSink()


@pytest.fixture
def store() -> MemoryWorkspaces:
    return MemoryWorkspaces()


def _gateway(tmp_path: Path, sink: MemoryAuditSink, store: MemoryWorkspaces, runner: FakeRunner) -> Gateway:
    runner.workspaces = store  # type: ignore[attr-defined]
    return Gateway(
        load_policy(SESSIONS_POLICY), runner=runner, audit=sink, slots=HostSlots(tmp_path / "s", 2, wait_s=0)
    )


@pytest.fixture
def gateway(tmp_path: Path, sink: MemoryAuditSink, store: MemoryWorkspaces) -> Gateway:
    return _gateway(tmp_path, sink, store, Runner())


def _session(gateway: Gateway) -> str:
    created = gateway.sessions.create({"mode": "workspace", "principal": "alice"})
    assert created.session is not None, created.to_dict()
    return created.session.session_id


def _file_records(sink: MemoryAuditSink) -> list[dict[str, Any]]:
    return [r for r in sink.records if r["event_type"].startswith("session.file.")]


def test_put_get_and_list_are_recorded_with_path_bytes_and_sha256(gateway: Gateway, sink: MemoryAuditSink) -> None:
    sid = _session(gateway)
    data = bytes(range(256))
    stored = gateway.sessions.put_file(sid, "data/all.bin", data, principal="alice", request_id="r-put")
    assert stored.to_dict() == {"path": "data/all.bin", "bytes": 256, "sha256": hashlib.sha256(data).hexdigest()}
    assert gateway.sessions.get_file(sid, "data/all.bin", principal="alice") == data
    listing = gateway.sessions.list_files(sid, principal="alice")
    assert listing == WorkspaceListing((WorkspaceFile("data/all.bin", 256),), truncated=False)
    put, got = _file_records(sink)  # the listing is not recorded
    assert (put["event_type"], put["request_id"], put["principal"]) == ("session.file.put", "r-put", "alice")
    assert put["data"] == {"session_id": sid, **stored.to_dict()}
    assert got["event_type"] == "session.file.get"
    assert got["data"] == put["data"]
    validator = jsonschema.Draft202012Validator(load_schema("audit-record"))
    for record in sink.records:
        assert not list(validator.iter_errors(record)), record["event_type"]


def test_the_caps_are_the_policys_ceilings_and_refusals_are_recorded(
    gateway: Gateway, sink: MemoryAuditSink, store: MemoryWorkspaces
) -> None:
    sid = _session(gateway)
    gateway.sessions.put_file(sid, "at-cap.bin", b"\0" * FILES_SIZE, principal="alice")
    with pytest.raises(WorkspaceFileTooLargeError) as over:
        gateway.sessions.put_file(sid, "over.bin", b"\0" * (FILES_SIZE + 1), principal="alice")
    assert (over.value.code, http_status_for(over.value)) == ("request.file_too_large", 413)
    assert ("0" * 16, "over.bin") not in store.files
    store.files["0" * 16, "made.bin"] = b"x" * (OUTPUT_FILES_BYTES + 1)  # as a program could have written it
    with pytest.raises(WorkspaceFileTooLargeError):
        gateway.sessions.get_file(sid, "made.bin", principal="alice")
    with pytest.raises(WorkspaceFileNotFoundError) as absent:
        gateway.sessions.get_file(sid, "absent", principal="alice")
    assert http_status_for(absent.value) == 404
    _ok, refused_put, refused_get, missing = _file_records(sink)
    assert refused_put["data"]["error"]["code"] == "request.file_too_large"
    assert refused_put["data"]["bytes"] == FILES_SIZE + 1
    assert refused_get["data"]["error"]["code"] == "request.file_too_large"
    assert "bytes" not in refused_get["data"]
    assert missing["data"]["error"]["code"] == "request.workspace_not_found"


def test_a_download_whose_record_cannot_be_written_returns_nothing(gateway: Gateway, sink: MemoryAuditSink) -> None:
    sid = _session(gateway)
    gateway.sessions.put_file(sid, "a.txt", b"secret", principal="alice")
    sink.available = False
    with pytest.raises(AuditUnavailableError):
        gateway.sessions.get_file(sid, "a.txt", principal="alice")


def test_another_principal_is_not_found_and_a_kernel_session_has_files_where_it_has_a_workspace(
    tmp_path: Path, gateway: Gateway, sink: MemoryAuditSink
) -> None:
    sid = _session(gateway)
    with pytest.raises(SessionNotFoundError):
        gateway.sessions.put_file(sid, "a.txt", b"x", principal="bob")
    with pytest.raises(SessionNotFoundError):
        gateway.sessions.list_files(sid, principal="bob")
    assert _file_records(sink) == []

    store = MemoryWorkspaces()  # a backend that keeps workspaces (Docker): a kernel's /workspace is one
    kernels = _gateway(tmp_path, sink, store, KernelFakeRunner())
    created = kernels.sessions.create({"mode": "kernel", "principal": "alice"})
    assert created.session is not None
    kernels.sessions.put_file(created.session.session_id, "a.txt", b"kept", principal="alice")
    assert kernels.sessions.get_file(created.session.session_id, "a.txt", principal="alice") == b"kept"
    kernels.sessions.close(created.session.session_id, principal="alice")
    assert not store.files  # the kernel's workspace went with it

    bare = KernelFakeRunner()  # a backend without workspaces (Kubernetes): a kernel has no file API
    alone = Gateway(load_policy(SESSIONS_POLICY), runner=bare, audit=sink, slots=HostSlots(tmp_path / "b", 2, wait_s=0))
    created = alone.sessions.create({"mode": "kernel", "principal": "alice"})
    assert created.session is not None
    with pytest.raises(SessionUnavailableError, match="workspace") as refused:
        alone.sessions.get_file(created.session.session_id, "a.txt", principal="alice")
    assert http_status_for(refused.value) == 501


def test_a_transfer_while_an_execution_runs_is_refused_busy(
    tmp_path: Path, sink: MemoryAuditSink, store: MemoryWorkspaces
) -> None:
    held = HeldRun()

    gw = _gateway(tmp_path, sink, store, Runner(outcome=held))
    sid = _session(gw)
    worker = threading.Thread(target=gw.sessions.execute, args=(sid, {"code": "1", "principal": "alice"}))
    worker.start()
    try:
        assert held.entered.wait(10)
        with pytest.raises(SessionBusyError) as busy:
            gw.sessions.put_file(sid, "a.txt", b"x", principal="alice")
        assert http_status_for(busy.value) == 409
    finally:
        held.release.set()
        worker.join()
    gw.sessions.put_file(sid, "a.txt", b"x", principal="alice")  # free again

"""``Gateway.sessions`` and ``Client.sessions`` are one API: the same method names and arguments (sync and async),
and results with the same attributes, which read the same from the same answer.

What only one side has is listed here with the reason, so that a new method, argument or attribute on one side
fails this test until the other side has it too or it is listed.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from gateway import ExecutionResult, Gateway
from gateway.audit import MemoryAuditSink
from gateway.client import AsyncRemoteSessions, RemoteResult, RemoteSession, RemoteSessionResult, RemoteSessions
from gateway.policy import load_policy
from gateway.sessions import SessionInfo, SessionManager, SessionResult
from gateway.slots import HostSlots
from tests.unit.sessions_support import SESSIONS_POLICY, Clock, KernelFakeRunner

LIBRARY_ONLY_METHODS = {
    "sweep": "the Gateway's own sweeper ends idle sessions; remotely the service's does",
    "close_all": "the Gateway's stop; a client cannot stop the service",
}
LIBRARY_ONLY_ARGUMENTS = {
    "principal": "remotely the token is the principal",
    "operator": "remotely the token's role is the operator's (only list asks for every principal's: ?all=true)",
    "caller": "the service's authenticated caller, set by the service",
    "request_id": "assigned by the service",
    "on_output": "remotely streaming is server-sent events",
    "cancel": "a remote run is bounded by the service's deadline",
}
SHARED_ARGUMENTS = {("list", "operator")}
"""Library-only arguments that a method has on both sides."""

LIBRARY_ONLY_ATTRIBUTES: dict[type, set[str]] = {
    ExecutionResult: {"outcome"},  # the sandbox's raw report; remotely its fields are in to_dict()
    SessionInfo: {"container_id"},  # the host's container is not told to remote callers
    SessionResult: set(),
}
REMOTE_ONLY_ATTRIBUTES: dict[type, set[str]] = {
    RemoteResult: {"status", "exit_code", "stdout", "stderr", "violations"},  # the HTTP status; to_dict() fields
    RemoteSession: set(),
    RemoteSessionResult: {"status", "violations", "session_id"},
}
PAIRS = [(ExecutionResult, RemoteResult), (SessionInfo, RemoteSession), (SessionResult, RemoteSessionResult)]


def public_methods(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls, inspect.isfunction) if not name.startswith("_")}


def shared_parameters(cls: type, method: str) -> list[tuple[str, Any, Any]]:
    """``method``'s parameters as (name, kind, default), without the library-only ones."""
    parameters = inspect.signature(getattr(cls, method)).parameters.values()
    return [
        (p.name, p.kind, p.default)
        for p in parameters
        if p.name not in LIBRARY_ONLY_ARGUMENTS or (method, p.name) in SHARED_ARGUMENTS
    ]


@pytest.mark.parametrize("facade", [RemoteSessions, AsyncRemoteSessions])
def test_the_client_has_the_managers_methods_with_its_arguments(facade: type) -> None:
    library = public_methods(SessionManager) - set(LIBRARY_ONLY_METHODS)
    assert public_methods(facade) == library
    for method in sorted(library):
        assert shared_parameters(facade, method) == shared_parameters(SessionManager, method), method
    for name, argument in SHARED_ARGUMENTS:
        assert argument in inspect.signature(getattr(SessionManager, name)).parameters


def test_the_async_client_awaits_every_method() -> None:
    assert all(inspect.iscoroutinefunction(getattr(AsyncRemoteSessions, m)) for m in public_methods(RemoteSessions))


def public_attributes(cls: type) -> set[str]:
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    return fields | {name for name in dir(cls) if not name.startswith("_")}


@pytest.mark.parametrize(("library", "remote"), PAIRS, ids=lambda cls: cls.__name__)
def test_the_results_have_the_same_attributes(library: type, remote: type) -> None:
    assert public_attributes(library) - LIBRARY_ONLY_ATTRIBUTES[library] <= public_attributes(remote)
    assert public_attributes(remote) - public_attributes(library) == REMOTE_ONLY_ATTRIBUTES[remote]


# --- the same answer reads the same on both sides ------------------------------------------------------------


@pytest.fixture
def gateway(tmp_path: Path) -> Gateway:
    gw = Gateway(
        load_policy(SESSIONS_POLICY),
        runner=KernelFakeRunner(),
        audit=MemoryAuditSink(),
        slots=HostSlots(tmp_path / "s", 8, wait_s=0),
    )
    gw.sessions = SessionManager(gw, clock=Clock())
    return gw


def values(result: object, names: set[str]) -> dict[str, Any]:
    return {name: getattr(result, name) for name in sorted(names)}


def test_a_session_and_a_cell_read_the_same_from_their_json(gateway: Gateway) -> None:
    created = gateway.sessions.create({"mode": "kernel"})  # made without a principal: principal None throughout
    assert created.session is not None
    sid = created.session.session_id
    gateway.sessions.execute(sid, {"code": "x = 41"})
    cell = gateway.sessions.execute(sid, {"code": "x + 1"})
    info = gateway.sessions.get(sid)
    assert [s.session_id for s in gateway.sessions.list()] == [sid]

    remote_info = RemoteSession(info.to_dict())
    compared = public_attributes(SessionInfo) - {"container_id", "settings", "to_dict"}
    assert values(remote_info, compared) == values(info, compared)  # the fake clock keeps whole seconds
    assert remote_info.settings == info.settings.to_dict()

    remote_cell = RemoteResult(cell.to_dict(), status=200)
    compared = public_attributes(ExecutionResult) - {"outcome", "decision", "error", "to_dict"}
    assert values(remote_cell, compared) == values(cell, compared)
    assert (remote_cell.value, remote_cell.session_id) == ("42", sid)

    remote_created = RemoteSessionResult(created.to_dict(), status=201)
    compared = public_attributes(SessionResult) - {"decision", "session", "to_dict"}
    assert values(remote_created, compared) == values(created, compared)
    assert remote_created.session is not None
    assert remote_created.session.session_id == sid

    assert gateway.sessions.close(sid) is None  # as DELETE's 204: nothing to read
    assert gateway.sessions.list() == []

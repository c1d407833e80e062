"""The LLM tool with a session on the real engine (runc): in a kernel two tool calls share a variable, a file
written under ./out comes back, and the kernel's container is gone once the handler closes; in a workspace files
persist between calls and variables do not, and the workspace is gone once the handler closes. The same through a
``gateway.client.Client`` to a real ``gateway serve`` on a loopback port: the same answers."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker.errors
import pytest

from gateway import Gateway
from gateway.audit import JsonlAuditTrail, verify_trail
from gateway.client import Client
from gateway.errors import SessionGoneError
from gateway.policy import load_policy
from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.service.principals import PrincipalsStore
from gateway.slots import HostSlots
from gateway.tool import TOOL_NAME, ToolHandler

if TYPE_CHECKING:
    from conftest import Server

pytestmark = pytest.mark.integration

SESSIONS_POLICY = policies_dir() / "examples" / "sessions.yaml"


@pytest.fixture
def gateway(engine: Any, tmp_path: Path) -> Iterator[Gateway]:
    trail = JsonlAuditTrail(tmp_path / "audit")
    policy = load_policy(SESSIONS_POLICY)
    with Gateway(policy, runner=DockerRunner(engine), audit=trail, slots=HostSlots(tmp_path / "slots", 8)) as gw:
        yield gw
    trail.close()


def test_two_tool_calls_share_a_variable_and_close_removes_the_kernel(
    gateway: Gateway, engine: Any, tmp_path: Path
) -> None:
    with ToolHandler(gateway, principal="agent-7", session="kernel") as handler:
        first = handler(TOOL_NAME, {"code": "x = 41"})
        second = handler(TOOL_NAME, "{\"code\": \"open('out/x.txt', 'w').write(str(x))\\nx + 1\"}")
        assert handler.session_id is not None
        container = gateway.sessions.get(handler.session_id, principal="agent-7").container_id
    assert (first["ok"], first["session"]) == (True, {"mode": "kernel", "new": True}), first
    assert (second["ok"], second["value"], second["session"]["new"]) == (True, "42", False), second
    assert [(f["path"], f["content"]) for f in second["files"]] == [("x.txt", "41")]
    assert container is not None
    with pytest.raises(docker.errors.NotFound):
        engine.api.inspect_container(container)
    assert gateway.sessions.list(principal="agent-7") == []
    assert verify_trail(tmp_path / "audit").ok


def test_a_workspace_session_keeps_files_not_variables(
    engine: Any,
    tmp_path: Path,
    workspace_root: str,
) -> None:
    trail = JsonlAuditTrail(tmp_path / "audit")
    policy = load_policy(policies_dir() / "examples" / "sessions.yaml")
    runner = DockerRunner(engine, workspace_root=workspace_root)
    with (
        Gateway(policy, runner=runner, audit=trail, slots=HostSlots(tmp_path / "slots", 8)) as gw,
        ToolHandler(gw, principal="agent-7", session="workspace") as handler,
    ):
        handler(TOOL_NAME, {"code": "x = 1\nopen('keep.txt', 'w').write('hello')"})
        kept = handler(TOOL_NAME, {"code": "print(open('keep.txt').read())\nprint('x' in globals())"})
    trail.close()
    assert (kept["ok"], kept["stdout"], kept["session"]) == (
        True,
        "hello\nFalse\n",
        {"mode": "workspace", "new": False},
    )
    assert "value" not in kept
    assert os.listdir(workspace_root) == []  # closed with the handler


# --- the same handler over a Client -------------------------------------------------------------------------


def _served(serve: Callable[..., Server], tmp_path: Path, **config: Any) -> tuple[Server, str]:
    """A server where agent-7 runs under the sessions policy, and agent-7's token."""
    path = tmp_path / "tool-principals.yaml"
    token = PrincipalsStore(path).add("agent-7", policy=str(SESSIONS_POLICY), role="agent")
    return serve(principals=path, **config), token


def _same(answer: dict[str, Any]) -> dict[str, Any]:
    """What must be equal locally and remotely: everything but the request's id."""
    return {key: value for key, value in answer.items() if key != "request_id"}


KERNEL_CALLS = [{"code": "x = 41"}, {"code": "open('out/x.txt', 'w').write(str(x))\nx + 1"}]


def test_a_client_backed_handler_shares_a_kernel_and_answers_as_a_local_one(
    serve: Callable[..., Server], gateway: Gateway, engine: Any, tmp_path: Path
) -> None:
    server, token = _served(serve, tmp_path)
    with ToolHandler(gateway, principal="agent-7", session="kernel") as local:
        expected = [local(TOOL_NAME, args) for args in KERNEL_CALLS]
    with Client(server.url, token) as client:
        with ToolHandler(client, session="kernel") as handler:
            answers = [handler(TOOL_NAME, args) for args in KERNEL_CALLS]
            first = handler.session_id
            assert first is not None
            client.sessions.close(first)  # ended behind the handler's back: the next call says so
            lost = handler(TOOL_NAME, {"code": "x"})
            second = handler.session_id
            assert second not in (None, first)
            container = server.service.gateway.sessions.get(second, principal="agent-7").container_id
        assert handler.session_id is None
        for sid in (first, second):
            with pytest.raises(SessionGoneError):
                client.sessions.get(sid)
        assert client.sessions.list() == []
        assert "State persists between calls" in handler.definition()["function"]["description"]
    assert [_same(a) for a in answers] == [_same(a) for a in expected], answers
    assert (answers[1]["value"], answers[1]["files"][0]["content"]) == ("42", "41")
    assert (lost["session"], "NameError" in lost["stderr"]) == ({"mode": "kernel", "new": True}, True), lost
    assert "earlier variables, imports and files are gone" in lost["state_lost"]
    assert container is not None
    with pytest.raises(docker.errors.NotFound):
        engine.api.inspect_container(container)


def test_a_client_backed_handler_keeps_a_workspace_and_close_removes_it(
    serve: Callable[..., Server], workspace_root: str, tmp_path: Path
) -> None:
    server, token = _served(serve, tmp_path, runner=functools.partial(DockerRunner, workspace_root=workspace_root))
    with Client(server.url, token) as client:
        with ToolHandler(client, session="workspace") as handler:
            handler(TOOL_NAME, {"code": "x = 1\nopen('keep.txt', 'w').write('hello')"})
            kept = handler(TOOL_NAME, {"code": "print(open('keep.txt').read())\nprint('x' in globals())"})
            sid = handler.session_id
            assert sid is not None
            assert "keep.txt" in [f.path for f in client.sessions.list_files(sid).files]
        with pytest.raises(SessionGoneError):
            client.sessions.get(sid)
    assert (kept["ok"], kept["stdout"], kept["session"]) == (
        True,
        "hello\nFalse\n",
        {"mode": "workspace", "new": False},
    )
    assert os.listdir(workspace_root) == []  # closed with the handler

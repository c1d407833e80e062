"""The LLM tool with a session on the real engine (runc): in a kernel two tool calls share a variable, a file
written under ./out comes back, and the kernel's container is gone once the handler closes; in a workspace files
persist between calls and variables do not, and the workspace is gone once the handler closes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from gateway import Gateway
from gateway.audit import JsonlAuditTrail, verify_trail
from gateway.policy import load_policy
from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.slots import HostSlots
from gateway.tool import TOOL_NAME, ToolHandler

pytestmark = pytest.mark.integration


@pytest.fixture
def gateway(engine: Any, tmp_path: Path) -> Iterator[Gateway]:
    trail = JsonlAuditTrail(tmp_path / "audit")
    policy = load_policy(policies_dir() / "examples" / "sessions.yaml")
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

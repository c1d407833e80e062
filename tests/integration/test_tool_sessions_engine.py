"""The LLM tool with a kernel session on the real engine (runc): two tool calls share a variable, a file written
under ./out comes back, and the kernel's container is gone once the handler closes."""

from __future__ import annotations

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

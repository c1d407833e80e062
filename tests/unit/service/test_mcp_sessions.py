"""``gateway mcp --session``: one gateway session per MCP connection, opened at start, closed at its end, and a
policy without sessions refused before anything is served.

A fake kernel runner keeps a real Python namespace between cells; the real engine over real stdio is
tests/integration/test_mcp_stdio.py.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.errors import EXIT_DENIED
from gateway.policy import load_policy
from gateway.resources import default_policy_path
from gateway.service.mcp import PrincipalIdentity, StdioWire, build_server, serve
from gateway.sessions import SessionManager
from gateway.slots import HostSlots
from gateway.tool import TOOL_NAME, ToolHandler
from tests.unit.sessions_support import SESSIONS_POLICY, Clock, KernelFakeRunner


def _gateway(policy: Path, runner: KernelFakeRunner, sink: MemoryAuditSink, tmp: Path) -> Gateway:
    gw = Gateway(load_policy(policy), runner=runner, audit=sink, slots=HostSlots(tmp / "slots", 8, wait_s=0))
    gw.sessions = SessionManager(gw, clock=Clock())
    return gw


def _identity(policy: Path) -> PrincipalIdentity:
    return PrincipalIdentity("agent-7", policy, 2)


def _empty_wire() -> StdioWire:
    """A client that connects and hangs up at once (stdin at its end)."""
    return StdioWire(io.BytesIO(b""), io.BytesIO())


def events(sink: MemoryAuditSink, kind: str) -> list[dict[str, Any]]:
    return [r for r in sink.records if r["event_type"] == kind]


def test_the_calls_of_one_mcp_session_share_state(tmp_path: Path) -> None:
    runner, sink = KernelFakeRunner(), MemoryAuditSink()
    handler = ToolHandler(_gateway(SESSIONS_POLICY, runner, sink, tmp_path), principal="agent-7", session="kernel")
    server = build_server(handler, max_concurrent=2)

    async def run() -> tuple[Any, Any, Any]:
        async with Client(server) as client:
            tools = await client.list_tools()
            first = await client.call_tool(TOOL_NAME, {"code": "x = 41"})
            second = await client.call_tool(TOOL_NAME, {"code": "x + 1"})
            return tools, first, second

    tools, first, second = anyio.run(run)
    handler.close()
    assert "variables, imports and files carry over" in tools.tools[0].description
    assert set(tools.tools[0].input_schema["properties"]) == {"code", "timeout"}  # no session id to guess
    assert (first.is_error, second.is_error) == (False, False)
    assert second.structured_content["value"] == "42"
    assert len(runner.kernels) == 1
    assert runner.kernels[0].killed == "closed"


def test_serve_opens_the_session_first_and_closes_it_when_the_connection_ends(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner, sink = KernelFakeRunner(), MemoryAuditSink()
    gw = _gateway(SESSIONS_POLICY, runner, sink, tmp_path)
    assert serve(gw, _identity(SESSIONS_POLICY), _empty_wire(), session="kernel") == 0
    assert "one kernel session for the connection" in capsys.readouterr().err
    [created] = events(sink, "session.created")
    [closed] = events(sink, "session.closed")
    assert closed["data"]["session_id"] == created["data"]["session_id"]
    assert (closed["principal"], closed["data"]["reason"]) == ("agent-7", "owner")
    assert runner.kernels[0].killed == "closed"


def test_a_policy_without_sessions_refuses_at_start_and_serves_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner, sink = KernelFakeRunner(), MemoryAuditSink()
    gw = _gateway(default_policy_path(), runner, sink, tmp_path)
    wire = _empty_wire()
    assert serve(gw, _identity(default_policy_path()), wire, session="kernel") == EXIT_DENIED
    err = capsys.readouterr().err
    assert "--session kernel is denied for principal agent-7" in err
    assert "sessions.enabled" in err
    assert "spec.sessions" in err  # what to do
    assert isinstance(wire.writer, io.BytesIO)
    assert wire.writer.getvalue() == b""  # not one protocol byte
    assert runner.kernels == []
    assert events(sink, "session.created") == []


def test_without_session_serve_keeps_none(tmp_path: Path) -> None:
    runner, sink = KernelFakeRunner(), MemoryAuditSink()
    assert serve(_gateway(SESSIONS_POLICY, runner, sink, tmp_path), _identity(SESSIONS_POLICY), _empty_wire()) == 0
    assert runner.kernels == []
    assert events(sink, "session.created") == []

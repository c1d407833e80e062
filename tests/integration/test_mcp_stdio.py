"""``gateway mcp`` on the real engine, driven by the MCP SDK's own stdio client.

The client starts ``python -m gateway mcp --principal ...`` as a subprocess (as Claude Desktop or any MCP
client would), lists the tool, runs ``print(2+2)`` in a real sandbox, is denied a timeout above the ceiling,
and the trail holds every record with the principal. A server stopped with SIGTERM mid-run removes its sandbox
and records the outcome first. With ``--session kernel`` two calls share a variable and the kernel is gone when the
client closes; a policy without sessions refuses at start.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from gateway.audit.verify import verify_trail
from gateway.policy import load_policy
from gateway.resources import default_policy_path, policies_dir
from gateway.service.principals import PrincipalsStore
from gateway.tool import TOOL_NAME
from tests.integration.conftest import gateway_containers

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PRINCIPAL = "agent-7"


@pytest.fixture
def principals(tmp_path: Path) -> Path:
    path = tmp_path / "principals.yaml"
    PrincipalsStore(path).add(PRINCIPAL, policy=default_policy_path())
    return path


def _records(audit_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for seg in sorted(audit_dir.glob("*.jsonl")) for line in seg.read_text().splitlines()]


def _server_args(principals: Path, audit_dir: Path) -> list[str]:
    return [
        "-m",
        "gateway",
        "mcp",
        "--principal",
        PRINCIPAL,
        "--principals",
        str(principals),
        "--audit-dir",
        str(audit_dir),
    ]


def test_sdk_client_lists_runs_and_is_denied_over_stdio(engine: Any, principals: Path, tmp_path: Path) -> None:
    audit_dir = tmp_path / "trail"
    ceiling = load_policy(default_policy_path()).limits.timeout_s.max
    params = StdioServerParameters(
        command=sys.executable,
        args=_server_args(principals, audit_dir),
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=str(tmp_path),
    )

    async def session() -> tuple[Any, Any, Any, Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            tools = await client.list_tools()
            ran = await client.call_tool(TOOL_NAME, {"code": "print(2+2)"})
            denied = await client.call_tool(TOOL_NAME, {"code": "print(2+2)", "timeout": ceiling + 1})
            wrote = await client.call_tool(TOOL_NAME, {"code": "open('out/b.bin', 'wb').write(bytes(range(256)))"})
            return tools, ran, denied, wrote

    tools, ran, denied, wrote = anyio.run(session)

    (tool,) = tools.tools
    assert tool.name == TOOL_NAME
    assert set(tool.input_schema["properties"]) == {"code", "timeout"}
    assert tool.input_schema["required"] == ["code"]
    assert tool.input_schema["properties"]["timeout"]["maximum"] == ceiling
    assert f"timeout up to {ceiling:g} s" in tool.description

    assert ran.is_error is False
    assert ran.structured_content["stdout"] == "4\n"
    assert ran.structured_content["exit_code"] == 0
    assert json.loads(ran.content[0].text)["stdout"] == "4\n"

    assert denied.is_error is False
    assert denied.structured_content["allowed"] is False
    assert [v["rule"] for v in denied.structured_content["denied_because"]] == ["limits.timeout"]
    assert "above the ceiling" in denied.structured_content["denied_because"][0]["message"]

    [written] = wrote.structured_content["files"]  # a file the program wrote, byte for byte
    assert (written["path"], written["encoding"], written["truncated"]) == ("b.bin", "base64", False)
    assert base64.b64decode(written["content"], validate=True) == bytes(range(256))

    records = _records(audit_dir)
    by_request: dict[str, list[str]] = {}
    for record in records:
        if record["request_id"]:
            assert record["principal"] == PRINCIPAL
            by_request.setdefault(record["request_id"], []).append(record["event_type"])
    assert by_request[ran.structured_content["request_id"]] == [
        "request.received",
        "policy.decision",
        "execution.outcome",
    ]
    assert by_request[denied.structured_content["request_id"]] == ["request.received", "policy.decision"]
    assert verify_trail(audit_dir).ok
    assert gateway_containers(engine) == []


def _rpc(id_: int | None, method: str, params: dict[str, Any]) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if id_ is not None:
        message["id"] = id_
    return (json.dumps(message) + "\n").encode()


@pytest.fixture
def server(principals: Path, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, *_server_args(principals, tmp_path / "trail")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_sigterm_mid_run_removes_the_sandbox_and_records_it(
    engine: Any, server: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    assert server.stdin is not None
    assert server.stdout is not None
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
    call = {"name": TOOL_NAME, "arguments": {"code": "import time\nprint('up', flush=True)\ntime.sleep(50)"}}
    server.stdin.write(
        _rpc(1, "initialize", init) + _rpc(None, "notifications/initialized", {}) + _rpc(2, "tools/call", call)
    )
    server.stdin.flush()
    assert json.loads(server.stdout.readline())["id"] == 1
    while not gateway_containers(engine):  # the sandbox exists: the run is in flight
        assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
        time.sleep(0.1)
    server.send_signal(signal.SIGTERM)
    _, err = server.communicate(timeout=60)
    assert server.returncode == 0, err.decode()
    assert gateway_containers(engine) == []
    outcomes = [r for r in _records(tmp_path / "trail") if r["event_type"] == "execution.outcome"]
    assert len(outcomes) == 1
    assert outcomes[0]["principal"] == PRINCIPAL
    assert outcomes[0]["data"]["error"]["code"] == "gateway.cancelled"


def test_a_kernel_session_keeps_state_across_calls_and_ends_with_the_connection(engine: Any, tmp_path: Path) -> None:
    principals = tmp_path / "principals.yaml"
    PrincipalsStore(principals).add(PRINCIPAL, policy=policies_dir() / "examples" / "sessions.yaml")
    audit_dir = tmp_path / "trail"
    params = StdioServerParameters(
        command=sys.executable,
        args=[*_server_args(principals, audit_dir), "--session", "kernel"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=str(tmp_path),
    )

    async def session() -> tuple[Any, Any, list[str]]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            first = await client.call_tool(TOOL_NAME, {"code": "x = 41"})
            second = await client.call_tool(TOOL_NAME, {"code": "x + 1"})
            return first, second, gateway_containers(engine)

    first, second, live = anyio.run(session)

    assert first.is_error is False, first.structured_content
    assert (second.structured_content["value"], second.structured_content["session"]["new"]) == ("42", False)
    assert len(live) == 1  # the kernel, while connected
    assert gateway_containers(engine) == []  # gone with the connection
    records = _records(audit_dir)
    [created] = [r for r in records if r["event_type"] == "session.created"]
    [closed] = [r for r in records if r["event_type"] == "session.closed"]
    sid = created["data"]["session_id"]
    assert (closed["principal"], closed["data"]["session_id"], closed["data"]["executions"]) == (PRINCIPAL, sid, 2)
    outcomes = [r for r in records if r["event_type"] == "execution.outcome"]
    assert [r["data"]["session_id"] for r in outcomes] == [sid, sid]
    assert verify_trail(audit_dir).ok


def test_a_session_the_policy_does_not_allow_is_refused_at_start(engine: Any, principals: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, *_server_args(principals, tmp_path / "trail"), "--session", "kernel"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert done.returncode == 77, done.stderr.decode()
    assert done.stdout == b""  # not one protocol byte
    err = done.stderr.decode()
    assert f"--session kernel is denied for principal {PRINCIPAL}" in err
    assert "sessions.enabled" in err
    assert gateway_containers(engine) == []


def test_sigterm_closes_the_connections_session(engine: Any, tmp_path: Path) -> None:
    principals = tmp_path / "principals.yaml"
    PrincipalsStore(principals).add(PRINCIPAL, policy=policies_dir() / "examples" / "sessions.yaml")
    proc = subprocess.Popen(
        [sys.executable, *_server_args(principals, tmp_path / "trail"), "--session", "kernel"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=tmp_path,
    )
    try:
        assert proc.stdin is not None
        assert proc.stdout is not None
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
        proc.stdin.write(_rpc(1, "initialize", init))
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 1  # serving: the session was opened before
        assert len(gateway_containers(engine)) == 1
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert gateway_containers(engine) == []
    [closed] = [r for r in _records(tmp_path / "trail") if r["event_type"] == "session.closed"]
    assert (closed["principal"], closed["data"]["reason"]) == (PRINCIPAL, "owner")

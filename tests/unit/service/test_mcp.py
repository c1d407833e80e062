"""``gateway mcp`` without an engine: who it acts as, what the tool answers, and a stdout that is only protocol.

The MCP client here is the SDK's own (in-process for the server logic, a raw pipe for the stdout check); the
real engine end to end is tests/integration/test_mcp_stdio.py.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.cli import main
from gateway.errors import EngineUnavailableError, PrincipalIdentityError, UnknownPrincipalError
from gateway.policy import load_policy
from gateway.resources import default_policy_path
from gateway.runner.fake import FakeRunner, make_outcome
from gateway.service.mcp import build_server, resolve_identity
from gateway.service.principals import PrincipalsStore, Quotas
from gateway.tool import TOOL_NAME, ToolHandler

REPO = Path(__file__).resolve().parents[3]


def _gateway(runner: FakeRunner, audit: MemoryAuditSink | None = None) -> Gateway:
    return Gateway(load_policy(default_policy_path()), runner=runner, audit=audit or MemoryAuditSink())


def _session(gateway: Gateway, calls: list[tuple[str, dict[str, Any]]]) -> tuple[Any, list[Any]]:
    """List the tools, then make each call, through the SDK's in-process client."""
    server = build_server(ToolHandler(gateway, principal="agent-7"), max_concurrent=2)

    async def run() -> tuple[Any, list[Any]]:
        async with Client(server) as client:
            tools = await client.list_tools()
            return tools, [await client.call_tool(name, args) for name, args in calls]

    return anyio.run(run)


# --- who the server acts as ------------------------------------------------------------------------------


@pytest.fixture
def principals(tmp_path: Path) -> Path:
    path = tmp_path / "principals.yaml"
    store = PrincipalsStore(path)
    store.add("agent-7", policy=default_policy_path(), quotas=Quotas(max_concurrent=3, rpm=60, queue=4))
    store.add("gone", policy=default_policy_path())
    store.revoke("gone")
    return path


def test_the_principal_brings_its_policy_and_concurrency(principals: Path) -> None:
    identity = resolve_identity(principal="agent-7", principals_file=str(principals), policy=None)
    assert identity.principal == "agent-7"
    assert identity.policy == default_policy_path().absolute()
    assert identity.max_concurrent == 3


def test_a_revoked_principal_is_not_served(principals: Path) -> None:
    with pytest.raises(PrincipalIdentityError, match=r"'gone'.*revoked.*gateway principals rotate gone"):
        resolve_identity(principal="gone", principals_file=str(principals), policy=None)


def test_an_unknown_principal_is_refused_with_the_known_names(principals: Path) -> None:
    with pytest.raises(UnknownPrincipalError, match=r"no principal named 'nobody'.*agent-7"):
        resolve_identity(principal="nobody", principals_file=str(principals), policy=None)


def test_the_principal_and_another_policy_contradict(principals: Path) -> None:
    with pytest.raises(PrincipalIdentityError, match="the principal's own policy decides"):
        resolve_identity(principal="agent-7", principals_file=str(principals), policy="policies/strict.yaml")


def test_no_principal_and_no_explicit_policy_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_POLICY", str(default_policy_path()))  # the environment's policy does not count
    with pytest.raises(PrincipalIdentityError, match=r"--principal NAME.*--policy FILE"):
        resolve_identity(principal=None, principals_file=None, policy=None)


def test_an_explicit_policy_acts_as_the_process_owner() -> None:
    identity = resolve_identity(principal=None, principals_file=None, policy="policies/default.yaml", user="alice")
    assert identity.principal == "local:alice"
    assert identity.policy == Path("policies/default.yaml").absolute()


def test_cli_refuses_to_serve_without_an_identity(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["mcp"]) == 2
    out, err = capfd.readouterr()
    assert out == ""  # even the refusal stays off the protocol's stream
    assert "principals.identity" in err
    assert "--principal NAME" in err


# --- the tool over MCP -----------------------------------------------------------------------------------


def test_the_tool_is_the_llm_tool_with_the_principals_ceilings() -> None:
    gateway = _gateway(FakeRunner())
    tools, _ = _session(gateway, [])
    (tool,) = tools.tools
    expected = ToolHandler(gateway, principal="agent-7").definition()["function"]
    assert tool.name == TOOL_NAME
    assert tool.input_schema == expected["parameters"]
    assert set(tool.input_schema["properties"]) == {"code", "timeout"}
    assert tool.input_schema["properties"]["timeout"]["maximum"] == gateway.policy.limits.timeout_s.max
    assert "timeout up to 60 s (default 10 s)" in tool.description
    assert "in an isolated, network-less sandbox" in tool.description


def test_runs_and_denials_are_results_and_audited_with_the_principal() -> None:
    runner, audit = FakeRunner(), MemoryAuditSink()
    _, (ran, denied) = _session(
        _gateway(runner, audit),
        [(TOOL_NAME, {"code": "print(2+2)"}), (TOOL_NAME, {"code": "print(1)", "timeout": 61})],
    )
    assert ran.is_error is False
    assert ran.structured_content["stdout"] == "4\n"
    assert json.loads(ran.content[0].text) == ran.structured_content  # the model reads the same object
    assert denied.is_error is False  # a denial is an answer the model reads, not a failure
    assert denied.structured_content["allowed"] is False
    assert denied.structured_content["denied_because"] == [
        {"rule": "limits.timeout", "message": "timeout_s 61 is above the ceiling 60"}
    ]
    assert len(runner.calls) == 1
    decisions = [r for r in audit.records if r["event_type"] == "policy.decision"]
    assert [r["principal"] for r in decisions] == ["agent-7", "agent-7"]
    assert [r["data"]["decision"]["allowed"] for r in decisions] == [True, False]


def test_the_files_a_run_wrote_come_back_with_their_contents() -> None:
    blob = bytes(range(256))
    runner = FakeRunner(outcome=make_outcome(files={"a.bin": blob, "b.txt": b"hi"}))
    _, (ran,) = _session(_gateway(runner), [(TOOL_NAME, {"code": "x"})])
    files = ran.structured_content["files"]
    assert [(f["path"], f["encoding"], f["truncated"]) for f in files] == [
        ("a.bin", "base64", False),
        ("b.txt", "utf-8", False),
    ]
    assert base64.b64decode(files[0]["content"]) == blob
    assert files[1]["content"] == "hi"
    assert json.loads(ran.content[0].text)["files"] == files


def test_a_gateway_failure_is_a_tool_error_with_its_code() -> None:
    runner = FakeRunner(error=EngineUnavailableError("the Docker engine does not answer"))
    _, (failed,) = _session(_gateway(runner), [(TOOL_NAME, {"code": "print(1)"})])
    assert failed.is_error is True
    assert failed.structured_content["error"]["type"] == "runner.engine_unavailable"


@pytest.mark.parametrize(
    ("name", "args", "kind"),
    [
        (TOOL_NAME, {"code": "x", "image": "python:latest"}, "invalid_arguments"),
        ("execute_ruby", {"code": "puts 1"}, "unknown_tool"),
    ],
)
def test_refused_calls_are_tool_errors_and_run_nothing(name: str, args: dict[str, Any], kind: str) -> None:
    runner = FakeRunner()
    _, (refused,) = _session(_gateway(runner), [(name, args)])
    assert refused.is_error is True
    assert refused.structured_content["error"]["type"] == kind
    assert runner.calls == []


# --- stdout is the protocol's ------------------------------------------------------------------------------

_NOISY_SERVER = textwrap.dedent(
    """
    import os, sys
    from gateway import Gateway
    from gateway.audit import MemoryAuditSink
    from gateway.policy import load_policy
    from gateway.resources import default_policy_path
    from gateway.runner.fake import FakeRunner
    from gateway.service.mcp import PrincipalIdentity, claim_stdio, serve

    class NoisyRunner(FakeRunner):
        def execute(self, *args, **kwargs):
            print("noise: print inside a run")
            os.write(1, b"noise: fd 1 inside a run\\n")
            return super().execute(*args, **kwargs)

    with claim_stdio() as wire:
        print("noise: print before serving")
        os.system("echo noise: a child process")
        gateway = Gateway(load_policy(default_policy_path()), runner=NoisyRunner(), audit=MemoryAuditSink())
        serve(gateway, PrincipalIdentity("agent-7", default_policy_path(), 1), wire)
    """
)


def _rpc(id_: int | None, method: str, params: dict[str, Any]) -> str:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if id_ is not None:
        message["id"] = id_
    return json.dumps(message) + "\n"


def test_stdout_carries_nothing_but_protocol(tmp_path: Path) -> None:
    script = tmp_path / "noisy_server.py"
    script.write_text(_NOISY_SERVER)
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}
    messages = (
        _rpc(1, "initialize", init)
        + _rpc(None, "notifications/initialized", {})
        + _rpc(2, "tools/list", {})
        + _rpc(3, "tools/call", {"name": TOOL_NAME, "arguments": {"code": "print(2+2)"}})
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(messages.encode())
        proc.stdin.flush()
        lines: list[dict[str, Any]] = []
        while len([m for m in lines if "id" in m]) < 3:  # every answer; then stdin closes and the server ends
            line = proc.stdout.readline()
            assert line, "the server ended before answering"
            lines.append(json.loads(line))
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    lines.extend(json.loads(line) for line in rest.splitlines())
    assert all(m["jsonrpc"] == "2.0" for m in lines)  # every line is one JSON-RPC message
    answers = {m["id"]: m for m in lines if "id" in m}
    assert sorted(answers) == [1, 2, 3]
    assert answers[3]["result"]["structuredContent"]["stdout"] == "4\n"
    stderr = err.decode()
    for noise in ("print before serving", "a child process", "print inside a run", "fd 1 inside a run"):
        assert f"noise: {noise}" in stderr


def test_the_sdk_is_loaded_only_by_gateway_mcp() -> None:
    """The ``mcp`` extra is optional: the library and every other command work without the SDK."""
    probe = (
        "import sys, gateway, gateway.cli, gateway.tool; print(sorted(m for m in sys.modules if m.startswith('mcp')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.stdout.strip() == "[]"

"""The LLM tools per language on the real engine: ``execute_shell`` runs ``echo 4`` in a real sandbox (a local
Gateway, ``gateway mcp`` over stdio, ``/mcp`` and a ``Client`` to a real ``gateway serve``), and ``/v1/tools``,
``Client.tools()`` and MCP ``tools/list`` offer a python-only caller ``execute_python`` alone and a caller under
``policies/examples/polyglot.yaml`` the three tools."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.client import Client
from gateway.policy import load_policy
from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.service.principals import PrincipalsStore
from gateway.slots import HostSlots
from gateway.tool import ToolHandler

if TYPE_CHECKING:
    from conftest import Server

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
POLYGLOT = policies_dir() / "examples" / "polyglot.yaml"
THREE = ["execute_python", "execute_shell", "execute_javascript"]
ECHO = {"code": "echo 4"}


def _ran_four(answer: dict[str, Any]) -> None:
    assert answer["ok"] is True, answer
    assert answer["stdout"] == "4\n"
    assert answer["exit_code"] == 0


def test_execute_shell_runs_echo_in_a_real_sandbox(engine: Any, tmp_path: Path) -> None:
    sink = MemoryAuditSink()
    policy = load_policy(POLYGLOT)
    with Gateway(policy, runner=DockerRunner(engine), audit=sink, slots=HostSlots(tmp_path / "slots", 4)) as gw:
        handler = ToolHandler(gw, principal="agent-7")
        assert [tool["function"]["name"] for tool in handler.definitions()] == THREE
        _ran_four(handler("execute_shell", ECHO))
    (received,) = [r for r in sink.records if r["event_type"] == "request.received"]
    assert received["data"]["request"]["language"] == "shell"


def test_gateway_mcp_over_stdio_lists_the_policys_tools_and_runs_shell(engine: Any, tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gateway", "mcp", "--policy", str(POLYGLOT), "--audit-dir", str(tmp_path / "trail")],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=str(tmp_path),
    )

    async def session() -> tuple[list[str], Any]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as client:
            await client.initialize()
            listed = [tool.name for tool in (await client.list_tools()).tools]
            return listed, await client.call_tool("execute_shell", ECHO)

    listed, ran = anyio.run(session)
    assert listed == THREE
    assert ran.is_error is False
    _ran_four(ran.structured_content)


async def _over_mcp_http(url: str, token: str, calls: list[str]) -> tuple[list[str], list[Any]]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(60)) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        listed = [tool.name for tool in (await client.list_tools()).tools]
        return listed, [await client.call_tool(name, ECHO) for name in calls]


def test_the_service_offers_each_caller_its_policys_tools(
    engine: Any, serve: Callable[..., Server], principals_file: tuple[Path, dict[str, str]]
) -> None:
    poly = PrincipalsStore(principals_file[0]).add("poly", policy=str(POLYGLOT), role="agent")
    server = serve()
    alice = server.tokens["alice"]  # the default policy: Python only
    with server.client(alice) as http:
        assert [t["function"]["name"] for t in http.get("/v1/tools").json()["tools"]] == ["execute_python"]
    with server.client(poly) as http:
        assert [t["function"]["name"] for t in http.get("/v1/tools").json()["tools"]] == THREE
    listed, (denied,) = anyio.run(_over_mcp_http, server.url, alice, ["execute_shell"])
    assert listed == ["execute_python"]
    assert [d["rule"] for d in denied.structured_content["denied_because"]] == ["language.supported"]
    listed, (ran,) = anyio.run(_over_mcp_http, server.url, poly, ["execute_shell"])
    assert listed == THREE
    _ran_four(ran.structured_content)
    with Client(server.url, poly) as client:
        assert [tool["function"]["name"] for tool in client.tools()] == THREE
        _ran_four(ToolHandler(client)("execute_shell", ECHO))
    shell_runs = [r for r in server.records("request.received") if r["data"]["request"].get("language") == "shell"]
    assert [r["principal"] for r in shell_runs] == ["alice", "poly", "poly"]

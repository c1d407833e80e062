"""The LLM tools per language: one per language the policy allows, each with its ceilings, and a call's tool name
sets its request's language.

The polyglot policy here is the default one with ``languages`` widened in the model; the real engine running
``execute_shell`` is tests/integration/test_tool_languages_engine.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.policy import load_policy
from gateway.policy.model import LanguagesRule, Policy
from gateway.resources import default_policy_path
from gateway.runner.fake import FakeRunner
from gateway.service.endpoints import tools_for
from gateway.service.mcp import build_server
from gateway.sessions import SessionManager
from gateway.slots import HostSlots
from gateway.tool import EXECUTE_PYTHON_TOOL, ToolHandler, ceilings_text, tool_definition, tool_definitions
from tests.unit.sessions_support import SESSIONS_POLICY, Clock, KernelFakeRunner

ALL = ("python", "shell", "javascript")


def polyglot(policy: Policy) -> Policy:
    return dataclasses.replace(policy, languages=LanguagesRule(ALL, "python"))


@pytest.fixture
def python_only() -> Policy:
    policy = load_policy(default_policy_path())
    assert policy.languages.allowed == ("python",)
    return policy


def names(tools: list[dict[str, Any]]) -> list[str]:
    return [tool["function"]["name"] for tool in tools]


def received_languages(sink: MemoryAuditSink) -> list[str]:
    return [r["data"]["request"]["language"] for r in sink.records if r["event_type"] == "request.received"]


@pytest.mark.parametrize(
    ("language", "what"),
    [("python", "Execute Python 3 code"), ("shell", "Run a bash script"), ("javascript", "Run a Node.js program")],
)
def test_each_language_has_its_tool_with_the_same_two_arguments(language: str, what: str) -> None:
    function = tool_definition(language=language)["function"]
    assert function["name"] == f"execute_{language}"
    assert function["description"].startswith(what)
    parameters = function["parameters"]
    assert set(parameters["properties"]) == {"code", "timeout"}
    assert parameters["required"] == ["code"]
    assert parameters["additionalProperties"] is False
    assert parameters["properties"]["timeout"] == EXECUTE_PYTHON_TOOL["function"]["parameters"]["properties"]["timeout"]


def test_a_language_without_a_tool_is_refused() -> None:
    with pytest.raises(ValueError, match=r"language 'ruby' has no tool; the tools' languages are"):
        tool_definition(language="ruby")


def test_a_python_only_policy_offers_only_execute_python(python_only: Policy) -> None:
    assert names(tool_definitions(python_only)) == ["execute_python"]
    assert names(tools_for(python_only)) == ["execute_python"]


def test_a_polyglot_policy_offers_one_tool_per_language_each_with_its_ceilings(python_only: Policy) -> None:
    policy = polyglot(python_only)
    for tools in (tool_definitions(policy), tools_for(policy)):
        assert names(tools) == ["execute_python", "execute_shell", "execute_javascript"]
        for tool in tools:
            assert ceilings_text(policy) in tool["function"]["description"]
            assert tool["function"]["parameters"]["properties"]["timeout"]["maximum"] == policy.limits.timeout_s.max
    http = {tool["function"]["name"]: tool["function"]["description"] for tool in tools_for(policy)}
    assert '"language": "shell"' in http["execute_shell"]  # the /v1/executions body each one stands for


def test_only_pythons_tool_keeps_a_sessions_state(python_only: Policy) -> None:
    tools = tool_definitions(polyglot(python_only), session="kernel")
    described = {tool["function"]["name"]: tool["function"]["description"] for tool in tools}
    assert "variables, imports and files carry over" in described["execute_python"]
    for name in ("execute_shell", "execute_javascript"):
        assert "State does not persist between calls." in described[name]
        assert "carry over" not in described[name]


def test_the_tool_name_sets_the_requests_language(python_only: Policy) -> None:
    sink = MemoryAuditSink()
    handler = ToolHandler(Gateway(polyglot(python_only), runner=FakeRunner(), audit=sink))
    assert names(handler.definitions()) == ["execute_python", "execute_shell", "execute_javascript"]
    assert handler.definition()["function"]["name"] == "execute_python"
    for name in ("execute_shell", "execute_javascript", "execute_python"):
        handler(name, {"code": "x"})
    assert received_languages(sink) == ["shell", "javascript", "python"]


def test_a_policy_without_python_has_no_python_definition(python_only: Policy) -> None:
    policy = dataclasses.replace(python_only, languages=LanguagesRule(("shell",), "shell"))
    handler = ToolHandler(Gateway(policy, runner=FakeRunner(), audit=MemoryAuditSink()))
    assert names(handler.definitions()) == ["execute_shell"]
    with pytest.raises(LookupError, match=r"does not offer the execute_python tool \(offered: execute_shell\)"):
        handler.definition()


def test_a_session_handler_runs_other_languages_outside_its_session(tmp_path: Path) -> None:
    sink, runner = MemoryAuditSink(), KernelFakeRunner()
    gw = Gateway(
        polyglot(load_policy(SESSIONS_POLICY)), runner=runner, audit=sink,
        slots=HostSlots(tmp_path / "slots", 8, wait_s=0),
    )  # fmt: skip
    gw.sessions = SessionManager(gw, clock=Clock())
    with ToolHandler(gw, session="kernel") as handler:
        shell = handler("execute_shell", {"code": "echo 4"})
        assert handler.session_id is None  # a shell call opens no session
        python = handler("execute_python", {"code": "x = 41"})
        assert handler.session_id is not None
    assert "session" not in shell
    assert python["session"] == {"mode": "kernel", "new": True}
    assert received_languages(sink) == ["shell", "python"]
    [kernel] = runner.kernels
    assert [code for code, _ in kernel.cells] == ["x = 41"]  # only the Python call went to the session's kernel


def test_mcp_lists_the_policys_tools_and_routes_each_call(python_only: Policy) -> None:
    async def listed_and_called(gateway: Gateway) -> tuple[list[str], Any]:
        async with Client(build_server(ToolHandler(gateway, principal="agent-7"), max_concurrent=2)) as client:
            listed = [tool.name for tool in (await client.list_tools()).tools]
            return listed, await client.call_tool("execute_shell", {"code": "echo 4"})

    runner = FakeRunner()
    listed, denied = anyio.run(listed_and_called, Gateway(python_only, runner=runner, audit=MemoryAuditSink()))
    assert listed == ["execute_python"]
    assert denied.is_error is False  # a denial is a result, with the rule
    assert [d["rule"] for d in denied.structured_content["denied_because"]] == ["language.supported"]
    assert runner.calls == []
    sink = MemoryAuditSink()
    listed, _ = anyio.run(listed_and_called, Gateway(polyglot(python_only), runner=FakeRunner(), audit=sink))
    assert listed == ["execute_python", "execute_shell", "execute_javascript"]
    assert received_languages(sink) == ["shell"]

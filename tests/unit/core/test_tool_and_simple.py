"""The LLM tool and the simple helper: what the model may set, and what it reads back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.policy import load_policy
from gateway.resources import default_policy_path
from gateway.runner.fake import FakeRunner, make_outcome
from gateway.simple import result_summary
from gateway.tool import EXECUTE_PYTHON_TOOL, TOOL_NAME, ToolHandler, handle_tool_call


@pytest.fixture
def runner() -> FakeRunner:
    return FakeRunner()


@pytest.fixture
def gw(runner: FakeRunner) -> Gateway:
    return Gateway(load_policy(default_policy_path()), runner=runner, audit=MemoryAuditSink())


def test_definition_exposes_only_code_and_timeout() -> None:
    params = EXECUTE_PYTHON_TOOL["function"]["parameters"]
    assert EXECUTE_PYTHON_TOOL["function"]["name"] == TOOL_NAME
    assert set(params["properties"]) == {"code", "timeout"}
    assert params["required"] == ["code"]
    assert params["additionalProperties"] is False


def test_definition_bounds_timeout_by_the_policy(gw: Gateway) -> None:
    bound = ToolHandler(gw).definition()["function"]["parameters"]["properties"]["timeout"]["maximum"]
    assert bound == gw.policy.limits.timeout_s.max


def test_call_runs_through_the_gateway(gw: Gateway, runner: FakeRunner) -> None:
    answer = handle_tool_call(TOOL_NAME, json.dumps({"code": "print(2+2)"}), gateway=gw)
    assert answer["ok"] is True
    assert answer["stdout"] == "4\n"
    assert answer["exit_code"] == 0
    assert len(runner.calls) == 1
    json.dumps(answer)  # the model gets JSON


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        ({"code": "x", "image": "python:latest"}, "invalid_arguments"),
        ({"code": "x", "mounts": [{"source": "/", "target": "/host"}]}, "invalid_arguments"),
        ({"code": 1}, "invalid_arguments"),
        ({"code": "x", "timeout": "soon"}, "invalid_arguments"),
        ({"code": "x", "timeout": True}, "invalid_arguments"),
        ("{not json", "invalid_arguments"),
        ("[1, 2]", "invalid_arguments"),
    ],
)
def test_model_cannot_set_operator_fields_or_bad_arguments(
    gw: Gateway, runner: FakeRunner, args: Any, kind: str
) -> None:
    answer = handle_tool_call(TOOL_NAME, args, gateway=gw)
    assert answer["ok"] is False
    assert answer["error"]["type"] == kind
    assert runner.calls == []


def test_unknown_tool_is_refused(gw: Gateway, runner: FakeRunner) -> None:
    answer = handle_tool_call("execute_ruby", {"code": "puts 1"}, gateway=gw)
    assert answer["error"]["type"] == "unknown_tool"
    assert "execute_python, execute_shell, execute_javascript" in answer["error"]["message"]
    assert runner.calls == []


def test_a_language_the_policy_does_not_allow_is_denied_by_its_rule(gw: Gateway, runner: FakeRunner) -> None:
    answer = handle_tool_call("execute_shell", {"code": "ls"}, gateway=gw)  # the default policy: Python only
    assert answer["allowed"] is False
    assert [d["rule"] for d in answer["denied_because"]] == ["language.supported"]
    assert runner.calls == []


def test_timeout_above_the_ceiling_is_denied_with_the_rule(gw: Gateway, runner: FakeRunner) -> None:
    answer = handle_tool_call(TOOL_NAME, {"code": "x", "timeout": 10_000}, gateway=gw)
    assert answer["allowed"] is False
    assert [d["rule"] for d in answer["denied_because"]] == ["limits.timeout"]
    assert runner.calls == []


def test_long_output_is_clipped_for_the_model(gw: Gateway, runner: FakeRunner) -> None:
    runner.outcome = make_outcome(stdout=b"y" * 100_000)
    answer = handle_tool_call(TOOL_NAME, {"code": "print('y' * 100000)"}, gateway=gw)
    assert len(answer["stdout"]) < 100_000
    assert answer["truncated"] is True


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (make_outcome(stdout=b"4\n"), {"success": True, "output": "4\n"}),
        (make_outcome(exit_code=1, stderr=b"Traceback: boom\n"), {"success": False, "error": "Traceback: boom\n"}),
    ],
)
def test_run_in_sandbox_shape(gw: Gateway, runner: FakeRunner, outcome: Any, expected: dict[str, Any]) -> None:
    runner.outcome = outcome
    assert result_summary(gw.execute({"code": "x"})) == expected


def test_run_in_sandbox_shape_on_denial(gw: Gateway) -> None:
    summary = result_summary(gw.execute({"code": "x", "limits": {"timeout_s": 10_000}}))
    assert summary["success"] is False
    assert "limits.timeout" in summary["error"]


def test_an_invalid_request_tells_the_model_what_and_where(gw: Gateway, runner: FakeRunner) -> None:
    answer = handle_tool_call(TOOL_NAME, {"code": "x", "timeout": 100_000}, gateway=gw)
    assert answer["error"]["type"] == "request.invalid"
    assert [p["path"] for p in answer["error"]["problems"]] == ["$.limits.timeout_s"]
    assert runner.calls == []


def test_requests_name_the_handlers_principal(gw: Gateway) -> None:
    handle_tool_call(TOOL_NAME, {"code": "print(1)"}, gateway=gw)
    ToolHandler(gw, principal="agent-7")(TOOL_NAME, {"code": "print(1)"})
    audit = gw.audit
    assert isinstance(audit, MemoryAuditSink)
    decisions = [r["principal"] for r in audit.records if r["event_type"] == "policy.decision"]
    assert decisions == ["llm-tool", "agent-7"]

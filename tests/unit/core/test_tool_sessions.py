"""The LLM tool with a session: the host chooses it, the model's calls share state, and a lost state is said.

A fake kernel runner keeps a real Python namespace between cells (tests/unit/sessions/test_session_manager.py);
the real engine is tests/integration/test_tool_sessions_engine.py.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.policy import load_policy
from gateway.resources import default_policy_path
from gateway.sessions import SessionManager
from gateway.slots import HostSlots
from gateway.tool import EXECUTE_PYTHON_TOOL, TOOL_NAME, ToolHandler, tool_definition
from tests.unit.sessions_support import SESSIONS_POLICY, Clock, KernelFakeRunner


@pytest.fixture
def runner() -> KernelFakeRunner:
    return KernelFakeRunner()


@pytest.fixture
def sink() -> MemoryAuditSink:
    return MemoryAuditSink()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _gateway(policy: Path, runner: KernelFakeRunner, sink: MemoryAuditSink, clock: Clock, tmp: Path) -> Gateway:
    gw = Gateway(load_policy(policy), runner=runner, audit=sink, slots=HostSlots(tmp / "slots", 8, wait_s=0))
    gw.sessions = SessionManager(gw, clock=clock)
    return gw


@pytest.fixture
def gw(runner: KernelFakeRunner, sink: MemoryAuditSink, clock: Clock, tmp_path: Path) -> Gateway:
    return _gateway(SESSIONS_POLICY, runner, sink, clock, tmp_path)


def call(handler: ToolHandler, code: str, **args: Any) -> dict[str, Any]:
    return handler(TOOL_NAME, {"code": code, **args})


def events(sink: MemoryAuditSink, kind: str) -> list[dict[str, Any]]:
    return [r for r in sink.records if r["event_type"] == kind]


def test_the_session_definition_says_state_persists_and_takes_the_same_arguments() -> None:
    kernel = tool_definition(session="kernel")["function"]
    workspace = tool_definition(session="workspace")["function"]
    stateless = EXECUTE_PYTHON_TOOL["function"]
    assert "State does not persist between calls." in stateless["description"]
    assert "variables, imports and files carry over" in kernel["description"]
    assert "variables and imports do not" in workspace["description"]
    assert kernel["parameters"] == workspace["parameters"] == stateless["parameters"]
    with pytest.raises(ValueError, match="'forever' is not one of"):
        tool_definition(session="forever")  # type: ignore[arg-type]


def test_a_handlers_definition_follows_its_session(gw: Gateway) -> None:
    assert "State does not persist" in ToolHandler(gw).definition()["function"]["description"]
    described = ToolHandler(gw, session="kernel").definition()["function"]["description"]
    assert "carry over" in described
    assert "Policy sessions:" in described  # the principal's ceilings, as without a session


def test_consecutive_calls_share_one_kernel_and_close_ends_it(
    gw: Gateway, runner: KernelFakeRunner, sink: MemoryAuditSink
) -> None:
    with ToolHandler(gw, principal="alice", session="kernel") as handler:
        assert handler.session_id is None  # opened at the first call
        first = call(handler, "x = 41")
        second = call(handler, "x + 1")
        sid = handler.session_id
    assert (first["ok"], first["session"], "value" not in first) == (True, {"mode": "kernel", "new": True}, True)
    assert (second["value"], second["value_truncated"], second["session"]["new"]) == ("42", False, False)
    assert "state_lost" not in second
    assert sid is not None
    assert sid not in str(second)  # the model never sees the id it could not use anyway
    assert len(runner.kernels) == 1
    assert runner.kernels[0].killed == "closed"
    assert handler.session_id is None
    [closed] = events(sink, "session.closed")
    assert (closed["principal"], closed["data"]["session_id"], closed["data"]["executions"]) == ("alice", sid, 2)
    assert {r["data"]["session_id"] for r in events(sink, "execution.outcome")} == {sid}


def test_each_call_gets_the_policy_default_timeout_and_may_ask_up_to_the_ceiling(
    gw: Gateway, runner: KernelFakeRunner
) -> None:
    handler = ToolHandler(gw, principal="alice", session="kernel")
    limits = handler.policy.limits.timeout_s
    assert call(handler, "1")["ok"]
    assert call(handler, "2", timeout=limits.max)["ok"]
    denied = call(handler, "3", timeout=limits.max + 1)
    assert denied["allowed"] is False
    assert {v["rule"] for v in denied["denied_because"]} >= {"limits.timeout"}
    assert [t for _, t in runner.kernels[0].cells] == [limits.default, limits.max]
    handler.close()


def test_a_policy_without_sessions_denies_the_call_with_the_rule_and_runs_nothing(
    runner: KernelFakeRunner, sink: MemoryAuditSink, clock: Clock, tmp_path: Path
) -> None:
    gw = _gateway(default_policy_path(), runner, sink, clock, tmp_path)
    handler = ToolHandler(gw, principal="alice", session="kernel")
    refused = handler.open()
    assert refused is not None
    assert not refused.allowed
    answer = call(handler, "x = 1")
    assert (answer["ok"], answer["allowed"]) == (False, False)
    assert "sessions.enabled" in {v["rule"] for v in answer["denied_because"]}
    assert "session" not in answer
    assert runner.kernels == []
    assert handler.session_id is None


def test_a_kernel_killed_during_a_call_is_said_and_the_next_call_starts_afresh(
    gw: Gateway, runner: KernelFakeRunner
) -> None:
    handler = ToolHandler(gw, principal="alice", session="kernel")
    call(handler, "x = 41")
    killed = call(handler, "kill:oom")
    assert "killed during this call (oom)" in killed["state_lost"]
    after = call(handler, "y = 1")
    assert (after["ok"], after["session"]["new"]) == (True, True)
    assert "previous session was killed (oom)" in after["state_lost"]  # said again: the answer may have been lost
    assert "state_lost" not in call(handler, "y")
    assert len(runner.kernels) == 2
    handler.close()


def test_an_expired_session_is_replaced_and_the_answer_says_the_state_is_gone(
    gw: Gateway, runner: KernelFakeRunner, sink: MemoryAuditSink, clock: Clock
) -> None:
    handler = ToolHandler(gw, principal="alice", session="kernel")
    call(handler, "x = 41")
    old = handler.session_id
    clock.now += 601  # past the policy's default idle_s
    answer = call(handler, "x + 1")
    assert "earlier variables, imports and files are gone" in answer["state_lost"]
    assert answer["session"] == {"mode": "kernel", "new": True}
    assert "NameError" in answer["stderr"]  # ran in the new, empty kernel: the model sees why
    assert handler.session_id not in (None, old)
    assert [r["data"]["session_id"] for r in events(sink, "session.expired")] == [old]
    handler.close()


def test_a_call_cancelled_while_queued_runs_nothing(gw: Gateway, runner: KernelFakeRunner) -> None:
    handler = ToolHandler(gw, principal="alice", session="kernel")
    cancel = threading.Event()
    cancel.set()
    answer = handler(TOOL_NAME, {"code": "x = 1"}, cancel=cancel)
    assert answer["error"]["type"] == "gateway.cancelled"
    assert runner.kernels == []


def test_parallel_calls_of_one_handler_run_one_after_another(gw: Gateway, runner: KernelFakeRunner) -> None:
    handler = ToolHandler(gw, principal="alice", session="kernel")
    call(handler, "x = 0")
    kernel = runner.kernels[0]
    answers: list[dict[str, Any]] = []
    waiting = threading.Thread(target=lambda: answers.append(call(handler, "wait")))
    waiting.start()
    assert kernel.entered.wait(10)
    queued = threading.Thread(target=lambda: answers.append(call(handler, "x + 1")))
    queued.start()
    kernel.release.set()
    waiting.join(10)
    queued.join(10)
    assert sorted(a.get("value") or "" for a in answers) == ["", "1"]  # the second queued, never session.busy
    assert all(a["ok"] for a in answers)
    handler.close()


def test_a_workspace_session_is_not_asked_of_a_backend_without_workspaces(gw: Gateway) -> None:
    answer = call(ToolHandler(gw, principal="alice", session="workspace"), "print(1)")
    assert answer["error"]["type"] == "session.unavailable"


class RemoteLike:
    """An executor that is neither a local Gateway nor a client: it has no sessions."""

    def execute(self, request: Any) -> Any:
        raise AssertionError("not reached")


def test_sessions_need_gateway_sessions_and_a_known_mode(gw: Gateway) -> None:
    with pytest.raises(ValueError, match="RemoteLike has none; pass a local Gateway or a gateway"):
        ToolHandler(RemoteLike(), session="kernel")
    with pytest.raises(ValueError, match="'forever' is not one of"):
        ToolHandler(gw, session="forever")  # type: ignore[arg-type]


def test_without_a_session_nothing_changes(gw: Gateway, runner: KernelFakeRunner) -> None:
    answer = call(ToolHandler(gw, principal="alice"), "print(2+2)")
    assert answer["stdout"] == "4\n"
    assert "session" not in answer
    assert "value" not in answer
    assert runner.kernels == []

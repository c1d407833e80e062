"""Approvals (issue 32): a held request waits, an operator decides, exactly that request runs, at most N times."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gateway import Gateway
from gateway.audit import JsonlAuditTrail, MemoryAuditSink
from gateway.audit.approvals import ApprovalStore
from gateway.errors import (
    EXIT_DENIED,
    EXIT_PENDING,
    ApprovalClosedError,
    ApprovalConflictError,
    ApprovalLimitError,
    ApprovalNotFoundError,
    AuditUnavailableError,
)
from gateway.policy import Policy, load_policy
from gateway.policy.model import Limit
from gateway.resources import load_schema, policies_dir
from gateway.testing import FakeRunner
from gateway.tool import TOOL_NAME, handle_tool_call

LARGE = {"code": "print(1)", "limits": {"memory": "384m"}, "principal": "agent-1"}


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(policies_dir() / "examples" / "approve-large.yaml")


def _gateway(policy: Policy, sink: Any, clock: Clock, **store: Any) -> tuple[Gateway, FakeRunner]:
    runner = FakeRunner()
    return Gateway(policy, runner=runner, audit=sink, approvals=ApprovalStore(sink, clock=clock, **store)), runner


def _kinds(sink: MemoryAuditSink) -> list[str]:
    return [r["event_type"] for r in sink.records if r["event_type"].startswith("approval.")]


def test_a_held_request_waits_then_runs_once_when_approved(policy: Policy) -> None:
    sink, clock = MemoryAuditSink(), Clock()
    gw, runner = _gateway(policy, sink, clock)
    held = gw.execute(LARGE)
    assert held.pending
    assert held.exit_status == EXIT_PENDING
    assert runner.calls == []
    assert held.to_dict()["approval_id"] == held.approval_id
    assert held.approval_id is not None
    assert gw.execute(LARGE).approval_id == held.approval_id  # still pending: the same approval, nothing new
    gw.approvals.grant(held.approval_id, approver="alice", reason="needs the memory")
    ran = gw.execute(LARGE)
    assert ran.ran
    assert ran.approval_id == held.approval_id
    assert runner.calls[0][0].options["mem_limit"] == 384 * 1024 * 1024
    again = gw.execute(LARGE)
    assert isinstance(again.error, ApprovalClosedError)
    assert again.exit_status == EXIT_DENIED
    assert len(runner.calls) == 1
    assert _kinds(sink) == ["approval.requested", "approval.granted", "approval.used"]
    validator = Draft202012Validator(load_schema("audit-record"))
    for record in sink.records:
        validator.validate(record)


def test_an_approval_runs_only_the_identical_request_of_the_same_principal(policy: Policy) -> None:
    sink, clock = MemoryAuditSink(), Clock()
    gw, runner = _gateway(policy, sink, clock)
    held = gw.execute(LARGE)
    assert held.approval_id is not None
    gw.approvals.grant(held.approval_id, approver="alice", reason="ok", uses=2)
    for other in ({**LARGE, "code": "print(2)"}, {**LARGE, "principal": "agent-2"}):
        assert gw.execute(other).pending
    assert runner.calls == []
    assert gw.execute(LARGE).ran
    assert gw.execute(LARGE).ran


def test_a_denied_request_does_not_run_and_says_who_denied_it(policy: Policy) -> None:
    sink, clock = MemoryAuditSink(), Clock()
    gw, runner = _gateway(policy, sink, clock)
    held = gw.execute(LARGE)
    assert held.approval_id is not None
    gw.approvals.deny(held.approval_id, approver="bob", reason="too large")
    result = gw.execute(LARGE)
    assert isinstance(result.error, ApprovalClosedError)
    assert "denied by bob: too large" in result.error.message
    assert runner.calls == []


def test_an_expired_approval_does_not_run_and_the_request_asks_anew(policy: Policy) -> None:
    sink, clock = MemoryAuditSink(), Clock()
    gw, runner = _gateway(policy, sink, clock)
    held = gw.execute(LARGE)
    assert held.approval_id is not None
    gw.approvals.grant(held.approval_id, approver="alice", reason="ok")
    clock.now += timedelta(hours=1)
    again = gw.execute(LARGE)
    assert again.pending
    assert again.approval_id != held.approval_id
    assert runner.calls == []


@pytest.mark.parametrize(
    ("act", "error"),
    [
        (lambda s, i: s.grant("0" * 32, approver="a", reason="r"), ApprovalNotFoundError),
        (lambda s, i: s.grant(i, approver="a", reason="r", digest="f" * 64), ApprovalConflictError),
        (lambda s, i: s.grant(i, approver="", reason="r"), ApprovalConflictError),
    ],
)
def test_bad_operator_input_is_refused_and_audited(policy: Policy, act: Any, error: type[Exception]) -> None:
    sink, clock = MemoryAuditSink(), Clock()
    gw, runner = _gateway(policy, sink, clock)
    held = gw.execute(LARGE)
    with pytest.raises(error):
        act(gw.approvals, held.approval_id)
    assert _kinds(sink) == ["approval.requested", "approval.refused"]
    assert gw.execute(LARGE).pending
    assert runner.calls == []


def test_an_approval_is_decided_once_and_not_after_expiry(policy: Policy) -> None:
    sink, clock = MemoryAuditSink(), Clock()
    gw, _ = _gateway(policy, sink, clock)
    first, second = gw.execute(LARGE), gw.execute({**LARGE, "code": "print(3)"})
    assert first.approval_id is not None
    assert second.approval_id is not None
    gw.approvals.grant(first.approval_id, approver="alice", reason="ok")
    with pytest.raises(ApprovalConflictError, match="granted, not pending"):
        gw.approvals.deny(first.approval_id, approver="bob", reason="no")
    clock.now += timedelta(hours=2)
    with pytest.raises(ApprovalConflictError, match="expired, not pending"):
        gw.approvals.grant(second.approval_id, approver="alice", reason="late")
    assert _kinds(sink).count("approval.refused") == 2


def test_pending_approvals_per_principal_are_capped(policy: Policy) -> None:
    sink, clock = MemoryAuditSink(), Clock()
    gw, _ = _gateway(policy, sink, clock, max_pending=2)
    assert gw.execute({**LARGE, "code": "1"}).pending
    assert gw.execute({**LARGE, "code": "2"}).pending
    refused = gw.execute({**LARGE, "code": "3"})
    assert isinstance(refused.error, ApprovalLimitError)
    assert not refused.pending
    assert gw.execute({**LARGE, "code": "3", "principal": "agent-2"}).pending


def test_a_request_is_not_held_when_the_trail_cannot_record_it(policy: Policy) -> None:
    sink, clock = MemoryAuditSink(), Clock()
    gw, runner = _gateway(policy, sink, clock)
    store = gw.approvals
    decided = gw.execute(LARGE)
    assert decided.approval_id is not None
    store.grant(decided.approval_id, approver="alice", reason="ok")
    failing = MemoryAuditSink()
    failing.available = False
    store.audit = failing
    result = gw.execute(LARGE)  # the decision's record goes to the working sink; approval.used cannot be written
    assert isinstance(result.error, AuditUnavailableError)
    assert not result.audit_ok
    assert runner.calls == []


def test_a_pending_approval_survives_a_new_gateway_on_the_same_trail(policy: Policy, tmp_path: Path) -> None:
    trail = tmp_path / "audit"
    with JsonlAuditTrail(trail) as sink, Gateway(policy, runner=FakeRunner(), audit=sink) as gw:
        held = gw.execute(LARGE)
    assert held.approval_id is not None
    runner = FakeRunner()
    with JsonlAuditTrail(trail) as sink, Gateway(policy, runner=runner, audit=sink) as gw:
        [pending] = gw.approvals.list(state="pending")
        assert pending.approval_id == held.approval_id
        assert pending.rules == ("limits.memory",)
        assert pending.request["code"] == "print(1)"
        gw.approvals.grant(held.approval_id, approver="alice", reason="ok")
    with JsonlAuditTrail(trail) as sink, Gateway(policy, runner=runner, audit=sink) as gw:
        assert gw.execute(LARGE).ran
    assert len(runner.calls) == 1


def test_the_llm_tool_says_it_waits_for_approval_and_runs_once_approved(policy: Policy) -> None:
    limits = dataclasses.replace(policy.limits, timeout_s=Limit(default=10, max=60, mode="approve", hard_max=600))
    sink = MemoryAuditSink()
    gw = Gateway(dataclasses.replace(policy, limits=limits), runner=FakeRunner(), audit=sink)
    waiting = handle_tool_call(TOOL_NAME, {"code": "print(1)", "timeout": 120}, gateway=gw)
    approval_id = waiting["waiting_for_approval"]["approval_id"]
    assert f"waiting for approval {approval_id}" in waiting["waiting_for_approval"]["message"]
    assert "denied_because" not in waiting
    assert "error" not in waiting
    gw.approvals.grant(approval_id, approver="alice", reason="a long job")
    assert handle_tool_call(TOOL_NAME, {"code": "print(1)", "timeout": 120}, gateway=gw)["ok"]


def test_a_pending_approval_shows_the_request_as_the_trail_keeps_it(policy: Policy) -> None:
    sink, clock = MemoryAuditSink(), Clock()
    gw, _ = _gateway(policy, sink, clock)
    held = gw.execute({**LARGE, "env": {"APP_TOKEN": "s3cret"}, "files": {"in.txt": "data"}})
    assert held.approval_id is not None
    shown = gw.approvals.get(held.approval_id).request
    assert shown["env_names"] == ["APP_TOKEN"]
    assert "s3cret" not in json.dumps(shown)
    assert "s3cret" not in json.dumps(sink.of_type("approval.requested"))
    assert shown["files"][0]["name"] == "in.txt"

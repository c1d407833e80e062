"""Approve mode: a request that only approve-mode rules fail is held with its digest; an approved digest runs."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gateway.decision import decide_session, evaluate
from gateway.decision.model import Decision, request_digest
from gateway.policy import Policy, load_policy
from gateway.request import parse_request, parse_session_request
from gateway.resources import load_schema, policies_dir
from gateway.runner.docker.options import DockerAssembler


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(policies_dir() / "examples" / "approve-large.yaml")


HELD = {"code": "print(1)", "limits": {"memory": "384m"}, "principal": "agent-1"}


def _decide(policy: Policy, approved: tuple[str, ...] = (), **fields: Any) -> Decision:
    request = parse_request({**HELD, **fields})
    return evaluate(policy, request, assembler=DockerAssembler(), approved=approved)


def test_a_held_request_is_neither_allowed_nor_denied_and_carries_its_digest(policy: Policy) -> None:
    held = _decide(policy)
    assert (held.allowed, held.approval_required, held.run) == (False, True, None)
    assert [r.rule for r in held.approvals] == ["limits.memory"]
    assert held.violations == ()
    assert held.settings is not None
    assert held.request_digest == request_digest(parse_request(HELD), held.settings)
    record = held.to_dict()
    Draft202012Validator(load_schema("decision")).validate(record)
    assert record["approval_required"] is True
    assert record["approvals"][0]["mode"] == "approve"


def test_the_approved_digest_runs_with_what_was_asked_and_another_does_not(policy: Policy) -> None:
    digest = _decide(policy).request_digest
    assert digest is not None
    approved = _decide(policy, approved=(digest,))
    assert approved.allowed
    assert approved.request_digest == digest
    assert approved.options is not None
    assert approved.options["mem_limit"] == 384 * 1024 * 1024
    other = _decide(policy, approved=(digest,), code="print(2)")
    assert other.approval_required
    assert other.request_digest != digest


@pytest.mark.parametrize(
    "change",
    [{"code": "print(2)"}, {"principal": "agent-2"}, {"limits": {"memory": "385m"}}, {"env": {"APP_X": "1"}}],
)
def test_the_digest_covers_code_principal_and_settings(policy: Policy, change: dict[str, Any]) -> None:
    assert _decide(policy, **change).request_digest != _decide(policy).request_digest


def test_metadata_is_not_part_of_the_digest(policy: Policy) -> None:
    assert _decide(policy, metadata={"trace": "a"}).request_digest == _decide(policy).request_digest


def test_a_decision_without_approve_rules_keeps_its_record_shape(policy: Policy) -> None:
    decision = evaluate(policy, parse_request({"code": "x"}), assembler=DockerAssembler())
    assert decision.allowed
    assert decision.request_digest is None
    assert "approval_required" not in decision.to_dict()


def test_a_session_is_denied_where_an_execution_would_wait(policy: Policy) -> None:
    with_sessions = dataclasses.replace(
        load_policy(policies_dir() / "examples" / "sessions.yaml"), limits=policy.limits
    )
    request = parse_session_request({"mode": "workspace", "limits": {"memory": "384m"}})
    decided = decide_session(with_sessions, request, live_sessions=0, assembler=DockerAssembler())
    assert not decided.allowed
    assert [r.rule for r in decided.violations] == ["limits.memory"]
    assert "sessions have no approvals" in decided.violations[0].message

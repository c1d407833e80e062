"""Room for principals: a policy per principal, an admission hook before the decision, and ownership on close."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import Gateway, PolicySet, RuleResult
from gateway.audit import MemoryAuditSink
from gateway.errors import EXIT_DENIED, PolicyError
from gateway.policy import Policy
from gateway.request import ExecutionRequest
from gateway.testing import FakeRunner


def test_each_principal_is_decided_under_its_own_policy(default_policy: Policy, strict_policy: Policy) -> None:
    policies = PolicySet.of(default_policy, {"untrusted-agent": strict_policy})
    assert policies.for_principal("untrusted-agent").policy is strict_policy
    assert policies.for_principal("someone-else").policy is default_policy
    assert policies.for_principal(None).policy is default_policy
    sink = MemoryAuditSink()
    with Gateway(policies, runner=FakeRunner(), audit=sink) as gw:
        mine = gw.decide({"code": "print(1)", "principal": "untrusted-agent"})
        theirs = gw.decide({"code": "print(1)", "principal": "someone-else"})
    # strict requires gVisor; the default policy's default runtime is runc
    assert mine.decision is not None
    assert mine.decision.policy.name == "strict"
    assert theirs.decision is not None
    assert theirs.decision.policy.name == "default"
    loaded = [r["data"]["name"] for r in sink.records if r["event_type"] == "policy.loaded"]
    assert loaded == ["default", "strict"]
    stamped = {r["principal"]: r["policy"]["name"] for r in sink.records if r["event_type"] == "policy.decision"}
    assert stamped == {"untrusted-agent": "strict", "someone-else": "default"}


def test_a_policy_set_refuses_an_empty_principal_name(default_policy: Policy) -> None:
    with pytest.raises(PolicyError):
        PolicySet.of(default_policy, {"": default_policy})


def test_the_admission_hook_runs_before_the_decision_and_its_refusal_denies(default_policy: Policy) -> None:
    seen: list[tuple[str | None, str]] = []

    def quota(request: ExecutionRequest, policy: Policy) -> list[RuleResult]:
        seen.append((request.principal, policy.name))
        if request.principal == "over-quota":
            return [RuleResult("admission.quota", "fail", "enforce", "$.principal", 11, 10, "11 runs; quota is 10")]
        return []

    runner, sink = FakeRunner(), MemoryAuditSink()
    gw = Gateway(default_policy, runner=runner, audit=sink, admission=quota)
    refused = gw.execute({"code": "print(1)", "principal": "over-quota"})
    admitted = gw.execute({"code": "print(1)", "principal": "fine"})
    assert seen == [("over-quota", "default"), ("fine", "default")]
    assert refused.exit_status == EXIT_DENIED
    assert [v["rule"] for v in refused.to_dict()["violations"]] == ["admission.quota"]
    assert admitted.exit_status == 0
    assert len(runner.calls) == 1
    recorded = [
        r["data"]["decision"]["results"][0]["rule"] for r in sink.records if r["event_type"] == "policy.decision"
    ]
    assert recorded[0] == "admission.quota"


def test_a_failing_admission_hook_denies(default_policy: Policy) -> None:
    def broken(_request: ExecutionRequest, _policy: Policy) -> list[RuleResult]:
        raise RuntimeError("quota store unreachable")

    runner = FakeRunner()
    result = Gateway(default_policy, runner=runner, audit=MemoryAuditSink(), admission=broken).execute({"code": "1"})
    assert result.exit_status == EXIT_DENIED
    [violation] = result.to_dict()["violations"]
    assert violation["rule"] == "admission"
    assert "quota store unreachable" in violation["message"]
    assert runner.calls == []


def test_close_closes_only_what_the_gateway_created(default_policy: Policy, tmp_path: Path) -> None:
    runner, sink = FakeRunner(), MemoryAuditSink()
    with Gateway(default_policy, runner=runner, audit=sink):
        pass
    assert not runner.closed
    assert not sink.closed

    passed_in = FakeRunner()
    with Gateway.from_env(audit_dir=tmp_path / "trail", runner=passed_in) as gw:
        trail = gw.audit
    assert not passed_in.closed  # the caller's runner
    with pytest.raises(Exception, match="closed"):  # the Gateway's own trail is closed: appends fail closed
        trail.append("gateway.start", {"policy_source": "x"})

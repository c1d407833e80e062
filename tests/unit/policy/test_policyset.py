"""A strict policy set (the service's) refuses a principal it does not list instead of deciding it under the
default policy (issue 28 H1: a principal removed by a reload had its queued requests decided under the
default); the Gateway answers such a request with the 401 and a ``request.refused`` record, nothing decided."""

from __future__ import annotations

import pytest

from gateway import Caller, Gateway, PolicySet
from gateway.audit import MemoryAuditSink
from gateway.errors import AuthenticationError, http_status_for
from gateway.policy import Policy, load_policy_text
from gateway.policy.policyset import code_size_ceiling
from gateway.testing import FakeRunner


def test_a_strict_set_refuses_a_principal_it_does_not_list(default_policy: Policy, strict_policy: Policy) -> None:
    policies = PolicySet.of(default_policy, {"agent": strict_policy}, strict=True)
    assert policies.for_principal("agent").policy is strict_policy
    for name in ("gone", None):
        with pytest.raises(AuthenticationError, match="never decided under another policy"):
            policies.for_principal(name)
    lenient = PolicySet.of(default_policy, {"agent": strict_policy})
    assert lenient.for_principal("gone").policy is default_policy  # the library's default behaviour is unchanged


def test_the_gateway_refuses_an_unlisted_principal_and_decides_nothing(
    default_policy: Policy, strict_policy: Policy
) -> None:
    sink = MemoryAuditSink()
    runner = FakeRunner()
    policies = PolicySet.of(default_policy, {"agent": strict_policy}, strict=True)
    with Gateway(policies, runner=runner, audit=sink) as gw:
        result = gw.execute({"code": "print(1)"}, caller=Caller("gone", "0123abcd"))
    assert isinstance(result.error, AuthenticationError)
    assert http_status_for(result.error) == 401
    assert result.decision is None
    assert runner.calls == []
    kinds = [r["event_type"] for r in sink.records]
    assert "policy.decision" not in kinds
    assert "request.received" not in kinds
    (refused,) = [r for r in sink.records if r["event_type"] == "request.refused"]
    assert refused["principal"] == "gone"
    assert refused["data"]["code"] == "auth.failed"
    assert refused["data"]["caller"] == {"principal": "gone", "token_id": "0123abcd"}


# --- the largest code a set lets through (issue 28 M7: refused before the queue) --------------------------------


def _with(base_policy_text: str, old: str, new: str, extra: str = "") -> Policy:
    assert old in base_policy_text
    return load_policy_text(base_policy_text.replace(old, new) + extra, source="test.yaml")


def test_a_policys_code_ceiling_is_its_max_raised_by_exceptions_or_its_audit_hard_max(
    base_policy_text: str,
) -> None:
    plain = _with(base_policy_text, "code_size: {max: 1k}", "code_size: {max: 1k}")
    assert code_size_ceiling(plain) == 1024
    exception = (
        "  exceptions:\n    - id: EXC-1\n      match: {principals: [bot]}\n      limits: {code_size: {max: 8k}}\n"
        "      reason: r\n      approved_by: a@example.com\n      expires: '2000-01-01T00:00:00Z'\n"
    )
    raised = _with(base_policy_text, "code_size: {max: 1k}", "code_size: {max: 1k}", exception)
    assert code_size_ceiling(raised) == 8 * 1024  # expired or not: a bound, not a decision
    audit = _with(base_policy_text, "code_size: {max: 1k}", "code_size: {max: 1k, mode: audit, hard_max: 4k}")
    assert code_size_ceiling(audit) == 4 * 1024  # above max only a warning; above hard_max denied


def test_a_sets_code_ceiling_is_the_largest_of_its_policies_the_default_included(
    default_policy: Policy, strict_policy: Policy, base_policy_text: str
) -> None:
    assert (code_size_ceiling(default_policy), code_size_ceiling(strict_policy)) == (256 * 1024, 64 * 1024)
    assert PolicySet.of(strict_policy, {"a": default_policy}, strict=True).code_size_ceiling == 256 * 1024
    assert PolicySet.of(default_policy, {"a": strict_policy}, strict=True).code_size_ceiling == 256 * 1024
    assert PolicySet.single(strict_policy).code_size_ceiling == 64 * 1024

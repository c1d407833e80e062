"""A strict policy set (the service's) refuses a principal it does not list instead of deciding it under the
default policy (issue 28 H1: a principal removed by a reload had its queued requests decided under the
default); the Gateway answers such a request with the 401 and a ``request.refused`` record, nothing decided."""

from __future__ import annotations

import pytest

from gateway import Caller, Gateway, PolicySet
from gateway.audit import MemoryAuditSink
from gateway.errors import AuthenticationError, http_status_for
from gateway.policy import Policy
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

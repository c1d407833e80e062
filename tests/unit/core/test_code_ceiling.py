"""Code larger than every policy of a set accepts is refused at intake (issue 28, M7): ``parse_request``'s
``max_code_bytes`` (UTF-8, before the schema) and :meth:`Gateway.intake`, which the service runs before a
request waits for a slot; :meth:`Gateway.execute` still decides such code (a denial by ``limits.code_size``)."""

from __future__ import annotations

import json

import pytest

from gateway import Caller, Gateway, PolicySet
from gateway.audit import MemoryAuditSink
from gateway.errors import CodeTooLargeError, http_status_for
from gateway.policy import Policy
from gateway.request import parse_request
from gateway.testing import FakeRunner

KIB = 1024


def test_code_above_max_code_bytes_is_413_at_dollar_code_counted_in_utf8() -> None:
    assert parse_request({"code": "x" * 100}, max_code_bytes=100).code_bytes == 100
    with pytest.raises(CodeTooLargeError) as info:
        parse_request(json.dumps({"code": "é" * 51}).encode(), max_code_bytes=100)  # 51 characters, 102 bytes
    assert http_status_for(info.value) == 413
    (problem,) = info.value.problems
    assert (problem.path, problem.code) == ("$.code", "request.code_too_large")
    assert "code is 102 bytes (UTF-8)" in problem.message
    assert "more than 100" in problem.message
    assert parse_request({"code": "x" * 10_000}).code_bytes == 10_000  # no bound unless asked


def test_the_bound_is_checked_before_the_schema() -> None:
    """An oversized code in an otherwise invalid request is refused for its size alone (cheap, first)."""
    with pytest.raises(CodeTooLargeError):
        parse_request({"code": "x" * 200, "unknown": 1}, max_code_bytes=100)


def test_intake_refuses_code_above_the_sets_ceiling_and_execute_still_decides_it(
    default_policy: Policy, strict_policy: Policy
) -> None:
    sink = MemoryAuditSink()
    runner = FakeRunner()
    policies = PolicySet.of(default_policy, {"agent": strict_policy}, strict=True)  # 256k and 64k
    caller = Caller("agent", "0123abcd")
    with Gateway(policies, runner=runner, audit=sink) as gw:
        refused = gw.intake({"code": "#" * (256 * KIB + 1)}, caller=caller)
        assert refused is not None
        assert isinstance(refused.error, CodeTooLargeError)
        assert refused.decision is None
        assert gw.intake({"code": "#" * (100 * KIB)}, caller=caller) is None  # above hers, within the set's
        decided = gw.execute({"code": "#" * (256 * KIB + 1)}, caller=caller)
    assert decided.decision is not None
    assert "limits.code_size" in [v.rule for v in decided.decision.violations]
    assert runner.calls == []
    (invalid,) = [r for r in sink.records if r["event_type"] == "request.invalid"]
    assert invalid["data"]["problems"][0]["path"] == "$.code"

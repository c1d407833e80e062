"""A secret in the trail: the connection names the secret injected, the outcome where its value was erased; the
value itself is in no record."""

from __future__ import annotations

import dataclasses
import json

import jsonschema

from gateway.egress import EgressReport
from gateway.egress.secrets import Redaction
from gateway.policy import load_policy
from gateway.resources import load_schema, policies_dir
from gateway.runner import FakeRunner
from gateway.runner.fake import make_outcome
from gateway.testing import capture_audit
from tests.egress_support import ALLOWED

POLICY = load_policy(policies_dir() / "examples" / "egress-mirror-secret.yaml")
REPORT = EgressReport(
    records=(dataclasses.replace(ALLOWED, method="GET", port=18089, secret="mirror-token"),),
    connections=1,
    denied=0,
    bytes_out=517,
    bytes_in=4096,
    redactions=(Redaction("mirror-token", "stdout", 2), Redaction("mirror-token", "file:echo.txt", 1)),
)


def test_the_connection_names_the_secret_and_the_outcome_its_redactions() -> None:
    runner = FakeRunner(outcome=make_outcome(stdout=b"[secret:mirror-token]\n", egress=REPORT))
    with capture_audit(POLICY, runner) as (gw, sink):
        result = gw.execute({"code": "x", "network": "egress"})
    assert result.allowed
    (connection,) = [r for r in sink.records if r["event_type"] == "network.connection"]
    assert connection["data"]["secret"] == "mirror-token"
    (outcome,) = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    assert outcome["data"]["egress"]["redactions"] == [
        {"secret": "mirror-token", "where": "stdout", "count": 2},
        {"secret": "mirror-token", "where": "file:echo.txt", "count": 1},
    ]
    (decision,) = [r for r in sink.records if r["event_type"] == "policy.decision"]
    assert "Bearer" not in json.dumps(decision)
    validator = jsonschema.Draft202012Validator(load_schema("audit-record"))
    for record in sink.records:
        assert not list(validator.iter_errors(record)), record["event_type"]


def test_a_connection_without_a_secret_has_no_secret_key() -> None:
    report = dataclasses.replace(REPORT, records=(ALLOWED,), redactions=())
    with capture_audit(POLICY, FakeRunner(outcome=make_outcome(egress=report))) as (gw, sink):
        gw.execute({"code": "x", "network": "egress"})
    (connection,) = [r for r in sink.records if r["event_type"] == "network.connection"]
    assert "secret" not in connection["data"]
    (outcome,) = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    assert "redactions" not in outcome["data"]["egress"]

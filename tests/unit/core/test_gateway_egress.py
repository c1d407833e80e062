"""A run's egress in its audit trail and its result: one ``network.connection`` record per connection, written
without waiting right before the run's ``execution.outcome`` (whose flush makes them durable), also when the run
ended in an error that carries its outcome; the outcome record and the result state the totals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from audit_support import CountingIO

from gateway import Caller, Gateway
from gateway.audit import JsonlAuditTrail, NetworkConnectionView, verify_trail, view_record
from gateway.egress import EgressReport
from gateway.errors import SandboxError
from gateway.policy import load_policy
from gateway.resources import load_schema, policies_dir
from gateway.result import connection_data
from gateway.runner import FakeRunner
from gateway.runner.fake import make_outcome
from gateway.testing import capture_audit
from tests.egress_support import ALLOWED, DENIED

POLICY = load_policy(policies_dir() / "examples" / "egress-mirror.yaml")
REQUEST = {"code": "import urllib.request", "network": "egress"}

REPORT = EgressReport(records=(ALLOWED, DENIED), connections=2, denied=1, bytes_out=600, bytes_in=5000, dropped=1)


def _runner(report: EgressReport | None = REPORT) -> FakeRunner:
    return FakeRunner(outcome=make_outcome(stdout=b"ok\n", egress=report))


def _types(records: list[dict[str, Any]]) -> list[str]:
    return [r["event_type"] for r in records]


def test_each_connection_is_a_record_before_the_outcome_with_the_runs_ids() -> None:
    caller = Caller("agent-1", "0123abcd")
    with capture_audit(POLICY, _runner()) as (gw, sink):
        result = gw.execute(REQUEST, caller=caller)
    assert result.allowed
    assert result.error is None
    run = [r for r in sink.records if r["request_id"] == result.request_id]
    assert _types(run) == [
        "request.received", "policy.decision", "network.connection", "network.connection", "execution.outcome",
    ]  # fmt: skip
    first, second, outcome = run[2:]
    for record in (first, second):
        assert record["principal"] == "agent-1"
        assert record["policy"] == run[1]["policy"]
        assert record["data"]["caller"] == {"principal": "agent-1", "token_id": "0123abcd"}
    assert {k: v for k, v in first["data"].items() if k != "caller"} == {
        "host": "mirror.internal", "port": 18443, "address": "127.0.0.1", "method": "CONNECT",
        "decision": "allowed", "rule": "network.egress.allowed", "bytes_out": 517, "bytes_in": 4096, "duration_ms": 50,
        "ended": "closed",
    }  # fmt: skip
    assert second["data"]["decision"] == "denied"
    assert second["data"]["message"] == "evil.example is not an allowed destination"
    assert second["data"]["address"] is None
    assert outcome["data"]["egress"] == {
        "connections": 2, "denied": 1, "bytes_out": 600, "bytes_in": 5000, "records_dropped": 1,
    }  # fmt: skip


def test_the_records_validate_and_read_as_views() -> None:
    with capture_audit(POLICY, _runner()) as (gw, sink):
        gw.execute(REQUEST)
    validator = jsonschema.Draft202012Validator(load_schema("audit-record"))
    for record in sink.records:
        assert not list(validator.iter_errors(record)), record["event_type"]
    views = [view_record(r) for r in sink.records if r["event_type"] == "network.connection"]
    assert all(isinstance(v, NetworkConnectionView) for v in views)
    assert [(v.host, v.port, v.allowed, v.rule, v.duration_ms) for v in views] == [  # type: ignore[attr-defined]
        ("mirror.internal", 18443, True, "network.egress.allowed", 50),
        ("evil.example", 80, False, "network.egress.host", 0),
    ]


def test_they_are_chained_without_a_flush_of_their_own_and_verify(tmp_path: Path) -> None:
    """The connections add no fsync to a run: the outcome's flush makes them durable with it."""
    io = CountingIO()

    def fsyncs_of_a_run(report: EgressReport | None) -> int:
        with Gateway(POLICY, runner=_runner(report), audit=JsonlAuditTrail(tmp_path / "audit", io=io)) as gw:
            before = io.fsyncs
            gw.execute(REQUEST)
            return io.fsyncs - before

    assert fsyncs_of_a_run(REPORT) == fsyncs_of_a_run(None)
    report = verify_trail(tmp_path / "audit")
    assert report.ok, report.first_break
    lines = [json.loads(line) for path in sorted((tmp_path / "audit").glob("trail-*.jsonl"))
             for line in path.read_text().splitlines()]  # fmt: skip
    assert _types(lines).count("network.connection") == 2


def test_a_run_that_ended_in_an_error_still_records_its_connections() -> None:
    error = SandboxError("the engine lost the container")
    error.outcome = make_outcome(exit_code=None, egress=REPORT)
    with capture_audit(POLICY, FakeRunner(error=error)) as (gw, sink):
        result = gw.execute(REQUEST)
    assert result.error is not None
    run = [r for r in sink.records if r["request_id"] == result.request_id]
    assert _types(run)[-3:] == ["network.connection", "network.connection", "execution.outcome"]
    assert run[-1]["data"]["error"]["code"] == error.code
    assert run[-1]["data"]["egress"]["connections"] == 2
    assert result.to_dict()["egress"] == {"connections": 2, "denied": 1, "bytes_out": 600, "bytes_in": 5000}


def test_the_result_states_the_totals_only_for_a_run_with_egress() -> None:
    with capture_audit(POLICY, _runner()) as (gw, _sink):
        with_egress = gw.execute(REQUEST).to_dict()
    with capture_audit(POLICY, _runner(None)) as (gw, sink):
        without = gw.execute({"code": "print(1)"}).to_dict()
    assert with_egress["egress"] == {"connections": 2, "denied": 1, "bytes_out": 600, "bytes_in": 5000}
    assert "egress" not in without
    assert "network.connection" not in _types(sink.records)
    (outcome,) = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    assert "egress" not in outcome["data"]
    validator = jsonschema.Draft202012Validator(load_schema("result"))
    for data in (with_egress, without):
        assert not list(validator.iter_errors(data))


def test_a_run_with_no_connection_still_states_zero_totals() -> None:
    empty = EgressReport(records=(), connections=0, denied=0, bytes_out=0, bytes_in=0)
    with capture_audit(POLICY, _runner(empty)) as (gw, sink):
        result = gw.execute(REQUEST)
    assert result.to_dict()["egress"] == {"connections": 0, "denied": 0, "bytes_out": 0, "bytes_in": 0}
    assert "network.connection" not in _types(sink.records)


@pytest.mark.parametrize("duration", [0.0, 0.0004, 1.2345])
def test_duration_is_whole_milliseconds(duration: float) -> None:
    record = dataclasses.replace(ALLOWED, duration=duration)
    assert connection_data(record)["duration_ms"] == round(duration * 1000)
    assert "message" not in connection_data(record)


def test_the_cli_prints_one_line_of_totals_for_a_run_with_egress(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import run_cmd

    with capture_audit(POLICY, _runner()) as (gw, _sink):
        with_egress = gw.execute(REQUEST)
    with capture_audit(POLICY, _runner(None)) as (gw, _sink):
        without = gw.execute({"code": "print(1)"})
    run_cmd._print_human(with_egress, run_cmd._LiveOutput())
    assert capsys.readouterr().err.splitlines()[-1] == (
        "gateway: egress: 2 connection(s), 1 denied, 600 bytes out, 5000 bytes in"
    )
    run_cmd._print_human(without, run_cmd._LiveOutput())
    assert "egress" not in capsys.readouterr().err

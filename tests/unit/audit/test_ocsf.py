"""OCSF export: every event type of a trail written by the writer itself, validated with py-ocsf-models."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from audit_support import CONNECTION

from gateway.audit import EVENT_TYPES, JsonlAuditTrail, ocsf_export, verify_trail
from gateway.audit.interrupted import mark_interrupted
from gateway.audit.ocsf import MAPPING, OCSF_VERSION, to_ocsf
from gateway.audit.ocsf_export import export_ocsf
from gateway.cli import main
from gateway.errors import AuditIntegrityError
from tests.ocsf_validation import OCSF_VERSION as LIBRARY_OCSF_VERSION
from tests.ocsf_validation import validate_event

IMAGE = "gateway/sandbox-python:3.11-bookworm"
POLICY = {"name": "default", "sha256": "a" * 64}
CALLER = {"principal": "agent-1", "token_id": "0123abcd"}


def _rule(rule_id: str, status: str, mode: str = "enforce") -> dict[str, Any]:
    return {"rule": rule_id, "status": status, "mode": mode, "path": "$.x", "message": f"{rule_id} {status}"}


def _decision(*, allowed: bool, dry_run: bool = False) -> dict[str, Any]:
    results = [
        _rule("images.allowlist", "pass"),
        _rule("limits.memory", "pass" if allowed else "fail"),
        _rule("network.mode", "warn", mode="audit"),
    ]
    return {
        "decision": {
            "decision_id": "d-1",
            "request_id": "r-1",
            "allowed": allowed,
            "policy": {**POLICY, "source": "policies/default.yaml"},
            "results": results,
            "violations": [r for r in results if r["status"] == "fail"],
            "warnings": [r for r in results if r["status"] == "warn"],
            "options": {"image": IMAGE} if allowed else None,
            "plan": {"image": IMAGE, "runtime": "runsc", "timeout_s": 10.0} if allowed else None,
        },
        "options_sha256": "e" * 64 if allowed else None,
        "dry_run": dry_run,
        "caller": CALLER,
    }


def _outcome(**changes: Any) -> dict[str, Any]:
    outcome: dict[str, Any] = {
        "exit_code": 0,
        "timed_out": False,
        "oom_killed": False,
        "output_limit_killed": False,
        "resource_killed": False,
        "duration_ms": 140,
        "container_id": "c" * 64,
        "image": IMAGE,
        "image_id": "sha256:" + "b" * 64,
        "stdout": {"bytes": 2, "sha256": "0" * 64, "truncated": False},
        "stderr": {"bytes": 0, "sha256": "0" * 64, "truncated": False},
        "files": [{"name": "out/result.txt", "sha256": "f" * 64, "bytes": 3}],
        "error": None,
    }
    outcome.update(changes)
    return outcome


def _connection(**changes: Any) -> dict[str, Any]:
    return {**CONNECTION, "caller": CALLER, **changes}


# (event_type, data, request_id, principal) for every event type, in the shapes the gateway writes
EVENTS: list[tuple[str, dict[str, Any], str | None, str | None]] = [
    ("gateway.start", {"policy_source": "policies/default.yaml"}, None, None),
    ("policy.loaded", {"name": "default", "sha256": "a" * 64, "source": "policies/default.yaml"}, None, None),
    (
        "request.received",
        {"request": {"code": "print(1)", "image": IMAGE, "env": {"TOKEN": "s3cret"}}, "caller": CALLER},
        "r-1",
        "agent-1",
    ),
    ("policy.decision", _decision(allowed=True), "r-1", "agent-1"),
    ("image.pulled", {"image": IMAGE, "image_id": "sha256:" + "b" * 64}, "r-1", "agent-1"),
    ("execution.outcome", _outcome(), "r-1", "agent-1"),
    ("policy.decision", _decision(allowed=False), "r-2", "agent-1"),
    ("policy.decision", _decision(allowed=False, dry_run=True), "r-3", "agent-2"),
    (
        "execution.outcome",
        _outcome(exit_code=None, timed_out=True, error={"code": "runner.timeout", "message": "deadline"}),
        "r-4",
        "agent-1",
    ),
    ("execution.outcome", _outcome(exit_code=3), "r-5", "agent-1"),
    (
        "request.invalid",
        {"problems": [{"path": "$.code", "message": "required"}], "raw_sha256": "d" * 64, "raw_bytes": 2},
        "r-6",
        None,
    ),
    (
        "request.refused",
        {"count": 1, "summary": "rpm quota of agent-1 exceeded", "code": "quota.rpm", "retry_after_s": 2},
        "r-7",
        "agent-1",
    ),
    ("auth.failed", {"count": 3, "summary": "3 failed bearer-token checks", "reason": "unknown token"}, None, None),
    (
        "auth.forbidden",
        {"role": "agent", "required_role": "operator", "path": "/v1/audit/records", "count": 5, "summary": True},
        None,
        "agent-1",
    ),
    ("containers.reaped", {"container_ids": ["c" * 64, "d" * 64]}, None, None),
    (
        "container.left",
        {"error": {"code": "runner.container_left", "message": "removal failed: engine busy"}},
        "r-8",
        "agent-1",
    ),
    ("policy.reloaded", {"ok": False, "problems": [{"path": "$.x", "message": "bad"}], "source": "p.yaml"}, None, None),
    ("policy.rejected", {"source": "p.yaml", "problems": [{"path": "$.x", "message": "bad"}]}, None, None),
    (
        "recovery",
        {"reason": "torn tail", "dropped_bytes": 10, "last_good_seq": 3, "last_good_hash": "0" * 64},
        None,
        None,
    ),
    (
        "session.created",
        {"session_id": "s-1", "mode": "kernel", "container_id": "e" * 64, "expires_at": "2026-12-05T16:00:00Z"},
        "r-9",
        "agent-1",
    ),
    ("session.expired", {"session_id": "s-1", "mode": "kernel", "reason": "idle"}, None, "agent-1"),
    ("session.closed", {"session_id": "s-2", "mode": "kernel", "reason": "owner"}, None, "agent-1"),
    ("session.killed", {"session_id": "s-3", "mode": "kernel", "reason": "memory"}, None, "agent-1"),
    (
        "session.file.put",
        {"session_id": "s-4", "path": "data/in.bin", "bytes": 3, "sha256": "a" * 64},
        "r-10",
        "agent-1",
    ),
    (
        "session.file.get",
        {"session_id": "s-4", "path": "link", "error": {"code": "request.workspace_path", "message": "a symlink"}},
        "r-11",
        "agent-1",
    ),
    # a run's connections (written before its outcome by the gateway; here after the others, seqs unchanged)
    ("network.connection", _connection(), "r-1", "agent-1"),
    ("network.connection", _connection(method="GET", port=18089, bytes_out=80, bytes_in=900), "r-1", "agent-1"),
    (
        "network.connection",
        _connection(
            host="evil.example",
            port=443,
            address=None,
            decision="denied",
            rule="network.egress.host",
            message="evil.example is not an allowed destination",
            bytes_out=0,
            bytes_in=0,
            ended="denied",
        ),
        "r-1",
        "agent-1",
    ),
    (
        "network.connection",
        _connection(ended="limit", message="the run reached its 1024 bytes out", bytes_out=1024),
        "r-1",
        "agent-1",
    ),
    ("network.connection", _connection(method="PATCH", port=18089), "r-1", "agent-1"),
    (
        "approval.requested",
        {
            "approval_id": "a" * 32,
            "request_digest": "d" * 64,
            "rules": ["limits.memory"],
            "requested_at": "2026-12-05T12:00:00.000000Z",
            "expires_at": "2026-12-05T13:00:00.000000Z",
            "request_id": "r-12",
            "decision_id": "d-12",
            "request": {"code": "print(1)"},
        },
        "r-12",
        "agent-1",
    ),
    (
        "approval.granted",
        {"approval_id": "a" * 32, "request_digest": "d" * 64, "approver": "alice", "reason": "ok", "uses_allowed": 1},
        "r-12",
        "agent-1",
    ),
    (
        "approval.used",
        {"approval_id": "a" * 32, "request_digest": "d" * 64, "use": 1, "uses_allowed": 1},
        "r-13",
        "agent-1",
    ),
    (
        "approval.denied",
        {"approval_id": "b" * 32, "request_digest": "d" * 64, "approver": "bob", "reason": "no"},
        None,
        "agent-1",
    ),
    (
        "approval.refused",
        {
            "approval_id": "c" * 32,
            "action": "approve",
            "approver": "bob",
            "code": "approval.not_found",
            "message": "no approval",
        },
        None,
        None,
    ),
    ("gateway.stop", {"policy_source": "policies/default.yaml"}, None, None),
]


def _write(directory: Path, key: bytes | None = None) -> None:
    trail = JsonlAuditTrail(directory, key=key, host="testhost")
    try:
        for event_type, data, request_id, principal in EVENTS:
            policy = POLICY if event_type not in ("gateway.start", "gateway.stop", "auth.failed") else None
            trail.append(event_type, data, request_id=request_id, principal=principal, policy=policy)
    finally:
        trail.close()


def _lines(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for seg in sorted(directory.glob("trail-*.jsonl")) for line in seg.read_bytes().splitlines()
    ]


@pytest.fixture
def trail(tmp_path: Path) -> Path:
    directory = tmp_path / "audit"
    _write(directory)
    return directory


def _export(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]], str]:
    rc = main(["audit", "export", "--format", "ocsf", *argv])
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines()], err


def test_the_mapping_covers_every_event_type_and_the_library_version() -> None:
    assert set(MAPPING) == set(EVENT_TYPES)
    assert {e[0] for e in EVENTS} == set(EVENT_TYPES)
    assert OCSF_VERSION == LIBRARY_OCSF_VERSION  # we emit the version py-ocsf-models implements


def test_every_event_of_a_written_trail_validates(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, events, err = _export(capsys, "--trail", str(trail))
    assert (rc, err) == (0, "")
    records = _lines(trail)
    assert len(events) == len(records) == len(EVENTS)
    for event, record in zip(events, records, strict=True):
        validate_event(event)
        assert event["metadata"]["uid"] == record["event_id"]
        assert event["metadata"]["event_code"] == record["event_type"]
        assert event["metadata"]["sequence"] == record["seq"]
        assert event["unmapped"]["audit"] == {
            "trail": records[0]["event_id"],
            "seq": record["seq"],
            "hash": record["hash"],
            "prev_hash": record["prev_hash"],
        }
        assert event["metadata"]["product"] == {
            "name": "agent-exec-gateway",
            "vendor_name": "agent-exec-gateway",
            "version": record["gateway"]["version"],
        }
        assert event["metadata"].get("correlation_uid") == record["request_id"]
        assert event["metadata"]["original_time"] == record["timestamp"]


def test_a_validator_that_can_fail(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The validation is not vacuous: a mistyped or misspelt field of an exported event is caught."""
    _rc, events, _err = _export(capsys, "--trail", str(trail))
    decision = next(e for e in events if e["metadata"]["event_code"] == "policy.decision")
    for corrupt in (
        lambda e: e["actor"]["user"].update(name=7),
        lambda e: e["api"].update(operaton="x"),
        lambda e: e.update(severity_id=42),
        lambda e: e["metadata"]["product"].pop("vendor_name"),
        lambda e: e.update(type_uid=1),
        lambda e: e.pop("src_endpoint"),
    ):
        broken = json.loads(json.dumps(decision))
        corrupt(broken)
        with pytest.raises((AssertionError, ValueError)):
            validate_event(broken)


def _by_code(events: list[dict[str, Any]], code: str) -> list[dict[str, Any]]:
    return [e for e in events if e["metadata"]["event_code"] == code]


def test_decisions_carry_the_actor_the_policy_and_the_rules(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rc, events, _err = _export(capsys, "--trail", str(trail))
    allowed, denied, dry = _by_code(events, "policy.decision")
    assert (allowed["class_uid"], allowed["activity_id"], allowed["type_uid"]) == (6003, 1, 600301)
    assert (allowed["status_id"], allowed["action_id"], allowed["disposition_id"]) == (1, 1, 1)
    assert allowed["actor"]["user"]["name"] == "agent-1"
    assert allowed["actor"]["user"]["credential_uid"] == "0123abcd"
    assert allowed["policy"] == {"name": "default", "uid": "a" * 64, "is_applied": True}
    assert allowed["status_detail"] == "warnings: network.mode"
    assert allowed["unmapped"]["gateway"]["warnings"] == ["network.mode"]
    assert {"type": "Container Image", "name": IMAGE} in allowed["resources"]
    assert (denied["status_id"], denied["action"], denied["disposition"]) == (2, "Denied", "Blocked")
    assert denied["severity_id"] == 3
    assert denied["status_detail"] == "denied by limits.memory"
    assert denied["unmapped"]["gateway"]["violations"] == ["limits.memory"]
    assert denied["metadata"]["correlation_uid"] == "r-2"
    assert (dry["activity_id"], dry["api"]["operation"]) == (2, "check")


def test_outcomes_carry_exit_code_container_and_image(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rc, events, _err = _export(capsys, "--trail", str(trail))
    ran, timed_out, failed = _by_code(events, "execution.outcome")
    assert (ran["status_id"], ran["api"]["response"]["code"], ran["duration"]) == (1, 0, 140)
    assert {"type": "Container Image", "name": IMAGE, "uid": "sha256:" + "b" * 64} in ran["resources"]
    assert any(r["type"] == "Container" and r["uid"] == "c" * 64 for r in ran["resources"])
    assert timed_out["status_id"] == 2
    assert timed_out["api"]["response"]["error"] == "runner.timeout"
    assert "code" not in timed_out["api"]["response"]
    assert (failed["status_id"], failed["status_code"], failed["status_detail"]) == (2, "3", "exit code 3")


def test_other_classes(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rc, events, _err = _export(capsys, "--trail", str(trail))
    (auth,) = _by_code(events, "auth.failed")
    assert (auth["class_uid"], auth["activity_id"], auth["status_id"], auth["count"]) == (3002, 1, 2, 3)
    (start,) = _by_code(events, "gateway.start")
    assert (start["class_uid"], start["activity_id"], start["app"]["name"]) == (6002, 3, "agent-exec-gateway")
    (reloaded,) = _by_code(events, "policy.reloaded")
    assert (reloaded["activity_id"], reloaded["status_id"]) == (8, 2)
    (recovery,) = _by_code(events, "recovery")
    assert (recovery["class_uid"], recovery["severity_id"]) == (6008, 4)
    (reaped,) = _by_code(events, "containers.reaped")
    assert (reaped["activity_id"], len(reaped["resources"])) == (4, 2)


def test_session_files_are_updates_and_reads_of_a_file(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _rc, events, _err = _export(capsys, "--trail", str(trail))
    (put,) = _by_code(events, "session.file.put")
    assert (put["class_uid"], put["activity_id"], put["status_id"]) == (6003, 3, 1)
    assert put["resources"] == [{"type": "File", "name": "data/in.bin", "uid": "a" * 64}]
    assert put["unmapped"]["gateway"]["bytes"] == 3
    (refused,) = _by_code(events, "session.file.get")
    assert (refused["activity_id"], refused["status_id"], refused["status_code"]) == (2, 2, "request.workspace_path")


def test_an_invalid_request_and_a_forbidden_call_are_not_allowed(
    trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _rc, events, _err = _export(capsys, "--trail", str(trail))
    (invalid,) = _by_code(events, "request.invalid")
    assert (invalid["status_id"], invalid["action"], invalid["disposition"]) == (2, "Denied", "Rejected")
    assert (invalid["action_id"], invalid["disposition_id"]) == (2, 25)
    (forbidden,) = _by_code(events, "auth.forbidden")
    assert (forbidden["status_id"], forbidden["action"], forbidden["disposition"]) == (2, "Denied", "Unauthorized")
    assert (forbidden["action_id"], forbidden["disposition_id"]) == (2, 26)
    assert forbidden["count"] == 5  # a summary stands for the calls it counts


def test_secrets_and_code_never_reach_the_export(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["audit", "export", "--trail", str(trail)])
    out = capsys.readouterr().out
    assert "s3cret" not in out
    assert "print(1)" not in out


def test_time_is_milliseconds_of_the_record_timestamp() -> None:
    record = _record_of("gateway.start")
    record["timestamp"] = "2024-02-29T23:59:58.123456Z"
    assert to_ocsf(record, trail="t")["time"] == 1709251198123


def _record_of(event_type: str) -> dict[str, Any]:
    from gateway.audit import MemoryAuditSink

    sink = MemoryAuditSink()
    data = next(d for t, d, _r, _p in EVENTS if t == event_type)
    sink.append(event_type, data)
    return sink.records[0]


def test_since_until_select_by_record_time(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = _lines(trail)
    since, until = records[3]["timestamp"], records[6]["timestamp"]
    rc, events, _err = _export(capsys, "--trail", str(trail), "--since", since, "--until", until)
    assert rc == 0
    assert [e["metadata"]["sequence"] for e in events] == [r["seq"] for r in records if since <= r["timestamp"] < until]


def test_output_file(trail: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "events.jsonl"
    assert main(["audit", "export", "--trail", str(trail), "-o", str(target)]) == 0
    assert capsys.readouterr().out == ""
    assert len(target.read_text().splitlines()) == len(EVENTS)
    assert not list(tmp_path.glob(".events.jsonl.*"))  # the temporary file was renamed into place


def test_output_to_a_device(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "export", "--trail", str(trail), "-o", os.devnull]) == 0
    assert capsys.readouterr() == ("", "")


def test_trail_from_the_environment(
    trail: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GATEWAY_AUDIT_DIR", str(trail))
    rc, events, _err = _export(capsys)
    assert (rc, len(events)) == (0, len(EVENTS))


def test_a_broken_chain_exports_the_verified_prefix_and_exits_1(
    trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    segment = next(trail.glob("trail-*.jsonl"))
    lines = segment.read_bytes().splitlines(keepends=True)
    lines[5] = lines[5].replace(b'"duration_ms":140', b'"duration_ms":141')  # seq 6 altered
    segment.write_bytes(b"".join(lines))
    rc, events, err = _export(capsys, "--trail", str(trail))
    assert rc == 1
    assert [e["metadata"]["sequence"] for e in events] == [1, 2, 3, 4, 5]
    assert re.match(rf"BROKEN: {re.escape(str(trail))}: first break at seq 6 \(modified: ", err.splitlines()[0])


def test_two_trails_are_merged_by_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    for directory in (first, second):
        trail = JsonlAuditTrail(directory, host=directory.name)
        trail.close()
    for n in range(3):  # interleaved in time: a, b, a, b, ...
        for directory in (first, second):
            trail = JsonlAuditTrail(directory, host=directory.name)
            trail.append("gateway.start", {"policy_source": f"{directory.name}-{n}"})
            trail.close()
    rc, events, _err = _export(capsys, "--trail", str(first), "--trail", str(second))
    assert rc == 0
    times = [e["metadata"]["original_time"] for e in events]
    assert times == sorted(times)
    trails = [e["unmapped"]["audit"]["trail"] for e in events]
    assert len(set(trails)) == 2
    assert trails[0] != trails[1]  # alternating, not one trail after the other


def test_keyed_trail_without_the_key_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "keyed"
    _write(directory, key=b"k" * 32)
    rc, events, err = _export(capsys, "--trail", str(directory))
    assert rc == 0
    assert "HMACs were NOT checked" in err
    assert all("hmac" in e["unmapped"]["audit"] for e in events)
    key_file = tmp_path / "key"
    key_file.write_bytes(b"k" * 32)
    rc, _events, err = _export(capsys, "--trail", str(directory), "--key-file", str(key_file))
    assert (rc, err) == (0, "")


def test_export_streams_to_a_binary_writer(trail: Path) -> None:
    out = io.BytesIO()
    (report,) = export_ocsf([trail], out)
    assert report.intact
    assert report.exported == len(EVENTS) == verify_trail(trail).records_checked
    assert report.trail_id == _lines(trail)[0]["event_id"]
    assert out.getvalue().count(b"\n") == len(EVENTS)


def test_a_missing_trail_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "export", "--trail", str(tmp_path / "nope")]) != 0
    assert "no audit trail directory" in capsys.readouterr().err


def _segmented(directory: Path, records: int) -> None:
    """A trail of many small segments, written by the writer (the segment size forces a rotation often)."""
    trail = JsonlAuditTrail(directory, host="testhost", segment_max_bytes=4096)
    try:
        for n in range(records):
            event_type, data, request_id, principal = EVENTS[n % len(EVENTS)]
            trail.append(event_type, data, request_id=request_id, principal=principal, policy=POLICY)
    finally:
        trail.close()


def test_parallel_export_writes_what_the_in_process_export_writes(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    _segmented(directory, 60)
    assert len(list(directory.glob("trail-*.jsonl"))) > 3
    one, two = io.BytesIO(), io.BytesIO()
    (serial,) = export_ocsf([directory], one, workers=1)
    (parallel,) = export_ocsf([directory], two, workers=2)
    assert serial.exported == parallel.exported == 60
    assert one.getvalue() == two.getvalue()
    window = io.BytesIO()
    records = _lines(directory)
    since, until = records[10]["timestamp"], records[40]["timestamp"]
    (part,) = export_ocsf([directory], window, workers=2, since=since, until=until)
    assert part.exported == sum(1 for r in records if since <= r["timestamp"] < until)


def test_parallel_export_in_pieces_of_segments_writes_what_the_in_process_export_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pieces smaller than a record, of about one record, and of several: every line is exported exactly once,
    # by the piece its first byte falls in
    directory = tmp_path / "audit"
    _segmented(directory, 60)
    one = io.BytesIO()
    export_ocsf([directory], one, workers=1)
    for piece in (100, 700, 1500):
        monkeypatch.setattr(ocsf_export, "PIECE_BYTES", piece)
        tasks = ocsf_export._plan(directory, verify_trail(directory))
        assert len(tasks) > len(list(directory.glob("trail-*.jsonl")))
        two = io.BytesIO()
        (report,) = export_ocsf([directory], two, workers=2)
        assert report.exported == 60
        assert two.getvalue() == one.getvalue(), piece


@pytest.mark.parametrize("piece", [ocsf_export.PIECE_BYTES, 700])
def test_parallel_export_stops_at_the_break(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece: int) -> None:
    monkeypatch.setattr(ocsf_export, "PIECE_BYTES", piece)
    directory = tmp_path / "audit"
    _segmented(directory, 60)
    segments = sorted(directory.glob("trail-*.jsonl"))
    victim = segments[2]
    lines = victim.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"testhost"', b'"otherhost"')
    victim.write_bytes(b"".join(lines))
    out = io.BytesIO()
    (report,) = export_ocsf([directory], out, workers=2)
    assert not report.intact
    brk = report.verification.first_break
    assert brk is not None
    assert brk.segment == victim.name
    seqs = [json.loads(line)["metadata"]["sequence"] for line in out.getvalue().splitlines()]
    assert seqs == list(range(1, brk.seq))


def test_a_record_without_the_schemas_shape_stops_the_export_in_workers_too(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    _segmented(directory, 60)
    bad = _decision(allowed=True)
    bad["decision"]["allowed"] = "yes"
    with JsonlAuditTrail(directory, host="testhost", segment_max_bytes=4096) as trail:
        trail.append("policy.decision", bad, request_id="r-bad", principal="agent-1", policy=POLICY)
    assert verify_trail(directory).ok  # chained like any record: the export's mapping is what refuses it
    for workers in (1, 2):
        with pytest.raises(AuditIntegrityError, match=r"\$\.data\.decision\.allowed: expected a boolean"):
            export_ocsf([directory], io.BytesIO(), workers=workers)


def test_docs_table_matches_the_mapping() -> None:
    """docs/ocsf.md's class table is the mapping: a changed class or activity fails here until the doc follows."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "ocsf.md").read_text()
    rows = re.findall(r"^\| `([a-z.]+)` \| [^|]*\((\d+)\) \| [^|]*?\((\d+)\)", doc, flags=re.MULTILINE)
    table = {event_type: (int(uid), int(activity)) for event_type, uid, activity in rows}
    assert table == {event_type: (cls.uid, activity) for event_type, (cls, activity) in MAPPING.items()}


def test_a_sandbox_left_after_its_result_is_a_failed_delete(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, events, _ = _export(capsys, "--trail", str(trail))
    (left,) = _by_code(events, "container.left")
    assert (left["class_uid"], left["activity_id"], left["status_id"]) == (6003, 4, 2)
    assert left["status_code"] == "runner.container_left"
    assert left["status_detail"] == "removal failed: engine busy"


def test_an_interrupted_run_is_a_failed_outcome_that_names_its_decision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "audit"
    with JsonlAuditTrail(directory) as writer:
        writer.append("policy.decision", _decision(allowed=True), request_id="r-9", principal="agent-1", policy=POLICY)
        mark_interrupted(writer, gone=lambda _host, _pid, _written: True)
    decision = _lines(directory)[0]
    _rc, events, _err = _export(capsys, "--trail", str(directory))
    (outcome,) = _by_code(events, "execution.outcome")
    validate_event(outcome)
    assert outcome["metadata"]["correlation_uid"] == "r-9"
    assert outcome["status_id"] == 2
    assert outcome["status_detail"].startswith("gateway.interrupted: ")
    assert outcome["api"]["response"]["message"] == "interrupted"
    assert "interrupted" in outcome["message"]
    assert "duration" not in outcome  # unknown, not 0
    assert outcome["unmapped"]["gateway"]["interrupted"]["decision"]["seq"] == decision["seq"]


def test_connections_are_network_or_http_activity(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, events, _ = _export(capsys, "--trail", str(trail))
    tunnel, get, denied, limited, patch = _by_code(events, "network.connection")
    for event in (tunnel, get, denied, limited, patch):
        assert event["metadata"]["correlation_uid"] == "r-1"
        assert event["src_endpoint"] == {"name": "agent-1"}
        assert event["connection_info"]["direction"] == "Outbound"
        assert event["unmapped"]["gateway"]["token_id"] == "0123abcd"
    assert (tunnel["class_uid"], tunnel["activity_name"], tunnel["status"], tunnel["disposition"]) == (
        4001, "Close", "Success", "Allowed",
    )  # fmt: skip
    assert tunnel["dst_endpoint"] == {"hostname": "mirror.internal", "port": 18443, "ip": "127.0.0.1"}
    assert tunnel["traffic"] == {"bytes_out": 517, "bytes_in": 4096, "bytes": 4613}
    assert tunnel["duration"] == 50
    assert "http_request" not in tunnel
    assert (get["class_uid"], get["activity_id"], get["type_uid"]) == (4002, 3, 400203)
    assert get["http_request"] == {
        "http_method": "GET",
        "url": {
            "hostname": "mirror.internal",
            "port": 18089,
            "scheme": "http",
            "url_string": "http://mirror.internal:18089",
        },
    }
    assert (denied["class_uid"], denied["activity_name"], denied["status"]) == (4001, "Refuse", "Failure")
    assert (denied["action"], denied["disposition"], denied["severity"]) == ("Denied", "Blocked", "Medium")
    assert denied["status_detail"] == "denied by network.egress.host: evil.example is not an allowed destination"
    assert "ip" not in denied["dst_endpoint"]  # denied before anything was resolved
    assert (limited["activity_name"], limited["status"], limited["disposition"]) == ("Reset", "Failure", "Allowed")
    assert limited["status_detail"] == "the run reached its 1024 bytes out"
    assert (patch["class_uid"], patch["activity_id"], patch["activity_name"]) == (4002, 99, "PATCH")

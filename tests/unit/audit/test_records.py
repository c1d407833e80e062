"""Typed record views: built from real records (memory sink and on-disk trail), read-only, strict."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import (
    EVENT_TYPES,
    AuditRecordView,
    ExecutionOutcomeView,
    FileDigestView,
    GenericRecordView,
    ImagePulledView,
    JsonlAuditTrail,
    MemoryAuditSink,
    PolicyDecisionView,
    PolicyRefView,
    ProblemView,
    RequestInvalidView,
    RequestReceivedView,
    RuleResultView,
    query_trail,
    view_record,
)
from gateway.errors import AuditIntegrityError

IMAGE = "gateway/sandbox-python:3.11-bookworm"
POLICY = {"name": "default", "sha256": "a" * 64}


def rule(rule_id: str, status: str, mode: str = "enforce") -> dict[str, Any]:
    return {"rule": rule_id, "status": status, "mode": mode, "path": "$.x", "message": f"{rule_id} {status}"}


def decision(*, allowed: bool, dry_run: bool = False) -> dict[str, Any]:
    results = [
        rule("images.allowlist", "pass"),
        rule("limits.memory", "pass" if allowed else "fail"),
        rule("network.mode", "warn", mode="audit"),
    ]
    return {
        "decision": {
            "decision_id": "d-1",
            "request_id": "r-1",
            "allowed": allowed,
            "policy": {"name": "default", "sha256": "a" * 64, "source": "policies/default.yaml"},
            "results": results,
            "violations": [r for r in results if r["status"] == "fail"],
            "warnings": [r for r in results if r["status"] == "warn"],
            "options": {"image": IMAGE, "environment": {"TOKEN": "secret"}} if allowed else None,
            "plan": {"image": IMAGE, "runtime": "runsc", "timeout_s": 10.0} if allowed else None,
        },
        "options_sha256": "e" * 64 if allowed else None,
        "dry_run": dry_run,
    }


OUTCOME: dict[str, Any] = {
    "exit_code": None,
    "timed_out": True,
    "oom_killed": False,
    "output_limit_killed": False,
    "resource_killed": True,
    "duration_ms": 10_004,
    "container_id": "c" * 64,
    "pool": "hit",
    "image": IMAGE,
    "image_id": "sha256:" + "b" * 64,
    "stdout": {"bytes": 0, "sha256": "0" * 64, "truncated": False},
    "stderr": {"bytes": 0, "sha256": "0" * 64, "truncated": False},
    "files": [{"name": "out/result.txt", "sha256": "f" * 64, "bytes": 3}],
    "error": {"code": "runner.sandbox_failed", "message": "killed at the deadline"},
}
EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("gateway.start", {"policy_source": "policies/default.yaml"}),
    (
        "request.received",
        {
            "request": {
                "code": "print('é')",
                "language": "python",
                "image": IMAGE,
                "network": "none",
                "files": {"in/a.txt": "abc"},
                "env": {"TOKEN": "secret"},
            }
        },
    ),
    (
        "request.invalid",
        {"problems": [{"path": "$.code", "message": "required"}], "raw_sha256": "d" * 64, "raw_bytes": 2},
    ),
    ("policy.decision", decision(allowed=True)),
    ("image.pulled", {"image": IMAGE, "image_id": "sha256:" + "b" * 64}),
    ("execution.outcome", OUTCOME),
    ("policy.decision", decision(allowed=False, dry_run=True)),
]


@pytest.fixture
def records() -> list[dict[str, Any]]:
    sink = MemoryAuditSink(key=b"k" * 32)
    for event_type, data in EVENTS:
        sink.append(event_type, data, request_id="r-1", principal="agent-1", policy=POLICY)
    return sink.records


def test_each_event_type_gets_its_view(records: list[dict[str, Any]]) -> None:
    kinds = [type(view_record(r)) for r in records]
    assert kinds == [
        GenericRecordView,
        RequestReceivedView,
        RequestInvalidView,
        PolicyDecisionView,
        ImagePulledView,
        ExecutionOutcomeView,
        PolicyDecisionView,
    ]
    assert all(issubclass(kind, AuditRecordView) for kind in kinds)


def test_envelope_fields(records: list[dict[str, Any]]) -> None:
    raw = records[1]
    view = view_record(raw)
    assert view.schema == "gateway.audit/v1"
    assert (view.seq, view.event_id, view.event_type) == (2, raw["event_id"], "request.received")
    assert view.timestamp == raw["timestamp"]
    assert (view.request_id, view.principal) == ("r-1", "agent-1")
    assert view.policy == PolicyRefView("default", "a" * 64)
    assert view.redacted == ("$.data.request.env.TOKEN", "$.data.request.files['in/a.txt']")
    assert (view.prev_hash, view.hash, view.hmac) == (records[0]["hash"], raw["hash"], raw["hmac"])
    assert (view.trace_id, view.span_id) == (None, None)


def test_request_views(records: list[dict[str, Any]]) -> None:
    received = view_record(records[1])
    assert isinstance(received, RequestReceivedView)
    assert (received.image, received.language, received.network, received.runtime) == (IMAGE, "python", "none", None)
    assert received.code_bytes == len("print('é')".encode())
    assert received.code_sha256 == records[1]["data"]["request"]["code_sha256"]
    assert received.code_truncated is False
    assert received.env_names == ("TOKEN",)
    assert received.files == (FileDigestView("in/a.txt", records[1]["data"]["request"]["files"][0]["sha256"], 3),)
    assert received.images == {IMAGE}
    invalid = view_record(records[2])
    assert isinstance(invalid, RequestInvalidView)
    assert invalid.problems == (ProblemView("$.code", "required"),)
    assert (invalid.raw_sha256, invalid.raw_bytes) == ("d" * 64, 2)
    assert invalid.images == frozenset()


def test_decision_views(records: list[dict[str, Any]]) -> None:
    allowed, denied = view_record(records[3]), view_record(records[6])
    assert isinstance(allowed, PolicyDecisionView)
    assert isinstance(denied, PolicyDecisionView)
    assert (allowed.allowed, allowed.dry_run, allowed.decision_id) == (True, False, "d-1")
    assert allowed.results[0] == RuleResultView("images.allowlist", "pass", "enforce", "$.x", "images.allowlist pass")
    assert allowed.violations == ()
    assert allowed.warnings == ("network.mode",)
    assert allowed.not_passed == {"network.mode"}
    assert allowed.options_sha256 == "e" * 64
    assert allowed.options is not None
    assert allowed.options["environment"] == {"TOKEN": "<redacted>"}
    assert (allowed.image, allowed.runtime, allowed.options_image) == (IMAGE, "runsc", IMAGE)
    assert allowed.images == {IMAGE}
    assert (denied.allowed, denied.dry_run) == (False, True)
    assert denied.violations == ("limits.memory",)
    assert denied.not_passed == {"limits.memory", "network.mode"}
    assert (denied.options, denied.options_sha256, denied.image, denied.runtime) == (None, None, None, None)
    assert denied.images == frozenset()


def test_results_without_the_optional_fields_read_as_none(records: list[dict[str, Any]]) -> None:
    record = copy.deepcopy(records[3])
    for key in ("mode", "path", "message"):
        del record["data"]["decision"]["results"][2][key]
    view = view_record(record)
    assert isinstance(view, PolicyDecisionView)
    assert view.results[0] == RuleResultView("images.allowlist", "pass", "enforce", "$.x", "images.allowlist pass")
    assert view.results[2] == RuleResultView("network.mode", "warn", None, None, None)
    assert view.not_passed == {"network.mode"}


def test_outcome_and_pull_views(records: list[dict[str, Any]]) -> None:
    pulled = view_record(records[4])
    assert isinstance(pulled, ImagePulledView)
    assert (pulled.image, pulled.image_id) == (IMAGE, "sha256:" + "b" * 64)
    outcome = view_record(records[5])
    assert isinstance(outcome, ExecutionOutcomeView)
    assert outcome.exit_code is None
    assert (outcome.timed_out, outcome.oom_killed, outcome.output_limit_killed, outcome.resource_killed) == (
        True,
        False,
        False,
        True,
    )
    assert outcome.duration_ms == 10_004
    assert (outcome.container_id, outcome.image, outcome.image_id) == ("c" * 64, IMAGE, "sha256:" + "b" * 64)
    assert outcome.files == (FileDigestView("out/result.txt", "f" * 64, 3),)
    assert (outcome.error_code, outcome.error_message) == ("runner.sandbox_failed", "killed at the deadline")
    assert outcome.images == {IMAGE}
    assert outcome.pool == "hit"


def test_optional_outcome_fields_have_documented_defaults() -> None:
    sink = MemoryAuditSink()
    sink.append("execution.outcome", {"exit_code": 0, "timed_out": False, "oom_killed": False, "duration_ms": 5})
    view = view_record(sink.records[0])
    assert isinstance(view, ExecutionOutcomeView)
    assert (view.output_limit_killed, view.resource_killed) == (False, False)
    assert (view.container_id, view.image, view.image_id, view.error_code, view.files) == (None, None, None, None, ())
    assert view.pool is None


def test_views_of_trail_lines_equal_views_of_memory_records(tmp_path: Path) -> None:
    memory = MemoryAuditSink(host="h")
    with JsonlAuditTrail(tmp_path, host="h") as trail:
        for event_type, data in EVENTS:
            for sink in (memory, trail):
                sink.append(event_type, data, request_id="r-1", principal="agent-1", policy=POLICY)
    from_disk = [view_record(r) for r in query_trail(tmp_path)]
    from_memory = [view_record(r) for r in memory.records]
    assert len(from_disk) == len(EVENTS) == len(from_memory)
    for disk, mem in zip(from_disk, from_memory, strict=True):
        assert type(disk) is type(mem)
        assert disk.seq == mem.seq
        assert disk.data == mem.data
        ignore = {"timestamp", "hash", "record", "_reader"}  # stamped per sink; each view reads its own record
        names = [f.name for f in dataclasses.fields(disk) if f.name not in ignore]
        names += ["redacted", "trace_id", "span_id", "hmac", "gateway"]  # read when asked (not event_id, prev_hash)
        assert {name: getattr(disk, name) for name in names} == {name: getattr(mem, name) for name in names}


def test_views_are_read_only_and_copy_nothing(records: list[dict[str, Any]]) -> None:
    raw = records[3]
    before = copy.deepcopy(raw)
    view = view_record(raw)
    assert isinstance(view, PolicyDecisionView)
    # the fields are Final (mypy rejects `view.allowed = False`); slotted, a view takes no other attribute
    with pytest.raises(AttributeError):
        view.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        view.data["dry_run"] = True  # type: ignore[index]
    assert view.options is not None
    with pytest.raises(TypeError):
        view.options["image"] = "evil:1"  # type: ignore[index]
    assert view.data["decision"] is raw["data"]["decision"]  # a proxy over the record's own dict, not a copy
    assert raw == before
    assert view == view_record(raw)
    assert hash(view) == hash(view_record(raw))


def test_every_event_type_has_a_view() -> None:
    sink = MemoryAuditSink()
    sink.append("containers.reaped", {"container_ids": []})
    sink.append("recovery", {"reason": "r", "dropped_bytes": 0, "last_good_seq": 0, "last_good_hash": "0" * 64})
    views = [view_record(r) for r in sink.records]
    assert [type(v) for v in views] == [GenericRecordView, GenericRecordView]
    assert views[1].data["reason"] == "r"
    assert "recovery" in EVENT_TYPES


def _broken(records: list[dict[str, Any]], index: int, change: Any) -> dict[str, Any]:
    record = copy.deepcopy(records[index])
    change(record)
    return record


@pytest.mark.parametrize(
    ("index", "change", "message"),
    [
        (0, lambda r: r.pop("timestamp"), "audit record seq 1: $.timestamp: missing"),
        (
            0,
            lambda r: r.update(seq="1"),
            "audit record with no valid seq: $.seq: expected an integer >= 1, got string '1'",
        ),
        (0, lambda r: r.update(seq=0), "audit record seq 0: $.seq: expected an integer >= 1, got integer 0"),
        (0, lambda r: r.update(schema="gateway.audit/v9"), "seq 1: $.schema: expected 'gateway.audit/v1'"),
        (0, lambda r: r.update(event_type="no.such"), "seq 1: $.event_type: expected a known event type"),
        (0, lambda r: r.update(timestamp="2024-05-01"), "seq 1: $.timestamp: expected UTC RFC 3339"),
        (0, lambda r: r["policy"].pop("sha256"), "seq 1: $.policy.sha256: missing"),
        (0, lambda r: r.update(hash="XYZ"), "seq 1: $.hash: expected 64 lowercase hex digits, got string 'XYZ'"),
        (0, lambda r: r.update(data=[]), "seq 1: $.data: expected an object, got an array"),
        (
            1,
            lambda r: r["data"]["request"].update(env_names=["A", 1]),
            "seq 2: $.data.request.env_names[1]: expected a string",
        ),
        (2, lambda r: r["data"]["problems"][0].pop("message"), "seq 3: $.data.problems[0].message: missing"),
        (
            3,
            lambda r: r["data"]["decision"].update(allowed="yes"),
            "seq 4: $.data.decision.allowed: expected a boolean, got string 'yes'",
        ),
        (
            3,
            lambda r: r["data"]["decision"]["warnings"][0].update(rule=None),
            "seq 4: $.data.decision.warnings[0].rule: expected a string, got null",
        ),
        (
            3,
            lambda r: r["data"]["decision"]["results"][1].update(status="ok"),
            "seq 4: $.data.decision.results[1].status: expected one of",
        ),
        (
            3,
            lambda r: r["data"]["decision"]["results"][1].update(mode=[]),
            "seq 4: $.data.decision.results[1].mode: expected one of audit, enforce or null, got an array",
        ),
        (
            3,
            lambda r: r["data"]["decision"].update(plan="runc"),
            "seq 4: $.data.decision.plan: expected an object or null",
        ),
        (
            5,
            lambda r: r["data"].update(duration_ms=1.5),
            "seq 6: $.data.duration_ms: expected an integer >= 0, got number 1.5",
        ),
        (5, lambda r: r["data"].update(timed_out=1), "seq 6: $.data.timed_out: expected a boolean, got integer 1"),
        (5, lambda r: r["data"]["files"][0].update(bytes=-1), "seq 6: $.data.files[0].bytes: expected an integer >= 0"),
    ],
)
def test_bad_fields_raise_naming_seq_and_path(
    records: list[dict[str, Any]], index: int, change: Any, message: str
) -> None:
    record = _broken(records, index, change)
    before = copy.deepcopy(record)
    with pytest.raises(AuditIntegrityError) as caught:
        view_record(record)
    assert message in str(caught.value)
    assert caught.value.code == "audit.integrity"
    assert "schemas/audit-record.schema.json" in caught.value.diagnostics()
    assert record == before


def test_query_data_filters_skip_records_whose_view_fails(tmp_path: Path) -> None:
    with JsonlAuditTrail(tmp_path) as trail:
        trail.append("policy.decision", decision(allowed=False), request_id="r-1", principal="bob")
    segment = next(tmp_path.glob("trail-*.jsonl"))
    good = json.loads(segment.read_bytes())
    bad = copy.deepcopy(good)
    bad["seq"] = 2
    bad["data"]["decision"]["allowed"] = "no"
    with segment.open("a") as fh:
        fh.write(json.dumps(bad) + "\n")
    assert [r["seq"] for r in query_trail(tmp_path)] == [1, 2]  # no filter: every record, as stored
    assert [r["seq"] for r in query_trail(tmp_path, principal="bob")] == [1, 2]  # the envelope is fine
    assert [r["seq"] for r in query_trail(tmp_path, decision="deny")] == [1]  # its decision is not readable
    assert [r["seq"] for r in query_trail(tmp_path, rule="limits.memory")] == [1]


_MISSING = object()
_ENVELOPE_BAD: list[tuple[str, Any]] = [
    ("seq", True),
    ("seq", 1.0),
    ("seq", _MISSING),
    ("schema", None),
    ("event_id", 7),
    ("event_type", ["policy.decision"]),
    ("timestamp", "2026-12-01T12:15:13Z"),
    ("request_id", 1),
    ("request_id", _MISSING),
    ("principal", _MISSING),
    ("policy", _MISSING),
    ("policy", "default"),
    ("policy", {"name": 1, "sha256": "a" * 64}),
    ("policy", {"name": "default", "sha256": "A" * 64}),
    ("redacted", _MISSING),
    ("redacted", None),
    ("redacted", ["$.data.code", 3]),
    ("trace_id", 5),
    ("span_id", {}),
    ("prev_hash", "a" * 63),
    ("hash", _MISSING),
    ("hmac", "not-hex"),
    ("data", None),
    ("gateway", "gateway-1"),
    ("gateway", {"version": "1", "host": "h", "pid": -1}),
    ("gateway", {"version": "1", "host": "h", "pid": True}),
    ("gateway", {"version": 1, "host": "h", "pid": 1}),
    ("gateway", {"version": "1", "pid": 1}),
]


LAZY = {"event_id", "prev_hash", "hmac", "redacted", "trace_id", "span_id", "gateway"}
"""Envelope fields a view reads when asked (a report never does), not when it is built."""


@pytest.mark.parametrize(("key", "bad"), _ENVELOPE_BAD)
def test_every_envelope_field_is_checked(records: list[dict[str, Any]], key: str, bad: Any) -> None:
    # Most fields are checked when the view is built, the envelope's provenance fields (LAZY) when they are
    # read: either way a malformed envelope field is never read silently, and the error names it.
    for record in records:
        broken = copy.deepcopy(record)
        if bad is _MISSING:
            del broken[key]
        else:
            broken[key] = bad
        if key in LAZY:
            view = view_record(broken)
            with pytest.raises(AuditIntegrityError, match=rf"\$\.{key}\b"):
                getattr(view, key)
        else:
            with pytest.raises(AuditIntegrityError, match=rf"\$\.{key}\b"):
                view_record(broken)


def test_lazy_envelope_fields_are_read_from_the_record(records: list[dict[str, Any]]) -> None:
    raw = records[3]
    view = view_record(raw)
    assert (view.event_id, view.prev_hash, view.hmac) == (raw["event_id"], raw["prev_hash"], raw["hmac"])
    assert view.record["data"] is raw["data"]  # a proxy over the record's own dict
    with pytest.raises(TypeError):
        view.record["seq"] = 9  # type: ignore[index]
    assert not LAZY & {f.name for f in dataclasses.fields(view)}
    assert isinstance(view, PolicyDecisionView)
    assert (view.decision_id, view.options_sha256) == ("d-1", "e" * 64)
    broken = copy.deepcopy(raw)
    broken["data"]["decision"]["decision_id"] = 7
    broken["data"]["options_sha256"] = "E" * 64
    late = view_record(broken)  # a report never reads them: checked when read
    assert isinstance(late, PolicyDecisionView)
    with pytest.raises(AuditIntegrityError, match=r"seq 4: \$\.data\.decision\.decision_id: expected a string"):
        _ = late.decision_id
    with pytest.raises(AuditIntegrityError, match=r"seq 4: \$\.data\.options_sha256: expected 64 lowercase hex"):
        _ = late.options_sha256


def test_envelope_variants_a_writer_produces_are_read_alike(records: list[dict[str, Any]]) -> None:
    # null request id, principal and policy; no writer identity; no hmac; a redacted path; a trace
    record = copy.deepcopy(records[0])
    record.update(request_id=None, principal=None, policy=None, redacted=["$.data.code"], trace_id="t" * 32)
    del record["gateway"], record["hmac"]
    view = view_record(record)
    assert (view.request_id, view.principal, view.policy, view.gateway, view.hmac) == (None, None, None, None, None)
    assert view.redacted == ("$.data.code",)
    assert view.trace_id == "t" * 32
    assert view.span_id is None
    full = view_record(records[0])
    assert full.gateway is not None
    assert full.gateway.pid == records[0]["gateway"]["pid"]
    assert full.hmac == records[0]["hmac"]

"""Record building through the in-memory sink: stamping, redaction, chaining, schema."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from audit_support import CONNECTION
from opentelemetry.sdk.trace import TracerProvider

from gateway.audit import GENESIS_HASH, SCHEMA_VERSION, MemoryAuditSink, verify_trail
from gateway.audit.interface import EVENT_TYPES, AuditSink
from gateway.audit.jsonl import JsonlAuditTrail
from gateway.errors import AuditUnavailableError
from gateway.resources import load_schema

POLICY = {"name": "default", "sha256": "a" * 64}
REQUEST: dict[str, Any] = {
    "code": "print(2+2)",
    "language": "python",
    "image": "gateway/sandbox-python:3.11-bookworm",
    "limits": {"memory": "256m", "cpus": 0.5, "pids": 64, "timeout_s": 10, "output_bytes": 65536},
    "network": "none",
    "files": {"in/data.txt": "FILE-CONTENT-SECRET", "b.txt": "x"},
    "env": {"API_KEY": "ENV-VALUE-SECRET", "weird.name": "OTHER-SECRET"},
    "principal": "agent-1",
    "metadata": {},
}
DECISION: dict[str, Any] = {
    "decision_id": "d-1",
    "request_id": "r-1",
    "allowed": True,
    "policy": {"name": "default", "sha256": "a" * 64, "source": "policies/default.yaml"},
    "results": [
        {
            "rule": "env.names",
            "status": "pass",
            "mode": "enforce",
            "path": "$.env",
            "got": {"API_KEY": "ENV-VALUE-SECRET"},
            "expected": None,
            "message": "ok",
        },
        {
            "rule": "limits.cpus",
            "status": "pass",
            "mode": "enforce",
            "path": "$.limits.cpus",
            "got": 0.5,
            "expected": 1.0,
            "message": "ok",
        },
    ],
    "violations": [],
    "warnings": [],
    "options": {
        "image": "gateway/sandbox-python:3.11-bookworm",
        "environment": {"API_KEY": "ENV-VALUE-SECRET"},
        "nano_cpus": 500000000,
    },
    "plan": {"image": "gateway/sandbox-python:3.11-bookworm", "runtime": "runc", "timeout_s": 10.0},
}
OUTCOME: dict[str, Any] = {
    "exit_code": 0,
    "timed_out": False,
    "oom_killed": False,
    "output_limit_killed": False,
    "resource_killed": False,
    "duration_ms": 123,
    "container_id": "c" * 64,
    "pool": "hit",
    "image": "gateway/sandbox-python:3.11-bookworm",
    "image_id": "sha256:" + "b" * 64,
    "stdout": {"bytes": 2, "sha256": hashlib.sha256(b"4\n").hexdigest(), "truncated": False},
    "stderr": {"bytes": 0, "sha256": hashlib.sha256(b"").hexdigest(), "truncated": False},
    "files": [],
    "error": None,
}
SAMPLES: dict[str, dict[str, Any]] = {
    "gateway.start": {"policy_source": "policies/default.yaml"},
    "gateway.stop": {"policy_source": "policies/default.yaml"},
    "policy.loaded": {"name": "default", "sha256": "a" * 64, "source": "policies/default.yaml"},
    "policy.reloaded": {"name": "default", "sha256": "c" * 64, "source": "policies/default.yaml"},
    "policy.rejected": {"source": "policies/bad.yaml", "problems": ["bad.yaml:3: $.rules: unknown rule"]},
    "request.received": {"request": REQUEST},
    "request.invalid": {
        "problems": [{"path": "$.code", "message": "required"}],
        "raw_sha256": "d" * 64,
        "raw_bytes": 2,
    },
    "policy.decision": {"decision": DECISION, "options_sha256": "e" * 64, "dry_run": False},
    "image.pulled": {"image": "gateway/sandbox-python:3.11-bookworm", "image_id": "sha256:" + "b" * 64},
    "execution.outcome": {
        **OUTCOME,
        "egress": {"connections": 1, "denied": 1, "bytes_out": 517, "bytes_in": 4096, "records_dropped": 0},
    },
    "network.connection": CONNECTION,
    "containers.reaped": {"container_ids": ["c" * 64]},
    "container.left": {"error": {"code": "runner.container_left", "message": "could not be removed"}},
    "recovery": {"reason": "truncated", "dropped_bytes": 10, "last_good_seq": 3, "last_good_hash": "f" * 64},
    "auth.failed": {
        "count": 1,
        "summary": False,
        "reason": "unknown",
        "token_id": "0123abcd",
        "client": "127.0.0.1",
        "path": "/v1/policy",
        "interval_ms": 60000,
    },
    "session.created": {"session_id": "s-1", "mode": "kernel", "container_id": "c" * 64},
    "session.expired": {"session_id": "s-1", "mode": "kernel", "reason": "idle"},
    "session.closed": {"session_id": "s-1", "mode": "kernel", "reason": "owner"},
    "session.killed": {"session_id": "s-1", "mode": "kernel", "reason": "memory"},
    "session.file.put": {"session_id": "s-1", "path": "data/in.bin", "bytes": 3, "sha256": "a" * 64},
    "session.file.get": {
        "session_id": "s-1",
        "path": "link",
        "error": {"code": "request.workspace_path", "message": "a symlink"},
    },
    "approval.requested": {
        "approval_id": "a" * 32,
        "request_digest": "d" * 64,
        "rules": ["limits.memory"],
        "requested_at": "2026-12-05T12:00:00.000000Z",
        "expires_at": "2026-12-05T13:00:00.000000Z",
        "request": {"code": "print(1)"},
    },
    "approval.granted": {
        "approval_id": "a" * 32,
        "request_digest": "d" * 64,
        "approver": "alice",
        "reason": "ok",
        "uses_allowed": 1,
    },
    "approval.denied": {"approval_id": "a" * 32, "request_digest": "d" * 64, "approver": "bob", "reason": "no"},
    "approval.used": {"approval_id": "a" * 32, "request_digest": "d" * 64, "use": 1, "uses_allowed": 1},
    "approval.refused": {
        "approval_id": "a" * 32,
        "action": "deny",
        "approver": "bob",
        "code": "approval.conflict",
        "message": "granted, not pending",
    },
    "auth.forbidden": {"role": "agent", "required_role": "operator", "token_id": "0123abcd", "path": "/metrics"},
    "request.refused": {
        "count": 1,
        "summary": False,
        "code": "service.over_quota",
        "quota": "rpm",
        "retry_after_s": 12,
        "path": "/v1/executions",
        "interval_ms": 60000,
        "caller": {"principal": "alice", "token_id": "0123abcd"},
    },
}


def test_samples_cover_every_event_type() -> None:
    assert set(SAMPLES) == EVENT_TYPES


def test_sinks_satisfy_the_protocol(tmp_path: Path) -> None:
    assert isinstance(MemoryAuditSink(), AuditSink)
    assert isinstance(JsonlAuditTrail(tmp_path), AuditSink)


def test_memory_sink_protects_no_paths() -> None:
    assert MemoryAuditSink().protected_paths == ()


def test_trail_protects_the_real_path_of_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    assert JsonlAuditTrail(tmp_path / "link").protected_paths == (str(real.resolve()),)
    monkeypatch.chdir(tmp_path)
    trail = JsonlAuditTrail("link")
    assert trail.protected_paths == (str(real.resolve()),)
    trail.append("gateway.start", SAMPLES["gateway.start"])
    assert {p.parent for p in real.glob("trail-*.jsonl")} == {real}  # the evidence is where it says
    trail.close()
    not_yet = JsonlAuditTrail(tmp_path / "later" / "audit")  # created on first append; still protected
    assert not_yet.protected_paths == (str(tmp_path.resolve() / "later" / "audit"),)


def test_the_protected_path_is_where_the_trail_writes(tmp_path: Path) -> None:
    # Resolved at each open through the path, not at each decision: a symlink re-pointed under a trail that
    # has its segment open does not move the protection away from the segment still being written.
    first, second, link = tmp_path / "first", tmp_path / "second", tmp_path / "link"
    first.mkdir()
    second.mkdir()
    link.symlink_to(first, target_is_directory=True)
    trail = JsonlAuditTrail(link, segment_max_bytes=4096)
    trail.append("gateway.start", SAMPLES["gateway.start"])
    link.unlink()
    link.symlink_to(second, target_is_directory=True)
    trail.append("gateway.start", SAMPLES["gateway.start"])
    assert trail.protected_paths == (str(first.resolve()),)
    assert len((first / "trail-000001.jsonl").read_bytes().splitlines()) == 2  # written where protected
    while not list(second.glob("trail-*.jsonl")):  # the next segment is opened through the path
        trail.append("gateway.start", SAMPLES["gateway.start"])
    assert trail.protected_paths == (str(second.resolve()),)
    trail.close()


def test_every_event_type_validates_against_the_schema() -> None:
    sink = MemoryAuditSink(key=b"k" * 32)
    for event_type, data in SAMPLES.items():
        sink.append(event_type, data, request_id="r-1", principal="agent-1", policy=POLICY)
    validator = jsonschema.Draft202012Validator(
        load_schema("audit-record"), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    for record in sink.records:
        errors = sorted(validator.iter_errors(record), key=str)
        assert not errors, (record["event_type"], [e.message for e in errors])


def test_schema_rejects_a_record_that_kept_env_values() -> None:
    sink = MemoryAuditSink()
    sink.append("request.received", {"request": REQUEST})
    record = copy.deepcopy(sink.records[0])
    record["data"]["request"]["env"] = {"API_KEY": "leaked"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(record, load_schema("audit-record"))


def test_envelope_is_stamped_and_chained() -> None:
    sink = MemoryAuditSink(host="host-a")
    first = sink.append("gateway.start", SAMPLES["gateway.start"])
    second = sink.append("policy.loaded", SAMPLES["policy.loaded"], request_id="r", principal="p", policy=POLICY)
    a, b = sink.records
    assert (first.seq, second.seq) == (1, 2)
    assert a["schema"] == SCHEMA_VERSION
    assert a["prev_hash"] == GENESIS_HASH
    assert b["prev_hash"] == a["hash"] == first.hash
    assert a["policy"] is None
    assert b["policy"] == POLICY
    assert (b["request_id"], b["principal"]) == ("r", "p")
    assert a["gateway"]["host"] == "host-a"
    assert a["timestamp"].endswith("Z")
    assert len(a["timestamp"]) == len("2024-01-01T00:00:00.000000Z")
    assert "trace_id" not in a
    assert "span_id" not in a
    assert a["event_id"] != b["event_id"]


def test_hash_is_sha256_of_the_line_without_hash() -> None:
    sink = MemoryAuditSink()
    sink.append("gateway.start", SAMPLES["gateway.start"])
    record = dict(sink.records[0])
    stored = record.pop("hash")
    body = json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    assert hashlib.sha256(body).hexdigest() == stored
    assert json.loads(sink.lines[0]) == sink.records[0]


def test_trace_and_span_ids_come_from_the_active_span() -> None:
    tracer = TracerProvider().get_tracer("test")
    sink = MemoryAuditSink()
    with tracer.start_as_current_span("gateway.execute") as span:
        sink.append("gateway.start", SAMPLES["gateway.start"])
        context = span.get_span_context()
    record = sink.records[0]
    assert record["trace_id"] == format(context.trace_id, "032x")
    assert record["span_id"] == format(context.span_id, "016x")


def test_env_values_and_file_contents_are_never_stored() -> None:
    sink = MemoryAuditSink()
    sink.append("request.received", {"request": REQUEST})
    sink.append("policy.decision", SAMPLES["policy.decision"])
    blob = b"".join(sink.lines)
    for secret in (b"ENV-VALUE-SECRET", b"OTHER-SECRET", b"FILE-CONTENT-SECRET"):
        assert secret not in blob
    received, decision = sink.records
    request = received["data"]["request"]
    assert "env" not in request
    assert request["env_names"] == ["API_KEY", "weird.name"]
    assert request["files"] == [
        {"name": "b.txt", "sha256": hashlib.sha256(b"x").hexdigest(), "bytes": 1},
        {"name": "in/data.txt", "sha256": hashlib.sha256(b"FILE-CONTENT-SECRET").hexdigest(), "bytes": 19},
    ]
    assert received["redacted"] == [
        "$.data.request.env.API_KEY",
        "$.data.request.env['weird.name']",
        "$.data.request.files['b.txt']",
        "$.data.request.files['in/data.txt']",
    ]
    options = decision["data"]["decision"]["options"]
    assert options["environment"] == {"API_KEY": "<redacted>"}
    assert decision["data"]["decision"]["results"][0]["got"] == ["API_KEY"]
    assert decision["redacted"] == [
        "$.data.decision.options.environment.API_KEY",
        "$.data.decision.results[0].got",
    ]


def test_caller_data_is_not_mutated() -> None:
    data = {"request": copy.deepcopy(REQUEST)}
    before = copy.deepcopy(data)
    MemoryAuditSink().append("request.received", data)
    assert data == before


def test_code_is_kept_up_to_the_cap_and_digested_in_full() -> None:
    """The cap is on the code as stored: "é" is 2 UTF-8 bytes but 6 stored (\u00e9), so a cap of 13 keeps 2."""
    code = "é" * 40  # 80 UTF-8 bytes, 240 stored; a cap of 13 falls inside the third character
    sink = MemoryAuditSink(code_max_bytes=13)
    sink.append("request.received", {"request": {"code": code}})
    sink.append("request.received", {"request": {"code": "short"}})
    cut, whole = (r["data"]["request"] for r in sink.records)
    assert cut["code"] == "é" * 2
    assert cut["code_truncated"] is True
    assert cut["code_bytes"] == 80
    assert cut["code_sha256"] == hashlib.sha256(code.encode()).hexdigest()
    assert sink.records[0]["redacted"] == ["$.data.request.code"]
    assert whole["code"] == "short"
    assert whole["code_truncated"] is False
    assert sink.records[1]["redacted"] == []


def test_floats_from_requests_become_decimal_strings() -> None:
    sink = MemoryAuditSink()
    sink.append("request.received", {"request": REQUEST})
    sink.append("policy.decision", SAMPLES["policy.decision"])
    assert sink.records[0]["data"]["request"]["limits"]["cpus"] == "0.5"
    decision = sink.records[1]["data"]["decision"]
    assert decision["results"][1]["got"] == "0.5"
    assert decision["plan"]["timeout_s"] == "10.0"


@pytest.mark.parametrize(
    ("event_type", "data"),
    [
        ("execution.outcome", {**OUTCOME, "duration_ms": 12.5}),
        ("no.such.event", {}),
        ("gateway.start", {"policy_source": object()}),
    ],
)
def test_unrecordable_events_fail_closed(event_type: str, data: dict[str, Any]) -> None:
    sink = MemoryAuditSink()
    with pytest.raises(AuditUnavailableError):
        sink.append(event_type, data)
    assert sink.records == []


def test_memory_sink_can_be_made_unavailable() -> None:
    sink = MemoryAuditSink()
    sink.available = False
    with pytest.raises(AuditUnavailableError):
        sink.append("gateway.start", SAMPLES["gateway.start"])


def test_memory_lines_are_a_valid_trail(tmp_path: Path) -> None:
    key = b"k" * 32
    sink = MemoryAuditSink(key=key)
    for event_type, data in SAMPLES.items():
        sink.append(event_type, data)
    (tmp_path / "trail-000001.jsonl").write_bytes(b"".join(sink.lines))
    report = verify_trail(tmp_path, key=key)
    assert report.ok
    assert report.records_checked == len(SAMPLES)


def test_every_list_in_a_record_is_bounded_but_the_decisions_options_are_kept_whole() -> None:
    """Item 6: a record keeps the first items of any list, a count and a digest of the rest."""
    import hashlib

    from gateway.audit import MemoryAuditSink
    from gateway.audit.canonical import canonical_bytes

    sink = MemoryAuditSink()
    names = [f"n{i:04d}" for i in range(1000)]
    env = [f"V{i}=x" for i in range(100)]
    sink.append("policy.rejected", {"source": "p.yaml", "problems": names})
    sink.append("policy.decision", {"decision": {"results": names, "options": {"environment": env}}})
    rejected, decision = sink.records
    assert rejected["data"]["problems"] == names[:32]
    omitted = rejected["data"]["problems_omitted"]
    assert omitted == {"count": 968, "sha256": hashlib.sha256(canonical_bytes(names[32:])).hexdigest()}
    assert "$.data.problems" in rejected["redacted"]
    assert len(decision["data"]["decision"]["results"]) == 32
    assert len(decision["data"]["decision"]["options"]["environment"]) == 100
    long_names = ["x" * 1000 for _ in range(32)]
    sink.append("policy.rejected", {"source": "p.yaml", "problems": long_names})
    assert len(sink.records[2]["data"]["problems"]) == 8  # 8 KiB of items at most


def test_a_list_inside_a_list_kept_whole_is_still_cut_by_its_item_count() -> None:
    """A list under a list that fits the byte cap is not sized again, but its item count still bounds it."""
    from gateway.audit import MemoryAuditSink

    sink = MemoryAuditSink()
    numbers = list(range(100))
    sink.append("policy.rejected", {"source": "p.yaml", "problems": [{"source": "x", "lines": numbers}]})
    problem = sink.records[0]["data"]["problems"][0]
    assert problem["lines"] == numbers[:32]
    assert problem["lines_omitted"]["count"] == 68
    assert "$.data.problems[0].lines" in sink.records[0]["redacted"]
    huge = {"source": "y" * 9000, "lines": ["z" * 100 for _ in range(90)]}  # over the byte cap on its own
    sink.append("policy.rejected", {"source": "p.yaml", "problems": [huge, huge]})
    kept = sink.records[1]["data"]["problems"]
    assert len(kept) == 1  # the first item is kept whatever its size ...
    assert len(kept[0]["lines"]) < 90  # ... and the lists inside it are still sized
    assert "$.data.problems[0].lines" in sink.records[1]["redacted"]


@pytest.mark.parametrize(
    "code",
    ["\x01" * 5000, "\U0001f600" * 2000, "é" * 5000, '"\\' * 3000, "\n" * 5000, "x" * 5000, "a\x01\U0001f600é" * 900],
)
def test_code_is_capped_as_stored_whatever_its_characters(code: str) -> None:
    """Before: the cap counted UTF-8 bytes, and 4,096 control characters were stored as 24,576 bytes."""
    from gateway.audit.pipeline import stored_prefix
    from gateway.canonical import audit_body_size

    cap = 4096
    sink = MemoryAuditSink(code_max_bytes=cap)
    sink.append("request.received", {"request": {"code": code}})
    (record,) = sink.records
    stored = record["data"]["request"]
    assert audit_body_size(stored["code"]) - 2 <= cap
    assert code.startswith(stored["code"])
    assert audit_body_size(code[: len(stored["code"]) + 1]) - 2 > cap  # the longest prefix that fits
    assert stored["code_truncated"] is True
    assert stored["code_bytes"] == len(code.encode())
    assert stored["code_sha256"] == hashlib.sha256(code.encode()).hexdigest()
    assert audit_body_size(record) <= cap + 1024
    assert stored_prefix(code, 10**9) == code


def test_long_names_and_strings_of_a_request_cost_a_bounded_record() -> None:
    """Before: 32 file names of 4,000 control characters were each listed, escaped, in ``redacted`` (794 KB),
    and a mount's source of 4,000 was kept whole; now each string keeps a prefix of at most STRING_MAX_BYTES."""
    from gateway.audit.pipeline import LIST_MAX_BYTES, STRING_MAX_BYTES
    from gateway.canonical import audit_body_size

    sink = MemoryAuditSink()
    files = {"\x01" * 4000 + str(i): "" for i in range(32)}
    mounts = [{"source": "/" + "\x01" * 4000, "target": "/w"}]
    sink.append("request.received", {"request": {"code": "x", "files": files, "mounts": mounts}})
    (record,) = sink.records
    request = record["data"]["request"]
    assert audit_body_size(record) <= 3 * LIST_MAX_BYTES
    assert "$.data.request.files" in record["redacted"]  # one path for the files: theirs are too long to list
    assert all(audit_body_size(f["name"]) - 2 <= STRING_MAX_BYTES for f in request["files"])
    assert "$.data.request.mounts[0].source" in record["redacted"]
    assert request["mounts"][0]["target"] == "/w"
    assert mounts[0]["source"].startswith(request["mounts"][0]["source"])


def test_the_strings_of_rule_results_and_problems_are_capped() -> None:
    from gateway.audit.pipeline import STRING_MAX_BYTES
    from gateway.canonical import audit_body_size

    name = "\x01" * 4000
    sink = MemoryAuditSink()
    result = {"rule": "files.path", "status": "fail", "path": f"$.files[{name!r}]", "got": name, "message": name}
    sink.append("policy.decision", {"decision": {"allowed": False, "results": [result], "violations": [result]}})
    sink.append("request.invalid", {"problems": [{"path": "$", "message": f"unknown key {name!r}"}]})
    decision, invalid = sink.records
    for kept in (decision["data"]["decision"]["results"][0], decision["data"]["decision"]["violations"][0]):
        assert (kept["rule"], kept["status"]) == ("files.path", "fail")
        assert all(audit_body_size(kept[k]) - 2 <= STRING_MAX_BYTES for k in ("path", "got", "message"))
    assert "$.data.decision.violations[0].got" in decision["redacted"]
    assert audit_body_size(invalid["data"]["problems"][0]["message"]) - 2 <= STRING_MAX_BYTES
    assert invalid["redacted"] == ["$.data.problems[0].message"]

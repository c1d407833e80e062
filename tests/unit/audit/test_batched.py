"""The batched sink: records built when appended, written only by ``flush``, in one turn on the trail (one hold
of its lock) and one fsync; a record that cannot be built fails its append at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from audit_support import CountingIO

from gateway.audit import AuditSink, JsonlAuditTrail, verify_trail
from gateway.audit.batched import BatchedAuditSink
from gateway.errors import AuditUnavailableError


def _written(directory: Path) -> list[dict[str, object]]:
    lines = [line for path in sorted(directory.glob("trail-*.jsonl")) for line in path.read_text().splitlines()]
    return [json.loads(line) for line in lines]


def test_a_batch_is_written_by_flush_in_one_turn_and_one_fsync(tmp_path: Path) -> None:
    io = CountingIO()
    sink = BatchedAuditSink(JsonlAuditTrail(tmp_path, io=io))
    assert isinstance(sink, AuditSink)
    for n in range(3):
        sink.append("request.received", {"n": n}, request_id=f"r{n}", durable=n == 2)
    assert _written(tmp_path) == []  # nothing written before the flush, whatever durable said
    sink.flush()
    assert (io.locks, io.fsyncs) == (1, 1)
    records = _written(tmp_path)
    assert [(r["request_id"], r["seq"]) for r in records] == [("r0", 1), ("r1", 2), ("r2", 3)]
    sink.flush()  # nothing new: nothing written
    assert len(_written(tmp_path)) == 3
    sink.close()
    assert verify_trail(tmp_path).ok


def test_a_record_that_cannot_be_built_fails_its_append_and_not_the_batch(tmp_path: Path) -> None:
    sink = BatchedAuditSink(JsonlAuditTrail(tmp_path))
    sink.append("request.received", {"n": 1})
    with pytest.raises(AuditUnavailableError, match=r"\$\.data\.x"):
        sink.append("request.received", {"x": object()})
    sink.flush()
    assert [r["data"] for r in _written(tmp_path)] == [{"n": 1}]
    sink.close()


def test_a_batch_that_cannot_be_made_durable_raises(tmp_path: Path) -> None:
    sink = BatchedAuditSink(JsonlAuditTrail(tmp_path, io=CountingIO(fail_fsync=True)))
    sink.append("request.received", {"n": 1})
    with pytest.raises(AuditUnavailableError):
        sink.flush()


def test_the_sink_protects_its_trails_paths(tmp_path: Path) -> None:
    trail = JsonlAuditTrail(tmp_path)
    assert BatchedAuditSink(trail).protected_paths == trail.protected_paths != ()
    trail.close()

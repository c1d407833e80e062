"""Runs a dead gateway left open: one interrupted outcome each, for real runs only, under the scan lock, within
the last two segments; and the liveness rule (dead pid, reused pid, another host)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gateway.audit import verify_trail
from gateway.audit.interrupted import INTERRUPTED, SCAN_LOCK_NAME, mark_interrupted, writer_gone
from gateway.audit.jsonl import JsonlAuditTrail
from gateway.resources import load_schema

POLICY = {"name": "default", "sha256": "a" * 64}
CALLER = {"principal": "alice", "token_id": "0a1b2c3d"}


def _gone(_host: str, _pid: int, _written: str) -> bool:
    return True


def _alive(_host: str, _pid: int, _written: str) -> bool:
    return False


def _decide(trail: JsonlAuditTrail, request_id: str, *, allowed: bool = True, dry_run: bool = False) -> None:
    decision = {"allowed": allowed, "plan": {"image": "img:1"} if allowed else None}
    data = {"decision": decision, "dry_run": dry_run, "caller": CALLER}
    trail.append("policy.decision", data, request_id=request_id, principal="alice", policy=POLICY)


def _finish(trail: JsonlAuditTrail, request_id: str) -> None:
    data = {"exit_code": 0, "timed_out": False, "oom_killed": False, "duration_ms": 5, "error": None}
    trail.append("execution.outcome", data, request_id=request_id, principal="alice", policy=POLICY)


def _records(directory: Path) -> list[dict[str, Any]]:
    paths = sorted(directory.glob("trail-*.jsonl"))
    return [json.loads(line) for path in paths for line in path.read_bytes().splitlines()]


def _interrupted(directory: Path) -> list[dict[str, Any]]:
    return [
        r
        for r in _records(directory)
        if r["event_type"] == "execution.outcome" and (r["data"]["error"] or {}).get("code") == INTERRUPTED
    ]


def test_only_an_allowed_real_run_without_an_outcome_is_marked_and_only_once(tmp_path: Path) -> None:
    with JsonlAuditTrail(tmp_path) as trail:
        _decide(trail, "open")
        _decide(trail, "finished")
        _finish(trail, "finished")
        _decide(trail, "dry", dry_run=True)
        _decide(trail, "denied", allowed=False)
        receipts = mark_interrupted(trail, gone=_gone)
        again = mark_interrupted(trail, gone=_gone)
    assert len(receipts) == 1
    assert again == []
    (marked,) = _interrupted(tmp_path)
    decision = next(r for r in _records(tmp_path) if r["request_id"] == "open")
    assert marked["request_id"] == "open"
    assert marked["principal"] == "alice"
    assert marked["policy"] == POLICY
    assert marked["data"]["caller"] == CALLER
    assert marked["data"]["image"] == "img:1"
    assert marked["data"]["exit_code"] is None
    assert marked["data"]["interrupted"] == {
        "decision": {"seq": decision["seq"], "event_id": decision["event_id"], "hash": decision["hash"]},
        "instance": {"host": decision["gateway"]["host"], "pid": decision["gateway"]["pid"]},
    }
    validator = jsonschema.Draft202012Validator(load_schema("audit-record"))
    assert not sorted(validator.iter_errors(marked), key=str)
    assert verify_trail(tmp_path).ok


def test_a_malformed_decision_is_left_to_verify_and_the_start_goes_on(tmp_path: Path) -> None:
    """A decision without the schema's shape (``allowed`` not a boolean) or without a request id is not marked;
    the well-formed open run after it still is."""
    with JsonlAuditTrail(tmp_path) as trail:
        trail.append("policy.decision", {"decision": {"allowed": "yes"}, "dry_run": False}, request_id="odd")
        nested = {"decision": {"allowed": True, "request_id": "nested"}, "dry_run": False}
        trail.append("policy.decision", nested, request_id=None)
        _decide(trail, "open")
        mark_interrupted(trail, gone=_gone)
    assert [r["request_id"] for r in _interrupted(tmp_path)] == ["open"]


def test_a_live_writer_s_open_run_is_left_alone(tmp_path: Path) -> None:
    with JsonlAuditTrail(tmp_path) as trail:
        _decide(trail, "running")
        assert mark_interrupted(trail, gone=_alive) == []
    assert _interrupted(tmp_path) == []


def test_the_scan_and_its_appends_hold_the_scan_lock(tmp_path: Path) -> None:
    """A second start blocks on the lock while the first scans: it then sees the first one's outcomes."""
    held: list[bool] = []

    def gone_while_checking_the_lock(_host: str, _pid: int, _written: str) -> bool:
        fd = os.open(tmp_path / SCAN_LOCK_NAME, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.append(True)
        else:
            held.append(False)
        finally:
            os.close(fd)
        return True

    with JsonlAuditTrail(tmp_path) as trail:
        _decide(trail, "open")
        mark_interrupted(trail, gone=gone_while_checking_the_lock)
    assert held == [True]


def test_only_the_last_two_segments_are_read(tmp_path: Path) -> None:
    with JsonlAuditTrail(tmp_path, segment_max_bytes=1) as trail:  # one record per segment
        _decide(trail, "too-old")
        _decide(trail, "older")
        _decide(trail, "newest")
        mark_interrupted(trail, gone=_gone)
    assert sorted(r["request_id"] for r in _interrupted(tmp_path)) == ["newest", "older"]


def test_a_record_of_another_host_is_never_taken_for_a_dead_writer() -> None:
    assert writer_gone(socket.gethostname() + "-elsewhere", 999_999_999, "2000-01-01T00:00:00.000000Z") is False


def test_a_pid_with_no_process_is_a_dead_writer() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert writer_gone(socket.gethostname(), child.pid, "2000-01-01T00:00:00.000000Z") is True


def test_a_live_process_is_the_writer_of_records_after_its_start_only() -> None:
    """This process wrote a record now: alive. A record with its pid from before it started: the pid was
    reused (a gateway restarted as its container's PID 1), so that record's writer is gone."""
    host, pid = socket.gethostname(), os.getpid()
    assert writer_gone(host, pid, "2099-01-01T00:00:00.000000Z") is False
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc: a process's start time cannot be read here")
    assert writer_gone(host, pid, "2000-01-01T00:00:00.000000Z") is True


_ROOT = Path(__file__).resolve().parents[3]
_WRITE_DECISION = """
import sys
from gateway.audit.jsonl import JsonlAuditTrail
with JsonlAuditTrail(sys.argv[1]) as trail:
    data = {"decision": {"allowed": True, "plan": {"image": "img:1"}}, "dry_run": False}
    trail.append("policy.decision", data, request_id="open", principal="alice", policy=None)
"""
_START = """
import pathlib, sys, time
from gateway.audit.interrupted import mark_interrupted
from gateway.audit.jsonl import JsonlAuditTrail
go, deadline = pathlib.Path(sys.argv[2]), time.monotonic() + 30
while not go.exists() and time.monotonic() < deadline:
    time.sleep(0.001)
with JsonlAuditTrail(sys.argv[1]) as trail:
    print(len(mark_interrupted(trail)))
"""


def test_concurrent_starts_of_several_processes_mark_a_dead_process_s_run_once(tmp_path: Path) -> None:
    """The decision's writer is a real process that has exited; four processes start on the trail at once,
    each with the real liveness rule: one outcome in all."""
    trail, go = tmp_path / "audit", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    subprocess.run([sys.executable, "-c", _WRITE_DECISION, str(trail)], check=True, env=env, timeout=60)
    starts = [
        subprocess.Popen([sys.executable, "-c", _START, str(trail), str(go)], stdout=subprocess.PIPE, env=env)
        for _ in range(4)
    ]
    go.touch()
    counts = [int(start.communicate(timeout=60)[0]) for start in starts]
    assert sorted(counts) == [0, 0, 0, 1]
    assert [r["request_id"] for r in _interrupted(trail)] == ["open"]


def test_a_gone_writers_session_without_an_end_is_killed_gateway_gone_and_its_creation_is_no_open_run(
    tmp_path: Path,
) -> None:
    with JsonlAuditTrail(tmp_path) as trail:
        for sid, request_id in (("s-open", "c1"), ("s-ended", "c2")):
            _decide(trail, request_id)
            created = {"session_id": sid, "mode": "kernel", "container_id": "c" * 64, "caller": CALLER}
            trail.append("session.created", created, request_id=request_id, principal="alice", policy=POLICY)
        trail.append("session.closed", {"session_id": "s-ended", "mode": "kernel", "reason": "owner"})
        assert mark_interrupted(trail, gone=_alive) == []
        receipts = mark_interrupted(trail, gone=_gone)
        assert mark_interrupted(trail, gone=_gone) == []
    assert len(receipts) == 1
    assert _interrupted(tmp_path) == []  # each creation's decision is closed by its session.created
    (killed,) = [r for r in _records(tmp_path) if r["event_type"] == "session.killed"]
    writer = _records(tmp_path)[0]["gateway"]
    assert killed["data"] == {
        "session_id": "s-open", "mode": "kernel", "reason": "gateway_gone", "container_id": "c" * 64,
        "instance": {"host": writer["host"], "pid": writer["pid"]}, "caller": CALLER,
    }  # fmt: skip
    assert (killed["principal"], killed["policy"]) == ("alice", POLICY)
    jsonschema.validate(killed, load_schema("audit-record"))
    assert verify_trail(tmp_path).ok

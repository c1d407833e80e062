"""A writer killed with SIGKILL mid-write, and many threads and processes appending at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gateway.audit import JsonlAuditTrail, repair_trail, verify_trail
from gateway.errors import AuditIntegrityError, AuditUnavailableError

START = {"policy_source": "policies/default.yaml"}

# A writer whose N-th write puts half the line on disk, says so, and hangs: the parent then SIGKILLs it.
HALF_WRITER = """
import os, sys, time
from gateway.audit import AuditIO, JsonlAuditTrail

class HalfIO(AuditIO):
    def __init__(self, stop_at):
        self.n, self.stop_at = 0, stop_at
    def write(self, fd, data):
        self.n += 1
        if self.n == self.stop_at:
            os.write(fd, bytes(data[: len(data) // 2]))
            print("HALF", flush=True)
            time.sleep(120)
        return os.write(fd, data)

trail = JsonlAuditTrail(sys.argv[1], io=HalfIO(int(sys.argv[2])), segment_max_bytes=3000)
for i in range(1000):
    trail.append("request.received", {"request": {"code": "print(%d)" % i, "env": {"K": "v"}}}, request_id=str(i))
"""

# A burst of big records from several threads; prints each acknowledged seq.
BURST_WRITER = """
import sys, threading
from gateway.audit import JsonlAuditTrail

trail = JsonlAuditTrail(sys.argv[1], group_commit=True, code_max_bytes=1 << 20, segment_max_bytes=8 << 20)
code = "x = 1\\n" * 50000  # 300 kB: a write spans many pages, so SIGKILL can tear it
lock = threading.Lock()

def run():
    while True:
        seq = trail.append("request.received", {"request": {"code": code}}).seq
        with lock:
            print(seq, flush=True)

for _ in range(4):
    threading.Thread(target=run, daemon=True).start()
threading.Event().wait()
"""

# Appends ARGV[3] records from ARGV[4] threads; prints every receipt as JSON.
MANY_WRITER = """
import json, sys, threading
from gateway.audit import JsonlAuditTrail

trail = JsonlAuditTrail(sys.argv[1], group_commit=sys.argv[2] == "group", segment_max_bytes=6000)
lock = threading.Lock()

def run(count):
    for i in range(count):
        r = trail.append("gateway.start", {"policy_source": "p"}, request_id=f"{i}")
        with lock:
            print(json.dumps([r.seq, r.event_id, r.hash]), flush=True)

threads = [threading.Thread(target=run, args=(int(sys.argv[3]),)) for _ in range(int(sys.argv[4]))]
for t in threads: t.start()
for t in threads: t.join()
trail.close()
"""


def spawn(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, stderr=subprocess.DEVNULL
    )


def test_sigkill_mid_write_leaves_an_intact_prefix_and_a_torn_tail(tmp_path: Path) -> None:
    proc = spawn(HALF_WRITER, str(tmp_path), "23")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "HALF"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL

    report = verify_trail(tmp_path)
    assert report.records_checked == 22
    assert report.first_break is not None
    assert (report.first_break.seq, report.first_break.reason) == (23, "truncated")

    with pytest.raises(AuditUnavailableError, match="torn") as info:
        JsonlAuditTrail(tmp_path).append("gateway.start", START)
    assert isinstance(info.value.__cause__, AuditIntegrityError)

    repaired = repair_trail(tmp_path)
    assert (repaired.repaired, repaired.last_good_seq, repaired.recovery_seq) == (True, 22, 23)
    assert repaired.dropped_bytes > 0
    with JsonlAuditTrail(tmp_path) as trail:
        assert trail.append("gateway.start", START).seq == 24
    final = verify_trail(tmp_path)
    assert (final.ok, final.records_checked) == (True, 24)


def test_sigkill_during_a_multithreaded_burst(tmp_path: Path) -> None:
    proc = spawn(BURST_WRITER, str(tmp_path))
    acknowledged = 0
    try:
        assert proc.stdout is not None
        while acknowledged < 40:
            line = proc.stdout.readline()
            assert line, "the writer died on its own"
            acknowledged = max(acknowledged, int(line))
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    complete = 0
    for path in sorted(tmp_path.glob("trail-*.jsonl")):
        complete += path.read_bytes().count(b"\n")
    report = verify_trail(tmp_path)
    assert report.records_checked == complete  # every complete line is intact
    assert report.records_checked >= acknowledged  # nothing acknowledged was lost
    if not report.ok:
        assert report.first_break is not None
        assert (report.first_break.seq, report.first_break.reason) == (complete + 1, "truncated")
        assert repair_trail(tmp_path).repaired
    with JsonlAuditTrail(tmp_path) as trail:
        trail.append("gateway.start", START)
    assert verify_trail(tmp_path).ok


@pytest.mark.parametrize("group_commit", [False, True])
def test_threads_appending_at_once(tmp_path: Path, group_commit: bool) -> None:
    shared = JsonlAuditTrail(tmp_path, group_commit=group_commit, segment_max_bytes=5000)
    seqs: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def run(own: bool) -> None:
        trail = JsonlAuditTrail(tmp_path, segment_max_bytes=5000) if own else shared
        barrier.wait()
        for _ in range(30):
            seq = trail.append("gateway.start", START).seq
            with lock:
                seqs.append(seq)
        if own:
            trail.close()

    threads = [threading.Thread(target=run, args=(i % 2 == 0,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shared.close()
    assert sorted(seqs) == list(range(1, 241))
    report = verify_trail(tmp_path)
    assert (report.ok, report.records_checked) == (True, 240)


def test_processes_appending_at_once(tmp_path: Path) -> None:
    procs = [spawn(MANY_WRITER, str(tmp_path), mode, "25", "2") for mode in ("group", "fsync", "group", "fsync")]
    receipts = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        receipts.extend(json.loads(line) for line in out.splitlines())
    assert sorted(r[0] for r in receipts) == list(range(1, 201))
    assert len({r[1] for r in receipts}) == 200
    report = verify_trail(tmp_path)
    assert (report.ok, report.records_checked) == (True, 200)
    assert report.segments > 1
    on_disk = {}
    for path in sorted(tmp_path.glob("trail-*.jsonl")):
        for line in path.read_bytes().splitlines():
            record = json.loads(line)
            on_disk[record["seq"]] = record["hash"]
    assert all(on_disk[seq] == digest for seq, _id, digest in receipts)
    pids = set()
    for path in sorted(tmp_path.glob("trail-*.jsonl")):
        pids.update(json.loads(line)["gateway"]["pid"] for line in path.read_bytes().splitlines())
    assert len(pids) == 4

"""Audit trail benchmark: append throughput (fsync per record, group commit) and verify/query throughput.

    .venv/bin/python benchmarks/audit.py                 # full run: 1,000,000-record trail for verify
    .venv/bin/python benchmarks/audit.py --records 100000 --appends 500

Appends go through :class:`JsonlAuditTrail` with real ``fsync``. The large trail for verify is built with the
same pipeline and sealing code (``RecordPipeline`` + ``chain``), written with buffered writes and no fsync
(building it through fsync would take hours and measures nothing new). Verify and query run in a child
process so that their peak RSS is measured alone (constant memory: it must not grow with the trail).
Everything happens under a temporary directory (``--dir`` to choose one), removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from gateway.audit import JsonlAuditTrail
from gateway.audit.canonical import GENESIS_HASH
from gateway.audit.pipeline import RecordPipeline, chain
from gateway.audit.segments import segment_name

IMAGE = "gateway/sandbox-python:3.11-bookworm"
KEY = bytes(range(32))


def events(i: int) -> tuple[str, dict[str, Any], str]:
    """A realistic mix: request, decision (every rule result), outcome."""
    rid = f"req-{i // 3:08d}"
    kind = i % 3
    if kind == 0:
        request = {
            "code": f"import math\nprint(math.factorial({i % 50}))\n" * 3,
            "image": IMAGE,
            "limits": {"memory": "256m", "cpus": 0.5, "pids": 64, "timeout_s": 10},
            "env": {"TOKEN": "secret"},
            "files": {"data/in.csv": "a,b\n1,2\n"},
            "principal": f"agent-{i % 7}",
        }
        return "request.received", {"request": request}, rid
    if kind == 1:
        allowed = i % 10 != 1
        results = [
            {
                "rule": rule,
                "status": "pass" if allowed or rule != "limits.memory" else "fail",
                "mode": "enforce",
                "path": path,
                "got": "256m",
                "expected": "<= 512m",
                "message": f"{rule}: requested value is within the policy ceiling",
            }
            for rule, path in (
                ("images.allowlist", "$.image"),
                ("limits.memory", "$.limits.memory"),
                ("limits.cpus", "$.limits.cpus"),
                ("limits.pids", "$.limits.pids"),
                ("network.mode", "$.network"),
                ("runtime.allowed", "$.runtime"),
                ("mounts.allowlist", "$.mounts"),
                ("env.names", "$.env"),
            )
        ]
        decision = {
            "decision_id": f"dec-{i}",
            "request_id": rid,
            "allowed": allowed,
            "policy": {"name": "default", "sha256": "a" * 64, "source": "policies/default.yaml"},
            "results": results,
            "violations": [r for r in results if r["status"] == "fail"],
            "warnings": [],
            "options": {"image": IMAGE, "network_mode": "none", "read_only": True, "cap_drop": ["ALL"]}
            if allowed
            else None,
            "plan": None,
        }
        return "policy.decision", {"decision": decision, "options_sha256": "b" * 64, "dry_run": False}, rid
    return (
        "execution.outcome",
        {
            "exit_code": 0,
            "timed_out": False,
            "oom_killed": False,
            "output_limit_killed": False,
            "resource_killed": False,
            "duration_ms": 120 + i % 50,
            "container_id": hashlib.sha256(str(i).encode()).hexdigest(),
            "image": IMAGE,
            "image_id": "sha256:" + "c" * 64,
            "stdout": {"bytes": 3, "sha256": "d" * 64, "truncated": False},
            "stderr": {"bytes": 0, "sha256": "e" * 64, "truncated": False},
            "files": [],
            "error": None,
        },
        rid,
    )


def bench_append(root: Path, count: int, threads: int, group_commit: bool) -> dict[str, Any]:
    directory = root / f"append-{threads}-{group_commit}"
    trail = JsonlAuditTrail(directory, group_commit=group_commit, host="bench")
    per_thread = count // threads
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads + 1)

    def run(offset: int) -> None:
        mine = []
        barrier.wait()
        for i in range(offset, offset + per_thread):
            event_type, data, rid = events(i)
            t0 = time.perf_counter()
            trail.append(event_type, data, request_id=rid, principal="agent")
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    workers = [threading.Thread(target=run, args=(n * per_thread,)) for n in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    start = time.perf_counter()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    trail.close()
    latencies.sort()
    total = per_thread * threads
    return {
        "mode": "group commit" if group_commit else "fsync per record",
        "threads": threads,
        "records": total,
        "records_per_s": round(total / elapsed),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
    }


def write_segments(directory: Path, lines: Iterable[bytes], segment_bytes: int = 64 << 20) -> int:
    """Write sealed lines into segments rotated by size as the trail's writer does (buffered, no fsync); the
    bytes written."""
    index, size, total = 1, 0, 0
    out = (directory / segment_name(index)).open("wb", buffering=1 << 20)
    try:
        for line in lines:
            if size and size + len(line) > segment_bytes:
                out.close()
                index, size = index + 1, 0
                out = (directory / segment_name(index)).open("wb", buffering=1 << 20)
            out.write(line)
            size += len(line)
            total += len(line)
    finally:
        out.close()
    return total


def build_trail(directory: Path, records: int, key: bytes | None, segment_bytes: int = 64 << 20) -> tuple[int, float]:
    """Write a trail of ``records`` sealed records (same code path as the writer, without fsync)."""
    directory.mkdir(parents=True)
    pipeline = RecordPipeline(host="bench")

    def lines() -> Iterator[bytes]:
        prev = GENESIS_HASH
        for i in range(records):
            event_type, data, rid = events(i)
            record = pipeline.build(event_type, data, request_id=rid, principal=f"agent-{i % 7}", policy=None)
            sealed = chain(record, seq=i + 1, prev_hash=prev, key=key)
            prev = sealed.hash
            yield sealed.line

    start = time.perf_counter()
    total = write_segments(directory, lines(), segment_bytes)
    return total, time.perf_counter() - start


CHILD = """
import hashlib, json, os, resource, sys, time
from pathlib import Path
from gateway.audit import query_trail, verify_trail
what, directory = sys.argv[1], sys.argv[2]
start = time.perf_counter()
if what == "verify":
    report = verify_trail(directory)
    result = {"ok": report.ok, "records": report.records_checked}
elif what == "verify-in-process":
    report = verify_trail(directory, workers=1)
    result = {"ok": report.ok, "records": report.records_checked}
elif what == "bare-sha256":
    lines = 0
    for path in sorted(Path(directory).glob("trail-*.jsonl")):
        with path.open("rb", buffering=1 << 20) as fh:
            for line in fh:
                hashlib.sha256(line).digest()
                lines += 1
    result = {"records": lines}
elif what == "verify-hmac":
    report = verify_trail(directory, key=bytes(range(32)))
    result = {"ok": report.ok, "records": report.records_checked}
elif what == "query-request":
    result = {"records": sum(1 for _ in query_trail(directory, request_id="req-00123456"))}
else:
    result = {"records": sum(1 for _ in query_trail(directory, decision="deny"))}
result["seconds"] = time.perf_counter() - start
result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
if children:
    result["workers_max_rss_mb"] = children
result["load_avg_1m"] = os.getloadavg()[0]
print(json.dumps(result))
"""


def child(what: str, directory: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, what, str(directory)], check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="records in the verify trail")
    parser.add_argument("--appends", type=int, default=2000, help="records per append benchmark")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--hmac", action="store_true", help="also build a keyed trail and verify with HMAC")
    parser.add_argument("--no-append", action="store_true", help="skip the append benchmarks")
    parser.add_argument(
        "--trail", type=Path, help="verify/query this existing trail (of --records records) instead of building one"
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each verify measurement")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="audit-bench-", dir=args.dir))
    try:
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, work dir {root}")
        if not args.no_append:
            print("\n## append (JsonlAuditTrail, real fsync)")
            for threads, group in ((1, False), (8, False), (8, True), (32, True)):
                print(json.dumps(bench_append(root, args.appends, threads, group)))

        print(f"\n## verify / query on a {args.records:,}-record trail")
        if args.trail is not None:
            plain = args.trail
        else:
            plain = root / "trail"
            size, secs = build_trail(plain, args.records, None)
            print(
                json.dumps(
                    {
                        "built": args.records,
                        "bytes": size,
                        "avg_record_bytes": size // args.records,
                        "build_s": round(secs, 1),
                    }
                )
            )
        small = root / "small"
        build_trail(small, max(1, args.records // 10), None)
        # verify (parallel when the trail is large), the same in one process, and one bare sha256 per line
        # (the floor for one core), interleaved so that each triple runs under about the same load
        runs = [("verify", plain), ("verify-in-process", plain), ("bare-sha256", plain)] * args.repeat
        for what, directory in (
            *runs,
            ("verify", small),
            ("query-request", plain),
            ("query-decision", plain),
        ):
            result = child(what, directory)
            records = args.records if directory == plain else max(1, args.records // 10)
            result["trail_records"] = records
            result["trail_records_per_s"] = round(records / result["seconds"])
            print(
                json.dumps({"what": what, **{k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}})
            )
        if args.hmac:
            keyed = root / "keyed"
            build_trail(keyed, args.records, KEY)
            result = child("verify-hmac", keyed)
            result["trail_records_per_s"] = round(args.records / result["seconds"])
            print(json.dumps({"what": "verify-hmac", **result}))
        print(f"\nbenchmark process max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Report benchmark: ``gateway report`` in every format over a 1,000,000-record synthetic trail.

    .venv/bin/python benchmarks/report.py                      # 1,000,000 records, every format
    .venv/bin/python benchmarks/report.py --records 100000 --formats html json
    .venv/bin/python benchmarks/report.py --records 100000 --per-record 15000   # CPU µs/record in process

The trail is built with the writer's own code: the records are what a Gateway writes (``request.received``,
``policy.decision`` with every rule result and the real Docker run options of the default policy, the seccomp
profile named by its digest as in every decision record, ``execution.outcome``), made by ``decide()`` on a
handful of request shapes and sealed by the trail's own pipeline and ``chain`` (``RecordPipeline`` +
``chain``, as ``benchmarks/audit.py`` does; buffered writes, no fsync: building through fsync would take hours
and measures nothing new). It is cached under the temporary directory
(``$TMPDIR/gateway-report-bench-<records>-<format>``, where ``<format>`` is a digest of the record templates,
so a change of what a Gateway records builds a new trail; ``--rebuild`` to redo it).

Each report runs in a fresh interpreter (``gateway.cli.main``, what the ``gateway`` command runs, output to a
file) that prints its own wall time and peak RSS, and the peak RSS of its largest worker process (the report
aggregates a large trail's segments in one worker per CPU), from ``resource.getrusage``. Baseline measured in
the same run: ``gateway audit verify`` on the same trail (every report verifies first), so the ratio
report/verify says what the report adds to the verification it cannot skip.

Targets on this machine: HTML report under 20 s and under 200 MB peak RSS.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from audit import write_segments
from gateway.audit.canonical import GENESIS_HASH
from gateway.audit.pipeline import RecordPipeline, chain
from gateway.policy import load_policy
from gateway.report.aggregate import DENIED_CAP
from gateway.report.scan import ReportFilters, SegmentTask, aggregate_segment
from gateway.request import parse_request
from gateway.resources import default_policy_path
from gateway.result import outcome_data
from gateway.runner.interface import Outcome
from gateway.testing import decide

REPO = Path(__file__).resolve().parents[1]
START_EPOCH = 1_772_000_000  # 2026-02-25: the synthetic trail's first second
SHAPES: list[tuple[dict[str, Any], str]] = [
    ({"code": "print(2+2)"}, "ok"),
    ({"code": "import sys; sys.exit(3)"}, "exit"),
    ({"code": "print(1)", "limits": {"memory": "128m", "cpus": 0.5}}, "ok"),
    ({"code": "while True: pass"}, "timeout"),
    ({"code": "print(1)", "image": "evil/miner:latest"}, "deny"),
    ({"code": "print(1)", "limits": {"memory": "4g"}}, "deny"),
    ({"code": "print(1)", "network": "host"}, "deny"),
    ({"code": "x = ' ' * 10**10"}, "oom"),
    ({"code": "print('hello')", "env": {"MODE": "fast"}}, "ok"),
    ({"code": "print('x' * 10**7)"}, "flood"),
]


def _outcome(kind: str, i: int) -> Outcome:
    return Outcome(
        exit_code={"ok": 0, "exit": 3, "oom": 137}.get(kind),
        stdout=b"4\n",
        stderr=b"",
        stdout_truncated=kind == "flood",
        stderr_truncated=False,
        stdout_bytes=2_000_000 if kind == "flood" else 2,
        stderr_bytes=0,
        timed_out=kind == "timeout",
        oom_killed=kind == "oom",
        output_limit_killed=kind == "flood",
        resource_killed=False,
        duration_ms=10_000 if kind == "timeout" else 90 + (i * 37) % 400,
        container_id=hashlib.sha256(str(i).encode()).hexdigest(),
        image_id="sha256:" + "c" * 64,
    )


def templates() -> list[tuple[dict[str, Any], dict[str, Any], str]]:
    """(request, decision record, outcome kind) of each shape, as a Gateway records them."""
    policy = load_policy(default_policy_path())
    out = []
    for request, kind in SHAPES:
        parsed = parse_request(request)
        out.append((parsed.to_dict(), decide(policy, parsed, request_id="r", decision_id="d").to_dict(), kind))
    return out


def format_tag() -> str:
    """A short digest of the record templates: names the cached trail, so a new record format builds anew."""
    return hashlib.sha256(json.dumps(templates(), sort_keys=True).encode()).hexdigest()[:12]


def build_trail(directory: Path, records: int, segment_bytes: int = 64 << 20) -> tuple[int, float]:
    """``records`` sealed records of requests in the SHAPES mix, one request every 0.2 s from START_EPOCH."""
    policy = load_policy(default_policy_path())
    ref = {"name": policy.name, "sha256": policy.sha256}
    shapes = templates()
    directory.mkdir(parents=True)
    pipeline = RecordPipeline(host="bench")

    def lines() -> Iterator[bytes]:
        prev, seq, request_no = GENESIS_HASH, 0, 0
        while seq < records:
            request, decision, kind = shapes[request_no % len(shapes)]
            rid = f"{request_no:032x}"
            principal = f"agent-{request_no % 7}"
            when = START_EPOCH + request_no // 5
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(when)) + f".{(request_no % 5) * 200000:06d}Z"
            decision = {**decision, "request_id": rid, "decision_id": f"d{rid}"}
            events: list[tuple[str, dict[str, Any]]] = [("request.received", {"request": request})]
            events.append(("policy.decision", {"decision": decision, "options_sha256": "b" * 64, "dry_run": False}))
            if decision["allowed"]:  # a denied request has no outcome (the env shape is denied: env.allowed)
                events.append(
                    ("execution.outcome", outcome_data(request_image(decision), _outcome(kind, request_no), None))
                )
            for event_type, data in events:
                if seq >= records:
                    break
                seq += 1
                record = pipeline.build(event_type, data, request_id=rid, principal=principal, policy=ref)
                sealed = chain(record, seq=seq, prev_hash=prev, key=None, timestamp=stamp)
                prev = sealed.hash
                yield sealed.line
            request_no += 1

    started = time.perf_counter()
    total = write_segments(directory, lines(), segment_bytes)
    return total, time.perf_counter() - started


def request_image(decision: dict[str, Any]) -> str:
    plan = decision.get("plan") or {}
    return str(plan.get("image") or "")


CHILD = """
import json, resource, sys, time
from gateway.cli import main
started = time.perf_counter()
rc = main(sys.argv[1:])
seconds = time.perf_counter() - started
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
out = {"rc": rc, "seconds": seconds, "cpu_s": cpu, "own_mb": me.ru_maxrss / 1024, "worker_mb": kids.ru_maxrss / 1024}
sys.stderr.write("\\n" + json.dumps(out) + "\\n")
"""


def run_child(argv: list[str]) -> dict[str, Any]:
    """Run ``gateway ARGV`` (``gateway.cli.main``, what the console script runs) in a fresh interpreter: its wall
    time, its own peak RSS and the peak RSS of its largest worker process (0 when it started none)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], env=env, capture_output=True, text=True, check=False)
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "{}"
    measured = json.loads(last) if last.startswith("{") else {}
    own, worker = measured.get("own_mb", 0.0), measured.get("worker_mb", 0.0)
    return {
        "rc": measured.get("rc", proc.returncode),
        "seconds": round(measured.get("seconds", 0.0), 2),
        # user + system time of the command and its workers (imports included): the cost under any load
        "cpu_s": round(measured.get("cpu_s", 0.0), 2),
        "max_rss_mb": round(own, 1),
        "worker_max_rss_mb": round(worker, 1),
        # workers run at the same time as the parent: their peaks add up at worst
        "total_rss_bound_mb": round(own + worker * (os.cpu_count() or 1), 1),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def per_record_cpu(trail: Path, lines: int, rounds: int = 9) -> float:
    """µs of CPU per trail line of the report's aggregation in this process (``aggregate_segment``: read, skip
    ``request.received``, parse, typed view, aggregate) over the first ``lines`` lines of the first segment,
    best of ``rounds``: the per-record cost without imports, workers or verification, least disturbed by load."""
    task = SegmentTask(0, str(min(trail.glob("trail-*.jsonl"))), lines)
    best = float("inf")
    for _round in range(rounds):
        started = time.thread_time()
        aggregate_segment(task, ReportFilters(), DENIED_CAP)
        best = min(best, time.thread_time() - started)
    return best / lines * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--formats", nargs="+", default=["html", "json", "md", "csv"])
    parser.add_argument("--rebuild", action="store_true", help="rebuild the cached trail")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the cache lives")
    parser.add_argument(
        "--per-record", type=int, metavar="LINES", help="only the in-process CPU µs per record over LINES lines"
    )
    args = parser.parse_args()
    trail = args.dir / f"gateway-report-bench-{args.records}-{format_tag()}"
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, trail {trail}")
    if args.rebuild and trail.exists():
        for path in trail.iterdir():
            path.unlink()
        trail.rmdir()
    if not trail.exists():
        size, secs = build_trail(trail, args.records)
        print(json.dumps({"built": args.records, "bytes": size, "avg_record_bytes": size // args.records,
                          "build_s": round(secs, 1)}))  # fmt: skip
    else:
        size = sum(p.stat().st_size for p in trail.glob("trail-*.jsonl"))
        print(json.dumps({"cached": args.records, "bytes": size}))
    if args.per_record:
        cost = per_record_cpu(trail, args.per_record)
        print(
            json.dumps(
                {"what": "aggregation in process", "lines": args.per_record, "cpu_us_per_record": round(cost, 1)}
            )
        )
        return 0
    out = Path(tempfile.mkdtemp(prefix="report-bench-out-"))
    for fmt in args.formats:
        target = out / f"report.{fmt}"
        result = run_child(["report", "--trail", str(trail), "--format", fmt, "-o", str(target)])
        result.update(what=f"report --format {fmt}", output_bytes=target.stat().st_size if target.exists() else 0)
        result["records_per_s"] = round(args.records / result["seconds"]) if result["seconds"] else None
        result["cpu_us_per_record"] = round(result["cpu_s"] / args.records * 1e6, 1)
        print(json.dumps(result))
    verify = run_child(["audit", "verify", str(trail)])
    verify.update(what="audit verify (baseline)")
    print(json.dumps(verify))
    for target in out.iterdir():
        target.unlink()
    out.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())

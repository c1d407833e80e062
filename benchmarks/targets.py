"""The performance targets of the Service and Reports issues, in rounds spread over time: one table of verdicts.

    PYTHONPATH=. .venv/bin/python benchmarks/targets.py                    # 3 rounds, one every 10 minutes
    PYTHONPATH=. .venv/bin/python benchmarks/targets.py --rounds 12 --every 600 > rounds.jsonl

This VM's speed drifts with its neighbours (the same code has moved from 1,339 to 1,023 decisions/s within 45
minutes), so one run of a benchmark says little about a target "on this machine": this script runs the scripts
the issues name, as they name them, once per round, and counts the rounds that meet each target. A round is:

- ``benchmarks/probe.py``: a fixed CPU workload, to place the round among the VM's fast and slow phases;
- ``benchmarks/service.py --n 16 --blocks 2 --decision-seconds 10 --json``: ``POST /v1/decisions`` at
  concurrency 16 (target: at least 1,000/s), the service's overhead over the in-process ``Gateway`` at
  concurrency 8 (under 10 %), errors and leftover containers (none), and its same-run baseline, the CPU of one
  in-process ``Gateway.decide``;
- ``benchmarks/export.py --records 200000 --repeat 2``: the OCSF export, best of two (at least 50,000 records/s),
  with its same-run baselines (verify, parse);
- ``benchmarks/report.py --formats html``: the HTML report over 1,000,000 records (under 20 s, under 200 MB of
  peak RSS), with its same-run baseline (verify).

Each round is printed as one JSON line on stdout as it ends; the summary (each target: rounds met, least,
median, most) follows as one JSON line, and as a table on stderr when a person is watching. Rounds start
``--every`` seconds apart (a round takes about two minutes). Needs the Docker engine and the sandbox image
(``scripts/setup.sh``); only loopback and the local engine are contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass(frozen=True)
class Target:
    name: str
    field: str
    """The round's figure it judges."""
    met: Callable[[Any], bool]
    text: str


TARGETS = (
    Target("decisions", "decisions_per_s", lambda v: v >= 1000, ">= 1,000 decisions/s at concurrency 16"),
    Target("overhead", "service_overhead", lambda v: v < 0.10, "service overhead < 10 % at concurrency 8"),
    Target("clean", "errors_and_leftovers", lambda v: v == 0, "0 errors, 0 leftover containers"),
    Target("export", "export_records_per_s", lambda v: v >= 50_000, ">= 50,000 OCSF records/s"),
    Target("report", "html_report_s", lambda v: v < 20, "HTML report of 1,000,000 records < 20 s"),
    Target("report_rss", "html_report_rss_mb", lambda v: v < 200, "HTML report peak RSS < 200 MB"),
)


def _run(argv: list[str], timeout: float) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done.stdout


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def one_round() -> dict[str, Any]:
    """Run each script once; the figures the targets judge, and the same-run baselines beside them."""
    row: dict[str, Any] = {"started": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    row["probe_cpu_ms"] = _lines(_run([str(HERE / "probe.py")], 120))[0]["probe_cpu_ms"]

    args = ["--n", "16", "--blocks", "2", "--decision-seconds", "10", "--json"]
    service = json.loads(_run([str(HERE / "service.py"), *args], 900))
    decisions = service["decisions"]
    row["decisions_per_s"] = decisions["throughput_rps"]
    row["decision_server_cpu_ms"] = decisions["server_cpu_ms_per_request"]
    row["decision_inprocess_cpu_ms"] = decisions["inprocess_decide_cpu_ms"]
    row["service_overhead"] = service["overhead"]["throughput"]
    errors = service["service"]["errors"] + service["in-process"]["errors"] + decisions["errors"]
    row["errors_and_leftovers"] = errors + service["leftover_containers"]

    export = _lines(_run([str(HERE / "export.py"), "--records", "200000", "--repeat", "2"], 900))
    row["export_records_per_s"] = max(r["records_per_s"] for r in export if r.get("what") == "export")
    row["export_verify_records_per_s"] = max(r["records_per_s"] for r in export if r.get("what") == "verify")
    row["export_parse_records_per_s"] = max(r["records_per_s"] for r in export if r.get("what") == "parse")

    report = _lines(_run([str(HERE / "report.py"), "--formats", "html"], 1800))
    (html,) = (r for r in report if r.get("what") == "report --format html")
    (verify,) = (r for r in report if r.get("what") == "audit verify (baseline)")
    if html["rc"] != 0:
        raise RuntimeError(f"the HTML report exited {html['rc']}")
    row["html_report_s"] = html["seconds"]
    row["html_report_rss_mb"] = html["total_rss_bound_mb"]
    row["report_verify_s"] = verify["seconds"]
    return row


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"rounds": len(rows)}
    for target in TARGETS:
        values = [row[target.field] for row in rows if target.field in row]
        out[target.name] = {
            "target": target.text,
            "met": sum(1 for v in values if target.met(v)),
            "of": len(values),
            "least": min(values) if values else None,
            "median": statistics.median(values) if values else None,
            "most": max(values) if values else None,
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds to run (default 3)")
    parser.add_argument("--every", type=float, default=600.0, help="seconds from one round's start to the next's")
    args = parser.parse_args()
    if args.rounds < 1 or args.every < 0:
        parser.error("--rounds must be at least 1 and --every at least 0")
    watched = sys.stderr.isatty()
    rows: list[dict[str, Any]] = []
    for number in range(1, args.rounds + 1):
        started = time.monotonic()
        if watched:
            print(f"round {number}/{args.rounds} ...", file=sys.stderr, flush=True)
        row = one_round()
        rows.append(row)
        print(json.dumps(row), flush=True)
        if number < args.rounds:
            time.sleep(max(0.0, args.every - (time.monotonic() - started)))
    result = summary(rows)
    print(json.dumps({"summary": result}), flush=True)
    if watched:
        for target in TARGETS:
            s = result[target.name]
            print(
                f"{s['target']:<45} met in {s['met']} of {s['of']} rounds "
                f"(least {s['least']}, median {s['median']}, most {s['most']})",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

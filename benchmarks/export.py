"""OCSF export benchmark: `gateway audit export --format ocsf` over a large synthetic trail.

    .venv/bin/python benchmarks/export.py                     # 1,000,000 records
    .venv/bin/python benchmarks/export.py --records 100000 --repeat 3
    .venv/bin/python benchmarks/export.py --records 15000 --per-record 15000   # CPU µs/record in process

The trail is built with the writer's own pipeline and sealing code (``RecordPipeline`` + ``chain``, the mix of
``benchmarks/audit.py``: request received, decision with every rule result, outcome), written without fsync.
Each measurement runs in a fresh child process (its peak RSS is its own): the export itself
(:func:`gateway.audit.ocsf_export.export_ocsf`, verification included, events written to /dev/null or ``--output``),
and two baselines in the same run, interleaved with it so they see about the same load: ``verify`` (the
chain check the export starts with) and ``parse`` (``json.loads`` of every line and nothing else: the floor of
any exporter that reads the records). Figures: records/s (wall) and the ratio to each baseline, and records per
CPU-second (user + system time of the child and its workers): the load-independent cost, since the machine
is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from audit import build_trail
from gateway.audit.ocsf import OcsfMapper
from gateway.audit.ocsf_export import event_line
from gateway.audit.records import view_record

orjson: Any
try:  # what the export parses with when the siem extra is installed
    import orjson
except ImportError:  # pragma: no cover
    orjson = None

CHILD = """
import json, os, resource, sys, time
from pathlib import Path
what, directory, output = sys.argv[1], sys.argv[2], sys.argv[3]
start = time.perf_counter()
if what == "export":
    from gateway.audit.ocsf_export import export_ocsf
    with open(output, "wb", buffering=1 << 20) as out:
        (report,) = export_ocsf([directory], out)
    result = {"records": report.exported, "intact": report.intact}
elif what == "verify":
    from gateway.audit import verify_trail
    result = {"records": verify_trail(directory).records_checked}
else:
    n = 0
    for path in sorted(Path(directory).glob("trail-*.jsonl")):
        with path.open("rb", buffering=1 << 20) as fh:
            for line in fh:
                json.loads(line)
                n += 1
    result = {"records": n}
result["seconds"] = time.perf_counter() - start
own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
result["cpu_s"] = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
if children:
    result["workers_max_rss_mb"] = children
result["load_avg_1m"] = os.getloadavg()[0]
print(json.dumps(result))
"""


def child(what: str, directory: Path, output: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, what, str(directory), output], check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def per_record_cpu(trail: Path, lines: int, rounds: int = 9) -> float:
    """µs of CPU per record of the export's per-record work in this process (parse, typed view, OCSF mapping,
    JSON line) over the first ``lines`` lines of the first segment, best of ``rounds``: the cost without
    imports, workers or verification, least disturbed by load."""
    segment = min(trail.glob("trail-*.jsonl"))
    with segment.open("rb") as fh:
        chunk = [line for _, line in zip(range(lines), fh, strict=False)]
    parse = orjson.loads if orjson is not None else json.loads
    best = float("inf")
    for _round in range(rounds):
        mapper = OcsfMapper()
        started = time.thread_time()
        for raw in chunk:
            event_line(mapper.event(view_record(parse(raw)), "bench"))
        best = min(best, time.thread_time() - started)
    return best / len(chunk) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="records in the trail (default 1,000,000)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of (export, verify, parse)")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--output", default=os.devnull, help="where the events go (default /dev/null)")
    parser.add_argument("--target", type=float, default=50_000, help="records/s the export should reach")
    parser.add_argument(
        "--per-record", type=int, metavar="LINES", help="only the in-process CPU µs per record over LINES lines"
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="export-bench-", dir=args.dir))
    try:
        trail = root / "trail"
        size, secs = build_trail(trail, args.records, None)
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, work dir {root}")
        print(json.dumps({"built": args.records, "bytes": size, "build_s": round(secs, 1)}))
        if args.per_record:
            cost = per_record_cpu(trail, args.per_record)
            print(
                json.dumps({"what": "export in process", "lines": args.per_record, "cpu_us_per_record": round(cost, 1)})
            )
            return 0
        rates: dict[str, list[float]] = {"export": [], "verify": [], "parse": []}
        cpu_rates: dict[str, list[float]] = {"export": [], "verify": [], "parse": []}
        for _round in range(args.repeat):
            for what in ("export", "verify", "parse"):
                result = child(what, trail, args.output)
                assert result["records"] == args.records, result
                rate = args.records / result["seconds"]
                rates[what].append(rate)
                cpu_rates[what].append(args.records / result["cpu_s"])
                shown = {k: round(v, 2) if isinstance(v, float) else v for k, v in result.items()}
                per_cpu = round(args.records / result["cpu_s"])
                print(json.dumps({"what": what, **shown, "records_per_s": round(rate), "records_per_cpu_s": per_cpu}))
        best = {what: max(values) for what, values in rates.items()}
        print(
            json.dumps(
                {
                    "export_records_per_s_best": round(best["export"]),
                    "export_records_per_cpu_s_best": round(max(cpu_rates["export"])),
                    "export_over_verify": round(best["export"] / best["verify"], 3),
                    "export_over_parse": round(best["export"] / best["parse"], 3),
                    "target_records_per_s": args.target,
                    "met": best["export"] >= args.target,
                }
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

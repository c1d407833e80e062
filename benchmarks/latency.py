"""End-to-end latency of ``print(2+2)``: the gateway vs. a plain ``docker run`` vs. the lesson's helper.

Three ways to run the same program in the same image, measured in the same run and interleaved (round-robin,
so that drift in the machine's load hits all three alike):

- ``gateway``: ``Gateway.execute`` with the default policy: request validation, policy decision, option
  assembly and guard, the audit record of the decision (fsync), a hardened single-use container driven by
  ``DockerRunner``, the audit record of the outcome (``policies/strict.yaml`` for ``--runtime runsc``).
- ``docker-cli``: ``docker run --rm --network none IMAGE python3 -c 'print(2+2)'`` through the CLI.
- ``lesson``: the lesson's docker-py helper, ``client.containers.run(image, f'python3 -c "{code}"',
  remove=True, network_disabled=True, mem_limit="256m")``.

Usage: ``.venv/bin/python benchmarks/latency.py [--n 30] [--warmup 3] [--runtime runc|runsc] [--json]``
Only the local engine is contacted. The three runners live in ``benchmarks/cases.py`` (shared with
``benchmarks/peers.py``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import docker
from cases import IMAGE, cpus, docker_cli, gateway_case, lesson_helper, percentile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30, help="measured rounds (each runs all three)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runtime", default="runc", choices=["runc", "runsc"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    client = docker.from_env()
    client.images.get(IMAGE)  # fails clearly when the image is missing: run scripts/build-image.sh
    with tempfile.TemporaryDirectory(prefix="gateway-bench-audit-") as audit:
        name = "gateway"
        gateway_run, close = gateway_case(args.runtime, Path(audit))
        cases: dict[str, Callable[[], None]] = {
            name: gateway_run,
            "docker-cli": docker_cli(args.runtime),
            "lesson": lesson_helper(client, args.runtime),
        }
        times: dict[str, list[float]] = {k: [] for k in cases}
        try:
            for i in range(args.warmup + args.n):
                order = list(cases.items())
                order = order[i % len(order) :] + order[: i % len(order)]  # rotate who goes first
                for key, fn in order:
                    start = time.perf_counter()
                    fn()
                    elapsed = (time.perf_counter() - start) * 1000
                    if i >= args.warmup:
                        times[key].append(elapsed)
        finally:
            close()
    client.close()

    summary = {
        key: {
            "p50_ms": round(statistics.median(v), 1),
            "p95_ms": round(percentile(v, 0.95), 1),
            "mean_ms": round(statistics.fmean(v), 1),
            "n": len(v),
        }
        for key, v in times.items()
    }
    base = summary[name]["p50_ms"]
    ratios = {
        f"{name}/docker-cli p50": round(base / summary["docker-cli"]["p50_ms"], 2),
        f"{name}/lesson p50": round(base / summary["lesson"]["p50_ms"], 2),
        f"{name}/docker-cli p95": round(summary[name]["p95_ms"] / summary["docker-cli"]["p95_ms"], 2),
    }
    info = {"runtime": args.runtime, "machine": platform.platform(), "cpus": cpus()}
    if args.json:
        print(json.dumps({"info": info, "summary": summary, "ratios": ratios}, indent=2))
    else:
        print(f"runtime={args.runtime}  n={args.n}  {info['machine']}  cpus={info['cpus']}")
        print(f"{'case':<12} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}")
        for key, row in summary.items():
            print(f"{key:<12} {row['p50_ms']:>8} {row['p95_ms']:>8} {row['mean_ms']:>8}")
        for key, value in ratios.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Kernel cells against pre-started runs, at the runner: ``print(2+2)`` in a live kernel and a cell reusing a
variable, side by side with the same program handed to a container that was created and started ahead (what a
warm pool's hit costs at the runner), and the kernel's open (container start and interpreter ready).

Both go through ``DockerRunner`` with the options the shipped policy assembles (``default.yaml`` for runc,
``strict.yaml`` for runsc): no Gateway, audit or HTTP, so the figures are the runner's part of a session cell.
A pre-started container's time is its payload's hand-over to the end of collection (the removal is confirmed
off the path, as the Gateway does).

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/kernel_cells.py [--runtime runsc] [--n 200] [--runs 20]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from cases import CODE, EXPECTED, policy_for

from gateway.policy import load_policy
from gateway.request import parse_request
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import Payload, RunSpec
from gateway.testing import assemble


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered):8.2f} ms   p90 {p90:8.2f} ms   (n={len(ordered)})"


def timed(step: Callable[[], object]) -> float:
    start = time.perf_counter()
    step()
    return (time.perf_counter() - start) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="runc", choices=["runc", "runsc"])
    parser.add_argument("--n", type=int, default=200, help="cells per kind")
    parser.add_argument("--runs", type=int, default=20, help="pre-started runs and kernel opens")
    args = parser.parse_args(argv)
    os.environ.setdefault("GATEWAY_INSTANCE", f"bench-kernel-cells-{os.getpid()}")
    policy = load_policy(policy_for(args.runtime))
    options = assemble(policy, parse_request({"code": "pass"}), decision_id="bench", request_id="bench")
    spec = RunSpec(options, timeout_s=600, output_bytes=1 << 16)
    runner = DockerRunner()
    try:
        opens: list[float] = []
        for _ in range(max(args.runs // 4, 1)):
            start = time.perf_counter()
            probe = runner.open_kernel(spec)
            opens.append((time.perf_counter() - start) * 1000)
            probe.close()
        kernel = runner.open_kernel(spec)
        try:
            first = kernel.execute(CODE, timeout_s=10)
            assert first.outcome.stdout.decode() == EXPECTED, first
            kernel.execute("n = 0", timeout_s=10)
            prints = [timed(lambda: kernel.execute(CODE, timeout_s=10)) for _ in range(args.n)]
            reuse = [timed(lambda: kernel.execute("n += 1\nn", timeout_s=10)) for _ in range(args.n)]
            assert kernel.execute("n", timeout_s=10).value == str(args.n)
        finally:
            kernel.close()
        runs: list[float] = []
        for _ in range(args.runs):
            sandbox = runner.prepare(RunSpec(options, timeout_s=10, output_bytes=1 << 16))
            start = time.perf_counter()
            outcome = runner.run(sandbox, Payload(CODE), on_gone=lambda _error: None)
            runs.append((time.perf_counter() - start) * 1000)
            assert outcome.stdout.decode() == EXPECTED, outcome
        runner.settle()
    finally:
        runner.close()
    print(f"runtime {args.runtime}")
    print(f"kernel cell print(2+2)      {percentiles(prints)}")
    print(f"kernel cell n += 1; n       {percentiles(reuse)}")
    print(f"pre-started run print(2+2)  {percentiles(runs)}")
    print(f"kernel open (start + ready) {percentiles(opens)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: request validation + policy decision + option assembly (and guard) on the default policy.

Public API only: ``load_policy``, ``parse_request``, ``evaluate``. The policy is compiled once, outside the
timed loop, as the gateway does. Each sample times one full intake of a typical request (parsed from a
mapping, as the HTTP/Python interfaces hand it over) and, separately, from raw JSON bytes.

    .venv/bin/python benchmarks/decision.py [--n 20000]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
from collections.abc import Callable

from gateway.decision import evaluate
from gateway.policy import load_policy
from gateway.request import parse_request
from gateway.resources import default_policy_path

REQUEST = {
    "code": "import math\nprint(math.sqrt(2))\n",
    "language": "python",
    "image": "gateway/sandbox-python:3.11-bookworm",
    "limits": {"memory": "256m", "cpus": 0.5, "pids": 64, "timeout_s": 10, "output_bytes": 65536},
    "network": "none",
    "runtime": "runc",
    "files": {"data/input.txt": "1 2 3\n"},
    "env": {"APP_MODE": "bench"},
    "principal": "bench-agent",
    "metadata": {"trace": "abc"},
}


def _measure(n: int, payload: object, clock: Callable[[], int]) -> list[float]:
    policy = load_policy(default_policy_path())
    for _ in range(500):  # warm caches (compiled regexes, validators)
        evaluate(policy, parse_request(payload))  # type: ignore[arg-type]
    samples: list[float] = []
    gc.collect()
    for _ in range(n):
        start = clock()
        decision = evaluate(policy, parse_request(payload))  # type: ignore[arg-type]
        samples.append((clock() - start) / 1000)
        assert decision.allowed
    return samples


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20000)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, n={args.n}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    # wall: what a caller waits (includes preemption by other processes); cpu: this thread's CPU time only.
    for clock_name, clock in (("wall", time.perf_counter_ns), ("cpu", time.thread_time_ns)):
        for label, payload in (("mapping", REQUEST), ("json-bytes", json.dumps(REQUEST).encode())):
            samples = _measure(args.n, payload, clock)
            print(
                f"{clock_name:>4} {label:>10}: p50 {_pct(samples, 0.50):7.1f} us   p99 {_pct(samples, 0.99):7.1f} us"
                f"   mean {statistics.fmean(samples):7.1f} us   max {max(samples):8.1f} us"
            )


if __name__ == "__main__":
    main()

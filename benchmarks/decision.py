"""Benchmark: request validation + policy decision + option assembly (and guard) on the default policy.

Public API only: ``load_policy``, ``compile_policy``, ``parse_request``, ``evaluate`` with the Docker assembler.
The policy is compiled once, outside the timed loop, as the Gateway's ``PolicySet`` does. Each sample times
one full intake of a typical request (parsed from a mapping, as the HTTP/Python interfaces hand it over)
and, separately, from raw JSON bytes.

``--compare DIR`` also measures the code in DIR (a checkout of the previous commit, old API) in a
subprocess, alternating with this code block by block, and prints the ratio new/old.

A whole ``Gateway.decide`` (with its two audit records on a real trail), and the same steps' CPU against a
baseline revision, are ``benchmarks/decision_cost.py``'s.

    .venv/bin/python benchmarks/decision.py [--n 20000] [--target-us 1000] [--compare DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gateway.decision import evaluate
from gateway.policy import compile_policy, load_policy
from gateway.request import parse_request
from gateway.resources import default_policy_path
from gateway.runner.docker.options import DockerAssembler

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
# wall: what a caller waits (includes preemption by other processes); cpu: this thread's CPU time only.
CLOCKS = {"wall": "perf_counter_ns", "cpu": "thread_time_ns"}

# The old API (previous commit), run as `python -I -c OLD_SCRIPT DIR CLOCK INPUT N REQUEST_JSON`: -I ignores
# PYTHONPATH and the working directory, so DIR (first on sys.path) is the only gateway it can import.
OLD_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
import gc, json, time
import gateway
from gateway.decision import evaluate
from gateway.policy import load_policy
from gateway.request import parse_request
from gateway.resources import default_policy_path
clock, n, request = getattr(time, sys.argv[2]), int(sys.argv[4]), json.loads(sys.argv[5])
payload = request if sys.argv[3] == "mapping" else json.dumps(request).encode()
policy = load_policy(default_policy_path())
for _ in range(500):
    evaluate(policy, parse_request(payload))
samples = []
gc.collect()
for _ in range(n):
    start = clock()
    decision = evaluate(policy, parse_request(payload))
    samples.append((clock() - start) / 1000)
    assert decision.allowed
print(json.dumps({"gateway": gateway.__file__, "policy": policy.sha256, "samples": samples}))
"""


def _payload(label: str) -> object:
    return REQUEST if label == "mapping" else json.dumps(REQUEST).encode()


def _measure(n: int, label: str, clock_name: str) -> list[float]:
    clock, payload = getattr(time, CLOCKS[clock_name]), _payload(label)
    policy, assembler = compile_policy(load_policy(default_policy_path())), DockerAssembler()
    for _ in range(500):  # warm caches (compiled regexes, validators)
        evaluate(policy, parse_request(payload), assembler=assembler)  # type: ignore[arg-type]
    samples: list[float] = []
    gc.collect()
    for _ in range(n):
        start = clock()
        decision = evaluate(policy, parse_request(payload), assembler=assembler)  # type: ignore[arg-type]
        samples.append((clock() - start) / 1000)
        assert decision.allowed
    return samples


def _measure_old(directory: Path, n: int, label: str, clock_name: str) -> tuple[str, list[float]]:
    argv = [sys.executable, "-I", "-c", OLD_SCRIPT, str(directory), CLOCKS[clock_name], label, str(n)]
    env = {**os.environ, "PYTHONPATH": str(directory)}
    out = subprocess.run([*argv, json.dumps(REQUEST)], env=env, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    if not Path(result["gateway"]).resolve().is_relative_to(directory):
        sys.exit(f"--compare: the old code imported {result['gateway']}, not a gateway under {directory}")
    if result["policy"] != load_policy(default_policy_path()).sha256:
        print(f"note: the old code's default policy differs (sha256 {result['policy'][:12]})")
    return result["gateway"], result["samples"]


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _line(clock_name: str, label: str, code: str, samples: list[float]) -> None:
    load = os.getloadavg()[0]
    print(
        f"{clock_name:>4} {label:>10} {code}: p50 {_pct(samples, 0.50):7.1f} us   p99 {_pct(samples, 0.99):7.1f} us"
        f"   mean {statistics.fmean(samples):7.1f} us   max {max(samples):8.1f} us   load {load:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20000, help="samples (default 20000)")
    parser.add_argument("--target-us", type=float, default=1000.0, help="p99 target in µs (default 1000)")
    parser.add_argument("--compare", type=Path, metavar="DIR", help="also measure the old code in DIR")
    args = parser.parse_args()
    old_dir = args.compare.resolve() if args.compare else None
    print(f"python {platform.python_version()} on {platform.machine()}, n={args.n}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    worst, shown = 0.0, False
    for clock_name in CLOCKS:
        for label in ("mapping", "json-bytes"):
            new = _measure(args.n, label, clock_name)
            _line(clock_name, label, "new", new)
            worst = max(worst, _pct(new, 0.99))
            if old_dir is not None:
                old_file, old = _measure_old(old_dir, args.n, label, clock_name)
                if not shown:
                    print(f"old code: {old_file}")
                    shown = True
                _line(clock_name, label, "old", old)
                p50, p99 = (_pct(new, q) / _pct(old, q) for q in (0.50, 0.99))
                print(f"{clock_name:>4} {label:>10} new/old: p50 {p50:.2f}   p99 {p99:.2f}")
    verdict = "met" if worst < args.target_us else "NOT met"
    print(
        f"target p99 < {args.target_us:.0f} us (new code, every clock and input): {verdict}, worst p99 {worst:.1f} us"
    )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

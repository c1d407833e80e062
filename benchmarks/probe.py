"""A fixed CPU workload, to tell how fast this VM runs right now: print the CPU it took.

The VM's speed drifts (its neighbours share the host's cores, and no steal time is reported), by up to 1.5
times within minutes. Run this before and after a benchmark to place its figures: the same code gives the
same probe time on a machine of steady speed. Usage: ``python benchmarks/probe.py [--rounds 300]``.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    rounds = parser.parse_args().rounds
    data = {f"k{i}": [i, "x" * 20, {"a": i}] for i in range(200)}
    started = time.thread_time()
    for _ in range(rounds):
        json.loads(json.dumps(data, sort_keys=True))
        sum(i * i for i in range(20000))
    print(json.dumps({"probe_cpu_ms": round((time.thread_time() - started) * 1000), "rounds": rounds}))


if __name__ == "__main__":
    main()

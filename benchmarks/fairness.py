"""Dry runs of several principals on one ``gateway serve``: hostile ones send expensive bodies, a victim cheap
ones.

``--hostile-principals`` principals (1 by default; ``--hostile-threads`` client threads in all, 8 by default,
dealt among them; rate quotas lifted) send ``POST /v1/decisions`` bodies that the request schema refuses (422)
only after checking each of their 19,990 ``env`` entries, just under the intake's bound on values (``MAX_VALUES``):
each costs a decision worker about 200-300 ms of CPU.
After 2 s, a victim principal sends ``print(1)`` dry runs one at a time for ``--seconds`` and the script
reports their latency (p50, p95, max) and how many dry runs the hostile side made. What it shows: whether
expensive dry runs of one principal, or of several together, hold back another's (the decision workers' shares
and dispatcher, ``gateway.service.shares`` and ``gateway.service.decisions``). Only loopback is contacted.

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/fairness.py [--hostile-principals 1] [--hostile-threads 8]
[--seconds 10] [--config FILE] [--hostile-body FILE] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import gateway_serve  # the benchmark's own server helper, next to this file

from gateway.resources import policies_dir
from gateway.service.principals import PrincipalsStore, Quotas

HEAVY = json.dumps({"code": "print(1)", "env": {f"V{i}": "v" * 100 for i in range(19_990)}}).encode()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hostile-principals", type=int, default=1)
    ap.add_argument("--hostile-threads", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json", action="store_true", help="print the result as JSON only")
    ap.add_argument("--config", type=Path, metavar="FILE", help="gateway serve --config FILE (decision_workers: 0)")
    ap.add_argument("--hostile-body", type=Path, metavar="FILE", help="the hostile side's body (default: 19,990 env)")
    args = ap.parse_args()
    heavy = HEAVY if args.hostile_body is None else args.hostile_body.read_bytes()
    with tempfile.TemporaryDirectory(prefix="gw-bench-fairness-") as tmp:
        work = Path(tmp)
        quotas = Quotas(max_concurrent=64, rpm=1_000_000, queue=1024)
        policy = str(policies_dir() / "default.yaml")
        store = PrincipalsStore(work / "principals.yaml")
        victim = store.add("victim", policy=policy, role="agent", quotas=quotas)
        others = [store.add(f"hostile{n}", policy=policy, quotas=quotas) for n in range(1, args.hostile_principals)]
        # gateway_serve adds the "bench" principal
        with gateway_serve(work, dict(os.environ), None, args.config) as (base, bench, _pid):
            hostile = [bench, *others]
            stop = threading.Event()
            hostile_done: list[int] = []
            errors: list[str] = []

            def flood(token: str) -> None:
                done = 0
                headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
                with httpx.Client(timeout=120) as client:
                    while not stop.is_set():
                        if client.post(f"{base}/v1/decisions", content=heavy, headers=headers).status_code == 422:
                            done += 1
                hostile_done.append(done)

            threads = [
                threading.Thread(target=flood, args=(hostile[n % len(hostile)],)) for n in range(args.hostile_threads)
            ]
            for thread in threads:
                thread.start()
            time.sleep(2.0)
            latencies: list[float] = []
            with httpx.Client(timeout=120) as client:
                stop_at = time.monotonic() + args.seconds
                while time.monotonic() < stop_at:
                    started = time.perf_counter()
                    answer = client.post(
                        f"{base}/v1/decisions", json={"code": "print(1)"}, headers={"Authorization": f"Bearer {victim}"}
                    )
                    latencies.append((time.perf_counter() - started) * 1000)
                    if answer.status_code != 200 or answer.json().get("allowed") is not True:
                        errors.append(f"{answer.status_code} {answer.text[:200]}")
            stop.set()
            for thread in threads:
                thread.join()
    latencies.sort()
    result: dict[str, Any] = {
        "hostile_principals": args.hostile_principals,
        "hostile_threads": args.hostile_threads,
        "victim": {
            "requests": len(latencies),
            "p50_ms": round(statistics.median(latencies), 1),
            "p95_ms": round(latencies[int(len(latencies) * 0.95)], 1),
            "max_ms": round(latencies[-1], 1),
            "errors": len(errors),
            "error_samples": errors[:3],
        },
        "hostile_dry_runs": sum(hostile_done),
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result, indent=2 if args.json else None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

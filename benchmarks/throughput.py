"""Sustained throughput at concurrency 8: the cold and the pooled gateway against the engine's own ceiling.

Why this exists: the issue asks for pooled throughput at concurrency 8 of at least three times the cold path's.
A pooled container is single-use, so every pooled request still costs the engine one container life cycle
(create, start, remove), only off the request's path. This measures whether the cold path leaves room for that:

- ``engine``: the engine's own rate for the same life cycle with no gateway at all (docker-py
  ``containers.run(IMAGE, ["python3", "-c", "print(2+2)"], remove=True, network_disabled=True)``): what no
  gateway, pooled or not, can exceed while each request gets a fresh container;
- ``cold_s4`` / ``cold_s8``: ``Gateway.execute`` cold with 4 host slots (the default here: two per core) and
  with 8 (do the slots bound the cold path?);
- ``pool2_s4`` / ``pool4_s8``: with a warm pool of 2 (4 slots) and of 4 (8 slots), ``min`` = size, misses
  run cold.

Cases alternate block by block (the order rotates); each block is ``--per-lane`` x 8 requests on 8 threads. Per
block: requests/s, and per request the CPU time of this process and of ``dockerd`` and ``containerd`` (their
``/proc`` counters: on a shared engine other sessions' work is in them too, so read them as an upper bound).
Every container is labelled with this run's instance (or ``io.agent-gateway.bench.run``) and removed.

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/throughput.py [--runtime runc|runsc] [--per-lane 2]
[--blocks 3] [--cases engine,cold_s4,...] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
from cases import CODE, EXPECTED, IMAGE, policy_for

from gateway import Gateway, PoolConfig

LANES = 8
GATEWAY_CASES = {"cold_s4": (4, 0), "cold_s8": (8, 0), "pool2_s4": (4, 2), "pool4_s8": (8, 4)}
"""name → (host slots, pool size)."""
RUN_LABEL = "io.agent-gateway.bench.run"


def engine_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) of the engine's daemons so far."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if name in ("dockerd", "containerd"):
            out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def gateway_call(gw: Gateway) -> Callable[[], str | None]:
    def call() -> str | None:
        data = gw.execute({"code": CODE}).to_dict()
        if data.get("stdout") != EXPECTED:
            raise SystemExit(f"gateway run failed: {json.dumps(data)[:400]}")
        return str(data.get("pool"))

    return call


def engine_call(client: Any, runtime: str, label: str) -> Callable[[], str | None]:
    def call() -> str | None:
        out = client.containers.run(
            IMAGE, ["python3", "-c", CODE], remove=True, network_disabled=True, runtime=runtime,
            labels={RUN_LABEL: label},
        )  # fmt: skip
        if out != EXPECTED.encode():
            raise SystemExit(f"engine run failed: {out!r}")
        return None

    return call


def block(call: Callable[[], str | None], total: int) -> tuple[float, dict[str, int]]:
    """``total`` calls over ``LANES`` threads: (seconds, pool statuses)."""
    lock = threading.Lock()
    left = [total]
    statuses: dict[str, int] = {}
    failures: list[BaseException] = []

    def lane() -> None:
        while True:
            with lock:
                if left[0] <= 0 or failures:
                    return
                left[0] -= 1
            try:
                status = call()
            except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
                with lock:
                    failures.append(exc)
                return
            if status is not None:
                with lock:
                    statuses[status] = statuses.get(status, 0) + 1

    threads = [threading.Thread(target=lane, daemon=True) for _ in range(LANES)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return time.perf_counter() - start, statuses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="runc", choices=["runc", "runsc"])
    parser.add_argument("--per-lane", type=int, default=2, help="requests per lane in each block")
    parser.add_argument("--blocks", type=int, default=3, help="blocks per case")
    parser.add_argument("--cases", default=",".join(["engine", *GATEWAY_CASES]))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    run_id = f"bench-throughput-{os.getpid()}"
    os.environ["GATEWAY_INSTANCE"] = run_id
    client = docker.from_env(max_pool_size=32)
    calls: dict[str, Callable[[], str | None]] = {}
    gateways: dict[str, Gateway] = {}
    report: dict[str, Any] = {"runtime": args.runtime, "requests_per_block": args.per_lane * LANES, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="gateway-bench-throughput-") as tmp:
        try:
            if "engine" in wanted:
                calls["engine"] = engine_call(client, args.runtime, run_id)
            for name, (slots, pool) in GATEWAY_CASES.items():
                if name not in wanted:
                    continue
                os.environ["GATEWAY_RUNTIME_DIR"] = str(Path(tmp) / name)  # slots of its own
                os.environ["GATEWAY_SLOTS"] = str(slots)
                config = PoolConfig(size=pool, min=pool, burst="cold") if pool else None
                gateways[name] = Gateway.from_env(policy_for(args.runtime), Path(tmp) / "audit", pool=config)
                calls[name] = gateway_call(gateways[name])
            for gw in gateways.values():
                if gw.pool is not None:
                    gw.pool.wait_ready(timeout_s=120)
            for call in calls.values():
                call()  # warm-up
            rows: dict[str, list[dict[str, Any]]] = {name: [] for name in calls}
            names = list(calls)
            for i in range(args.blocks):
                for name in names[i % len(names) :] + names[: i % len(names)]:
                    pool = gateways[name].pool if name in gateways else None
                    if pool is not None:
                        pool.wait_ready(timeout_s=120)  # every block starts from a full pool
                    total = args.per_lane * LANES
                    cpu0, own0 = engine_cpu_s(), resource.getrusage(resource.RUSAGE_SELF)
                    seconds, statuses = block(calls[name], total)
                    cpu1, own1 = engine_cpu_s(), resource.getrusage(resource.RUSAGE_SELF)
                    own = own1.ru_utime + own1.ru_stime - own0.ru_utime - own0.ru_stime
                    rows[name].append({
                        "rps": round(total / seconds, 2),
                        "self_cpu_ms_per_request": round(own * 1000 / total, 1),
                        **{f"{d}_cpu_ms_per_request": round((cpu1[d] - cpu0.get(d, 0.0)) * 1000 / total, 1)
                           for d in cpu1},
                        **({"pool": statuses} if pool is not None else {}),
                    })  # fmt: skip
        finally:
            for gw in gateways.values():
                gw.close()
            for c in client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}):
                c.remove(force=True)
    for name, blocks in rows.items():
        report["cases"][name] = {"rps_median": round(statistics.median(b["rps"] for b in blocks), 2), "blocks": blocks}
    engine = report["cases"].get("engine", {}).get("rps_median")
    cold = report["cases"].get("cold_s4", {}).get("rps_median")
    report["ratios"] = {
        f"{name}/{base}": round(row["rps_median"] / ref, 2)
        for name, row in report["cases"].items()
        for base, ref in (("engine", engine), ("cold_s4", cold))
        if ref and name != base
    }
    report["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for name, row in report["cases"].items():
            print(f"{name:<9} rps {row['rps_median']:>6}  blocks {[b['rps'] for b in row['blocks']]}")
            print(f"{'':<9} {row['blocks'][-1]}")
        print(json.dumps(report["ratios"]), "load", report["load_avg_after"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

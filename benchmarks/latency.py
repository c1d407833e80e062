"""End-to-end latency of ``print(2+2)``: the gateway vs. a plain ``docker run`` vs. the lesson's helper.

Three ways to run the same program in the same image, measured in the same run and interleaved (round-robin,
so that drift in the machine's load hits all three alike):

- ``gateway``: ``Gateway.execute`` with the default policy: request validation, policy decision, option
  assembly and guard, the audit record of the decision (fsync), a hardened single-use container driven by
  ``DockerRunner``, the audit record of the outcome (``policies/strict.yaml`` for ``--runtime runsc``).
- ``gateway-pool`` (``--pool``): the same with a warm pool (``Gateway.from_env(..., pool=PoolConfig(size=2))``):
  the run claims a container created and started ahead (its interpreter already running); the benchmark
  waits, untimed, until the pool has refilled before each round, so every timed run is a hit.
- ``docker-cli``: ``docker run --rm --network none IMAGE python3 -c 'print(2+2)'`` through the CLI.
- ``lesson``: the lesson's docker-py helper, ``client.containers.run(image, f'python3 -c "{code}"',
  remove=True, network_disabled=True, mem_limit="256m")``.

``--concurrency N`` then measures throughput: N threads each running ``--n`` requests back to back through one
cold gateway, then through one gateway with a pool of N (requests/s over the whole batch; the pool case
without waiting for refills, so misses count too).

Usage: ``.venv/bin/python benchmarks/latency.py [--n 30] [--warmup 3] [--runtime runc|runsc] [--pool]
[--concurrency N] [--json]``
Only the local engine is contacted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import docker
from cases import CODE, IMAGE, cpus, docker_cli, lesson_helper, percentile

from gateway import Gateway, PoolConfig
from gateway.resources import policies_dir

DEFER = [False]
"""``--defer-removal``: cold runs return before their container's removal is confirmed."""


def gateway_case(
    runtime: str, audit_dir: Path, *, pool: int = 0
) -> tuple[Callable[[], None], Callable[[], None], Gateway]:
    """The full gateway path; runsc requests go through ``policies/strict.yaml`` (the default allows runc only)."""
    policy = policies_dir() / ("strict.yaml" if runtime == "runsc" else "default.yaml")
    gw = Gateway.from_env(policy, audit_dir, pool=PoolConfig(size=pool) if pool else None, defer_removal=DEFER[0])
    if gw.pool is not None:
        gw.pool.wait_ready(timeout_s=120)
    request = {"code": CODE}

    def via_gateway() -> None:
        data = gw.execute(request).to_dict()
        if data.get("stdout") != "4\n":
            raise SystemExit(f"gateway run failed: {json.dumps(data)[:400]}")

    return via_gateway, gw.close, gw


def _refilled(gw: Gateway) -> None:
    if gw.pool is not None:
        gw.pool.wait_ready(timeout_s=60)
        time.sleep(0.05)


def _throughput(run_one: Callable[[], None], concurrency: int, n: int) -> dict[str, float]:
    """Requests per second of ``concurrency`` threads each running ``n`` requests back to back (a failed
    request, e.g. every host slot busy past its wait, counts as an error, not as throughput)."""
    errors: list[str] = []

    def worker() -> None:
        for _ in range(n):
            try:
                run_one()
            except BaseException as exc:  # noqa: BLE001 - counted and reported after the batch
                errors.append(str(exc)[:200])

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    ok = concurrency * n - len(errors)
    if errors:
        print(f"{len(errors)} failed request(s), first: {errors[0]}", file=sys.stderr)
    return {"rps": round(ok / elapsed, 2), "errors": len(errors), "seconds": round(elapsed, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30, help="measured rounds (each runs all three)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--runtime", default="runc", choices=["runc", "runsc"])
    parser.add_argument("--pool", action="store_true", help="add the gateway-pool case")
    parser.add_argument("--defer-removal", action="store_true", help="Gateway(defer_removal=True) for cold runs")
    parser.add_argument("--concurrency", type=int, default=0, help="also measure throughput at this concurrency")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    DEFER[0] = args.defer_removal

    client = docker.from_env()
    client.images.get(IMAGE)  # fails clearly when the image is missing: run scripts/build-image.sh
    os.environ.setdefault("GATEWAY_INSTANCE", f"bench-latency-{os.getpid()}")
    throughput: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="gateway-bench-audit-") as audit:
        name = "gateway"
        gateway_run, close, _ = gateway_case(args.runtime, Path(audit) / "cold")
        closers = [close]
        cases: dict[str, Callable[[], None]] = {
            name: gateway_run,
            "docker-cli": docker_cli(args.runtime),
            "lesson": lesson_helper(client, args.runtime),
        }
        settle: dict[str, Callable[[], None]] = {}
        if args.pool:
            pooled_run, pooled_close, pooled_gw = gateway_case(args.runtime, Path(audit) / "pool", pool=2)
            closers.append(pooled_close)
            cases["gateway-pool"] = pooled_run
            settle["gateway-pool"] = lambda: _refilled(pooled_gw)
        times: dict[str, list[float]] = {k: [] for k in cases}
        try:
            for i in range(args.warmup + args.n):
                order = list(cases.items())
                order = order[i % len(order) :] + order[: i % len(order)]  # rotate who goes first
                for key, fn in order:
                    if key in settle:
                        settle[key]()
                    start = time.perf_counter()
                    fn()
                    elapsed = (time.perf_counter() - start) * 1000
                    if i >= args.warmup:
                        times[key].append(elapsed)
        finally:
            for close in closers:
                close()
        if args.concurrency:
            for label, size in (("gateway", 0), ("gateway-pool", args.concurrency)):
                run_one, close, _ = gateway_case(args.runtime, Path(audit) / f"tp-{label}", pool=size)
                try:
                    throughput[label] = _throughput(run_one, args.concurrency, args.n)
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
        **({"gateway-pool/gateway p50": round(summary["gateway-pool"]["p50_ms"] / base, 3)} if args.pool else {}),
        f"{name}/lesson p50": round(base / summary["lesson"]["p50_ms"], 2),
        f"{name}/docker-cli p95": round(summary[name]["p95_ms"] / summary["docker-cli"]["p95_ms"], 2),
    }
    info = {"runtime": args.runtime, "machine": platform.platform(), "cpus": cpus()}
    if throughput:
        info["concurrency"] = args.concurrency
        ratios[f"throughput pool/cold at concurrency {args.concurrency}"] = round(
            throughput["gateway-pool"]["rps"] / max(throughput["gateway"]["rps"], 0.01), 2
        )
    if args.json:
        print(json.dumps({"info": info, "summary": summary, "ratios": ratios, "throughput_rps": throughput}, indent=2))
    else:
        print(f"runtime={args.runtime}  n={args.n}  {info['machine']}  cpus={info['cpus']}")
        print(f"{'case':<12} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}")
        for key, row in summary.items():
            print(f"{key:<12} {row['p50_ms']:>8} {row['p95_ms']:>8} {row['mean_ms']:>8}")
        for key, tp in throughput.items():
            print(f"throughput {key} at concurrency {args.concurrency}: {tp['rps']} requests/s ({tp['errors']} errors)")
        for key, value in ratios.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

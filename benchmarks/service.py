"""``gateway serve`` under concurrent load: the service vs. the in-process ``Gateway``, and decisions/s.

One run, same machine, same engine, same image, same policy (``policies/default.yaml``), same host slots:

- ``service``: a real ``gateway serve`` subprocess on a free loopback port with a real principal (a
  principals file made with ``PrincipalsStore.add``); ``--concurrency`` client threads, each with its own
  ``httpx.Client``, ``POST /v1/executions {"code": "print(2+2)"}`` with the principal's bearer token.
- ``in-process``: the same workload, same number of threads, through one ``Gateway.from_env`` in this process.
- ``decisions``: ``POST /v1/decisions`` on ``--decision-concurrency`` keep-alive connections for
  ``--decision-seconds`` (after 2 s of warm-up), from a raw asyncio HTTP/1.1 client in this process (an HTTP
  library would spend more CPU per request than the server does, on the same cores); the server's CPU per
  decision counts its decision workers (its child processes). Baseline in the same run, just before and just
  after: the CPU of one ``Gateway.decide`` of the same dry run in this process (``inprocess_decide_cpu_ms``),
  and the ratio of the two (``server_cpu_over_inprocess``), which follows the code and not the VM's speed.

The execution phases alternate in blocks (service, in-process, service, ...; ``--blocks`` of each), so drift in
the machine's load hits both alike. Every response is checked (200 and stdout ``4\\n`` for an execution, 200
and ``allowed`` for a decision); anything else counts as an error. At the end the script counts the containers
still carrying this run's instance label (``GATEWAY_INSTANCE``, set for the server and this process): it must
be zero.

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/service.py [--n 48] [--concurrency 8] [--blocks 2]
[--decision-seconds 10] [--decision-concurrency 16] [--profile FILE] [--config FILE] [--json]``

``--profile FILE`` runs the server with a cProfile profiler in every thread (the event loop's and the workers'
that decide and execute) for the whole run and writes the merged statistics to FILE; inspect them with
``python -m pstats FILE`` (the decision workers are other processes: not in it). Execution concurrency is
bounded by the host-wide execution slots (``GATEWAY_SLOTS``, default two per core): at concurrency 8 on 2
cores, 4 sandboxes run at a time and the others wait for a slot, in both the service and the in-process case.
Only loopback and the local engine are contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import docker
import httpx
import uvicorn
import yaml

from gateway import Gateway
from gateway.resources import policies_dir
from gateway.service.app import build_app
from gateway.service.principals import PrincipalsStore, Quotas
from gateway.service.service import Service
from gateway.slots import HostSlots

CODE = "print(2+2)"
INSTANCE_LABEL = "io.agent-gateway.instance"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def gateway_serve(
    work: Path, env: dict[str, str], profile: str | None, config: Path | None = None, policy: Path | None = None
) -> Iterator[tuple[str, str, int]]:
    """A ``gateway serve`` subprocess (with ``--config config`` when given) serving one principal under ``policy``
    (default: ``policies/default.yaml``); yields its base URL, the principal's token and its pid, stops it with
    SIGTERM."""
    principals = work / "principals.yaml"
    # Quotas well above the workload: the benchmark measures the service, not its rate limits.
    quotas = Quotas(max_concurrent=64, rpm=1_000_000, queue=1024)
    token = PrincipalsStore(principals).add(
        "bench", policy=str(policy or policies_dir() / "default.yaml"), role="agent", quotas=quotas
    )
    port = free_port()
    here = str(Path(__file__).resolve())
    prefix = [sys.executable, here, "--serve-profiled", profile, "--"] if profile else [sys.executable, "-m", "gateway"]
    audit = work / "audit-service"
    argv = [*prefix, "serve", "--principals", str(principals), "--audit-dir", str(audit), "--port", str(port)]
    argv += ["--config", str(config)] if config is not None else []
    log = (work / "serve.log").open("wb")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                tail = (work / "serve.log").read_text()[-2000:]
                raise SystemExit(f"gateway serve exited with {proc.returncode}: {tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("gateway serve did not become ready")
            time.sleep(0.1)
        yield base, token, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextlib.contextmanager
def gateway_serve_with(
    work: Path, settings: Mapping[str, object], policy: Path | None = None
) -> Iterator[tuple[str, str, int]]:
    """:func:`gateway_serve` with a server configuration file holding ``settings`` (none: no file)."""
    config = None
    if settings:
        config = work / "server.yaml"
        document = {"apiVersion": "gateway.agent-exec/v1", "kind": "ServerConfig", **settings}
        config.write_text(yaml.safe_dump(document, sort_keys=False))
    with gateway_serve(work, dict(os.environ), None, config, policy) as served:
        yield served


@contextlib.contextmanager
def serve_in_thread(service: Service, *, stop_s: float = 60) -> Iterator[int]:
    """``service``'s application on uvicorn in a thread of this process, on a free loopback port (yielded);
    stopped at the end (waiting at most ``stop_s`` for its requests)."""
    server = uvicorn.Server(uvicorn.Config(build_app(service), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=stop_s)


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid`` (``VmRSS``), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmRSS for process {pid}")


Client = tuple[Callable[[], bool], Callable[[], None]]
"""A call (True: the response was right) and its close."""


def run_threads(concurrency: int, n: int, make: Callable[[], Client]) -> dict[str, Any]:
    """``n`` calls spread over ``concurrency`` threads (each with its own client from ``make``); latencies,
    errors and the wall time from the first start to the last end."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    per_thread = [n // concurrency + (1 if i < n % concurrency else 0) for i in range(concurrency)]
    barrier = threading.Barrier(concurrency + 1)

    def worker(count: int) -> None:
        call, close = make()
        try:
            barrier.wait()
            for _ in range(count):
                t0 = time.perf_counter()
                try:
                    ok = call()
                    err = None if ok else "bad response"
                except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the run
                    err = f"{type(exc).__name__}: {exc}"
                dt = time.perf_counter() - t0
                with lock:
                    latencies.append(dt)
                    if err:
                        errors.append(err)
        finally:
            close()

    threads = [threading.Thread(target=worker, args=(c,)) for c in per_thread]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    return _joined(threads, t0, cpu0, latencies, errors)


def _joined(
    threads: list[threading.Thread], t0: float, cpu0: float, latencies: list[float], errors: list[str]
) -> dict[str, Any]:
    """Wait for the client threads; the block's wall time and client CPU since ``t0`` / ``cpu0``."""
    for t in threads:
        t.join()
    return {
        "wall_s": time.perf_counter() - t0,
        "client_cpu_s": time.process_time() - cpu0,
        "latencies": latencies,
        "errors": errors,
    }


def summary(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    lat = sorted(x for b in blocks for x in b["latencies"])
    wall = sum(b["wall_s"] for b in blocks)
    q = statistics.quantiles(lat, n=100, method="inclusive")
    errors = [e for b in blocks for e in b["errors"]]
    return {
        "requests": len(lat),
        "wall_s": round(wall, 2),
        "throughput_rps": round(len(lat) / wall, 2),
        "p50_ms": round(q[49] * 1000, 1),
        "p95_ms": round(q[94] * 1000, 1),
        "p99_ms": round(q[98] * 1000, 1),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "client_cpu_s": round(sum(b["client_cpu_s"] for b in blocks), 2),
        "block_rps": [round(len(b["latencies"]) / b["wall_s"], 2) for b in blocks],
    }


def service_executions(base: str, token: str) -> tuple[Callable[[], bool], Callable[[], None]]:
    client = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120)

    def call() -> bool:
        r = client.post("/v1/executions", json={"code": CODE})
        return r.status_code == 200 and r.json().get("stdout") == "4\n"

    return call, client.close


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds used so far by process ``pid`` (all its threads) and its children (the decision
    workers), from ``/proc/PID/stat``; None where there is no /proc."""

    def stat(path: Path) -> list[str] | None:
        try:
            return path.read_text().rpartition(")")[2].split()
        except OSError:
            return None

    own = stat(Path(f"/proc/{pid}/stat"))
    if own is None:
        return None
    ticks = int(own[11]) + int(own[12])  # utime, stime (fields 14, 15)
    for path in Path("/proc").glob("[0-9]*/stat"):
        fields = stat(path)
        if fields is not None and int(fields[1]) == pid:  # ppid (field 4)
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def server_cpu_ms(pid: int, start: float | None, requests: int) -> float | None:
    """The server's CPU milliseconds per request since ``start`` (its CPU seconds then), its workers included."""
    end = process_cpu_s(pid)
    if start is None or end is None or not requests:
        return None
    return round((end - start) * 1000 / requests, 3)


try:  # the client's own CPU is taken from the server's two cores: parse the answers the cheapest way there is
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson comes with the report extra
    _loads = json.loads


async def _decisions_connection(
    port: int, request: bytes, stop_at: float, latencies: list[float], errors: list[str]
) -> None:
    """One keep-alive HTTP/1.1 connection posting ``request`` until ``stop_at``; each answer must be 200 with
    ``"allowed": true``. A raw client: an HTTP library in Python would spend more CPU per request than the
    server, on the same two cores."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head[9:12]
            lines = head.lower().split(b"\r\n")
            length = next(int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length:"))
            body = await reader.readexactly(length)
            latencies.append(time.perf_counter() - t0)
            if status != b"200" or _loads(body).get("allowed") is not True:
                errors.append(f"HTTP {status.decode()}: {body[:200]!r}")
    except (OSError, asyncio.IncompleteReadError, StopIteration, ValueError) as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        writer.close()


def _client_loop() -> Callable[[Any], Any]:
    """``asyncio.run``, on uvloop when installed (the service extra): less client CPU per request."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:  # pragma: no cover
        return asyncio.run
    return uvloop.run


def timed_decisions(base: str, token: str, concurrency: int, seconds: float, pid: int) -> dict[str, Any]:
    """Decisions for ``seconds`` on ``concurrency`` keep-alive connections (one asyncio loop in this process),
    after a 2 s warm-up; with the server's CPU per decision (process ``pid`` and its decision workers)."""
    port = int(base.rsplit(":", 1)[1])
    body = json.dumps({"code": CODE}).encode()
    request = (
        f"POST /v1/decisions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    latencies: list[float] = []
    errors: list[str] = []

    async def run(duration: float, lat: list[float], err: list[str]) -> None:
        stop_at = time.perf_counter() + duration
        await asyncio.gather(*(_decisions_connection(port, request, stop_at, lat, err) for _ in range(concurrency)))

    loop = _client_loop()
    loop(run(2.0, [], []))  # warm-up: every decision worker has started and decided
    server0 = process_cpu_s(pid)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    loop(run(seconds, latencies, errors))
    wall = time.perf_counter() - t0
    return {
        "latencies": latencies,
        "errors": errors,
        "wall_s": wall,
        "client_cpu_s": time.process_time() - cpu0,
        "server_cpu_ms_per_request": server_cpu_ms(pid, server0, len(latencies)),
    }


def inprocess_decide_cpu_ms(gw: Gateway, seconds: float = 2.0) -> float:
    """CPU ms of one ``Gateway.decide`` of the benchmark's dry run in this process (one thread, a trail with an
    fsync per dry run): the same run's baseline for the service's CPU per decision, since this VM's speed drifts
    by up to 1.6 times within minutes (its neighbours) and a fixed CPU probe does not follow that drift."""
    body = {"code": CODE}
    for _ in range(50):  # warm-up
        gw.decide(body)
    count, started, stop_at = 0, time.thread_time(), time.perf_counter() + seconds
    while time.perf_counter() < stop_at:
        gw.decide(body)
        count += 1
    return (time.thread_time() - started) / count * 1000


def serve_profiled(out: str, argv: list[str]) -> int:
    """``gateway serve`` with a cProfile profiler in every thread (the event loop's and each worker's, where
    the decisions and executions run); the merged statistics are written to ``out`` when it stops."""
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    from gateway.cli import main as gateway_main  # noqa: PLC0415

    profilers: list[cProfile.Profile] = []

    def start_in_thread(*_: Any) -> None:
        sys.setprofile(None)
        prof = cProfile.Profile()
        profilers.append(prof)
        prof.enable()

    def stopped(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # uvicorn re-raises SIGTERM after its graceful shutdown: write the stats

    signal.signal(signal.SIGTERM, stopped)
    threading.setprofile(start_in_thread)
    first = cProfile.Profile()
    profilers.append(first)
    first.enable()
    try:
        return gateway_main(argv)
    finally:
        first.disable()
        stats = pstats.Stats(first)
        for prof in profilers[1:]:
            stats.add(prof)
        stats.dump_stats(out)


def main() -> int:
    if len(sys.argv) > 3 and sys.argv[1] == "--serve-profiled" and sys.argv[3] == "--":
        return serve_profiled(sys.argv[2], sys.argv[4:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=48, help="executions per block and case (default 48)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=2, help="blocks of each case, alternating (default 2)")
    ap.add_argument("--warmup", type=int, default=4, help="untimed executions per case first (default 4)")
    ap.add_argument("--decision-seconds", type=float, default=10.0)
    ap.add_argument("--decision-concurrency", type=int, default=16)
    ap.add_argument("--profile", metavar="FILE", help="run the server under cProfile, writing FILE")
    ap.add_argument("--config", type=Path, metavar="FILE", help="gateway serve --config FILE (decision_workers: 0)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON only")
    args = ap.parse_args()

    instance = f"bench-{uuid.uuid4().hex[:12]}"
    os.environ["GATEWAY_INSTANCE"] = instance
    env = dict(os.environ)
    slots = HostSlots.from_env()
    load_before = os.getloadavg()
    engine = docker.from_env()

    with tempfile.TemporaryDirectory(prefix="gw-bench-service-") as tmp:
        work = Path(tmp)
        gw = Gateway.from_env(policies_dir() / "default.yaml", work / "audit-inprocess")

        def inprocess() -> tuple[Callable[[], bool], Callable[[], None]]:
            def call() -> bool:
                return gw.execute({"code": CODE}).to_dict().get("stdout") == "4\n"

            return call, lambda: None

        try:
            with gateway_serve(work, env, args.profile, args.config) as (base, token, pid):
                svc = lambda: service_executions(base, token)  # noqa: E731
                run_threads(min(args.warmup, args.concurrency), args.warmup, svc)
                run_threads(min(args.warmup, args.concurrency), args.warmup, inprocess)
                blocks: dict[str, list[dict[str, Any]]] = {"service": [], "in-process": []}
                loads: list[float] = []
                for _ in range(args.blocks):
                    for name, make in (("service", svc), ("in-process", inprocess)):
                        blocks[name].append(run_threads(args.concurrency, args.n, make))
                        loads.append(os.getloadavg()[0])
                baseline = [inprocess_decide_cpu_ms(gw)]
                decisions = timed_decisions(base, token, args.decision_concurrency, args.decision_seconds, pid)
                baseline.append(inprocess_decide_cpu_ms(gw))
                loads.append(os.getloadavg()[0])
        finally:
            gw.close()
        left = engine.containers.list(all=True, filters={"label": f"{INSTANCE_LABEL}={instance}"})

    result: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "nproc": os.cpu_count(),
            "load_before": [round(x, 2) for x in load_before],
            "load_during_1m": [round(x, 2) for x in loads],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "slots": slots.count,
        },
        "concurrency": args.concurrency,
        "service": summary(blocks["service"]),
        "in-process": summary(blocks["in-process"]),
        "decisions": {
            **summary([decisions]),
            "concurrency": args.decision_concurrency,
            "server_cpu_ms_per_request": decisions["server_cpu_ms_per_request"],
            "inprocess_decide_cpu_ms": [round(x, 3) for x in baseline],
        },
        "leftover_containers": len(left),
    }
    svc_r, inp_r = result["service"], result["in-process"]
    result["overhead"] = {
        "throughput": round(inp_r["throughput_rps"] / svc_r["throughput_rps"] - 1, 4),
        "p50": round(svc_r["p50_ms"] / inp_r["p50_ms"] - 1, 4),
        "p95": round(svc_r["p95_ms"] / inp_r["p95_ms"] - 1, 4),
    }
    server_cpu = result["decisions"]["server_cpu_ms_per_request"]
    if server_cpu is not None:  # the service's CPU per dry run in units of the same run's in-process decide
        result["decisions"]["server_cpu_over_inprocess"] = round(server_cpu / statistics.mean(baseline), 3)
    errors = svc_r["errors"] + inp_r["errors"] + result["decisions"]["errors"]
    result["targets"] = {
        "overhead_under_10pct": result["overhead"]["throughput"] < 0.10,
        "decisions_1000_rps": result["decisions"]["throughput_rps"] >= 1000,
        "zero_errors": errors == 0,
        "zero_leftover_containers": not left,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(json.dumps(result["machine"]))
    for name in ("service", "in-process", "decisions"):
        print(f"{name:>11}: {json.dumps(result[name])}")
    print(f"   overhead: {json.dumps(result['overhead'])}  (service vs in-process, >0 = service slower)")
    print(f"   leftover containers: {len(left)}")
    print(f"    targets: {json.dumps(result['targets'])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

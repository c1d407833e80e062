"""``print(2+2)`` side by side: the gateway (cold and warm-pooled) against a hardened ``docker run`` and peers.

Every case runs the same program in the same local image (``gateway/sandbox-python:3.11-bookworm``, never
pulled), in one process run, interleaved round by round (the order rotates, so drift in the machine's load
hits every case alike):

- ``docker_cli``: the ``docker run`` CLI with the gateway's own hardening as flags (``benchmarks/cases.py``);
- ``lesson_helper``: the lesson's docker-py helper;
- ``llm_sandbox``: llm-sandbox (PyPI), one ``SandboxSession`` per call, as its README shows;
- ``llm_sandbox_reused``: one llm-sandbox session reused for every call (its fastest mode: a container that
  serves many requests, so one request's files and processes are there for the next);
- ``epicbox``: epicbox (PyPI), ``epicbox.run`` per call;
- ``gateway_cold``: ``Gateway.execute`` without a pool (a hardened single-use container per request);
- ``gateway_pool``: ``Gateway.execute`` with a warm pool of single-use containers (``--pool-size``);

each under runc and, whenever the engine has ``runsc`` registered, under runsc (``_runsc`` suffix). The peers
are installed by this script into their own virtualenvs (``--peers-dir``, default
``~/.cache/agent-gateway/peers/<name>``; idempotent) and each is driven by a small worker process in its venv
(``benchmarks/peer_worker.py``, one request per line over a pipe; the time is taken on this side). What each
peer needed to run here is in the worker's docstrings and ``benchmarks/log/2026-12-01-peers.md``.

Measured: latency (p50/p95 of ``--n`` interleaved rounds), throughput at concurrency 1, 4 and 8 (requests/s
over ``--throughput-requests`` x concurrency requests; the peers get one worker per lane), and a burst of
``--burst-factor`` x pool size requests at once against the pooled (and the cold) gateway, to show what
happens when the pool drains. A case that fails is reported with its error, never with numbers.

``--quick --json`` (a few runs of each case, under two minutes once the peers are installed) prints one JSON
object: ``cases`` (name → ``p50_ms``, ``p95_ms``, ... or ``error``), ``ratios``, ``targets``, ``throughput``
(name → {"1": rps, "4": rps, "8": rps}), ``throughput_pool`` (the gateway's hit/miss/cold counts per level),
``burst``, ``peers`` (versions and settings), ``leaked_containers``
(containers this run left behind, found by its labels: must be 0) and ``info``. The gateway's audit trail goes
to ``GATEWAY_AUDIT_DIR`` when set (else a temporary directory). Progress goes to stderr when it is a terminal.
Every container the run started is removed at the end, also on Ctrl-C.

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/peers.py [--quick] [--json] [--cases a,b] [--runtimes runc]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cases import (
    CODE,
    EXPECTED,
    IMAGE,
    Progress,
    cli_flags,
    cpus,
    docker_cli,
    gateway_failure,
    gateway_profile_options,
    lesson_helper,
    percentile,
    policy_for,
)

from gateway import Gateway
from gateway.runner.docker.options import INSTANCE_LABEL
from gateway.slots import default_slot_count

RUN_LABEL = "io.agent-gateway.bench.run"
"""Put on every container this benchmark starts outside the gateway (whose containers carry its instance)."""
BASE_CASES = (
    "docker_cli",
    "lesson_helper",
    "llm_sandbox",
    "llm_sandbox_reused",
    "epicbox",
    "gateway_cold",
    "gateway_pool",
)
PEER_CASES = ("llm_sandbox", "llm_sandbox_reused", "epicbox")
CONCURRENCY = (1, 4, 8)
WORKER = Path(__file__).with_name("peer_worker.py")
PEER_VENVS: dict[str, tuple[str, ...]] = {
    # Exact pins: the numbers are for these versions. urllib3<2: epicbox 1.1.0 builds its retry policy with
    # ``Retry(method_whitelist=...)``, removed in urllib3 2 (TypeError on its first call otherwise).
    "llm_sandbox": ("llm-sandbox[docker]==0.3.46",),
    "epicbox": ("epicbox==1.1.0", "urllib3<2"),
}
VENV_OF = {"llm_sandbox": "llm_sandbox", "llm_sandbox_reused": "llm_sandbox", "epicbox": "epicbox"}
PEER_SETTINGS = {
    "llm_sandbox": "SandboxSession(backend='docker', lang='python', image=IMAGE, skip_environment_setup=True, "
    "workdir='/var/tmp', runtime_configs={network_disabled: True, network_mode: 'none', "
    "runtime: RUNTIME, labels: {run label}, init: True, command: ['sleep', 'infinity']}); a Python handler "
    "registered with command 'python3 {file}'; user root (its default); one session per call",
    "llm_sandbox_reused": "the same settings; one session opened before the first call and reused by every call",
    "epicbox": "epicbox.configure(profiles=[Profile('python', IMAGE, user='65534:65534', read_only=True, "
    "network_disabled=True)]); epicbox.run('python', \"python3 -c 'print(2+2)'\", limits={cputime: 10, "
    "realtime: 20, memory: 256, processes: 64}); a wrapper on docker-py's ContainerCollection.create adds "
    "runtime=RUNTIME and the run label (epicbox has neither setting)",
}

Runner = Callable[[], "str | None"]
"""One call of a case: raises (or ``SystemExit``) on a wrong result; returns the gateway's pool status or None."""


class CaseError(Exception):
    """A case could not be set up or one of its calls failed: reported in the JSON instead of numbers."""


# --- cases ----------------------------------------------------------------------------------------------


class Case:
    """A way to run ``print(2+2)``: ``lanes(k)`` gives ``k`` callables that may run at the same time."""

    def __init__(self, name: str, run: Runner, close: Callable[[], None] = lambda: None) -> None:
        self.name = name
        self._run = run
        self._close = close

    def lanes(self, k: int) -> list[Runner]:
        """In-process cases are thread-safe: every lane calls the same function."""
        return [self._run] * k

    def shrink(self) -> None:
        """Give back what ``lanes(k)`` made beyond the first lane (peer workers)."""

    def close(self) -> None:
        self._close()


class Worker:
    """One peer worker process (``script``, by default ``peer_worker.py``, in the peer's venv), one request at a
    time over a pipe."""

    def __init__(
        self, python: Path, peer: str, runtime: str, label: str, log_dir: Path, *, script: Path = WORKER
    ) -> None:
        self.log = log_dir / f"{peer}-{runtime}-{uuid.uuid4().hex[:8]}.log"
        argv = [str(python), str(script), "--peer", peer, "--image", IMAGE, "--runtime", runtime, "--label", label]
        with self.log.open("wb") as log:
            # A new session: a Ctrl-C in the terminal reaches this process only, which then closes the workers
            # in order (each closes its own session) before sweeping the containers by label.
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True
            )
        hello = self._read()
        if not hello.get("ready"):
            self.close()
            raise CaseError(f"{peer} worker did not start: {hello.get('error') or self._tail()}")
        self.versions: dict[str, str] = hello.get("versions", {})

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            return {"ok": False, "ready": False, "error": f"worker exited: {self._tail()}"}
        try:
            data = json.loads(line)
        except ValueError:
            return {"ok": False, "ready": False, "error": f"worker wrote {line[:200]!r}"}
        return data if isinstance(data, dict) else {"ok": False, "error": f"worker wrote {line[:200]!r}"}

    def _tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-600:].strip() or "(no output)"
        except OSError:
            return "(no log)"

    def call(self, command: str = "run") -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise CaseError(f"worker gone: {exc}: {self._tail()}") from exc
        reply = self._read()
        if not reply.get("ok"):
            raise CaseError(f"{command}: {reply.get('error')}")

    def close(self, timeout_s: float = 30.0) -> None:
        """Ask the worker to close its peer session and exit; kill it if it does not in ``timeout_s``."""
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class WorkerCase(Case):
    """A peer: one worker process per lane, started on demand (outside any timing)."""

    def __init__(self, name: str, python: Path, peer: str, *, runtime: str, label: str, log_dir: Path) -> None:
        self._spawn = lambda: Worker(python, peer, runtime, label, log_dir)
        self.workers = [self._spawn()]
        self.versions = self.workers[0].versions
        super().__init__(name, self._first)

    def _first(self) -> None:
        self.workers[0].call()

    def lanes(self, k: int) -> list[Runner]:
        """Start the missing workers in parallel (each imports its peer and, reused, opens a session)."""
        started: list[Worker] = []
        failures: list[BaseException] = []
        lock = threading.Lock()

        def spawn() -> None:
            try:
                worker = self._spawn()
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - raised below, after the others
                with lock:
                    failures.append(exc)
                return
            with lock:
                started.append(worker)

        threads = [threading.Thread(target=spawn, daemon=True) for _ in range(k - len(self.workers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.workers += started
        if failures:
            raise CaseError(f"starting {len(threads)} workers: {_failure(failures[0])}")
        return [_call_of(w) for w in self.workers[:k]]

    def shrink(self) -> None:
        extra, self.workers = self.workers[1:], self.workers[:1]
        _close_all([w.close for w in extra])

    def close(self) -> None:
        workers, self.workers = self.workers, []
        _close_all([w.close for w in workers])


def _call_of(worker: Worker) -> Runner:
    def call() -> None:
        worker.call()

    return call


def _close_all(closers: Sequence[Callable[[], None]]) -> None:
    """Close in parallel (a peer's close can take a while: stop, wait, remove), errors swallowed: the final
    sweep by label removes whatever a failed close left."""
    threads = [threading.Thread(target=_quietly, args=(c,), daemon=True) for c in closers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _quietly(fn: Callable[[], None]) -> None:
    with contextlib.suppress(Exception):
        fn()


def gateway_runner(gw: Gateway) -> Runner:
    request = {"code": CODE}

    def run() -> str | None:
        data = gw.execute(request).to_dict()
        if data.get("stdout") != EXPECTED:
            raise CaseError(f"gateway run failed: {gateway_failure(data)}")
        pool = data.get("pool")
        return str(pool) if pool is not None else None

    return run


def gateway_pool_case(name: str, runtime: str, audit_dir: Path, size: int) -> tuple[Case, Gateway]:
    """The gateway with a warm pool of ``size`` for the policy's default profile, filled before it is timed.

    The pool API of issue 10: ``Gateway.from_env(..., pool=gateway.PoolConfig(size=N, min=N, burst="cold"))``,
    ``gw.pool.wait_ready()``/``stats()``, and ``"pool": "hit" | "miss" | "cold"`` in the result. Without that
    API (a gateway from before it) the case reports why, with no numbers.
    """
    try:
        from gateway import PoolConfig  # type: ignore[attr-defined,unused-ignore]  # noqa: PLC0415
    except ImportError as exc:
        raise CaseError(f"no warm pool in this gateway (gateway.PoolConfig: {exc})") from exc
    # min=size: the other cases keep this one idle for minutes; idle expiry must not shrink it (it would find the
    # pool at target 0, as seen with min 0: wait_ready then returns at once and the burst meets an empty pool).
    config = PoolConfig(size=size, min=size, burst="cold")
    gw = Gateway.from_env(policy_for(runtime), audit_dir, pool=config)  # type: ignore[call-arg,unused-ignore]
    try:
        wait_for_pool(gw)
    except BaseException:
        gw.close()  # its pooled containers go with it
        raise
    return Case(name, gateway_runner(gw), gw.close), gw


def wait_for_pool(gw: Gateway, timeout_s: float = 60.0) -> None:
    """Until the pool is full again (a burst and the rounds start from a full pool), or say why not."""
    pool: Any = getattr(gw, "pool", None)
    if pool is None:
        raise CaseError("the gateway has no pool after Gateway.from_env(pool=...)")
    if not pool.wait_ready(timeout_s=timeout_s):
        raise CaseError(f"the pool did not fill in {timeout_s:g} s: {pool.stats()}")


# --- peers' virtualenvs ---------------------------------------------------------------------------------


def peers_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "agent-gateway" / "peers"


def ensure_venv(root: Path, name: str, progress: Callable[[str], None]) -> Path:
    """The venv ``root/name`` with ``PEER_VENVS[name]`` installed (once: a marker records what is installed)."""
    requirements = PEER_VENVS[name]
    venv = root / name
    python = venv / "bin" / "python"
    marker = venv / "benchmark-requirements.txt"
    wanted = "\n".join(requirements) + "\n"
    if python.exists() and marker.exists() and marker.read_text(encoding="utf-8") == wanted:
        return python
    progress(f"installing {' '.join(requirements)} into {venv}")
    if not python.exists():
        _check_run([sys.executable, "-m", "venv", str(venv)], f"creating the venv {venv}")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements]
    _check_run(pip, f"pip install {' '.join(requirements)}")
    marker.write_text(wanted, encoding="utf-8")
    return python


def _check_run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CaseError(f"{what} failed (exit {proc.returncode}): {(proc.stderr or proc.stdout)[-600:].strip()}")


# --- measurement (pure: the cases come in, numbers go out) ---------------------------------------------


def _timed(run: Runner) -> tuple[float, str | None]:
    start = time.perf_counter()
    status = run()
    return (time.perf_counter() - start) * 1000, status


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, SystemExit) else str(exc.code)


def measure_latency(
    cases: dict[str, Case], *, rounds: int, warmup: int, errors: dict[str, str], progress: Callable[[str], None]
) -> tuple[dict[str, list[float]], dict[str, dict[str, int]]]:
    """Interleaved rounds, the order rotated each round; a case that fails once is dropped with its error."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    statuses: dict[str, dict[str, int]] = {}
    for i in range(warmup + rounds):
        names = [n for n in cases if n not in errors]
        shift = i % max(1, len(names))
        for name in names[shift:] + names[:shift]:
            progress(f"latency round {i + 1}/{warmup + rounds}{' (warm-up)' if i < warmup else ''}: {name}")
            try:
                elapsed, status = _timed(cases[name].lanes(1)[0])
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - recorded as the case's error
                errors[name] = _failure(exc)
                continue
            if i >= warmup:
                times[name].append(elapsed)
                if status is not None:
                    counts = statuses.setdefault(name, {})
                    counts[status] = counts.get(status, 0) + 1
    return times, statuses


def run_concurrently(lanes: list[Runner], total: int) -> tuple[float, list[tuple[float, str | None]], list[str]]:
    """``total`` calls spread over the lanes, one thread per lane, all released at once: (seconds, per-call
    results, failures). With one call per lane this is a burst of ``len(lanes)`` requests."""
    lock = threading.Lock()
    remaining = [total]
    results: list[tuple[float, str | None]] = []
    failures: list[str] = []
    barrier = threading.Barrier(len(lanes) + 1)

    def lane(run: Runner) -> None:
        barrier.wait()
        while True:
            with lock:
                if remaining[0] <= 0 or failures:
                    return
                remaining[0] -= 1
            try:
                result = _timed(run)
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported by the caller
                with lock:
                    failures.append(_failure(exc))
                return
            with lock:
                results.append(result)

    threads = [threading.Thread(target=lane, args=(run,), daemon=True) for run in lanes]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        while t.is_alive():  # join in slices: Ctrl-C stays responsive
            t.join(0.2)
    return time.perf_counter() - start, results, failures


def measure_throughput(
    cases: dict[str, Case],
    *,
    levels: Sequence[int],
    requests_per_lane: int,
    errors: dict[str, str],
    progress: Callable[[str], None],
    settle: Callable[[str], None] = lambda name: None,
    statuses: dict[str, dict[str, dict[str, int]]] | None = None,
    burst: Burst | None = None,
) -> dict[str, dict[str, float]]:
    """Requests/s at each concurrency level: ``requests_per_lane`` x level calls over ``level`` lanes. Case by
    case, every level in turn: the lanes for the highest level are made once, untimed, before the first, and
    given back after the last. Not all cases' lanes at once: an idle reused llm-sandbox session under runsc
    burns CPU (5-35 % of a core each, measured), so idle extra lanes would slow the cases measured meanwhile.
    ``burst``: the level that is also the gateway cases' burst (see :class:`Burst`)."""
    out: dict[str, dict[str, float]] = {}
    for name in [n for n in cases if n not in errors]:
        try:
            progress(f"throughput: {name}: starting {max(levels)} lanes")
            lanes = cases[name].lanes(max(levels))
            row = _levels(
                name,
                lanes,
                levels=levels,
                requests_per_lane=requests_per_lane,
                progress=progress,
                settle=settle,
                statuses=statuses,
                burst=burst,
            )
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - recorded as the case's error
            errors[name] = str(exc) if isinstance(exc, CaseError) else _failure(exc)
            continue
        finally:
            cases[name].shrink()
        out[name] = row
    return out


def _levels(
    name: str,
    lanes: list[Runner],
    *,
    levels: Sequence[int],
    requests_per_lane: int,
    progress: Callable[[str], None],
    settle: Callable[[str], None],
    statuses: dict[str, dict[str, dict[str, int]]] | None = None,
    burst: Burst | None = None,
) -> dict[str, float]:
    row: dict[str, float] = {}
    for level in levels:
        progress(f"throughput: {name} at concurrency {level}")
        settle(name)
        keep = burst is not None and burst.level == level and name.startswith(BURST_CASES)
        state = burst.pool_state(name) if burst is not None and keep else None
        seconds, results, failures = run_concurrently(lanes[:level], requests_per_lane * level)
        if failures:
            raise CaseError(f"at concurrency {level}: {failures[0]}")
        if burst is not None and keep:
            size = burst.pool_size if name.startswith("gateway_pool") else None
            burst.found[name] = _burst_row(seconds, results, state, pool_size=size)
        row[str(level)] = round(len(results) / seconds, 2)
        counts = _status_counts(results)
        if counts and statuses is not None:
            statuses.setdefault(name, {})[str(level)] = counts
    return row


def _status_counts(results: list[tuple[float, str | None]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, status in results:
        if status is not None:
            counts[status] = counts.get(status, 0) + 1
    return counts


BURST_CASES = ("gateway_pool", "gateway_cold")
"""The cases measured in a burst (a pooled gateway draining, and the cold one for comparison)."""


@dataclass
class Burst:
    """A throughput level that is also the burst: with one call per lane, ``level`` lanes released at once
    from a settled (refilled) pool are exactly a burst of ``level`` requests, so in that mode (``--quick``)
    the burst is taken from that level instead of being run a second time."""

    level: int
    pool_size: int
    pool_state: Callable[[str], dict[str, Any] | None]
    found: dict[str, dict[str, Any]] = field(default_factory=dict)


def measure_burst(case: Case, *, requests: int, pool_size: int | None) -> dict[str, Any]:
    """``requests`` calls released at once (one thread each): per-call latency in order of completion."""
    inner = case.lanes(1)[0]
    seconds, results, failures = run_concurrently([inner] * requests, requests)
    if failures:
        return {"error": failures[0]}
    return _burst_row(seconds, results, None, pool_size=pool_size)


def _burst_row(
    seconds: float, results: list[tuple[float, str | None]], state: dict[str, Any] | None, *, pool_size: int | None
) -> dict[str, Any]:
    latencies = [ms for ms, _ in results]
    statuses = _status_counts(results)
    return {
        "requests": len(results),
        "pool_size": pool_size,
        "elapsed_s": round(seconds, 2),
        "p50_ms": round(statistics.median(latencies), 1),
        "max_ms": round(max(latencies), 1),
        "latencies_ms": [round(ms, 1) for ms in sorted(latencies)],
        **({"pool": statuses} if statuses else {}),
        **({"pool_before": state} if state is not None else {}),
    }


def summarize(times: dict[str, list[float]], errors: dict[str, str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, values in times.items():
        if name in errors:
            out[name] = {"error": errors[name]}
        elif values:
            out[name] = {
                "p50_ms": round(statistics.median(values), 1),
                "p95_ms": round(percentile(values, 0.95), 1),
                "mean_ms": round(statistics.fmean(values), 1),
                "n": len(values),
            }
        else:
            out[name] = {"error": "no measured run"}
    for name, message in errors.items():
        out.setdefault(name, {"error": message})
    return out


def _ratio(a: Any, b: Any) -> float | None:
    return round(a / b, 2) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def ratios_and_targets(
    cases: dict[str, dict[str, Any]], throughput: dict[str, dict[str, float]], runtimes: Sequence[str]
) -> tuple[dict[str, float | None], list[dict[str, Any]]]:
    """Ratios of the same run (p50 unless named), and the issue's targets with whether each was met."""
    ratios: dict[str, float | None] = {}
    targets: list[dict[str, Any]] = []

    def p50(name: str) -> Any:
        return cases.get(name, {}).get("p50_ms")

    for runtime in runtimes:
        s = suffix(runtime)
        pool, cold, cli = f"gateway_pool{s}", f"gateway_cold{s}", f"docker_cli{s}"
        for other in ("gateway_cold", "docker_cli", "lesson_helper", *PEER_CASES):
            ratios[f"{pool}/{other}{s}"] = _ratio(p50(pool), p50(f"{other}{s}"))
        for other in ("docker_cli", "lesson_helper", *PEER_CASES):
            ratios[f"{cold}/{other}{s}"] = _ratio(p50(cold), p50(f"{other}{s}"))
        thr = _ratio(throughput.get(pool, {}).get("8"), throughput.get(cold, {}).get("8"))
        ratios[f"{pool}/{cold} throughput at 8"] = thr
        bound = 0.25 if runtime == "runc" else round(1 / 3, 3)
        peers = {f"{p}{s}": p50(f"{p}{s}") for p in ("docker_cli", "lesson_helper", *PEER_CASES)}
        fastest = (
            min((v, k) for k, v in peers.items() if isinstance(v, (int, float)))
            if any(isinstance(v, (int, float)) for v in peers.values())
            else None
        )
        targets += [
            _target(f"{pool} p50 <= {bound} x {cold} p50", ratios[f"{pool}/gateway_cold{s}"], bound),
            _target(f"{cold} p50 <= {cli} p50", ratios[f"{cold}/docker_cli{s}"], 1.0),
            _target(f"{pool} throughput at 8 >= 3 x {cold}", thr, 3.0, at_least=True),
            _target(
                f"{pool} p50 < every peer's p50 (fastest: {fastest[1] if fastest else 'none measured'})",
                _ratio(p50(pool), fastest[0]) if fastest else None,
                1.0,
                strict=True,
            ),
        ]
    return ratios, targets


def _target(
    what: str, value: float | None, bound: float, *, at_least: bool = False, strict: bool = False
) -> dict[str, Any]:
    if value is None:
        met = None
    elif at_least:
        met = value >= bound
    else:
        met = value < bound if strict else value <= bound
    return {"target": what, "ratio": value, "met": met}


def suffix(runtime: str) -> str:
    return "" if runtime == "runc" else f"_{runtime}"


def measure(
    cases: dict[str, Case],
    *,
    errors: dict[str, str],
    runtimes: Sequence[str],
    rounds: int,
    warmup: int,
    requests_per_lane: int,
    burst_requests: int,
    pool_size: int,
    progress: Callable[[str], None] = lambda message: None,
    settle: Callable[[str], None] = lambda name: None,
    pool_state: Callable[[str], dict[str, Any] | None] = lambda name: None,
) -> dict[str, Any]:
    """Latency, throughput and bursts of ``cases`` (set up by the caller, who also closes them): the report's
    ``cases``, ``ratios``, ``targets``, ``throughput`` and ``burst``. ``errors`` holds (and receives) the cases
    that failed; ``settle(name)`` runs, untimed, before each throughput level and burst (the pool refills)."""
    phases: dict[str, float] = {}
    clock = time.monotonic()
    times, statuses = measure_latency(cases, rounds=rounds, warmup=warmup, errors=errors, progress=progress)
    phases["latency"], clock = round(time.monotonic() - clock, 1), time.monotonic()
    # With one call per lane, concurrency 1 is one call on its own: the latency rounds made ``rounds`` of exactly
    # those (sequential, each case alone on the engine's side of the benchmark), so that level is their rate.
    # Likewise a level of ``burst_requests`` lanes is the burst (:class:`Burst`). Without this, --quick would time
    # the same experiments twice.
    one_call = requests_per_lane == 1
    levels = [level for level in CONCURRENCY if not (one_call and level == 1)]
    shared = Burst(burst_requests, pool_size, pool_state) if one_call and burst_requests in levels else None
    throughput_pool: dict[str, dict[str, dict[str, int]]] = {}
    measured = measure_throughput(
        cases, levels=levels, requests_per_lane=requests_per_lane, errors=errors, progress=progress,
        settle=settle, statuses=throughput_pool, burst=shared,
    )  # fmt: skip
    throughput: dict[str, dict[str, float]] = {}
    for name, row in measured.items():
        first = {"1": round(1000 / statistics.fmean(times[name]), 2)} if one_call and times.get(name) else {}
        throughput[name] = {**first, **row}
    phases["throughput"], clock = round(time.monotonic() - clock, 1), time.monotonic()
    burst: dict[str, Any] = dict(shared.found) if shared is not None else {}
    for name in [n for n in cases if n.startswith(BURST_CASES) and n not in errors and n not in burst]:
        progress(f"burst of {burst_requests}: {name}")
        settle(name)
        state = pool_state(name)  # what the burst found: ready containers per the pool's own count
        pooled = name.startswith("gateway_pool")
        burst[name] = measure_burst(cases[name], requests=burst_requests, pool_size=pool_size if pooled else None)
        if state is not None:
            burst[name]["pool_before"] = state
    phases["burst"] = round(time.monotonic() - clock, 1)
    summary = summarize(times, errors)
    for name, counts in statuses.items():
        if "error" not in summary.get(name, {"error": None}):
            summary[name]["pool"] = counts
    ratios, targets = ratios_and_targets(summary, throughput, runtimes)
    return {
        "cases": summary,
        "ratios": ratios,
        "targets": targets,
        "throughput": throughput,
        "throughput_pool": {n: v for n, v in throughput_pool.items() if n in throughput},
        "throughput_1_from_latency_rounds": one_call,
        "burst": burst,
        "burst_from_throughput_level": shared.level if shared is not None else None,
        "phase_seconds": phases,
    }


# --- the run ---------------------------------------------------------------------------------------------


def registered_runtimes(client: Any) -> list[str]:
    runtimes = client.info().get("Runtimes", {})
    return ["runc"] + (["runsc"] if "runsc" in runtimes else [])


class Run:
    """Everything one benchmark run started, so that it can all be closed and swept (also on Ctrl-C)."""

    def __init__(self, client: Any, run_id: str, instance: str) -> None:
        self.client = client
        self.run_id = run_id
        self.instance = instance
        self.cases: dict[str, Case] = {}
        self.gateways: dict[str, Gateway] = {}
        self.errors: dict[str, str] = {}
        self.peers: dict[str, dict[str, Any]] = {}

    def add(self, name: str, make: Callable[[], Case]) -> None:
        try:
            self.cases[name] = make()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the case is reported with its error
            self.errors[name] = _failure(exc)

    def close(self) -> None:
        cases, self.cases = list(self.cases.values()), {}
        _close_all([c.close for c in cases])

    def leftovers(self) -> list[Any]:
        found: dict[str, Any] = {}
        for label in (f"{RUN_LABEL}={self.run_id}", f"{INSTANCE_LABEL}={self.instance}"):
            for c in self.client.containers.list(all=True, filters={"label": label}):
                found[c.id] = c
        return list(found.values())

    def sweep(self, grace_s: float = 10.0) -> int:
        """Count what this run left behind once everything was closed (waiting ``grace_s`` for removals the
        engine or a background reaper still has in flight), then remove it. Returns the count."""
        deadline = time.monotonic() + grace_s
        left = self.leftovers()
        while left and time.monotonic() < deadline:
            time.sleep(0.25)
            left = self.leftovers()
        for c in left:
            with contextlib.suppress(Exception):
                c.remove(force=True)
        return len(left)


def build_cases(
    run: Run, args: argparse.Namespace, *, audit_dir: Path, work: Path, slots: int, progress: Progress
) -> None:
    wanted = set(args.cases)
    label = f"{RUN_LABEL}={run.run_id}"
    venvs: dict[str, Path | CaseError] = {}
    for venv in sorted({VENV_OF[c] for c in PEER_CASES if c in wanted}):
        try:
            venvs[venv] = ensure_venv(args.peers_dir, venv, progress)
        except CaseError as exc:
            venvs[venv] = exc
    for runtime in args.runtimes:
        s = suffix(runtime)
        progress(f"setting up the {runtime} cases")
        if "docker_cli" in wanted:
            seccomp = work / runtime
            seccomp.mkdir(exist_ok=True)

            def cli(runtime: str = runtime, seccomp: Path = seccomp) -> Case:
                options = gateway_profile_options(runtime, audit_dir)
                options["labels"] = {RUN_LABEL: run.run_id}
                return Case(f"docker_cli{suffix(runtime)}", _none(docker_cli(runtime, cli_flags(options, seccomp))))

            run.add(f"docker_cli{s}", cli)
        if "lesson_helper" in wanted:
            helper = lesson_helper(run.client, runtime, {RUN_LABEL: run.run_id})
            run.add(f"lesson_helper{s}", lambda s=s, helper=helper: Case(f"lesson_helper{s}", _none(helper)))
        for peer in PEER_CASES:
            if peer not in wanted:
                continue
            python = venvs[VENV_OF[peer]]
            name = f"{peer}{s}"
            if isinstance(python, CaseError):
                run.errors[name] = str(python)
                continue

            def make(name: str = name, python: Path = python, peer: str = peer, runtime: str = runtime) -> Case:
                return WorkerCase(name, python, peer, runtime=runtime, label=label, log_dir=work)

            run.add(name, make)
            case = run.cases.get(name)
            if isinstance(case, WorkerCase):
                run.peers[peer] = {
                    "requirements": list(PEER_VENVS[VENV_OF[peer]]),
                    "versions": case.versions,
                    "settings": PEER_SETTINGS[peer],
                }
        if "gateway_cold" in wanted:

            def cold(runtime: str = runtime) -> Case:
                own_slots(work, f"gateway_cold{suffix(runtime)}", slots)
                gw = Gateway.from_env(policy_for(runtime), audit_dir)
                run.gateways[f"gateway_cold{suffix(runtime)}"] = gw
                return Case(f"gateway_cold{suffix(runtime)}", gateway_runner(gw), gw.close)

            run.add(f"gateway_cold{s}", cold)
        if "gateway_pool" in wanted:

            def pooled(runtime: str = runtime) -> Case:
                own_slots(work, f"gateway_pool{suffix(runtime)}", slots)
                case, gw = gateway_pool_case(f"gateway_pool{suffix(runtime)}", runtime, audit_dir, args.pool_size)
                run.gateways[case.name] = gw
                return case

            run.add(f"gateway_pool{s}", pooled)


def _none(fn: Callable[[], None]) -> Runner:
    def run() -> None:
        fn()

    return run


def execute(args: argparse.Namespace, client: Any, progress: Progress) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:12]
    # This run's own gateway instance: its containers (pooled ones included) are found by it afterwards.
    instance = f"bench-peers-{run_id}"
    os.environ["GATEWAY_INSTANCE"] = instance
    run = Run(client, run_id, instance)
    env_audit = os.environ.get("GATEWAY_AUDIT_DIR")
    started = datetime.now(UTC)
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gateway-bench-peers-")))
        audit_dir = Path(env_audit) if env_audit else work / "audit"
        slots = args.slots if args.slots is not None else default_slot_count()
        leaked: int | None = None
        clock = time.monotonic()
        try:
            build_cases(run, args, audit_dir=audit_dir, work=work, slots=slots, progress=progress)
            setup_s, clock = round(time.monotonic() - clock, 1), time.monotonic()
            measured = measure(
                run.cases,
                errors=run.errors,
                runtimes=args.runtimes,
                rounds=args.n,
                warmup=args.warmup,
                requests_per_lane=args.throughput_requests,
                burst_requests=args.burst_factor * args.pool_size,
                pool_size=args.pool_size,
                progress=progress,
                settle=lambda name: _refill(run, name),
                pool_state=lambda name: _pool_state(run, name),
            )
        finally:
            progress("closing every case and sweeping containers")
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the cleanup
            try:
                clock = time.monotonic()
                run.close()
                leaked = run.sweep()
            finally:
                signal.signal(signal.SIGINT, previous)
                progress.done()
    measured["phase_seconds"] = {
        "setup": setup_s,
        **measured["phase_seconds"],
        "close": round(time.monotonic() - clock, 1),
    }
    info = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round((datetime.now(UTC) - started).total_seconds(), 1),
        "quick": args.quick,
        "rounds": args.n,
        "warmup": args.warmup,
        "throughput_requests_per_lane": args.throughput_requests,
        "pool_size": args.pool_size,
        "slots": slots,
        "image": IMAGE,
        "runtimes": list(args.runtimes),
        "machine": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": cpus(),
        "python": platform.python_version(),
        "docker": client.version().get("Version"),
        "runsc": _runsc_version(client) if "runsc" in args.runtimes else None,
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "audit_dir": str(audit_dir) if env_audit else None,
    }
    return {"info": info, **measured, "peers": run.peers, "leaked_containers": leaked}


def own_slots(work: Path, name: str, count: int) -> None:
    """Give the next Gateway made in this process host slots of its own (``count`` in a directory of its own),
    as if it were alone on the host with that setting: another session's runs on the machine never hold its
    slots, and the cold and pooled cases (separate Gateways here) never hold each other's. A warm pool's
    ready containers count against its gateway's slots, as in a deployment."""
    runtime_dir = work / "slots" / name
    runtime_dir.mkdir(parents=True)
    os.environ["GATEWAY_RUNTIME_DIR"] = str(runtime_dir)
    os.environ["GATEWAY_SLOTS"] = str(count)


def _refill(run: Run, name: str) -> None:
    """Before a pooled case's throughput level or burst, let its pool fill again (not timed)."""
    gw = run.gateways.get(name)
    if gw is not None and getattr(gw, "pool", None) is not None:
        wait_for_pool(gw)


def _pool_state(run: Run, name: str) -> dict[str, Any] | None:
    pool: Any = getattr(run.gateways.get(name), "pool", None)
    if pool is None:
        return None
    stats = pool.stats()
    return {"ready": stats.ready, "creating": stats.creating, "target": stats.target, "errors": list(stats.errors)}


def _runsc_version(client: Any) -> str | None:
    path = client.info().get("Runtimes", {}).get("runsc", {}).get("path")
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, check=False).stdout
        return out.splitlines()[0].strip() if out else None
    return None


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def print_table(report: dict[str, Any]) -> None:
    info = report["info"]
    print(f"{info['date']}  {info['machine']}  {info['cpu']}  cpus={info['cpus']}  docker {info['docker']}")
    print(f"{'case':<26} {'p50 ms':>8} {'p95 ms':>8} {'rps@1':>7} {'rps@4':>7} {'rps@8':>7}")
    for name, row in report["cases"].items():
        thr = report["throughput"].get(name, {})
        if "error" in row:
            print(f"{name:<26} error: {row['error'][:120]}")
            continue
        cells = [str(thr.get(str(c), "-")) for c in CONCURRENCY]
        print(f"{name:<26} {row['p50_ms']:>8} {row['p95_ms']:>8} {cells[0]:>7} {cells[1]:>7} {cells[2]:>7}")
    for key, value in report["ratios"].items():
        if value is not None:
            print(f"{key}: {value}")
    for t in report["targets"]:
        print(f"target {t['target']}: ratio {t['ratio']} met={t['met']}")
    for name, b in report["burst"].items():
        print(f"burst {name}: {json.dumps(b)}")
    print(f"leaked containers: {report['leaked_containers']}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few runs of each case (under two minutes)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--n", type=int, help="measured latency rounds (default 20; 3 with --quick)")
    parser.add_argument("--warmup", type=int, help="untimed rounds first (default 2; 1 with --quick)")
    parser.add_argument("--throughput-requests", type=int, help="calls per lane at each level (default 3; 1 quick)")
    parser.add_argument(
        "--pool-size", type=int, help="warm containers of gateway_pool (default: half the host's default slots)"
    )
    parser.add_argument("--slots", type=int, help="host slots of each gateway case (default: the host's default)")
    parser.add_argument("--burst-factor", type=int, help="burst = this x pool size (default 3; 2 with --quick)")
    parser.add_argument("--cases", default=",".join(BASE_CASES), help="comma-separated subset of the cases")
    parser.add_argument("--runtimes", help="comma-separated (default: runc, and runsc when it is registered)")
    parser.add_argument("--peers-dir", type=Path, default=None, help="where the peers' venvs live")
    args = parser.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(args.cases) - set(BASE_CASES))
    if unknown:
        parser.error(f"--cases: unknown {unknown}; expected a subset of {list(BASE_CASES)}")
    args.n = args.n if args.n is not None else (3 if args.quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.throughput_requests = args.throughput_requests or (1 if args.quick else 3)
    args.burst_factor = args.burst_factor or (2 if args.quick else 3)
    # Half the slots: the pool's ready containers hold slots, the rest are for the runs that miss it.
    args.pool_size = args.pool_size or max(1, default_slot_count() // 2)
    args.peers_dir = args.peers_dir or peers_dir()
    if args.runtimes is not None:
        args.runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
        bad = sorted(set(args.runtimes) - {"runc", "runsc"})
        if bad:
            parser.error(f"--runtimes: unknown {bad}; expected runc and/or runsc")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import docker  # noqa: PLC0415 - after argument parsing, so --help works without an engine

    client = docker.from_env(max_pool_size=32)
    try:
        client.images.get(IMAGE)  # never pulled: build it with scripts/build-image.sh
    except docker.errors.ImageNotFound:
        print(f"peers.py: the image {IMAGE} is missing; build it with scripts/build-image.sh", file=sys.stderr)
        return 2
    registered = registered_runtimes(client)
    if args.runtimes is None:
        args.runtimes = registered
    missing = sorted(set(args.runtimes) - set(registered))
    if missing:
        print(f"peers.py: runtime(s) {missing} not registered with the engine", file=sys.stderr)
        return 2
    progress = Progress("peers", sys.stderr.isatty())
    # Ctrl-C and SIGTERM both end the run through the cleanup below, even when started from a shell that
    # made this process ignore SIGINT (a background job).
    previous = signal.signal(signal.SIGTERM, _interrupt)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        report = execute(args, client, progress)
    except KeyboardInterrupt:
        print("peers.py: interrupted; every container it started was removed", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
        client.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0 if report["leaked_containers"] == 0 else 1


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())

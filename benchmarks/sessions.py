"""Sessions side by side: kernel cells, session create and workspace executions, against a pooled run and the
persistent modes of AutoGen's ``DockerCommandLineCodeExecutor`` and llm-sandbox, in one run (issue 29).

Every step runs in the same local image (``gateway/sandbox-python:3.11-bookworm``, never pulled), under one
runtime (``--runtime``), interleaved round by round with the order rotated, so drift in the machine's load hits
every step alike:

- ``kernel_cell_local`` / ``kernel_reuse_local``: ``print(2+2)`` and ``n += 1; n`` (the value checked) as cells of
  one kernel session through ``Gateway.sessions.execute``;
- ``kernel_cell_http`` / ``kernel_reuse_http``: the same through ``gateway.client.Client.sessions.execute``
  against a ``gateway serve`` this script starts on loopback (its principal under the sessions policy, its trail
  durable as the service's default: records fsynced before an answer);
- ``workspace_run_local`` / ``workspace_reuse_local``: ``print(2+2)`` and a program that reads, increments and
  writes a counter file in ``/workspace`` (its state across executions), in a workspace-mode session;
- ``pooled_run``: ``Gateway.execute`` of ``print(2+2)`` with a warm pool (the same-run baseline: a plain run);
- ``create_kernel_local`` / ``create_workspace_local`` / ``create_kernel_http``: a session's create (ready to
  run), each followed by its close (``close_*``, timed too); both gateways keep a pool, so a kernel session is
  served by a ready kernel (``spec.sessions.pool``; ``ready kernels`` in the report counts hits and misses);
- ``autogen_cell`` / ``autogen_reuse`` / ``autogen_create``: AutoGen's executor, one persistent container
  (``execute_code_blocks``, ``start()``); its ``stop()`` waits out the engine's 10 s stop timeout, so
  ``autogen_close`` is timed once before the rounds and the rounds remove its container at once
  (``autogen_discard``, ``docker rm -f``);
- ``llm_sandbox_cell`` / ``llm_sandbox_reuse`` / ``llm_sandbox_create`` / ``llm_sandbox_close``: one reused
  llm-sandbox ``SandboxSession``.

Neither peer keeps an interpreter between calls (each runs a new ``python3`` in its container), so their reuse
step is the counter file, as the workspace's (``benchmarks/session_peer_worker.py`` says what each needed to run
here: local image, no network, no pull). The peers are installed by this script into their own virtualenvs
(``--peers-dir``, default ``~/.cache/agent-gateway/peers/<name>``, shared with ``peers.py``; idempotent), never
into the project's. The gateway's two sides (this process and the server) take their host slots from a
directory of this run, so another session's runs on the machine never hold them.

Printed: p50 and p95 per step, the ratios against the same run's baselines and the issue's targets with
whether each was met; ``--json`` prints one JSON object. Progress goes to stderr when it is a terminal. Every
container the run started is removed at the end (the count left behind is reported: it must be 0).

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/sessions.py [--quick] [--json] [--runtime runsc] [--rounds N]``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from cases import CODE, EXPECTED, IMAGE, Progress, percentile, print_steps, run_info
from peers import RUN_LABEL, CaseError, Worker, peers_dir
from service import gateway_serve_with

from gateway import Gateway, PoolConfig
from gateway.client import Client
from gateway.resources import policies_dir
from gateway.runner.docker.options import INSTANCE_LABEL

REUSE_CELL = "n += 1\nn"
REUSE_FILE = (
    "import os\np = '/workspace/bench-state'\nn = int(open(p).read()) + 1 if os.path.exists(p) else 1\n"
    "open(p, 'w').write(str(n))\nprint(n)"
)
"""The workspace's reuse step: the peers' (``session_peer_worker.REUSE``) with the workspace's path."""
PEER_VENVS: dict[str, tuple[str, ...]] = {
    # Exact pins: the numbers are for these versions (llm-sandbox's venv is the one peers.py makes).
    "autogen": ("autogen-ext[docker]==0.7.5",),
    "llm_sandbox": ("llm-sandbox[docker]==0.3.46",),
}
PEERS = {"autogen": "autogen", "llm_sandbox": "llm_sandbox_reused"}
"""Step prefix -> the worker's ``--peer``."""
WORKER = Path(__file__).with_name("session_peer_worker.py")

Step = Callable[[], None]


class StepError(Exception):
    """A step gave a wrong answer or failed: its case is reported with the error, never with numbers."""


# --- the gateway's cases ---------------------------------------------------------------------------------


def sessions_policy(work: Path, runtime: str) -> Path:
    """``policies/examples/sessions.yaml`` under runc; under runsc the same sessions over ``strict.yaml``."""
    if runtime == "runc":
        return policies_dir() / "examples" / "sessions.yaml"
    path = work / "sessions-runsc.yaml"
    path.write_text(
        "apiVersion: gateway.agent-exec/v1\nkind: Policy\n"
        f"extends: {policies_dir() / 'strict.yaml'}\nmetadata:\n  name: sessions-runsc\n"
        "spec:\n  sessions:\n    modes: [workspace, kernel]\n    max_per_principal: 2\n"
        "    idle_s: {default: 600, max: 1800}\n    lifetime_s: {default: 3600, max: 14400}\n"
        "    workspace_size: {default: 64m, max: 256m}\n    pool: {size: 2}\n"
    )
    return path


def _check(ok: bool, what: str, got: Any) -> None:
    if not ok:
        raise StepError(f"{what}: {json.dumps(got, default=str)[:400]}")


def local_cells(gw: Gateway, mode: str, principal: str) -> tuple[Step, Step]:
    """(``print(2+2)``, the reuse step) in one ``mode`` session of ``principal``, opened now."""
    created = gw.sessions.create({"mode": mode, "principal": principal}).to_dict()
    _check(created.get("allowed") is True, f"creating a {mode} session", created)
    sid = created["session_id"]
    count = [0]
    if mode == "kernel":
        first = gw.sessions.execute(sid, {"code": "n = 0", "principal": principal}).to_dict()
        _check(first.get("exit_status") == 0, "the kernel's first cell", first)

    def run() -> None:
        data = gw.sessions.execute(sid, {"code": CODE, "principal": principal}).to_dict()
        _check(data.get("stdout") == EXPECTED, f"{mode} print(2+2)", data)

    def reuse() -> None:
        code = REUSE_CELL if mode == "kernel" else REUSE_FILE
        data = gw.sessions.execute(sid, {"code": code, "principal": principal}).to_dict()
        count[0] += 1
        got = data.get("value") if mode == "kernel" else (data.get("stdout") or "").strip()
        _check(got == str(count[0]), f"{mode} reuse (expected {count[0]})", data)

    return run, reuse


def http_cells(client: Client) -> tuple[Step, Step]:
    created = client.sessions.create({"mode": "kernel"})
    _check(created.session_id is not None, "creating a kernel session over HTTP", created.to_dict())
    sid = str(created.session_id)
    _check(client.sessions.execute(sid, {"code": "n = 0"}).exit_status == 0, "the first cell", sid)
    count = [0]

    def run() -> None:
        result = client.sessions.execute(sid, {"code": CODE})
        _check(result.stdout == EXPECTED, "print(2+2) over HTTP", result.to_dict())

    def reuse() -> None:
        result = client.sessions.execute(sid, {"code": REUSE_CELL})
        count[0] += 1
        _check(result.value == str(count[0]), f"reuse over HTTP (expected {count[0]})", result.to_dict())

    return run, reuse


def local_create(gw: Gateway, mode: str, principal: str) -> tuple[Step, Step]:
    """(create a ``mode`` session, close it): one at a time."""
    made: list[str] = []

    def create() -> None:
        data = gw.sessions.create({"mode": mode, "principal": principal}).to_dict()
        _check(data.get("allowed") is True and data.get("session_id"), f"creating a {mode} session", data)
        made.append(data["session_id"])

    def close() -> None:
        gw.sessions.close(made.pop(), principal=principal)

    return create, close


def http_create(client: Client) -> tuple[Step, Step]:
    made: list[str] = []

    def create() -> None:
        result = client.sessions.create({"mode": "kernel"})
        _check(result.session_id is not None, "creating a kernel session over HTTP", result.to_dict())
        made.append(str(result.session_id))

    def close() -> None:
        client.sessions.close(made.pop())

    return create, close


def pooled_run(gw: Gateway, pool: dict[str, int]) -> Step:
    def run() -> None:
        data = gw.execute({"code": CODE, "principal": "bench"}).to_dict()
        _check(data.get("stdout") == EXPECTED, "pooled run", data)
        status = str(data.get("pool"))
        pool[status] = pool.get(status, 0) + 1

    return run


# --- peers ----------------------------------------------------------------------------------------------


def peer_python(root: Path, name: str, progress: Callable[[str], None]) -> Path:
    """The venv ``root/name`` with ``PEER_VENVS[name]`` installed (once: a marker records what is installed)."""
    requirements = PEER_VENVS[name]
    venv = root / name
    python = venv / "bin" / "python"
    marker = venv / "benchmark-requirements.txt"
    wanted = "\n".join(requirements) + "\n"
    if python.exists() and marker.exists() and marker.read_text(encoding="utf-8") == wanted:
        return python
    progress(f"installing {' '.join(requirements)} into {venv}")
    for argv in (
        [sys.executable, "-m", "venv", str(venv)],
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
    ):
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise StepError(f"{' '.join(argv[:4])} failed: {(proc.stderr or proc.stdout)[-600:].strip()}")
    marker.write_text(wanted, encoding="utf-8")
    return python


# --- measurement ----------------------------------------------------------------------------------------


def timed_close(worker: Worker) -> float:
    """Milliseconds of the peer's own close of a sandbox it just created (once, before the rounds)."""
    worker.call("create")
    start = time.perf_counter()
    worker.call("drop")
    return (time.perf_counter() - start) * 1000


def measure(
    cases: dict[str, list[tuple[str, Step]]], *, rounds: int, warmup: int, errors: dict[str, str],
    progress: Callable[[str], None],
) -> dict[str, list[float]]:  # fmt: skip
    """Rounds of every case in turn (the order rotated each round), each case's steps in their order; a case
    that fails once is dropped with its error. Milliseconds per step."""
    times: dict[str, list[float]] = {step: [] for steps in cases.values() for step, _ in steps}
    for i in range(warmup + rounds):
        names = [n for n in cases if n not in errors]
        shift = i % max(1, len(names))
        for name in names[shift:] + names[:shift]:
            progress(f"round {i + 1}/{warmup + rounds}{' (warm-up)' if i < warmup else ''}: {name}")
            for step, fn in cases[name]:
                start = time.perf_counter()
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - recorded as the case's error
                    errors[name] = f"{step}: {type(exc).__name__}: {exc}"
                    break
                if i >= warmup:
                    times[step].append((time.perf_counter() - start) * 1000)
    return times


def summarize(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    return {
        step: {
            "p50_ms": round(statistics.median(v), 2),
            "p95_ms": round(percentile(v, 0.95), 2),
            "n": len(v),
        }
        for step, v in times.items()
        if v
    }


def targets(steps: dict[str, dict[str, float]], runtime: str) -> tuple[dict[str, float | None], list[dict[str, Any]]]:
    """Ratios of p50s of the same run, and the issue's targets."""

    def p50(step: str) -> float | None:
        return steps.get(step, {}).get("p50_ms")

    def ratio(a: str, b: str) -> float | None:
        x, y = p50(a), p50(b)
        return round(x / y, 3) if x is not None and y else None

    ratios = {
        f"{a}/{b}": ratio(a, b)
        for a, b in (
            ("kernel_cell_http", "kernel_cell_local"),
            ("kernel_cell_http", "autogen_cell"),
            ("kernel_cell_http", "llm_sandbox_cell"),
            ("kernel_reuse_http", "autogen_reuse"),
            ("kernel_reuse_http", "llm_sandbox_reuse"),
            ("kernel_cell_http", "pooled_run"),
            ("create_kernel_local", "pooled_run"),
            ("create_workspace_local", "pooled_run"),
            ("create_kernel_http", "pooled_run"),
            ("create_kernel_local", "autogen_create"),
            ("create_kernel_local", "llm_sandbox_create"),
            ("workspace_run_local", "pooled_run"),
            ("workspace_reuse_local", "pooled_run"),
        )
    }

    def target(what: str, value: float | None, bound: float, *, strict: bool = False) -> dict[str, Any]:
        met = None if value is None else (value < bound if strict else value <= bound)
        return {"target": what, "value": value, "bound": bound, "met": met}

    found = [target(f"kernel_cell_http p50 <= 10 ms ({runtime})", p50("kernel_cell_http"), 10.0)]
    for mine, peer in (("kernel_cell_http", "autogen_cell"), ("kernel_cell_http", "llm_sandbox_cell"),
                       ("kernel_reuse_http", "autogen_reuse"), ("kernel_reuse_http", "llm_sandbox_reuse")):  # fmt: skip
        found.append(target(f"{mine} faster than {peer}", ratios[f"{mine}/{peer}"], 1.0, strict=True))
    for create in ("create_kernel_local", "create_workspace_local", "create_kernel_http"):
        found.append(target(f"{create} <= 1.2 x pooled_run", ratios[f"{create}/pooled_run"], 1.2))
    found.append(target("workspace_run_local <= 1.5 x pooled_run", ratios["workspace_run_local/pooled_run"], 1.5))
    return ratios, found


# --- the run --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def private_slots(work: Path, count: int) -> Iterator[None]:
    """Host slots of this run's own (``count`` in a runtime directory of its own) for the local Gateway and the
    server; the workspaces' root there (a private mount the workspace store makes) is unmounted at the end."""
    saved = {k: os.environ.get(k) for k in ("GATEWAY_RUNTIME_DIR", "GATEWAY_WORKSPACE_DIR", "GATEWAY_SLOTS")}
    (work / "slots").mkdir()
    root = str(work / "slots" / "workspaces")
    os.environ.update(GATEWAY_RUNTIME_DIR=str(work / "slots"), GATEWAY_WORKSPACE_DIR=root, GATEWAY_SLOTS=str(count))
    try:
        yield
    finally:
        for _ in range(Path("/proc/self/mounts").read_text().split().count(root)):
            subprocess.run(["umount", root], check=False)  # a bind of itself: os.path.ismount cannot tell
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run(args: argparse.Namespace, engine: Any, progress: Progress) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:12]
    instance = f"bench-sessions-{run_id}"
    os.environ["GATEWAY_INSTANCE"] = instance  # this process's gateway and the server's: found by it afterwards
    label = f"{RUN_LABEL}={run_id}"
    started, load_before = datetime.now(UTC), os.getloadavg()
    errors: dict[str, str] = {}
    pool: dict[str, int] = {}
    times_once: dict[str, list[float]] = {}
    versions: dict[str, dict[str, str]] = {}
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gateway-bench-sessions-")))
        stack.enter_context(private_slots(work, 16))
        policy = sessions_policy(work, args.runtime)
        cases: dict[str, list[tuple[str, Step]]] = {}

        def add(name: str, make: Callable[[], list[tuple[str, Step]]]) -> None:
            try:
                cases[name] = make()
            except Exception as exc:  # noqa: BLE001 - the case is reported with its error
                errors[name] = f"{type(exc).__name__}: {exc}"

        progress("starting gateway serve and the local gateway (its pool filling)")
        base, token, _pid = stack.enter_context(gateway_serve_with(work, {"pool": True}, policy))
        client = stack.enter_context(Client(base, token, timeout=120))
        size = 2
        gw = stack.enter_context(
            Gateway.from_env(policy, work / "audit", pool=PoolConfig(size=size, min=size, burst="cold"))
        )
        if not gw.pool or not gw.pool.wait_ready(timeout_s=60):
            raise SystemExit("sessions.py: the warm pool did not fill in 60 s")
        add("kernel_local", lambda: list(zip(("kernel_cell_local", "kernel_reuse_local"),
                                             local_cells(gw, "kernel", "bench"), strict=True)))  # fmt: skip
        add("kernel_http", lambda: list(zip(("kernel_cell_http", "kernel_reuse_http"), http_cells(client),
                                            strict=True)))  # fmt: skip
        add("workspace_local", lambda: list(zip(("workspace_run_local", "workspace_reuse_local"),
                                                local_cells(gw, "workspace", "bench"), strict=True)))  # fmt: skip
        add("pooled", lambda: [("pooled_run", pooled_run(gw, pool))])
        for mode in ("kernel", "workspace"):
            add(f"create_{mode}_local", lambda mode=mode: list(zip(  # type: ignore[misc]
                (f"create_{mode}_local", f"close_{mode}_local"), local_create(gw, mode, "bench-create"), strict=True
            )))  # fmt: skip
        add("create_kernel_http", lambda: list(zip(("create_kernel_http", "close_kernel_http"), http_create(client),
                                                   strict=True)))  # fmt: skip
        workers: list[Worker] = []
        stack.callback(lambda: [w.close(60) for w in workers])
        for prefix, peer in PEERS.items():
            progress(f"starting {peer}")

            def make(prefix: str = prefix, peer: str = peer) -> list[tuple[str, Step]]:
                python = peer_python(args.peers_dir, prefix, progress)
                worker = Worker(python, peer, args.runtime, label, work, script=WORKER)
                workers.append(worker)
                versions[peer] = worker.versions
                return [
                    (f"{prefix}_cell", partial(worker.call, "print")),
                    (f"{prefix}_reuse", partial(worker.call, "reuse")),
                ]

            add(prefix, make)
            if prefix in cases:
                worker = workers[-1]
                # AutoGen's own close takes the engine's 10 s stop timeout: timed once here, not in every round.
                drop = "discard" if prefix == "autogen" else "drop"
                if drop == "discard":
                    try:
                        times_once["autogen_close"] = [timed_close(worker)]
                    except CaseError as exc:
                        errors["autogen_close"] = str(exc)
                cases[f"{prefix}_create"] = [
                    (f"{prefix}_create", partial(worker.call, "create")),
                    (f"{prefix}_{drop}", partial(worker.call, drop)),
                ]
        clock = time.monotonic()
        times = measure(cases, rounds=args.rounds, warmup=args.warmup, errors=errors, progress=progress)
        times.update(times_once)
        measured_s = round(time.monotonic() - clock, 1)
        kernels = gw.pool.stats()
        progress("closing every session, the server and the peers")
    progress.done()
    leaked = sweep(engine, [label, f"{INSTANCE_LABEL}={instance}"])
    steps = summarize(times)
    ratios, found = targets(steps, args.runtime)
    return {
        "info": run_info(
            args,
            engine,
            started,
            load_before,
            measured_s,
            pool_size=size,
            image=IMAGE,
            python=platform.python_version(),
        ),
        "steps": steps,
        "ratios": ratios,
        "targets": found,
        "pooled_run_pool": pool,
        "ready_kernels_local": {"hits": kernels.kernel_hits, "misses": kernels.kernel_misses},
        "peers": {peer: {"versions": v} for peer, v in versions.items()},
        "errors": errors,
        "leaked_containers": len(leaked),
        "leaked": leaked,
    }


def sweep(engine: Any, labels: list[str], grace_s: float = 10.0) -> list[str]:
    """The containers this run left once everything was closed (waiting ``grace_s`` for removals still in
    flight), then removed: each as its name, image and state."""

    def left() -> dict[str, Any]:
        return {c.id: c for lb in labels for c in engine.containers.list(all=True, filters={"label": lb})}

    deadline = time.monotonic() + grace_s
    found = left()
    while found and time.monotonic() < deadline:
        time.sleep(0.25)
        found = left()
    named = []
    for c in found.values():
        named.append(f"{c.name} {c.attrs.get('Config', {}).get('Image')} {c.status}")
        with contextlib.suppress(Exception):
            c.remove(force=True)
    return named


def print_table(report: dict[str, Any]) -> None:
    print_steps(report)
    print(
        f"pooled run: {report['pooled_run_pool']}; ready kernels (local): {report['ready_kernels_local']}; "
        f"leaked containers: {report['leaked_containers']} {report['leaked']}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 rounds after 1 warm-up (under two minutes)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--runtime", default="runc", choices=["runc", "runsc"])
    parser.add_argument("--rounds", type=int, help="measured rounds (default 60; 20 with --quick)")
    parser.add_argument("--warmup", type=int, help="untimed rounds first (default 2; 1 with --quick)")
    parser.add_argument("--peers-dir", type=Path, default=None, help="where the peers' venvs live")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (20 if args.quick else 60)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.peers_dir = args.peers_dir or peers_dir()
    import docker  # noqa: PLC0415 - after argument parsing, so --help works without an engine

    engine = docker.from_env()
    try:
        engine.images.get(IMAGE)  # never pulled: build it with scripts/build-image.sh
    except docker.errors.ImageNotFound:
        print(f"sessions.py: the image {IMAGE} is missing; build it with scripts/build-image.sh", file=sys.stderr)
        return 2
    try:
        report = run(args, engine, Progress("sessions", sys.stderr.isatty()))
    finally:
        engine.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0 if report["leaked_containers"] == 0 and not report["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Where the milliseconds of one ``print(2+2)`` run go: each step of the Docker runner timed on its own.

The steps are driven with the runner's own pieces, in the runner's order (``DockerRunner._create_kwargs``,
``_ensure_image``, ``_create_args``, docker-py's low-level API, the supervisor's payload and frame decoder,
``collect.read_frames``), so the sum is what a cold run costs the runner:

    decide     the policy decision for the request (intake, rules, assembly, guard)
    audit      one fsynced record on a JsonlAuditTrail (a run writes three: request, decision, outcome)
    image      inspect the image (``_ensure_image``)
    create     ``create_container``
    attach     ``attach_socket``
    start      ``start``
    payload    write the framed payload to the supervisor's stdin
    wait       read the verified frames until the final one (the supervisor's and the program's start and run)
    inspect    ``inspect_container`` (OOMKilled), only when the runner needs it: no final frame, or exit 137
               without the supervisor's own OOM count (so ``-`` in a normal ``print(2+2)`` run)
    close      close the attach connection (the supervisor then exits)
    remove     ``remove_container(force=True)`` (the engine's AutoRemove may be doing it already)

The same steps are timed in four modes, interleaved (see ``MODES``): ``cold``, and three things a warm pool
could do ahead of the request: ``created`` (create + attach), ``started`` (+ start) and ``warm`` (+ the
program's process, which the supervisor forks first thing, done loading). Each step's p50 over ``--n`` runs;
the floor (``print(2+2)`` sent to an interpreter already running in a container already running); and the
end-to-end ``Gateway.execute`` p50, cold and with the pool, in the same process run.

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/breakdown.py [--n 20] [--runtime runc|runsc] [--json]``
Only the local engine is contacted; every container is labelled with this run's instance and removed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway import Gateway, PoolConfig
from gateway.audit import JsonlAuditTrail
from gateway.decision import evaluate
from gateway.policy import compile_policy, load_policy
from gateway.request import parse_request
from gateway.resources import policies_dir
from gateway.runner.docker.collect import read_frames
from gateway.runner.docker.runner import DockerRunner, _close, _create_args, _raw_socket
from gateway.runner.frames import Collected, FrameDecoder
from gateway.runner.supervisor import encode_payload, new_key

CODE = "print(2+2)"
STEPS = ("decide", "audit", "image", "create", "attach", "start", "payload", "wait", "inspect", "close", "remove")


def _policy(runtime: str) -> Path:
    return policies_dir() / ("strict.yaml" if runtime == "runsc" else "default.yaml")


class Timer:
    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        value = fn()
        self.times.setdefault(name, []).append((time.perf_counter() - start) * 1000)
        return value


MODES = ("cold", "created", "started", "warm")
"""cold: every step on the clock. created: the container was created and attached ahead (start on the clock).
started: created and started ahead (the supervisor waits for the payload). warm: started ahead and left for
0.3 s, so the program's process the supervisor forks first thing has loaded ``site`` too and waits for its go
(what a pooled container that waited for its request looks like)."""


def one_run(runner: DockerRunner, policy: Any, trail: JsonlAuditTrail, timer: Timer, *, mode: str) -> None:
    api = runner.client.api
    compiled = compile_policy(policy)
    request = parse_request({"code": CODE})
    decision = timer.step("decide", lambda: evaluate(compiled, request, assembler=runner.assembler, request_id="b"))
    assert decision.run is not None
    spec = decision.run
    timer.step("audit", lambda: trail.append("policy.decision", {"benchmark": True}))
    kwargs = runner._create_kwargs(spec.options, expires_s=spec.timeout_s)
    ahead = Timer()  # what a pool does before the request: off the clock
    early = timer if mode == "cold" else ahead
    _, _, kwargs["image"] = early.step("image", lambda: runner._ensure_image(spec.image, spec.pull))
    cid = str(early.step("create", lambda: api.create_container(**_create_args(kwargs, api)))["Id"])
    params = {"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}
    sockio = early.step("attach", lambda: api.attach_socket(cid, params=params))
    sock = _raw_socket(sockio)
    (timer if mode in ("cold", "created") else ahead).step("start", lambda: api.start(cid))
    if mode == "warm":
        time.sleep(0.3)  # the interpreter starts while the container waits in the pool
    try:
        key = new_key()
        data = encode_payload(
            key, CODE, {}, spec.output_files_bytes, spec.output_files, env={}, timeout_s=spec.timeout_s
        )
        timer.step("payload", lambda: sock.sendall(data))
        got = Collected()
        deadline = time.monotonic() + spec.timeout_s
        timer.step("wait", lambda: read_frames(sock, FrameDecoder(key), got, spec, deadline))
        if bytes(got.stdout.kept) != b"4\n":
            raise SystemExit(f"unexpected output {bytes(got.stdout.kept)!r} {got.error!r}")
        if got.final is None or (not got.oom_known and got.final["status"] == 137):  # only when the runner does
            timer.step("inspect", lambda: api.inspect_container(cid))
        timer.step("close", lambda: _close(sockio))
    finally:
        timer.step("remove", lambda: runner._remove(cid, quiet=True))


def floor(runner: DockerRunner, image: str, runtime: str, n: int) -> list[float]:
    """``print(2+2)`` in an already running interpreter in an already running container: the floor."""
    api = runner.client.api
    loop = "import sys\nfor line in sys.stdin:\n    exec(line)\n    sys.stdout.flush()\n"
    cid = str(
        api.create_container(
            image, ["python3", "-u", "-c", loop], stdin_open=True, network_disabled=True,
            host_config=api.create_host_config(network_mode="none", runtime=runtime, auto_remove=True),
            labels={"io.agent-gateway.managed": "true", "io.agent-gateway.instance": os.environ["GATEWAY_INSTANCE"]},
        )["Id"]
    )  # fmt: skip
    sockio = api.attach_socket(cid, params={"stdin": 1, "stdout": 1, "stream": 1})
    sock = _raw_socket(sockio)
    api.start(cid)
    out = []
    sock.settimeout(30)  # an answer that never comes fails the benchmark instead of hanging it
    raw = b""
    try:
        for _ in range(n + 2):
            start = time.perf_counter()
            sock.sendall(b"print(2+2)\n")
            # The engine's stream is multiplexed (8-byte header per chunk), and `-u` writes "4" and "\n"
            # separately, which may arrive as two chunks: wait for the program's bytes, not the stream's.
            while _payload(raw) != b"4\n":
                chunk = sock.recv(4096)
                if not chunk:
                    raise SystemExit("the floor's interpreter ended before it answered")
                raw += chunk
            raw = b""
            out.append((time.perf_counter() - start) * 1000)
    finally:
        _close(sockio)
        runner._remove(cid, quiet=True)
    return out[2:]


def _payload(raw: bytes) -> bytes:
    """The bytes of the complete chunks of a multiplexed attach stream, headers removed."""
    data = b""
    while len(raw) >= 8:
        size = int.from_bytes(raw[4:8], "big")
        if len(raw) < 8 + size:
            break
        data += raw[8 : 8 + size]
        raw = raw[8 + size :]
    return data


def end_to_end(gw: Gateway, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        result = gw.execute({"code": CODE})
        out.append((time.perf_counter() - start) * 1000)
        if result.to_dict()["stdout"] != "4\n":
            raise SystemExit(f"gateway run failed: {json.dumps(result.to_dict())[:300]}")
        if gw.pool is not None:
            gw.pool.wait_ready(timeout_s=10)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--runtime", default="runc", choices=["runc", "runsc"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("GATEWAY_INSTANCE", f"bench-breakdown-{os.getpid()}")
    policy = load_policy(_policy(args.runtime))
    runner = DockerRunner()
    report: dict[str, Any] = {"runtime": args.runtime, "n": args.n}
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        trail = JsonlAuditTrail(Path(tmp) / "steps")
        timers = {mode: Timer() for mode in MODES}
        one_run(runner, policy, trail, Timer(), mode="cold")  # warm-up
        for _ in range(args.n):
            for mode in MODES:  # interleaved: machine drift hits every mode alike
                one_run(runner, policy, trail, timers[mode], mode=mode)
        trail.close()
        for mode, timer in timers.items():
            steps = {s: round(statistics.median(timer.times[s]), 1) for s in STEPS if s in timer.times}
            report[mode] = {"steps_p50_ms": steps, "sum_ms": round(sum(steps.values()) + 2 * steps["audit"], 1)}
        report["floor_p50_ms"] = round(statistics.median(floor(runner, policy.images.default, args.runtime, args.n)), 1)
        with Gateway.from_env(_policy(args.runtime), Path(tmp) / "cold") as gw:
            end_to_end(gw, 2)
            report["gateway_cold_p50_ms"] = round(statistics.median(end_to_end(gw, args.n)), 1)
        with Gateway.from_env(_policy(args.runtime), Path(tmp) / "pool", pool=PoolConfig(size=2)) as gw:
            assert gw.pool is not None
            gw.pool.wait_ready(timeout_s=60)
            end_to_end(gw, 2)
            report["gateway_pool_p50_ms"] = round(statistics.median(end_to_end(gw, args.n)), 1)
    runner.close()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"runtime={args.runtime} n={args.n}  (p50 ms per step; 'sum' counts the three audit records)")
    print(f"{'step':<10}" + "".join(f"{m:>9}" for m in MODES))
    for step in STEPS:
        print(f"{step:<10}" + "".join(f"{report[m]['steps_p50_ms'].get(step, '-')!s:>9}" for m in MODES))
    print(f"{'sum':<10}" + "".join(f"{report[m]['sum_ms']!s:>9}" for m in MODES))
    print(f"floor (print(2+2) in a running interpreter in a running container): {report['floor_p50_ms']} ms")
    print(f"Gateway.execute p50: cold {report['gateway_cold_p50_ms']} ms, pool {report['gateway_pool_p50_ms']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

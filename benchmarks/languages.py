"""Latency per language: ``echo 4`` in shell and ``console.log(2+2)`` in Node next to Python's ``print(2+2)``,
cold and pooled through the gateway, against the plain ``docker run`` CLI of the same image, in one run (issue 30).

Every language runs under ``policies/examples/polyglot.yaml`` (for ``--runtime runsc``, a policy of this run
that extends it and allows runsc only), interleaved round by round with the order rotated, so drift in the
machine's load hits every step alike. Per language:

- ``<language>_cold``: ``Gateway.execute`` of ``{"code": ..., "language": ...}`` with no pool: a hardened
  single-use container created, started, run and removed on the request's path;
- ``<language>_pooled``: the same through a gateway with a warm pool (size 2 per profile; each language is a
  profile of its own, its interpreter started ahead, warmed once the warm-up asked for it); the benchmark waits,
  untimed, until every profile has refilled before the step, so every timed run is a hit (``pool`` in the report
  counts the statuses);
- ``<language>_docker_cli``: ``docker run --rm --network none --runtime RUNTIME IMAGE`` with ``python3 -c
  'print(2+2)'``, ``bash -c 'echo 4'`` or ``node -e 'console.log(2+2)'`` (none of the gateway's hardening);
- ``python_pooled_fresh``: Python's pooled step with ``LANG`` in the request's ``env``, which makes the
  supervisor start a fresh ``python3`` after the payload instead of handing the program to its pre-forked
  interpreter: Python as every other language runs in a pooled container.

Then, once and untimed by the rounds, ``startup``: each interpreter's own start-up inside one running container
of its image (``python3 -c 0``, ``bash -c :``, ``node -e 0``, timed by a Python loop in the container), the
floor that a language whose interpreter is started fresh pays on every pooled run.

Printed: p50 and p95 per step, the ratios of the same run and the issue's targets with whether each was met
(each language's pooled p50 at most 1.3 x Python's pooled p50; its cold p50 at most its image's ``docker run``
p50); ``--json`` prints one JSON object. Progress goes to stderr when it is a terminal. Every container the
run started is removed at the end (the count left behind is reported: it must be 0).

Under runsc, Node's ``docker run`` drops seccomp (``--security-opt seccomp=unconfined``): this host's runsc
(2022-12-19) answers the engine default profile's clone3 rule (ENOSYS) with EPERM, on which glibc does not fall
back, so node cannot start a thread and aborts (the gateway's own profile answers clone3 by ``SCMP_ACT_TRACE``,
which runs). No filter is at most as much work as one, so the baseline can only get faster.

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/languages.py [--quick] [--json] [--runtime runsc]
[--languages python,shell,javascript] [--rounds N] [--warmup N]``
Only the local engine is contacted; the images are never pulled (build them with ``scripts/build-image.sh``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cases import EXPECTED, Progress, gateway_failure, print_steps, run_info
from peers import RUN_LABEL
from sessions import private_slots, summarize, sweep

from gateway import Gateway, PoolConfig
from gateway.resources import policies_dir
from gateway.runner.docker.options import INSTANCE_LABEL

PYTHON_IMAGE = "gateway/sandbox-python:3.11-bookworm"
NODE_IMAGE = "gateway/sandbox-node:24-bookworm"
POLICY = policies_dir() / "examples" / "polyglot.yaml"
POOLED_BOUND = 1.3
"""A language's pooled p50 over Python's, at most (issue 30)."""
COLD_BOUND = 1.0
"""A language's cold p50 over its image's plain ``docker run`` p50, at most (issue 30)."""
STARTUP_RUNS = 20


@dataclass(frozen=True)
class Language:
    name: str
    code: str
    image: str
    """The image ``polyglot.yaml`` gives the language by default (the ``docker run`` case uses the same)."""
    cli: tuple[str, ...]
    """The command of the plain ``docker run`` case."""
    startup: tuple[str, ...]
    """The interpreter doing nothing: its start-up alone."""
    env: tuple[tuple[str, str], ...] = ()
    """The request's ``env``."""


LANGUAGES = (
    Language("python", "print(2+2)", PYTHON_IMAGE, ("python3", "-c", "print(2+2)"), ("python3", "-c", "0")),
    Language("shell", "echo 4", PYTHON_IMAGE, ("bash", "-c", "echo 4"), ("bash", "-c", ":")),
    Language("javascript", "console.log(2+2)", NODE_IMAGE, ("node", "-e", "console.log(2+2)"), ("node", "-e", "0")),
)
FRESH_PYTHON = Language("python", "print(2+2)", PYTHON_IMAGE, (), (), env=(("LANG", "C.UTF-8"),))
"""Python without the pre-forked interpreter: a request setting ``LANG`` (read only while an interpreter starts)
gets a python3 started for it after the payload, as every other language's interpreter is."""
Step = Callable[[], None]


def policy_for(runtime: str, work: Path) -> Path:
    """``polyglot.yaml`` for runc (it inherits the default's runc only); for runsc a policy of this run
    extending it with runsc allowed and the default, and strict.yaml's pids (gVisor's own threads count)."""
    if runtime == "runc":
        return POLICY
    path = work / "polyglot-runsc.yaml"
    path.write_text(
        "apiVersion: gateway.agent-exec/v1\nkind: Policy\n"
        f"extends: {json.dumps(str(POLICY))}\n"
        "metadata: {name: polyglot-runsc}\n"
        "spec:\n  runtime: {allowed: [runsc], default: runsc}\n  limits:\n    pids: {default: 256, max: 256}\n",
        encoding="utf-8",
    )
    return path


def gateway_step(gw: Gateway, lang: Language, pool: dict[str, int] | None = None) -> Step:
    request: dict[str, Any] = {"code": lang.code, "language": lang.name}
    if lang.env:
        request["env"] = dict(lang.env)

    def run() -> None:
        data = gw.execute(request).to_dict()
        if data.get("stdout") != EXPECTED:
            raise SystemExit(f"{lang.name} through the gateway failed: {gateway_failure(data)}")
        if pool is not None:
            status = str(data.get("pool"))
            pool[status] = pool.get(status, 0) + 1

    return run


def plain_run(runtime: str, label: str, image: str) -> list[str]:
    """``docker run`` of ``image`` with none of the gateway's hardening (Node's under runsc without seccomp:
    its threads cannot start otherwise, see the module docstring)."""
    argv = ["docker", "run", "--rm", "--network", "none", "--runtime", runtime, "--label", label]
    if runtime == "runsc" and image == NODE_IMAGE:
        argv += ["--security-opt", "seccomp=unconfined"]
    return [*argv, image]


def docker_cli_step(lang: Language, runtime: str, label: str) -> Step:
    argv = plain_run(runtime, label, lang.image) + list(lang.cli)

    def run() -> None:
        proc = subprocess.run(argv, capture_output=True, check=False)
        if proc.stdout.decode(errors="replace") != EXPECTED:
            raise SystemExit(f"docker run of {lang.name} failed: {proc.stderr.decode(errors='replace')[:400]}")

    return run


def measure(
    steps: dict[str, Step], *, settle: dict[str, Callable[[], None]], rounds: int, warmup: int,
    progress: Callable[[str], None],
) -> dict[str, list[float]]:  # fmt: skip
    """Rounds of every step (the order rotated each round); ``settle[step]`` runs, untimed, right before its
    step. Milliseconds per step; a failing step stops the run (its message says what it got)."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for i in range(warmup + rounds):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            progress(f"round {i + 1}/{warmup + rounds}{' (warm-up)' if i < warmup else ''}: {name}")
            if name in settle:
                settle[name]()
            start = time.perf_counter()
            steps[name]()
            if i >= warmup:
                times[name].append((time.perf_counter() - start) * 1000)
    return times


STARTUP_PROBE = """
import json, statistics, subprocess, sys, time
out = {}
for argv in json.loads(sys.argv[1]):
    ms = []
    for _ in range(int(sys.argv[2])):
        t = time.perf_counter()
        subprocess.run(argv, check=True)
        ms.append((time.perf_counter() - t) * 1000)
    out[argv[0]] = round(statistics.median(ms), 2)
print(json.dumps(out))
"""


def interpreter_startup(
    runtime: str, label: str, langs: tuple[Language, ...], runs: int = STARTUP_RUNS
) -> dict[str, float]:
    """p50 ms of each language's interpreter doing nothing, started ``runs`` times by a Python loop inside one
    running container of its image (no engine on the path: the interpreter's own start-up)."""
    found: dict[str, float] = {}
    for image in dict.fromkeys(lang.image for lang in langs):
        argvs = [list(lang.startup) for lang in langs if lang.image == image]
        argv = [*plain_run(runtime, label, image), "python3", "-c", STARTUP_PROBE, json.dumps(argvs), str(runs)]
        proc = subprocess.run(argv, capture_output=True, check=False, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"the start-up probe in {image} failed: {proc.stderr[:400]}")
        for name, ms in json.loads(proc.stdout).items():
            found[f"{name} ({image.split('/')[-1]})"] = ms
    return found


def targets(steps: dict[str, dict[str, float]]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Ratios of p50s of the same run, and the issue's targets with whether each was met (for the languages
    that ran: Python, the baseline, always does)."""
    ratios: dict[str, float] = {}
    found: list[dict[str, Any]] = []
    python_pooled = steps["python_pooled"]["p50_ms"]
    for lang in (lang for lang in LANGUAGES if f"{lang.name}_cold" in steps):
        cold = steps[f"{lang.name}_cold"]["p50_ms"] / steps[f"{lang.name}_docker_cli"]["p50_ms"]
        ratios[f"{lang.name}_cold / {lang.name}_docker_cli p50"] = round(cold, 3)
        ratios[f"{lang.name}_pooled / {lang.name}_cold p50"] = round(
            steps[f"{lang.name}_pooled"]["p50_ms"] / steps[f"{lang.name}_cold"]["p50_ms"], 3
        )
        if lang.name == "python":
            continue
        pooled = steps[f"{lang.name}_pooled"]["p50_ms"] / python_pooled
        ratios[f"{lang.name}_pooled / python_pooled p50"] = round(pooled, 3)
        found.append({"target": f"{lang.name} pooled p50 / python pooled p50", "value": round(pooled, 3),
                      "bound": POOLED_BOUND, "met": pooled <= POOLED_BOUND})  # fmt: skip
        found.append({"target": f"{lang.name} cold p50 / docker run {lang.image} p50", "value": round(cold, 3),
                      "bound": COLD_BOUND, "met": cold <= COLD_BOUND})  # fmt: skip
    if "python_pooled_fresh" in steps:
        ratios["python_pooled_fresh / python_pooled p50"] = round(
            steps["python_pooled_fresh"]["p50_ms"] / python_pooled, 3
        )
    return ratios, found


def run(args: argparse.Namespace, engine: Any, progress: Progress) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:12]
    instance = f"bench-languages-{run_id}"
    os.environ["GATEWAY_INSTANCE"] = instance  # this process's gateways: their containers found by it afterwards
    label = f"{RUN_LABEL}={run_id}"
    started, load_before = datetime.now(UTC), os.getloadavg()
    langs: tuple[Language, ...] = args.languages
    pool: dict[str, dict[str, int]] = {lang.name: {} for lang in langs} | {"python_pooled_fresh": {}}
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gateway-bench-languages-")))
        stack.enter_context(private_slots(work, 8))
        policy = policy_for(args.runtime, work)
        progress("starting the gateways (the pool filling)")
        cold_gw = stack.enter_context(Gateway.from_env(policy, work / "audit-cold"))
        size = 2
        pooled_gw = stack.enter_context(
            Gateway.from_env(policy, work / "audit-pool", pool=PoolConfig(size=size, min=size, burst="cold"))
        )
        warm = pooled_gw.pool
        if warm is None or not warm.wait_ready(timeout_s=60):
            raise SystemExit("languages.py: the warm pool did not fill in 60 s")

        def refilled() -> None:
            if not warm.wait_ready(timeout_s=60):
                raise SystemExit("languages.py: the warm pool did not refill in 60 s")
            time.sleep(0.05)  # as latency.py: the refill's own engine calls settle before the timed step

        steps: dict[str, Step] = {}
        settle: dict[str, Callable[[], None]] = {}
        for lang in langs:
            steps[f"{lang.name}_cold"] = gateway_step(cold_gw, lang)
            steps[f"{lang.name}_pooled"] = gateway_step(pooled_gw, lang, pool[lang.name])
            settle[f"{lang.name}_pooled"] = refilled
            steps[f"{lang.name}_docker_cli"] = docker_cli_step(lang, args.runtime, label)
        # Python as the other languages run: ``LANG`` set, so the supervisor starts a fresh python3 for it.
        steps["python_pooled_fresh"] = gateway_step(pooled_gw, FRESH_PYTHON, pool["python_pooled_fresh"])
        settle["python_pooled_fresh"] = refilled
        clock = time.monotonic()
        times = measure(steps, settle=settle, rounds=args.rounds, warmup=args.warmup, progress=progress)
        measured_s = round(time.monotonic() - clock, 1)
        progress("interpreter start-up inside a running container")
        startup = interpreter_startup(args.runtime, label, langs)
        progress("closing the gateways")
    progress.done()
    leaked = sweep(engine, [label, f"{INSTANCE_LABEL}={instance}"])
    summary = summarize(times)
    ratios, found = targets(summary)
    return {
        "info": run_info(
            args,
            engine,
            started,
            load_before,
            measured_s,
            pool_size=size,
            policy=policy.name,
            languages=[lang.name for lang in langs],
            images=sorted({lang.image for lang in langs}),
        ),
        "steps": summary,
        "ratios": ratios,
        "targets": found,
        "startup_p50_ms": startup,
        "pool": pool,
        "leaked_containers": len(leaked),
        "leaked": leaked,
    }


def print_table(report: dict[str, Any]) -> None:
    print_steps(report)
    startup = ", ".join(f"{name} {ms} ms" for name, ms in report["startup_p50_ms"].items())
    print(f"interpreter start-up p50 inside a running container: {startup}")
    print(f"pool statuses: {report['pool']}; leaked containers: {report['leaked_containers']} {report['leaked']}")


def languages_arg(text: str) -> tuple[Language, ...]:
    """``--languages``: names of :data:`LANGUAGES`, Python (every target's baseline) always measured."""
    known = {lang.name: lang for lang in LANGUAGES}
    names = {name.strip() for name in text.split(",") if name.strip()} | {"python"}
    unknown = sorted(names - set(known))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {unknown}; the languages are {', '.join(known)}")
    return tuple(lang for lang in LANGUAGES if lang.name in names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 rounds after 1 warm-up")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--runtime", default="runc", choices=["runc", "runsc"])
    parser.add_argument("--rounds", type=int, help="measured rounds (default 20; 8 with --quick)")
    parser.add_argument("--warmup", type=int, help="untimed rounds first (default 2; 1 with --quick)")
    parser.add_argument(
        "--languages",
        type=languages_arg,
        default=LANGUAGES,
        help="comma-separated, python always among them (default: python,shell,javascript)",
    )
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (8 if args.quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    import docker  # noqa: PLC0415 - after argument parsing, so --help works without an engine

    engine = docker.from_env()
    try:
        for image in sorted({lang.image for lang in args.languages}):
            try:
                engine.images.get(image)  # never pulled
            except docker.errors.ImageNotFound:
                print(f"languages.py: the image {image} is missing; build it with scripts/build-image.sh",
                      file=sys.stderr)  # fmt: skip
                return 2
        report = run(args, engine, Progress("languages", sys.stderr.isatty()))
    finally:
        engine.close()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0 if report["leaked_containers"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

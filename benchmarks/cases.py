"""The ways to run ``print(2+2)`` that the latency and peers benchmarks share (one place, imported by both).

- :func:`gateway_case`: ``Gateway.execute`` with the default policy (``policies/strict.yaml`` for runsc);
- :func:`docker_cli`: the ``docker run`` CLI, plain (``--network none``) or, given the gateway's own profile
  options (:func:`gateway_profile_options`), with the same hardening turned into CLI flags
  (:func:`cli_flags`);
- :func:`lesson_helper`: the lesson's docker-py helper (``containers.run(..., remove=True,
  network_disabled=True, mem_limit="256m")``).

Every runner raises ``SystemExit`` with what it got when the output is not ``4\\n``: a benchmark never counts
a failed run as a fast one. Only the local engine is contacted; the image is never pulled.

:func:`run_info` and :func:`print_steps` are the report's parts that the sessions and languages benchmarks share;
:class:`Progress` is the progress line of the peers, sessions, languages and egress benchmarks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway import Gateway
from gateway.resources import policies_dir
from gateway.runner.docker.options import profile_options

IMAGE = "gateway/sandbox-python:3.11-bookworm"
CODE = "print(2+2)"
EXPECTED = "4\n"


def policy_for(runtime: str) -> Path:
    """The policy the gateway cases use: the default allows runc only, ``strict.yaml`` requires runsc."""
    return policies_dir() / ("strict.yaml" if runtime == "runsc" else "default.yaml")


def gateway_case(
    runtime: str, audit_dir: Path, *, policy: Path | None = None
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(run once, close) for the full gateway path with ``policy`` (default: :func:`policy_for`)."""
    gw = Gateway.from_env(policy or policy_for(runtime), audit_dir)
    request = {"code": CODE}

    def via_gateway() -> None:
        data = gw.execute(request).to_dict()
        if data.get("stdout") != EXPECTED:
            raise SystemExit(f"gateway run failed: {gateway_failure(data)}")

    return via_gateway, gw.close


def gateway_failure(data: Mapping[str, Any]) -> str:
    """What went wrong in a result (``to_dict()``), short enough for a report line."""
    parts = [f"exit_status {data.get('exit_status')}", f"allowed {data.get('allowed')}"]
    if data.get("error"):
        parts.append(f"error {json.dumps(data['error'])[:300]}")
    if data.get("violations"):
        parts.append(f"violations {json.dumps(data['violations'])[:300]}")
    parts.append(f"stdout {str(data.get('stdout'))[:100]!r} stderr {str(data.get('stderr'))[:200]!r}")
    return "; ".join(parts)


def gateway_profile_options(runtime: str, audit_dir: Path) -> dict[str, Any]:
    """The profile part of the options the gateway assembles for ``{"code": CODE}`` under ``runtime``: what the
    hardened CLI case reproduces (the decision is taken, and audited, once; nothing runs)."""
    with Gateway.from_env(policy_for(runtime), audit_dir) as gw:
        result = gw.decide({"code": CODE})
    if result.decision is None or not result.decision.allowed:
        raise SystemExit(f"the gateway denied the benchmark request: {json.dumps(result.to_dict())[:400]}")
    return profile_options(result.decision.settings.profile)


def cli_flags(options: Mapping[str, Any], seccomp_dir: Path) -> list[str]:
    """``docker run`` flags for assembled docker-py options (the image excluded).

    An inline seccomp profile is written to ``seccomp_dir`` (the CLI takes a file and sends its JSON, the same
    bytes the API receives). ``network_disabled`` has no CLI flag: the CLI's ``--network none`` still sets up
    an (empty) network namespace the engine wires, one of the reasons the gateway's create is faster.
    Unknown keys raise, so the CLI case can never silently run with less hardening than it claims."""
    flags: list[str] = ["--rm"]
    for key, value in options.items():
        if key in ("image", "network_disabled", "labels"):
            continue
        if key == "user":
            flags += ["--user", str(value)]
        elif key == "working_dir":
            flags += ["--workdir", str(value)]
        elif key == "network_mode":
            flags += ["--network", str(value)]
        elif key == "read_only":
            flags += ["--read-only"] if value else []
        elif key == "cap_drop":
            for cap in value:
                flags += ["--cap-drop", str(cap)]
        elif key == "security_opt":
            flags += _security_flags(value, seccomp_dir)
        elif key == "mem_limit":
            flags += ["--memory", f"{int(value)}b"]
        elif key == "memswap_limit":
            flags += ["--memory-swap", f"{int(value)}b"]
        elif key == "nano_cpus":
            flags += ["--cpus", f"{int(value) / 1e9:g}"]
        elif key == "pids_limit":
            flags += ["--pids-limit", str(value)]
        elif key == "tmpfs":
            for target, opts in value.items():
                flags += ["--tmpfs", f"{target}:{opts}"]
        elif key == "ulimits":
            for limit in value:
                flags += ["--ulimit", f"{limit['name']}={limit['soft']}:{limit['hard']}"]
        elif key == "init":
            flags += ["--init"] if value else []
        elif key == "ipc_mode":
            flags += ["--ipc", str(value)]
        elif key == "cgroupns":
            flags += ["--cgroupns", str(value)]
        elif key == "hostname":
            flags += ["--hostname", str(value)]
        elif key == "runtime":
            flags += ["--runtime", str(value)]
        else:
            raise SystemExit(f"cli_flags: no CLI flag for option {key!r}")
    for name, value in dict(options.get("labels", {})).items():
        flags += ["--label", f"{name}={value}"]
    return flags


def _security_flags(security_opt: list[str], seccomp_dir: Path) -> list[str]:
    flags: list[str] = []
    for opt in security_opt:
        flag = opt
        if opt.startswith("seccomp="):
            path = seccomp_dir / "gateway-seccomp.json"
            path.write_text(opt[len("seccomp=") :], encoding="utf-8")
            flag = f"seccomp={path}"
        flags += ["--security-opt", flag]
    return flags


def docker_cli(runtime: str, flags: list[str] | None = None) -> Callable[[], None]:
    """``docker run`` through the CLI: ``flags`` (from :func:`cli_flags`) or, with none, only ``--rm --network
    none --runtime RUNTIME``."""
    argv = ["docker", "run", *(flags if flags is not None else ["--rm", "--network", "none", "--runtime", runtime])]
    argv += [IMAGE, "python3", "-c", CODE]

    def run() -> None:
        proc = subprocess.run(argv, capture_output=True, check=False)
        if proc.stdout.decode(errors="replace") != EXPECTED:
            raise SystemExit(f"docker run failed: {proc.stderr.decode(errors='replace')[:400]}")

    return run


def lesson_helper(client: Any, runtime: str, labels: Mapping[str, str] | None = None) -> Callable[[], None]:
    """The lesson's helper (``labels``, when given, only let a benchmark find what it left behind)."""
    extra = {"labels": dict(labels)} if labels else {}

    def run_in_sandbox() -> None:
        # The lesson's shape, shell quoting included (it is the baseline, not something we ship).
        quoted = CODE.replace('"', '\\"')
        output = client.containers.run(
            IMAGE,
            f'python3 -c "{quoted}"',
            remove=True,
            network_disabled=True,
            mem_limit="256m",
            runtime=runtime,
            **extra,
        )
        if output != EXPECTED.encode():
            raise SystemExit(f"lesson helper failed: {output!r}")

    return run_in_sandbox


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in 0..1) of a non-empty list."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class Progress:
    """One updating line on stderr, the benchmark's ``name`` and the seconds since the start before each message,
    when ``enabled`` (stderr is a terminal); silent otherwise."""

    def __init__(self, name: str, enabled: bool) -> None:
        self.name = name
        self.enabled = enabled
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        if self.enabled:
            line = f"[{self.name} {time.monotonic() - self.start:6.1f}s] {message}"
            sys.stderr.write("\r\033[K" + line[:160])
            sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def cpus() -> int:
    return len(os.sched_getaffinity(0))


def run_info(
    args: argparse.Namespace, engine: Any, started: datetime, load_before: tuple[float, float, float],
    measured_s: float, **fields: Any,
) -> dict[str, Any]:  # fmt: skip
    """A report's ``info``: when the run started and how long it took, its ``--runtime``, ``--rounds`` and
    ``--warmup``, the run's own ``fields``, then the machine, the engine's version and the load around the run."""
    return {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round((datetime.now(UTC) - started).total_seconds(), 1),
        "measured_seconds": measured_s,
        "runtime": args.runtime,
        "rounds": args.rounds,
        "warmup": args.warmup,
        **fields,
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "docker": engine.version().get("Version"),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }


def print_steps(report: Mapping[str, Any]) -> None:
    """A report's head as a table: the run's line, each step's p50, p95 and count, each failed case's error
    (``errors``, where the report has them), the ratios and the targets."""
    info = report["info"]
    print(f"{info['date']}  {info['runtime']}  rounds {info['rounds']}  load {info['load_avg_before']} -> "
          f"{info['load_avg_after']}  {info['seconds']} s")  # fmt: skip
    print(f"{'step':<24} {'p50 ms':>9} {'p95 ms':>9} {'n':>4}")
    for step, row in report["steps"].items():
        print(f"{step:<24} {row['p50_ms']:>9} {row['p95_ms']:>9} {row['n']:>4}")
    for name, error in report.get("errors", {}).items():
        print(f"{name:<24} error: {error[:200]}")
    for key, value in report["ratios"].items():
        print(f"{key}: {value}")
    for t in report["targets"]:
        print(f"target {t['target']}: {t['value']} (bound {t['bound']}) met={t['met']}")

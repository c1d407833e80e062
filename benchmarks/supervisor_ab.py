"""A/B of the in-sandbox supervisor: another version's against this one, cold ``Gateway.execute`` runs interleaved.

The other version is a ``supervisor.py`` file (e.g. ``git show REV:gateway/runner/supervisor.py >
/tmp/old_supervisor.py``; ``gateway/runner/docker/supervisor.py`` before issue 27) whose frame protocol is this
one's: its ``encode_payload`` and ``supervisor_command`` are swapped into the Docker runner for every other run,
everything else is the same Gateway, engine and process. Per version: the end-to-end p50 and the p50 of the
runner's three stages (``prepare``: create, attach, start; ``run``: payload to final frame, where the
supervisor's start-up is; ``remove``).

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/supervisor_ab.py --old /tmp/old_supervisor.py [--runtime
runsc] [--n 10]``
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cases import CODE, EXPECTED, policy_for

import gateway.runner.docker.runner as docker_runner
from gateway import Gateway
from gateway.runner import supervisor as current


def load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("old_supervisor", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_supervisor"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the other version's supervisor.py")
    parser.add_argument("--runtime", default="runsc", choices=["runc", "runsc"])
    parser.add_argument("--n", type=int, default=10)
    args = parser.parse_args(argv)
    os.environ.setdefault("GATEWAY_INSTANCE", f"bench-supervisor-ab-{os.getpid()}")
    versions = {"old": load(args.old), "new": current}
    mode = ["warm-up"]
    steps: dict[str, list[float]] = {}
    totals: dict[str, list[float]] = {name: [] for name in versions}
    with (
        tempfile.TemporaryDirectory(prefix="gateway-bench-ab-") as tmp,
        Gateway.from_env(policy_for(args.runtime), Path(tmp)) as gw,
    ):
        runner: Any = gw.runner

        def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*a: Any, **k: Any) -> Any:
                start = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    steps.setdefault(f"{mode[0]} {name}", []).append((time.perf_counter() - start) * 1000)

            return wrapper

        runner.prepare = timed("prepare", runner.prepare)
        runner._run = timed("run", runner._run)
        runner._destroy = timed("remove", runner._destroy)
        for i in range(args.n + 1):
            for name in ("old", "new") if i % 2 else ("new", "old"):
                docker_runner.encode_payload = versions[name].encode_payload  # type: ignore[attr-defined]
                docker_runner.supervisor_command = versions[name].supervisor_command  # type: ignore[attr-defined]
                mode[0] = name if i else "warm-up"
                start = time.perf_counter()
                data = gw.execute({"code": CODE}).to_dict()
                if data.get("stdout") != EXPECTED:
                    raise SystemExit(f"{name}: the run failed: {data}")
                if i:
                    totals[name].append((time.perf_counter() - start) * 1000)
    print(f"runtime={args.runtime} n={args.n} load={[round(x, 1) for x in os.getloadavg()]}")
    for name in versions:
        parts = "  ".join(
            f"{step} {statistics.median(steps[f'{name} {step}']):.1f}" for step in ("prepare", "run", "remove")
        )
        print(f"{name}: end to end {statistics.median(totals[name]):.1f} ms  ({parts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

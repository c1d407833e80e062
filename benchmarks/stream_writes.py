"""Tiny writes streamed: what a ``gateway serve`` process spends relaying a program's 1-byte writes as
server-sent events.

One principal runs, ``--runs`` times, a program that writes ``--writes`` single bytes to stdout, flushing each
and pausing ``--pause-ms`` after each (so that most writes reach the service on their own), as a streamed
execution (``Accept: text/event-stream``); the script reads every event and prints per run the number of
``stdout`` events, the server process's CPU time (user + system, all its threads, from ``/proc/PID/stat``) and
the wall time, and checks that the streamed text is the result's stdout. Only loopback and the local engine are
contacted.

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/stream_writes.py [--writes 10000] [--runs 3] [--pause-ms 0.2]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import gateway_serve  # the benchmark's own server helper, next to this file

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def stream(client: httpx.Client, base: str, code: str) -> tuple[int, str, dict[str, object]]:
    """Run ``code`` streamed; the number of stdout events, their joined text and the result."""
    events, text, result = 0, [], {}
    name = ""
    body = {"code": code}
    with client.stream("POST", f"{base}/v1/executions", json=body, headers={"Accept": "text/event-stream"}) as got:
        got.raise_for_status()
        for line in got.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                if name == "stdout":
                    events += 1
                    text.append(data)
                elif name == "result":
                    result = data
    return events, "".join(text), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pause-ms", type=float, default=0.2)
    args = parser.parse_args()
    code = (
        f"import sys, time\nfor _ in range({args.writes}):\n    sys.stdout.write('x')\n    sys.stdout.flush()\n"
        f"    time.sleep({args.pause_ms / 1000})\n"
    )
    cpus = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        gateway_serve(Path(tmp), dict(os.environ), None) as (base, token, pid),
        httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=180) as client,
    ):
        stream(client, base, "print(1)")  # warm-up: the image and the first run's imports
        for _ in range(args.runs):
            cpu0, wall0 = cpu_s(pid), time.perf_counter()
            events, text, result = stream(client, base, code)
            cpu, wall = cpu_s(pid) - cpu0, time.perf_counter() - wall0
            if text != result.get("stdout") or len(text) != args.writes:
                raise SystemExit(f"the streamed text is not the result's stdout ({len(text)} bytes streamed)")
            cpus.append(cpu)
            print(f"{args.writes} writes: {events} stdout events, server CPU {cpu:.2f} s, wall {wall:.2f} s")
    print(f"server CPU median {statistics.median(cpus):.2f} s over {args.runs} runs")


if __name__ == "__main__":
    main()

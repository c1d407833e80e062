"""Idle connections as an attack: how many authenticated requests a ``gateway serve`` process answers while a
client holds ``--idle`` connections open and sends nothing on them.

The attacker opens ``--idle`` connections to the service and writes nothing; every connection the server closes
(at its head deadline, or to make room) is opened again at once, so the attacker keeps holding what it can for
the whole run. Meanwhile ``--victims`` authenticated ``GET /v1/policy`` requests, one after another, each on a
new connection (as a new client comes); the script prints how many got 200, their latency, and how often the
attacker had to reconnect. Run it with ``--max-headless-connections`` equal to ``--max-connections`` for the
service before the head-less bound (idle connections then fill the whole bound, as before), and without it for
the default (a quarter of ``--max-connections``; the oldest head-less connection gives way). Only loopback is
contacted.

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/idle_connections.py [--idle 4096] [--victims 92]
[--max-connections 4096] [--max-headless-connections N]``
"""

from __future__ import annotations

import argparse
import resource
import selectors
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import gateway_serve_with  # the benchmark's own server helper, next to this file


def hold(port: int, count: int, stop: threading.Event, reopened: list[int]) -> None:
    """Keep ``count`` idle connections open until ``stop``: each one the server closes is opened again."""
    selector = selectors.DefaultSelector()

    def open_one() -> None:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            return
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)

    for _ in range(count):
        open_one()
    try:
        while not stop.is_set():
            for key, _ in selector.select(timeout=0.1):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                selector.unregister(sock)
                sock.close()  # closed by the server (or answered 503 and closed)
                reopened[0] += 1
                open_one()
            missing = count - len(selector.get_map())
            for _ in range(missing):  # a connect that failed: try again
                open_one()
    finally:
        for key in list(selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        selector.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, default=4096)
    parser.add_argument("--victims", type=int, default=92)
    parser.add_argument("--max-connections", type=int, default=4096)
    parser.add_argument("--max-headless-connections", type=int)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * args.idle + 256
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))  # the server inherits it
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        settings = {"max_connections": args.max_connections}
        if args.max_headless_connections is not None:
            settings["max_headless_connections"] = args.max_headless_connections
        with gateway_serve_with(work, settings) as (base, token, _pid):
            port = int(base.rsplit(":", 1)[1])
            stop, reopened = threading.Event(), [0]
            attacker = threading.Thread(target=hold, args=(port, args.idle, stop, reopened), daemon=True)
            attacker.start()
            time.sleep(3)  # the attacker holds its connections
            ok, latencies, failures = 0, [], {}
            try:
                for _ in range(args.victims):
                    started = time.perf_counter()
                    try:
                        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as client:
                            status = client.get(f"{base}/v1/policy").status_code
                    except httpx.HTTPError as exc:
                        status = type(exc).__name__
                    latencies.append((time.perf_counter() - started) * 1000)
                    ok += status == 200
                    if status != 200:
                        failures[str(status)] = failures.get(str(status), 0) + 1
            finally:
                stop.set()
                attacker.join(timeout=60)
    quantiles = statistics.quantiles(latencies, n=20, method="inclusive")  # never past the largest
    print(
        f"idle {args.idle}, max_connections {args.max_connections}, "
        f"max_headless_connections {args.max_headless_connections or 'default'}: "
        f"{ok}/{args.victims} victims answered 200 (failures {failures or 'none'}); "
        f"latency p50 {statistics.median(latencies):.1f} ms, p95 {quantiles[18]:.1f} ms, "
        f"max {max(latencies):.1f} ms; attacker reconnected {reopened[0]} times"
    )


if __name__ == "__main__":
    main()

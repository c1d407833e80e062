"""A victim's executions while another principal floods ``gateway serve`` with long runs, both under the default
quotas (``max_concurrent`` 8, above the service's bound): issue 28, M6.

mallory sends ``--flood`` runs of ``--run-s`` seconds over bare sockets and waits until the service holds them;
then victim sends ``print(1)`` executions one at a time, ``--victim`` of them, and the script reports each one's
latency and how many slots mallory held meanwhile. At the end mallory's sockets are closed (her running runs are
cancelled, her waiting ones leave the queue) and the server stops. Only loopback is contacted.

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/execution_shares.py [--bound 2] [--flood 6] [--run-s 20]
[--victim 3] [--json]``
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.service.config import ServerConfig
from gateway.service.principals import PrincipalsStore
from gateway.service.service import Service

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import serve_in_thread  # the benchmark's own server helper, next to this file


def _hold(port: int, token: str, run_s: float) -> socket.socket:
    """One long execution whose answer is never read: it stays in the service until the socket is closed."""
    code = f"import time; time.sleep({run_s})"
    body = json.dumps({"code": code, "limits": {"timeout_s": int(run_s) + 5}}).encode()
    head = (
        f"POST /v1/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(head.encode() + body)
    return sock


def measure(bound: int, flood: int, run_s: float, victims: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="execution-shares-") as tmp:
        work = Path(tmp)
        store = PrincipalsStore(work / "principals.yaml")
        policy = str(policies_dir() / "default.yaml")
        tokens = {name: store.add(name, policy=policy) for name in ("mallory", "victim")}
        config = ServerConfig(
            principals=work / "principals.yaml", audit_dir=work / "audit", max_concurrent_executions=bound,
            queue_wait_s=run_s * 3,
        )  # fmt: skip
        service = Service.from_config(config, runner=DockerRunner)
        with serve_in_thread(service, stop_s=run_s * 4) as port:
            gate = service.quota_gate
            held = [_hold(port, tokens["mallory"], run_s) for _ in range(flood)]
            try:
                while gate.running_of("mallory") + gate.waiting_of("mallory") < flood:
                    time.sleep(0.05)
                latencies, statuses, mallory_running = [], [], []
                with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=run_s * 4) as client:
                    client.headers["Authorization"] = f"Bearer {tokens['victim']}"
                    for _ in range(victims):
                        mallory_running.append(gate.running_of("mallory"))
                        started = time.perf_counter()
                        answer = client.post("/v1/executions", json={"code": "print(1)"})
                        latencies.append(round(time.perf_counter() - started, 2))
                        statuses.append(answer.status_code)
            finally:
                for sock in held:
                    sock.close()
    return {
        "bound": bound, "flood": flood, "run_s": run_s, "victim_latency_s": latencies, "victim_status": statuses,
        "mallory_running_when_victim_sent": mallory_running,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bound", type=int, default=2, help="max_concurrent_executions of the service")
    parser.add_argument("--flood", type=int, default=6, help="mallory's long runs")
    parser.add_argument("--run-s", type=float, default=20.0, help="seconds each of mallory's runs sleeps")
    parser.add_argument("--victim", type=int, default=3, help="victim's print(1) executions, one at a time")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.bound, args.flood, args.run_s, args.victim)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

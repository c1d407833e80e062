"""Requests that run nothing, from one principal under ``rpm: 300``, against ``gateway serve``: issue 28, M2 and
L3 (``all_rpm``).

One client sends ``--pairs`` pairs of ``GET /v1/policy`` and MCP ``tools/list`` as fast as the service answers,
one at a time, and the script counts the answers by kind and status. Only loopback is contacted; the server
runs in this process and is stopped at the end.

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/request_rate.py [--pairs 2000] [--json]``
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.service.config import ServerConfig
from gateway.service.principals import PrincipalsStore, Quotas
from gateway.service.service import Service

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import serve_in_thread  # the benchmark's own server helper, next to this file

MCP_HEADERS = {"Accept": "application/json, text/event-stream"}


def measure(pairs: int) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    with tempfile.TemporaryDirectory(prefix="request-rate-") as tmp:
        work = Path(tmp)
        policy = str(policies_dir() / "default.yaml")
        token = PrincipalsStore(work / "principals.yaml").add(
            "alice", policy=policy, quotas=Quotas(rpm=300), quotas_set=frozenset({"rpm"})
        )
        config = ServerConfig(principals=work / "principals.yaml", audit_dir=work / "audit")
        service = Service.from_config(config, runner=DockerRunner)
        with serve_in_thread(service) as port:
            started = time.perf_counter()
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30) as client:
                for number in range(pairs):
                    counts[f"GET /v1/policy {client.get('/v1/policy').status_code}"] += 1
                    message = {"jsonrpc": "2.0", "id": number, "method": "tools/list", "params": {}}
                    counts[f"tools/list {client.post('/mcp', json=message, headers=MCP_HEADERS).status_code}"] += 1
            seconds = round(time.perf_counter() - started)
    return {**dict(sorted(counts.items())), "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000, help="pairs of GET /v1/policy and MCP tools/list")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.pairs)
    print(json.dumps(result) if args.json else "\n".join(f"{key}: {value}" for key, value in result.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Trail bytes per request and per minute under the escaping attack (issue 28 M3), measured on a real trail.

Each payload is decided (a dry run, as ``POST /v1/decisions`` does) by an in-process Gateway writing to a
``JsonlAuditTrail`` in a temporary directory (the default code cap, 64 KiB); the figures are the bytes of the
lines it wrote, per request and at ``--rpm`` requests a minute (the default quota: 600), the rate one principal
may reach. It uses only the public API, so the same script runs at any commit (for a before/after, run it in a
checkout of the commit before). No server, no engine: nothing runs.

Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/trail_bytes.py [--rpm 600]``
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from gateway import Gateway
from gateway.audit import JsonlAuditTrail
from gateway.policy import load_policy
from gateway.resources import default_policy_path
from gateway.runner.fake import FakeRunner

CAP = 65536
PAYLOADS: dict[str, dict[str, Any]] = {
    "print(1)": {"code": "print(1)"},
    "4 KiB of code": {"code": "x = 1\n" * 683},
    "64 KiB ASCII": {"code": "x" * CAP},
    "64 KiB control characters": {"code": "\x01" * CAP},
    "astral characters (64 KiB UTF-8)": {"code": "\U0001f600" * (CAP // 4)},
    "32 files, names of 4,000 control chars": {"code": "x", "files": {"\x01" * 4000 + str(i): "" for i in range(32)}},
}


def trail_bytes(request: dict[str, Any]) -> int:
    """The bytes one dry run of ``request`` adds to a trail (its request.received and policy.decision lines)."""
    policy = load_policy(default_policy_path())
    with tempfile.TemporaryDirectory() as directory:
        trail = JsonlAuditTrail(directory, code_max_bytes=CAP)
        with Gateway(policy, runner=FakeRunner(), audit=trail) as gateway:
            before = sum(p.stat().st_size for p in Path(directory).glob("trail-*.jsonl"))
            gateway.decide(request)
            after = sum(p.stat().st_size for p in Path(directory).glob("trail-*.jsonl"))
        trail.close()
    return after - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rpm", type=int, default=600, help="requests a minute of one principal (default 600)")
    args = parser.parse_args()
    print(f"| payload | bytes per dry run | MB a minute at {args.rpm} rpm |")
    print("|---|---|---|")
    for name, request in PAYLOADS.items():
        size = trail_bytes(request)
        print(f"| {name} | {size:,} | {size * args.rpm / 1e6:,.1f} |")


if __name__ == "__main__":
    main()

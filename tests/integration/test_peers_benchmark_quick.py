"""``benchmarks/peers.py --quick --json`` for the gateway cases only, against the real engine: the JSON
contract (cases with p50/p95, throughput at 1/4/8, burst, no leaked container, the audit trail where
``GATEWAY_AUDIT_DIR`` says). Shape and counts only; timings are the benchmark's business, never asserted."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_quick_json_for_the_gateway_cases(engine: Any, tmp_path: Path) -> None:
    audit = tmp_path / "audit"
    env = {**os.environ, "GATEWAY_AUDIT_DIR": str(audit), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--quick", "--json", "--runtimes", "runc"]
    argv += ["--cases", "gateway_cold,gateway_pool", "--pool-size", "2"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == ""  # progress only on a terminal
    report = json.loads(proc.stdout)

    assert report["leaked_containers"] == 0
    cold = report["cases"]["gateway_cold"]
    assert isinstance(cold["p50_ms"], float), cold
    assert isinstance(cold["p95_ms"], float), cold
    assert set(report["throughput"]["gateway_cold"]) == {"1", "4", "8"}
    assert report["burst"]["gateway_cold"]["requests"] == 2 * 2
    assert report["info"]["audit_dir"] == str(audit)
    trail = "".join(p.read_text() for p in sorted(audit.rglob("*.jsonl")))
    # rounds, warm-up, levels 4 and 8: with one call per lane, level 1 is the rounds' rate and the burst of 4 is
    # level 4 (a quick run does not time the same experiment twice)
    assert report["throughput_1_from_latency_rounds"] is True
    assert report["burst_from_throughput_level"] == 4
    assert trail.count('"execution.outcome"') >= 3 + 1 + 4 + 8

    pooled = report["cases"]["gateway_pool"]
    if importlib.util.find_spec("gateway.runner.pool") is None:
        assert "no warm pool in this gateway" in pooled["error"]  # reported, never faked
    else:
        assert isinstance(pooled["p50_ms"], float), pooled
        assert pooled["pool"].get("hit", 0) >= 1, pooled
        assert set(report["throughput"]["gateway_pool"]) == {"1", "4", "8"}
        assert sum(report["burst"]["gateway_pool"]["pool"].values()) == 4

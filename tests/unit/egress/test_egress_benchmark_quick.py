"""``benchmarks/egress.py`` with tiny sizes: it runs end to end on loopback (its proxy, upstreams and client) and its
``--json`` has the shape the README's figures are read from; its targets from made-up figures. No timing asserts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "egress.py"


@pytest.fixture
def egress(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import egress as module  # a script directory: importable once it is on the path

    return module


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_a_tiny_run_reports_every_step_throughput_and_target() -> None:
    proc = run_script("--json", "--rounds", "3", "--warmup", "1", "--bulk-mb", "0.5", "--bulk-rounds", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == ""  # progress only on a terminal
    report = json.loads(proc.stdout)

    assert set(report["steps"]) == {"https_proxy", "https_direct", "http_proxy", "http_direct"}
    for row in report["steps"].values():
        assert isinstance(row["p50_ms"], float), row
        assert isinstance(row["p90_ms"], float), row
        assert row["n"] == 3
    assert set(report["throughput"]) - {"raw_relay"} == {"raw_proxy", "raw_direct", "https_proxy", "https_direct"}
    for row in report["throughput"].values():
        assert row["mb_s"] > 0, row
        assert len(row["rounds_mb_s"]) == 1, row
    assert [t["bound"] for t in report["targets"]] == [2.0, 2.0, 0.7, 0.7, 50.0]
    assert report["packages"]["measured"] is False
    # every proxied connection went through the proxy and was allowed: (warm-up + rounds) x 2 steps + 2 bulk
    assert report["proxy"]["connections"] == report["proxy"]["expected"] == 4 * 2 + 2
    assert report["proxy"]["denied"] == 0
    assert set(report["proxy"]["cpu"]) == {"https_ms_p50", "http_ms_p50", "raw_bulk_s_per_gb", "https_bulk_s_per_gb"}
    assert report["info"]["tls"].startswith("TLS")
    assert report["info"]["cpus"] >= 1
    assert report["info"]["python"]


def test_the_packages_policy_allows_the_index_and_the_bench_wheel_only(egress: ModuleType) -> None:
    from gateway.policy.loader import load_policy_text

    policy = load_policy_text(egress.packages_policy("runsc", 18089), source="bench.yaml")
    assert policy.packages is not None
    assert policy.packages.index == f"http://{egress.HOST}:18089/simple/"
    assert list(policy.packages.allow) == ["gw-bench"]
    assert policy.runtime.default == "runsc"


def test_targets_take_the_proxy_against_direct_of_the_same_run(egress: ModuleType) -> None:
    steps = {
        name: {"p50_ms": p50, "p90_ms": p50, "n": 1}
        for name, p50 in (("https_proxy", 3.5), ("https_direct", 1.25), ("http_proxy", 0.75), ("http_direct", 0.25))
    }
    throughput = {  # the ratio is the median of the rounds' ratios, each round's two run back to back
        "raw_proxy": {"rounds_mb_s": [700.0, 350.0, 900.0]},
        "raw_direct": {"rounds_mb_s": [1000.0, 500.0, 2000.0]},
        "https_proxy": {"rounds_mb_s": [300.0]},
        "https_direct": {"rounds_mb_s": [600.0]},
    }
    ratios, found = egress.targets(steps, throughput, {"measured": False, "why": egress.PACKAGES_NOT_ASKED})
    met = [(t["value"], t["met"]) for t in found]
    assert met == [(2.25, False), (0.5, True), (0.7, True), (0.5, False), (None, None)]  # 0.7 is the bound: met
    assert ratios["https added ms at p50"] == 2.25
    for added, ok in ((50.0, True), (50.1, False)):  # the bound is met at 50 ms
        _, found = egress.targets(steps, throughput, {"measured": True, "added_ms": added})
        assert (found[-1]["value"], found[-1]["met"]) == (added, ok)

"""A report over a trail made by real executions on the real engine: the control evidence is judged from the
run options the Docker backend recorded, and the report's outcomes are what the engine did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit import JsonlAuditTrail, query_trail
from gateway.cli import main
from gateway.policy import load_policy
from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner

pytestmark = pytest.mark.integration

ENFORCED_ON_RUNC = ("5.4", "5.5", "5.6", "5.10", "5.11", "5.12", "5.13", "5.16", "5.17", "5.18", "5.20", "5.21",
                    "5.22", "5.25", "5.26", "5.29", "5.30", "5.31", "5.32")  # fmt: skip


def _report(trail: Path, out: Path) -> dict[str, Any]:
    assert main(["report", "--trail", str(trail), "--format", "json", "-o", str(out)]) == 0
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def test_a_report_of_real_runs_proves_the_runc_controls(
    runner: DockerRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trail = tmp_path / "audit"
    sink = JsonlAuditTrail(trail)
    with Gateway(load_policy(policies_dir() / "default.yaml"), runner=runner, audit=sink) as gateway:
        ok = gateway.execute({"code": "print(2 + 2)", "principal": "it-agent"})
        failed = gateway.execute({"code": "import sys; sys.exit(3)", "principal": "it-agent"})
        denied = gateway.execute({"code": "print(1)", "image": "evil/miner:latest", "principal": "it-agent"})
    sink.close()
    assert ok.outcome is not None
    assert ok.outcome.exit_code == 0
    assert failed.outcome is not None
    assert failed.outcome.exit_code == 3
    assert not denied.allowed

    data = _report(trail, tmp_path / "r.json")
    assert data["verification"][0]["intact"] is True
    t = data["totals"]
    assert (t["requests"], t["allowed"], t["denied"], t["executions"]) == (3, 2, 1, 2)
    assert {(c["exit_code"], c["count"]) for c in data["outcomes"]["exit_codes"]} == {(0, 1), (3, 1)}
    assert data["denied"]["shown"][0]["request_id"] == denied.request_id
    assert [i["image"] for i in data["images"]] == ["gateway/sandbox-python:3.11-bookworm"]
    assert data["images"][0]["image_id"].startswith("sha256:")
    controls = {c["number"]: c for c in data["controls"]}
    for number in ENFORCED_ON_RUNC:
        assert controls[number]["status"] == "enforced", controls[number]
        assert controls[number]["executions_checked"] == 2

    # the evidence is the options the backend recorded for each run (what it submitted to the engine)
    recorded = [r for r in query_trail(trail, event_types=["policy.decision"]) if r["data"]["decision"]["allowed"]]
    assert all(r["data"]["decision"]["options"]["pids_limit"] > 0 for r in recorded)
    assert all("no-new-privileges" in r["data"]["decision"]["options"]["security_opt"] for r in recorded)


def test_gvisor_runs_are_reported_unproven_for_no_new_privileges(
    runner: DockerRunner, runtimes: tuple[str, ...], tmp_path: Path
) -> None:
    if "runsc" not in runtimes:
        pytest.skip("the runsc runtime is not registered with the engine")
    trail = tmp_path / "audit"
    sink = JsonlAuditTrail(trail)
    with Gateway(load_policy(policies_dir() / "strict.yaml"), runner=runner, audit=sink) as gateway:
        result = gateway.execute({"code": "print(7)", "principal": "it-agent"})
    sink.close()
    assert result.outcome is not None, result.error
    assert result.outcome.exit_code == 0, result.error
    controls = {c["number"]: c for c in _report(trail, tmp_path / "r.json")["controls"]}
    assert controls["5.26"]["status"] == "unproven"
    assert controls["5.26"]["executions_unproven"] == 1
    assert controls["5.29"]["status"] == "enforced"

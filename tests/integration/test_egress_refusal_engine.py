"""Fail closed on a live engine: a run the policy allows network egress is refused before any container is made."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import verify_trail
from gateway.cli import main
from gateway.resources import policies_dir
from tests.integration.conftest import gateway_containers

pytestmark = pytest.mark.integration

MIRROR = str(policies_dir() / "examples" / "egress-mirror.yaml")


def test_an_allowed_egress_run_is_refused_and_nothing_ran(
    engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    audit_dir = tmp_path / "audit"
    argv = ["run", "--json", "--policy", MIRROR, "--audit-dir", str(audit_dir), "--code", "print('ran')"]
    rc = main([*argv, "--network", "egress"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 125
    assert result["error"]["code"] == "runner.egress_unavailable"
    assert "nothing ran" in result["error"]["message"]
    assert result["stdout"] == ""
    assert gateway_containers(engine) == []
    records = [json.loads(line) for seg in sorted(audit_dir.glob("*.jsonl")) for line in seg.read_text().splitlines()]
    decision = next(r for r in records if r["event_type"] == "policy.decision")["data"]["decision"]
    assert decision["allowed"] is True  # the policy allows it; this version's sandbox is what cannot give it
    assert decision["plan"]["egress"]["destinations"] == [
        {"host": "mirror.internal", "ports": [18089, 18443], "cidrs": ["127.0.0.0/8"]}
    ]
    outcome = next(r for r in records if r["event_type"] == "execution.outcome")["data"]
    assert outcome["error"]["code"] == "runner.egress_unavailable"
    assert verify_trail(audit_dir).ok

    assert main(argv) == 0  # the same policy without egress runs as before
    assert json.loads(capsys.readouterr().out)["stdout"] == "ran\n"

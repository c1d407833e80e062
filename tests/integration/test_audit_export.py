"""OCSF export of a trail written by real executions on the real engine, validated with py-ocsf-models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from tests.integration.conftest import SANDBOX_IMAGE
from tests.ocsf_validation import validate_event

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GATEWAY_POLICY", "GATEWAY_AUDIT_DIR", "GATEWAY_AUDIT_KEY", "GATEWAY_AUDIT_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)


def test_a_real_trail_exports_as_valid_ocsf(engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trail = tmp_path / "audit"
    assert main(["run", "--audit-dir", str(trail), "--principal", "agent-7", "--code", "print(2+2)"]) == 0
    assert main(["run", "--audit-dir", str(trail), "--code", "import sys; sys.exit(3)"]) == 3
    assert main(["run", "--audit-dir", str(trail), "--memory", "64g", "--code", "print(1)"]) == 77  # denied
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"code": "print(1)", "network": "bridge"}))
    assert main(["check", "--audit-dir", str(trail), str(request)]) == 77  # a denied dry run
    capsys.readouterr()

    out = tmp_path / "events.jsonl"
    assert main(["audit", "export", "--format", "ocsf", "--trail", str(trail), "-o", str(out)]) == 0
    assert capsys.readouterr().err == ""
    events = [json.loads(line) for line in out.read_text().splitlines()]
    records = [json.loads(line) for seg in sorted(trail.glob("trail-*.jsonl")) for line in seg.read_text().splitlines()]
    assert len(events) == len(records)
    for event, record in zip(events, records, strict=True):
        validate_event(event)
        assert event["metadata"]["uid"] == record["event_id"]
        assert event["unmapped"]["audit"]["hash"] == record["hash"]

    decisions = [e for e in events if e["metadata"]["event_code"] == "policy.decision"]
    assert [e["action"] for e in decisions] == ["Allowed", "Allowed", "Denied", "Denied"]
    assert decisions[0]["actor"]["user"]["name"] == "agent-7"
    assert decisions[0]["policy"]["name"] == "default"
    assert "limits.memory" in decisions[2]["unmapped"]["gateway"]["violations"]
    assert (decisions[3]["activity_id"], decisions[3]["api"]["operation"]) == (2, "check")

    outcomes = [e for e in events if e["metadata"]["event_code"] == "execution.outcome"]
    assert [e["api"]["response"]["code"] for e in outcomes] == [0, 3]
    assert [e["status"] for e in outcomes] == ["Success", "Failure"]
    image_id = engine.images.get(SANDBOX_IMAGE).id
    for outcome in outcomes:
        kinds = {r["type"]: r for r in outcome["resources"]}
        assert kinds["Container Image"] == {"type": "Container Image", "name": SANDBOX_IMAGE, "uid": image_id}
        assert len(kinds["Container"]["uid"]) == 64  # the container the engine created (and removed)
        assert outcome["metadata"]["correlation_uid"] == next(
            e["metadata"]["correlation_uid"]
            for e in decisions
            if e["metadata"]["correlation_uid"] == outcome["metadata"]["correlation_uid"]
        )

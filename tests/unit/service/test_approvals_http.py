"""Approvals over HTTP (issue 32): 202 with the id, the requester polls, operators list, approve and deny."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gateway.resources import policies_dir
from gateway.runner.fake import FakeRunner
from gateway.service.app import build_app
from gateway.service.config import ServerConfig
from gateway.service.principals import PrincipalsStore
from gateway.service.service import Service

LARGE = {"code": "print(1)", "limits": {"memory": "384m"}}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, dict[str, str]], Path]]:
    principals = tmp_path / "principals.yaml"
    store = PrincipalsStore(principals)
    policy = policies_dir() / "examples" / "approve-large.yaml"
    tokens = {
        "agent": store.add("agent-1", policy=policy),
        "other": store.add("agent-2", policy=policy),
        "ops": store.add("ops", policy=policy, role="operator"),
    }
    config = ServerConfig(principals=principals, audit_dir=tmp_path / "audit", decision_workers=0)
    service = Service.from_config(config, runner=FakeRunner)
    headers = {name: {"Authorization": f"Bearer {token}"} for name, token in tokens.items()}
    with TestClient(build_app(service)) as client:
        yield client, headers, tmp_path / "audit"


def _records(trail: Path, kind: str) -> list[dict[str, Any]]:
    lines = (line for seg in sorted(trail.glob("trail-*.jsonl")) for line in seg.read_bytes().splitlines())
    return [r for r in map(json.loads, lines) if r["event_type"] == kind]


def test_held_then_approved_then_run_once(served: tuple[TestClient, dict[str, dict[str, str]], Path]) -> None:
    client, headers, trail = served
    held = client.post("/v1/executions", json=LARGE, headers=headers["agent"])
    assert held.status_code == 202
    approval_id = held.json()["approval_id"]
    assert held.json()["pending"] is True
    polled = client.get(f"/v1/approvals/{approval_id}", headers=headers["agent"])
    assert (polled.status_code, polled.json()["state"]) == (200, "pending")
    assert client.get(f"/v1/approvals/{approval_id}", headers=headers["other"]).status_code == 404
    listed = client.get("/v1/approvals", headers=headers["ops"]).json()["approvals"]
    assert [a["approval_id"] for a in listed] == [approval_id]
    approved = client.post(f"/v1/approvals/{approval_id}/approve", json={"reason": "ok"}, headers=headers["ops"])
    assert (approved.status_code, approved.json()["approver"]) == (200, "ops")
    ran = client.post("/v1/executions", json=LARGE, headers=headers["agent"])
    assert ran.status_code == 200
    again = client.post("/v1/executions", json=LARGE, headers=headers["agent"])
    assert (again.status_code, again.json()["code"]) == (403, "approval.closed")
    assert len(_records(trail, "approval.used")) == 1
    assert len(_records(trail, "execution.outcome")) == 1


def test_an_agent_cannot_approve_and_bad_verdicts_are_refused(
    served: tuple[TestClient, dict[str, dict[str, str]], Path],
) -> None:
    client, headers, trail = served
    approval_id = client.post("/v1/executions", json=LARGE, headers=headers["agent"]).json()["approval_id"]
    forbidden = client.post(f"/v1/approvals/{approval_id}/approve", json={"reason": "me"}, headers=headers["agent"])
    assert (forbidden.status_code, forbidden.json()["code"]) == (403, "auth.forbidden")
    assert client.get("/v1/approvals", headers=headers["agent"]).status_code == 403
    unknown = client.post("/v1/approvals/" + "0" * 32 + "/deny", json={"reason": "x"}, headers=headers["ops"])
    assert (unknown.status_code, unknown.json()["code"]) == (404, "approval.not_found")
    no_reason = client.post(f"/v1/approvals/{approval_id}/approve", json={"uses": 0}, headers=headers["ops"])
    assert no_reason.status_code == 422
    tampered = {"reason": "x", "digest": "f" * 64}
    conflict = client.post(f"/v1/approvals/{approval_id}/approve", json=tampered, headers=headers["ops"])
    assert (conflict.status_code, conflict.json()["code"]) == (409, "approval.conflict")
    assert client.post(f"/v1/approvals/{approval_id}/deny", json={"reason": "no"}, headers=headers["ops"]).is_success
    twice = client.post(f"/v1/approvals/{approval_id}/approve", json={"reason": "x"}, headers=headers["ops"])
    assert twice.status_code == 409
    assert len(_records(trail, "approval.refused")) == 3
    assert len(_records(trail, "auth.forbidden")) >= 1
    assert client.post("/v1/executions", json=LARGE, headers=headers["agent"]).status_code == 403
    assert _records(trail, "execution.outcome") == []

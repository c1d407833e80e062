"""How much code the trail keeps is the operator's choice, set from the environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.audit import JsonlAuditTrail
from gateway.errors import AuditUnavailableError


def test_code_cap_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_AUDIT_CODE_MAX_BYTES", "10")
    with JsonlAuditTrail.from_env(tmp_path) as trail:
        trail.append("request.received", {"request": {"code": "print('a very long program')"}})
    record = json.loads(next(tmp_path.glob("*.jsonl")).read_text().splitlines()[0])
    request = record["data"]["request"]
    assert request["code"] == "print('a v"
    assert request["code_truncated"] is True
    assert request["code_bytes"] == len("print('a very long program')")


def test_a_bad_code_cap_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_AUDIT_CODE_MAX_BYTES", "64k")
    with pytest.raises(AuditUnavailableError, match="GATEWAY_AUDIT_CODE_MAX_BYTES"):
        JsonlAuditTrail.from_env(tmp_path)

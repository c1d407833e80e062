"""`query_trail` filters and the `gateway audit query | repair` commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import JsonlAuditTrail, query_trail, verify_trail
from gateway.audit.query import parse_time
from gateway.cli import main
from gateway.errors import AuditError

IMAGE = "gateway/sandbox-python:3.11-bookworm"


def decision(allowed: bool, failed_rule: str | None = None) -> dict[str, Any]:
    results = [{"rule": "images.allowlist", "status": "pass", "mode": "enforce", "path": "$.image"}]
    if failed_rule is not None:
        results.append({"rule": failed_rule, "status": "fail", "mode": "enforce", "path": "$.limits"})
    return {
        "decision": {
            "decision_id": "d",
            "allowed": allowed,
            "results": results,
            "violations": [r for r in results if r["status"] == "fail"],
            "warnings": [],
            "options": {"image": IMAGE} if allowed else None,
            "plan": {"image": IMAGE} if allowed else None,
        },
        "options_sha256": None,
        "dry_run": False,
    }


@pytest.fixture
def trail_dir(tmp_path: Path) -> Path:
    with JsonlAuditTrail(tmp_path, segment_max_bytes=3000) as trail:
        trail.append("gateway.start", {"policy_source": "p.yaml"})
        trail.append("request.received", {"request": {"code": "1", "image": IMAGE}}, request_id="r1", principal="alice")
        trail.append("policy.decision", decision(True), request_id="r1", principal="alice")
        trail.append(
            "request.received", {"request": {"code": "2", "image": "evil:1"}}, request_id="r2", principal="bob"
        )
        trail.append("policy.decision", decision(False, "limits.memory"), request_id="r2", principal="bob")
        trail.append("request.received", {"request": {"code": "3"}}, request_id="r3", principal="bob")
        trail.append("policy.decision", decision(False, "network.mode"), request_id="r3", principal="bob")
    return tmp_path


def seqs(records: Any) -> list[int]:
    return [r["seq"] for r in records]


def test_filters(trail_dir: Path) -> None:
    assert seqs(query_trail(trail_dir)) == [1, 2, 3, 4, 5, 6, 7]
    assert seqs(query_trail(trail_dir, principal="bob")) == [4, 5, 6, 7]
    assert seqs(query_trail(trail_dir, request_id="r1")) == [2, 3]
    assert seqs(query_trail(trail_dir, decision="deny")) == [5, 7]
    assert seqs(query_trail(trail_dir, decision="allow")) == [3]
    assert seqs(query_trail(trail_dir, rule="limits.memory")) == [5]
    assert seqs(query_trail(trail_dir, rule="images.allowlist")) == []  # it passed everywhere
    assert seqs(query_trail(trail_dir, image=IMAGE)) == [2, 3]
    assert seqs(query_trail(trail_dir, event_types=["policy.decision", "gateway.start"])) == [1, 3, 5, 7]
    assert seqs(query_trail(trail_dir, principal="bob", decision="deny", rule="network.mode")) == [7]


def test_time_range(trail_dir: Path) -> None:
    stamps = [r["timestamp"] for r in query_trail(trail_dir)]
    assert seqs(query_trail(trail_dir, since=stamps[3])) == [4, 5, 6, 7]
    assert seqs(query_trail(trail_dir, until=stamps[3])) == [1, 2, 3]
    assert seqs(query_trail(trail_dir, since="2000-01-01", until="2000-01-02")) == []
    assert parse_time("2024-05-01T12:00:00+02:00") == "2024-05-01T10:00:00.000000Z"
    with pytest.raises(AuditError):
        parse_time("yesterday")


def test_query_streams_lazily(trail_dir: Path) -> None:
    records = query_trail(trail_dir)
    assert iter(records) is records  # an iterator, not a list built up front
    assert next(records)["seq"] == 1


def test_torn_lines_are_skipped_and_reported(trail_dir: Path) -> None:
    last = sorted(trail_dir.glob("trail-*.jsonl"))[-1]
    with last.open("ab") as fh:
        fh.write(b'{"seq": 8, "event_')
    skipped: list[tuple[str, int]] = []
    assert seqs(query_trail(trail_dir, on_skip=lambda seg, line: skipped.append((seg, line)))) == list(range(1, 8))
    assert skipped == [(last.name, len(last.read_bytes().splitlines()))]


def test_cli_query_table_and_json(trail_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "query", str(trail_dir), "--decision", "deny"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["seq", "timestamp", "event_type"]
    assert len(table) == 3
    assert "deny limits.memory" in table[1]
    assert (
        main(["audit", "query", str(trail_dir), "--json", "--event-type", "request.received", "--principal", "bob"])
        == 0
    )
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert seqs(records) == [4, 6]


def test_cli_uses_gateway_audit_dir(
    trail_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_AUDIT_DIR", str(trail_dir))
    monkeypatch.delenv("GATEWAY_AUDIT_KEY", raising=False)
    monkeypatch.delenv("GATEWAY_AUDIT_KEY_FILE", raising=False)
    assert main(["audit", "verify"]) == 0
    assert "records checked: 7" in capsys.readouterr().out


def test_cli_verify_with_key_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = bytes(range(32))
    with JsonlAuditTrail(tmp_path / "t", key=key) as trail:
        trail.append("gateway.start", {"policy_source": "p"})
    key_file = tmp_path / "key"
    key_file.write_text(key.hex())
    assert main(["audit", "verify", str(tmp_path / "t"), "--key-file", str(key_file)]) == 0
    assert "hashes and HMACs" in capsys.readouterr().out
    key_file.write_text(bytes(32).hex())
    assert main(["audit", "verify", str(tmp_path / "t"), "--key-file", str(key_file)]) == 1


def test_cli_verify_of_a_missing_directory_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "verify", str(tmp_path / "nope")]) == 125
    assert "no audit trail directory" in capsys.readouterr().err


def test_cli_repair_needs_yes_and_seals_the_tail(trail_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    last = sorted(trail_dir.glob("trail-*.jsonl"))[-1]
    data = last.read_bytes()
    last.write_bytes(data[:-30])
    assert main(["audit", "repair", str(trail_dir)]) == 2
    assert "BROKEN at seq 7" in capsys.readouterr().out
    assert verify_trail(trail_dir).first_break is not None  # nothing changed without --yes
    assert main(["audit", "repair", str(trail_dir), "--yes"]) == 0
    assert "recovery record at seq 7 after seq 6" in capsys.readouterr().out
    assert main(["audit", "verify", str(trail_dir)]) == 0
    recovery = list(query_trail(trail_dir, event_types=["recovery"]))
    assert len(recovery) == 1
    assert recovery[0]["data"]["last_good_seq"] == 6
    assert recovery[0]["data"]["reason"].startswith("truncated at seq 7")
    assert main(["audit", "repair", str(trail_dir), "--yes"]) == 0
    assert "nothing to repair" in capsys.readouterr().out

"""`gateway approvals list|show|approve|deny` on a local trail, and what `gateway run` says about a held request."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest

from gateway import Gateway
from gateway.audit import JsonlAuditTrail
from gateway.cli import main
from gateway.cli.run_cmd import _LiveOutput, _print_human
from gateway.errors import EXIT_USAGE
from gateway.policy import Policy, load_policy
from gateway.resources import policies_dir
from gateway.result import ExecutionResult
from gateway.testing import FakeRunner

LARGE = {"code": "print(1)", "limits": {"memory": "384m"}, "principal": "agent-1"}


@pytest.fixture(scope="module")
def policy() -> Policy:
    return load_policy(policies_dir() / "examples" / "approve-large.yaml")


def _execute(policy: Policy, trail: Path, runner: FakeRunner | None = None) -> ExecutionResult:
    with JsonlAuditTrail(trail) as sink, Gateway(policy, runner=runner or FakeRunner(), audit=sink) as gw:
        return gw.execute(LARGE)


def _records(trail: Path, kind: str) -> list[dict[str, object]]:
    lines = (line for seg in sorted(trail.glob("trail-*.jsonl")) for line in seg.read_bytes().splitlines())
    return [r for r in map(json.loads, lines) if r["event_type"] == kind]


def test_an_operator_lists_shows_and_approves_and_the_request_then_runs(
    policy: Policy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trail = tmp_path / "audit"
    held = _execute(policy, trail)
    assert held.approval_id is not None
    assert main(["approvals", "list", "--audit-dir", str(trail)]) == 0
    out = capsys.readouterr().out
    assert held.approval_id in out
    assert "limits.memory" in out
    assert main(["approvals", "show", held.approval_id, "--audit-dir", str(trail)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["request"]["code"] == "print(1)"
    assert shown["state"] == "pending"
    assert main(["approvals", "approve", held.approval_id, "--reason", "needed", "--audit-dir", str(trail)]) == 0
    [granted] = _records(trail, "approval.granted")
    assert granted["data"]["approver"] == f"os:{getpass.getuser()}"
    runner = FakeRunner()
    assert _execute(policy, trail, runner).ran
    assert len(runner.calls) == 1


def test_bad_operator_input_exits_2_and_is_recorded(
    policy: Policy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trail = tmp_path / "audit"
    held = _execute(policy, trail)
    assert held.approval_id is not None
    assert main(["approvals", "approve", "0" * 32, "--reason", "x", "--audit-dir", str(trail)]) == EXIT_USAGE
    assert "approval.not_found" in capsys.readouterr().err
    digest = ["--digest", "f" * 64]
    assert main(["approvals", "deny", held.approval_id, "--reason", "x", *digest, "--audit-dir", str(trail)]) == 2
    assert main(["approvals", "deny", held.approval_id, "--reason", "no", "--audit-dir", str(trail)]) == 0
    assert main(["approvals", "approve", held.approval_id, "--reason", "x", "--audit-dir", str(trail)]) == EXIT_USAGE
    assert "denied, not pending" in capsys.readouterr().err
    assert len(_records(trail, "approval.refused")) == 3
    runner = FakeRunner()
    assert not _execute(policy, trail, runner).ran
    assert runner.calls == []


def test_run_says_which_approval_a_held_request_waits_for(
    policy: Policy, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    held = _execute(policy, tmp_path / "audit")
    _print_human(held, _LiveOutput())
    err = capsys.readouterr().err
    assert f"waiting for approval {held.approval_id} (asked by limits.memory)" in err
    assert "denied" not in err

"""Issue 13, defects 2, 4, 5 and 6 end to end through ``gateway.cli.main``: what a policy author sees.

No engine is needed: ``DOCKER_HOST`` points at a socket that does not exist, so a run that is allowed fails
with ``runner.engine_unavailable`` after its decision, and a denied one never reaches the runner.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from gateway.audit import JsonlAuditTrail, query_trail, verify_trail
from gateway.cli import main
from gateway.resources import policies_dir
from gateway.runner.docker.seccomp import gateway_profile

DEFAULT = policies_dir() / "default.yaml"
AUDIT_POLICY = Path(__file__).resolve().parents[2] / "policies" / "audit-warnings" / "policy.yaml"


@pytest.fixture(autouse=True)
def _no_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    for name in ("GATEWAY_POLICY", "GATEWAY_AUDIT_KEY", "GATEWAY_AUDIT_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def audit_policy() -> Path:
    """Memory and CPU in audit mode: asking for more than those ceilings is a warning."""
    return AUDIT_POLICY


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# --- defect 4: warnings in a plain `gateway run` and in the query table -----------------------------------


def test_plain_run_prints_each_warning_on_stderr(
    audit_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before the fix the warning was only in the --json object: a plain run printed nothing about it."""
    audit = tmp_path / "audit"
    rc, out, err = run(
        capsys, "run", "--policy", str(audit_policy), "--audit-dir", str(audit), "--memory", "600m", "--code", "x"
    )
    assert rc == 125  # allowed, then no engine
    assert out == ""
    warnings = [line for line in err.splitlines() if line.startswith("gateway: warning:")]
    assert len(warnings) == 1
    assert warnings[0].startswith("gateway: warning: limits.memory at $.limits.memory: ")
    assert warnings[0].count("audit mode") == 1  # said once, not twice


def test_check_names_the_seccomp_profile_by_digest_in_both_outputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    request = tmp_path / "r.json"
    request.write_text('{"code": "print(1)"}')
    reference = "seccomp=gateway@sha256:" + hashlib.sha256(gateway_profile().encode()).hexdigest()
    rc, out, _ = run(capsys, "check", "--audit-dir", str(tmp_path / "audit"), str(request))
    assert rc == 0
    assert reference in out
    assert "SCMP_ACT_ALLOW" not in out  # the 7 KB profile is named, not repeated
    rc, out, _ = run(capsys, "check", "--json", "--audit-dir", str(tmp_path / "audit"), str(request))
    assert rc == 0
    assert json.loads(out)["options"]["security_opt"] == ["no-new-privileges", reference]


def test_denied_run_prints_warnings_beside_the_violations(
    audit_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _out, err = run(
        capsys, "run", "--policy", str(audit_policy), "--audit-dir", str(tmp_path / "a"),
        "--memory", "600m", "--network", "host", "--code", "x",
    )  # fmt: skip
    assert rc == 77
    assert "  network.mode at $.network: " in err
    assert "gateway: warning: limits.memory at $.limits.memory: " in err


def test_run_without_warnings_prints_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _out, err = run(capsys, "run", "--audit-dir", str(tmp_path / "a"), "--network", "host", "--code", "x")
    assert rc == 77
    assert "warning" not in err


def test_query_table_marks_warnings_and_dry_runs(
    audit_policy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    audit = tmp_path / "audit"
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"code": "x", "limits": {"memory": "600m"}}))
    assert main(["check", "--policy", str(audit_policy), "--audit-dir", str(audit), str(request)]) == 0
    assert main(["run", "--audit-dir", str(audit), "--network", "host", "--code", "x"]) == 77
    capsys.readouterr()
    rc, out, _ = run(capsys, "audit", "query", "--audit-dir", str(audit), "--event-type", "policy.decision")
    assert rc == 0
    rows = out.splitlines()[1:]
    assert len(rows) == 2
    assert rows[0].endswith("dry-run allow warn:limits.memory")
    assert rows[1].endswith("deny network.mode")


# --- defect 5: an invalid policy is not an audit failure --------------------------------------------------


def test_invalid_policy_run_says_the_rejection_was_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before the fix: 'WARNING: the audit record of this request could not be written', although it was."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: gateway.agent-exec/v1\nkind: Policy\nmetadata: {name: x}\nspec: {bogus: 1}\n")
    audit = tmp_path / "audit"
    rc, _out, err = run(capsys, "run", "--policy", str(bad), "--audit-dir", str(audit), "--code", "x")
    assert rc == 125
    assert "could not be written" not in err
    assert f"{bad}:4: $.spec.bogus: unknown field" in err
    assert "the rejection is recorded in the audit trail (policy.rejected)" in err
    assert verify_trail(audit).ok
    assert [r["event_type"] for r in query_trail(audit)] == ["policy.rejected"]
    rc, out, _ = run(capsys, "run", "--json", "--policy", str(bad), "--audit-dir", str(audit), "--code", "x")
    assert rc == 125
    data = json.loads(out)
    assert data["audit_ok"] is True
    assert data["error"]["code"] == "policy.invalid"


def test_unwritable_trail_still_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("not a directory")
    rc, out, _ = run(capsys, "run", "--json", "--audit-dir", str(tmp_path / "file" / "audit"), "--code", "x")
    assert rc == 125
    data = json.loads(out)
    assert data["audit_ok"] is False
    assert data["error"]["code"].startswith("audit.")
    rc, _out, err = run(capsys, "run", "--audit-dir", str(tmp_path / "file" / "audit"), "--code", "x")
    assert "could not be written" in err


# --- defect 6: --audit-dir everywhere, the default documented, --policy and --dry-run filters --------------


@pytest.fixture
def trail(tmp_path: Path) -> Path:
    directory = tmp_path / "trail"
    policy_a = {"name": "team-a", "sha256": "a" * 64}
    policy_b = {"name": "team-b", "sha256": "b" * 64}

    def decision(allowed: bool, dry_run: bool) -> dict[str, object]:
        return {
            "decision": {"decision_id": "d", "allowed": allowed, "results": [], "violations": [], "warnings": []},
            "options_sha256": None,
            "dry_run": dry_run,
        }

    with JsonlAuditTrail(directory) as sink:
        sink.append("gateway.start", {"policy_source": "a.yaml"}, policy=policy_a)
        sink.append("policy.decision", decision(True, True), request_id="r1", policy=policy_a)
        sink.append("policy.decision", decision(True, False), request_id="r2", policy=policy_b)
        sink.append("policy.decision", decision(False, False), request_id="r3", policy=policy_a)
    return directory


def _seqs(out: str) -> list[int]:
    return [json.loads(line)["seq"] for line in out.splitlines()]


def test_audit_dir_flag_and_positional_are_the_same(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before the fix `audit query --audit-dir DIR` was a usage error (exit 2)."""
    assert run(capsys, "audit", "query", "--json", "--audit-dir", str(trail))[:2] == (0, run(
        capsys, "audit", "query", "--json", str(trail))[1])  # fmt: skip
    rc, out, _ = run(capsys, "audit", "verify", "--audit-dir", str(trail))
    assert rc == 0
    assert "OK: chain intact up to seq 4" in out
    rc, out, _ = run(capsys, "audit", "repair", "--audit-dir", str(trail))
    assert (rc, out.strip()) == (0, "trail intact (4 records); nothing to repair")


def test_audit_dir_twice_with_different_values_is_a_usage_error(
    trail: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _out, err = run(capsys, "audit", "verify", str(trail), "--audit-dir", str(tmp_path / "other"))
    assert rc == 2
    assert "give the trail directory once" in err
    assert run(capsys, "audit", "verify", str(trail), "--audit-dir", str(trail))[0] == 0


@pytest.mark.parametrize("command", ["verify", "query", "repair"])
def test_the_audit_commands_on_one_trail_take_the_trail_flag_of_report_export_and_anchor(
    command: str, trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gateway audit anchor --trail DIR -o A` then `gateway audit verify --trail DIR --anchor A` works; before,
    `--trail` was an unrecognised argument of verify, query and repair (exit 2)."""
    rc, _out, err = run(capsys, "audit", command, "--trail", str(trail))
    assert rc == 0, err


def test_the_trail_flag_names_one_trail_for_the_commands_on_one_trail(
    trail: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _out, err = run(capsys, "audit", "verify", "--trail", str(trail), "--trail", str(tmp_path / "other"))
    assert rc == 2
    assert "give the trail directory once" in err
    assert "one trail" in err  # and says why: verify, query and repair work on one trail
    rc, _out, err = run(capsys, "audit", "verify", "--trail", str(trail), "--audit-dir", str(tmp_path / "other"))
    assert rc == 2
    assert "give the trail directory once" in err
    assert run(capsys, "audit", "verify", "--trail", str(trail), str(trail))[0] == 0


_TIMED = {
    "query": ["audit", "query"],
    "export": ["audit", "export", "--format", "ocsf", "-o", "-", "--trail"],
    "report": ["report", "--format", "json", "-o", "-", "--trail"],
    "impact": ["policy", "impact", str(policies_dir() / "default.yaml"), "--audit-dir"],
}


@pytest.mark.parametrize(
    ("name", "flag"),
    [(name, flag) for name in _TIMED for flag in ("--since", "--until") if (name, flag) != ("impact", "--until")],
)
def test_a_time_that_is_not_one_is_a_usage_error_naming_its_flag(
    name: str, flag: str, trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, a bad --since was a gateway failure (exit 125) whose message did not name the flag."""
    command = _TIMED[name]
    rc, out, err = run(capsys, *command, str(trail), flag, "last tuesday")
    assert (rc, out) == (2, "")
    assert f"argument {flag}: not an RFC 3339 time: 'last tuesday'" in err
    rc, _out, err = run(capsys, *command, str(trail), flag, "2026-12-01")  # a date is a time
    assert rc in (0, 1), err  # 1: impact reports a change of decision


@pytest.mark.parametrize(
    "command",
    [
        ["report", "--format", "html", "--trail"],
        ["audit", "export", "--format", "ocsf", "--trail"],
        ["audit", "anchor", "--trail"],
    ],
    ids=["report", "export", "anchor"],
)
def test_an_output_file_that_cannot_be_written_is_an_error_naming_it(
    command: list[str], trail: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, each of these ended in a Python traceback naming a temporary file."""
    target = tmp_path / "no-such-directory" / "out"
    rc, out, err = run(capsys, *command, str(trail), "-o", str(target))
    assert (rc, out) == (125, "")
    assert err.startswith(f"error[gateway.error]: No such file or directory: {target}")
    assert not target.parent.exists()


def test_audit_dir_defaults_to_the_environment(
    trail: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GATEWAY_AUDIT_DIR", str(trail))
    rc, out, _ = run(capsys, "audit", "query", "--json")
    assert rc == 0
    assert _seqs(out) == [1, 2, 3, 4]


@pytest.mark.parametrize("command", ["verify", "query", "repair"])
def test_help_documents_the_default_directory(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--audit-dir DIR" in text
    assert "$GATEWAY_AUDIT_DIR" in text
    assert "./audit" in text


def test_query_filters_by_policy_and_dry_run(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["audit", "query", "--json", "--audit-dir", str(trail)]
    assert _seqs(run(capsys, *base, "--policy", "team-a")[1]) == [1, 2, 4]
    assert _seqs(run(capsys, *base, "--policy", "team-b")[1]) == [3]
    assert _seqs(run(capsys, *base, "--dry-run")[1]) == [2]
    assert _seqs(run(capsys, *base, "--no-dry-run")[1]) == [3, 4]
    assert _seqs(run(capsys, *base, "--no-dry-run", "--policy", "team-a")[1]) == [4]
    rc, out, _ = run(capsys, "audit", "query", "--audit-dir", str(trail), "--dry-run")
    assert rc == 0
    assert out.splitlines()[1].endswith("dry-run allow")


# --- defect 2 through the CLI ---------------------------------------------------------------------------


def test_policy_test_reports_a_broken_suite_with_file_line_and_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        f"kind: PolicyTest\npolicy: {DEFAULT}\ncases:\n"
        "  - name: typo\n    request: {code: x, network: host}\n    violation: [limits.memory]\n"
    )
    rc, out, _ = run(capsys, "policy", "test", str(tmp_path))
    assert rc == 1
    assert f"{suite}:6: $.cases[0].violation: unknown field 'violation'" in out
    assert f"{suite}:4: $.cases[0]: 'allowed' is required here but missing" in out
    assert "0 passed" in out

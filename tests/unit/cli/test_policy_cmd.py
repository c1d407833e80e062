"""`gateway policy validate`, `gateway policy test`, `gateway check`: exit codes and output, via main(argv)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.resources import policies_dir

ROOT = Path(__file__).resolve().parents[3]
INVALID = ROOT / "tests" / "policies" / "invalid"


def test_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(p) for p in sorted(policies_dir().rglob("*.yaml"))]
    assert main(["policy", "validate", *files]) == 0
    out = capsys.readouterr().out
    assert out.count(": ok (") == len(files)


def test_validate_reports_every_error_as_file_line_path(capsys: pytest.CaptureFixture[str]) -> None:
    bad = INVALID / "root-user.yaml"
    good = policies_dir() / "default.yaml"
    assert main(["policy", "validate", str(good), str(bad)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert f"{bad}:20: $.spec.user.gid: 0 is less than the minimum of 1" in lines
    assert f"{bad}:20: $.spec.user.uid: 0 is less than the minimum of 1" in lines


def test_validate_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["policy", "validate", str(tmp_path / "nope.yaml")]) == 1
    assert "no such file" in capsys.readouterr().out


def test_policy_test_directory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "test", str(ROOT / "tests" / "policies")]) == 0
    captured = capsys.readouterr()
    assert "0 failed" in captured.out
    assert "FAIL" not in captured.out


def test_policy_test_mismatch_exits_nonzero(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(
        f"kind: PolicyTest\npolicy: {policies_dir() / 'default.yaml'}\ncases:\n"
        "  - name: wrong\n    request: {code: x, network: host}\n    allowed: true\n"
    )
    assert main(["policy", "test", str(tmp_path)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_policy_test_empty_dir(tmp_path: Path) -> None:
    assert main(["policy", "test", str(tmp_path)]) == 1
    assert main(["policy", "test", str(tmp_path / "missing")]) == 2


def _request(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "req.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_check_allow_human(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["check", _request(tmp_path, {"code": "print(1)"})]) == 0
    out = capsys.readouterr().out
    assert out.startswith("decision: ALLOW")
    assert '"network_mode": "none"' in out


def test_check_deny_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["check", "--json", _request(tmp_path, {"code": "x", "network": "host"})]) == 77
    data = json.loads(capsys.readouterr().out)
    assert data["allowed"] is False
    assert [v["rule"] for v in data["violations"]] == ["network.mode"]
    assert data["options"] is None


def test_check_invalid_request(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["check", _request(tmp_path, {"code": 1})]) == 2
    assert "$.code" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\xfe")
    assert main(["check", "--json", str(bad)]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "request.invalid"
    assert main(["check", str(tmp_path / "missing.json")]) == 2


def test_check_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake = io.TextIOWrapper(io.BytesIO(b'{"code": "print(1)", "runtime": "runc"}'))
    monkeypatch.setattr(sys, "stdin", fake)
    assert main(["check", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["allowed"] is True


def test_check_policy_precedence(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    req = _request(tmp_path, {"code": "x"})
    strict = str(policies_dir() / "strict.yaml")
    monkeypatch.setenv("GATEWAY_POLICY", strict)
    assert main(["check", "--json", req]) == 0
    assert json.loads(capsys.readouterr().out)["policy"]["name"] == "strict"
    assert main(["check", "--json", "--policy", str(policies_dir() / "default.yaml"), req]) == 0
    assert json.loads(capsys.readouterr().out)["policy"]["name"] == "default"


def test_check_broken_policy_is_a_gateway_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    req = _request(tmp_path, {"code": "x"})
    assert main(["check", "--policy", str(INVALID / "duplicate-key.yaml"), req]) == 125
    assert "duplicate key" in capsys.readouterr().err
    assert main(["check", "--policy", str(tmp_path / "none.yaml"), req]) == 125

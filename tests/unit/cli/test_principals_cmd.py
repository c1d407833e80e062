"""``gateway principals`` end to end through ``gateway.cli.main``: add → list → rotate → old token fails → revoke."""

from __future__ import annotations

import http.server
import json
import re
import threading
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.resources import default_policy_path
from gateway.service.principals import load_principals

TOKEN_FORMAT = re.compile(r"agw_[0-9a-f]{8}_[A-Za-z0-9_-]{43}")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_add_list_rotate_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = str(tmp_path / "p.yaml")
    policy = str(default_policy_path())
    rc, out, err = _run(
        capsys, "principals", "add", "alice", "--policy", policy, "--principals", file,
        "--max-concurrent", "2", "--rpm", "60", "--queue", "0",
    )  # fmt: skip
    assert rc == 0, err
    first = out.removesuffix("\n")
    assert TOKEN_FORMAT.fullmatch(first)  # stdout is the token and nothing else
    assert "shown once" in err
    rc, out, err = _run(
        capsys, "principals", "add", "ops", "--policy", policy, "--role", "operator", "--principals", file
    )
    assert rc == 0, err
    ops_token = out.strip()

    rc, out, _ = _run(capsys, "principals", "list", "--principals", file)
    assert rc == 0
    token_id = first.split("_")[1]
    digest = load_principals(file).get("alice").tokens[0].sha256
    assert f"alice  role=agent  policy={Path(policy).resolve()}" in out
    assert "max_concurrent=2 rpm=60 queue=0" in out
    assert "ops  role=operator" in out
    assert token_id in out
    for secret in (first, ops_token, digest):
        assert secret not in out

    rc, out, _ = _run(capsys, "principals", "list", "--json", "--principals", file)
    doc = json.loads(out)
    assert doc["source"] == file
    alice = doc["principals"][0]
    assert alice["name"] == "alice"
    assert alice["role"] == "agent"
    assert alice["policy"] == str(Path(policy).resolve())
    assert alice["quotas"] == {"max_concurrent": 2, "rpm": 60, "queue": 0}
    assert [set(t) for t in alice["tokens"]] == [{"id", "created"}]
    assert digest not in out
    assert first not in out

    rc, out, err = _run(capsys, "principals", "rotate", "alice", "--principals", file)
    assert rc == 0, err
    second = out.removesuffix("\n")
    assert TOKEN_FORMAT.fullmatch(second)
    assert second != first
    loaded = load_principals(file)
    assert loaded.authenticate(first) is None
    found = loaded.authenticate(second)
    assert found is not None
    assert found[0].name == "alice"
    assert loaded.authenticate(ops_token) is not None  # rotating alice leaves ops alone

    rc, out, err = _run(capsys, "principals", "revoke", "alice", "--principals", file)
    assert (rc, out) == (3, "")  # written, but no running service was told (issue 28, M1)
    assert "revoked every token of 'alice'" in err
    assert "NOT yet applied: no running service was told" in err
    loaded = load_principals(file)
    assert loaded.authenticate(second) is None
    rc, out, _ = _run(capsys, "principals", "list", "--principals", file)
    assert "tokens: none (revoked" in out

    rc, out, err = _run(capsys, "principals", "revoke", "alice", "--remove", "--principals", file)
    assert rc == 3
    assert "removed principal 'alice'" in err
    assert [p.name for p in load_principals(file)] == ["ops"]
    for clear in (first, second, ops_token):
        assert clear not in Path(file).read_text()


def test_unknown_duplicate_and_bad_input_exit_with_the_table_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = str(tmp_path / "p.yaml")
    policy = str(default_policy_path())
    assert _run(capsys, "principals", "add", "alice", "--policy", policy, "--principals", file)[0] == 0

    rc, out, err = _run(capsys, "principals", "revoke", "bob", "--principals", file)
    assert (rc, out) == (2, "")
    assert "error[principals.unknown]: no principal named 'bob'" in err
    assert _run(capsys, "principals", "rotate", "bob", "--principals", file)[0] == 2

    rc, out, err = _run(capsys, "principals", "add", "alice", "--policy", policy, "--principals", file)
    assert (rc, out) == (2, "")
    assert "error[principals.duplicate]" in err

    rc, out, err = _run(capsys, "principals", "add", "has space", "--policy", policy, "--principals", file)
    assert (rc, out) == (2, "")
    assert "is not a principal name" in err
    rc, _, err = _run(capsys, "principals", "add", "q", "--policy", policy, "--rpm", "0", "--principals", file)
    assert rc == 2
    assert "not a positive integer" in err

    rc, out, err = _run(
        capsys, "principals", "add", "bob", "--policy", str(tmp_path / "nope.yaml"), "--principals", file
    )
    assert (rc, out) == (125, "")
    assert "error[policy.not_found]" in err
    assert [p.name for p in load_principals(file)] == ["alice"]


def test_a_missing_or_broken_file_is_reported_with_its_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "none.yaml")
    rc, out, err = _run(capsys, "principals", "list", "--principals", missing)
    assert (rc, out) == (125, "")
    assert "error[principals.not_found]" in err
    assert "gateway principals add NAME --policy FILE" in err
    assert _run(capsys, "principals", "rotate", "a", "--principals", missing)[0] == 125
    assert not Path(missing).exists()  # only add creates a file

    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: gateway.agent-exec/v1\nkind: Principals\nprincipals:\n- {name: a, role: root}\n")
    rc, _, err = _run(capsys, "principals", "list", "--principals", str(broken))
    assert rc == 125
    assert "error[principals.invalid]" in err
    assert f"{broken}:4: $.principals[0].role: 'root' is not one of ['agent', 'operator']" in err


def test_the_environment_and_the_working_directory_pick_the_file_and_policies_are_stored_absolute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GATEWAY_PRINCIPALS", raising=False)
    (tmp_path / "pol.yaml").write_bytes(default_policy_path().read_bytes())
    assert _run(capsys, "principals", "add", "me", "--policy", "pol.yaml")[0] == 0
    assert load_principals(tmp_path / "principals.yaml").get("me").policy == tmp_path / "pol.yaml"

    other = tmp_path / "env" / "p.yaml"
    other.parent.mkdir()
    monkeypatch.setenv("GATEWAY_PRINCIPALS", str(other))
    assert _run(capsys, "principals", "add", "you", "--policy", "pol.yaml")[0] == 0
    assert [p.name for p in load_principals(other)] == ["you"]
    assert [p.name for p in load_principals(tmp_path / "principals.yaml")] == ["me"]


def test_revoke_with_a_service_but_no_operator_token_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked before the file is written: a revocation never half happens for want of the token."""
    file = tmp_path / "p.yaml"
    assert (
        _run(capsys, "principals", "add", "alice", "--policy", str(default_policy_path()), "--principals", str(file))[0]
        == 0
    )
    before = file.read_bytes()
    monkeypatch.delenv("GATEWAY_OPERATOR_TOKEN", raising=False)
    rc, out, err = _run(
        capsys, "principals", "revoke", "alice", "--principals", str(file), "--service", "http://127.0.0.1:9"
    )
    assert (rc, out) == (2, "")
    assert "$GATEWAY_OPERATOR_TOKEN" in err
    assert "nothing was changed" in err
    assert file.read_bytes() == before


def test_revoke_json_says_not_applied_when_no_service_was_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "p.yaml"
    token = _run(
        capsys, "principals", "add", "alice", "--policy", str(default_policy_path()), "--principals", str(file)
    )[1]
    rc, out, _ = _run(capsys, "principals", "revoke", "alice", "--principals", str(file), "--json")
    assert rc == 3
    report = json.loads(out)
    assert report["applied"] is False
    assert report["service"] is None
    assert report["revoked_token_ids"] == [token.split("_")[1]]
    assert report["file"] == str(file)
    assert "no running service was told" in report["reason"]


class _Answers(http.server.BaseHTTPRequestHandler):
    """A loopback stand-in for the service's ``POST /v1/reload``: it answers ``self.server.answer``."""

    def do_POST(self) -> None:
        status, body = self.server.answer  # type: ignore[attr-defined]
        content = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            (200, {"applied": False, "reloaded_at": "2026-01-01T00:00:00.000Z", "source": "p.yaml", "token_ids": [],
                   "problems": ["p.yaml:3: $.principals: duplicate"]}),
            "rejected the reload and keeps its last good principals: p.yaml:3: $.principals: duplicate",
        ),
        (
            (403, {"code": "auth.forbidden", "message": "/v1/reload is for operators"}),
            "refused the reload (HTTP 403, auth.forbidden: /v1/reload is for operators)",
        ),
    ],
    ids=["rejected", "not-an-operator"],
)  # fmt: skip
def test_revoke_says_why_the_service_did_not_apply_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    answer: tuple[int, dict[str, object]],
    reason: str,
) -> None:
    file = str(tmp_path / "p.yaml")
    assert (
        _run(capsys, "principals", "add", "alice", "--policy", str(default_policy_path()), "--principals", file)[0] == 0
    )
    monkeypatch.setenv("GATEWAY_OPERATOR_TOKEN", "agw_00000000_x")
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers) as server:
        server.answer = answer  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rc, out, err = _run(capsys, "principals", "revoke", "alice", "--principals", file, "--service", url, "--json")
        server.shutdown()
    assert rc == 4
    report = json.loads(out)
    assert report["applied"] is False
    assert reason in report["reason"]
    assert "NOT yet applied" in err

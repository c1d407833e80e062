"""``gateway session``: its arguments, its request bodies and what it prints, through ``gateway.cli.main``.

No gateway runs here: the usage errors come before any call, and the answers come from a canned HTTP stub on a
loopback port (the service's own answers, as ``tests/integration/test_session_cli.py`` gets them for real)."""

from __future__ import annotations

import http.server
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import build_parser, main
from gateway.cli.session_cmd import create_body, exec_body, exec_lines, session_lines

SID = "sg8Q9VpOWIVKteLLm2Qs_gzcRQx-yliI"
TOKEN = "agw_00000000_" + "s" * 43


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["session", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _args(*argv: str) -> Any:
    return build_parser("session").parse_args(["session", *argv])


class _Stub(http.server.BaseHTTPRequestHandler):
    """Answers every request with the server's canned ``(status, body)`` and keeps what it was sent."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        server: Any = self.server
        server.seen.append((self.command, self.path, dict(self.headers), self.rfile.read(length)))
        status, body = server.answer
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream" if isinstance(body, bytes) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _answer  # noqa: N815 - http.server's names

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The stub as ``$GATEWAY_URL``, with ``$GATEWAY_TOKEN`` set; ``stub.answer = (status, body)``."""
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub) as server:
        server.seen = []  # type: ignore[attr-defined]
        server.answer = (200, {})  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        monkeypatch.setenv("GATEWAY_URL", f"http://127.0.0.1:{server.server_address[1]}")
        monkeypatch.setenv("GATEWAY_TOKEN", TOKEN)
        yield server
        server.shutdown()


def _result(**fields: Any) -> dict[str, Any]:
    """An execution result object as the service sends it (``ExecutionResult.to_dict`` plus a cell's keys)."""
    return {
        "request_id": "r1", "allowed": True, "decision_id": "d1", "violations": [], "warnings": [],
        "policy": {"name": "sessions", "sha256": "0" * 64}, "exit_code": 0, "stdout": "", "stderr": "",
        "stdout_truncated": False, "stderr_truncated": False, "timed_out": False, "oom_killed": False,
        "output_limit_killed": False, "resource_killed": False, "duration_ms": 1, "files": [],
        "files_truncated": False, "pool": None, "error": None, "audit_ok": True, "exit_status": 0,
        "session_id": SID, "value": None, "value_truncated": False, "interrupted": False, "session_ended": None,
    } | fields  # fmt: skip


SESSION = {
    "session_id": SID, "principal": "alice", "mode": "kernel", "state": "ready", "ready_at": "2026-12-05T16:00:00Z",
    "last_used_at": "2026-12-05T16:00:00Z", "expires_at": "2026-12-05T16:10:00Z",
    "lifetime_ends_at": "2026-12-05T17:00:00Z", "executions": 0, "idle_s": 600, "lifetime_s": 3600,
}  # fmt: skip


# --- arguments and bodies -----------------------------------------------------------------------------------


def test_create_flags_are_the_session_bounds_and_the_run_profile_flags() -> None:
    args = _args(
        "create", "--mode", "workspace", "--idle", "60", "--lifetime", "600", "--workspace-size", "32m",
        "--image", "gateway/sandbox-python:3.11-bookworm", "--memory", "128m", "--timeout", "5",
        "--runtime", "runsc", "--mount", "/data:/mnt/data",
    )  # fmt: skip
    assert create_body(args) == {
        "mode": "workspace", "idle_s": 60.0, "lifetime_s": 600.0, "workspace_size": "32m",
        "image": "gateway/sandbox-python:3.11-bookworm", "runtime": "runsc",
        "limits": {"memory": "128m", "timeout_s": 5.0},
        "mounts": [{"source": "/data", "target": "/mnt/data", "mode": "ro"}],
    }  # fmt: skip
    assert create_body(_args("create", "--mode", "kernel")) == {"mode": "kernel"}


def test_exec_takes_the_code_as_an_argument_from_a_file_or_from_stdin(tmp_path: Path) -> None:
    (tmp_path / "step.py").write_text("x = 41\n")
    (tmp_path / "data.bin").write_bytes(b"\xff\x00")
    assert exec_body(_args("exec", SID, "x + 1")) == {"code": "x + 1"}
    assert exec_body(_args("exec", SID, "-f", str(tmp_path / "step.py"), "--timeout", "3")) == {
        "code": "x = 41\n",
        "limits": {"timeout_s": 3.0},
    }
    body = exec_body(_args("exec", SID, "-", "--env", "A=1", "--file", f"{tmp_path / 'data.bin'}:in/d"), "print(1)")
    assert body == {
        "code": "print(1)",
        "env": {"A": "1"},
        "files": {"in/d": {"content": "/wA=", "encoding": "base64"}},
    }


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["exec", SID], "one of the arguments CODE -f/--program is required"),
        (["exec", SID, "x", "-f", "step.py"], "argument -f/--program: not allowed with argument CODE"),
        (["exec", "../v1/policy", "x"], "argument SID: '../v1/policy' is not a session id"),
        (["close", "a b"], "argument SID: 'a b' is not a session id"),
        (["create"], "the following arguments are required: --mode"),
        (["create", "--mode", "vm"], "argument --mode: invalid choice: 'vm'"),
        (["ls", "--token", TOKEN], "unrecognized arguments: --token"),  # a token is never on the command line
    ],
)
def test_usage_errors_exit_2_naming_the_argument(
    capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    rc, out, err = _run(capsys, *argv)
    assert (rc, out) == (2, "")
    assert said in err


@pytest.mark.parametrize("sid", ["-" + "A" * 31, "-f" + "A" * 30, "--s" + "A" * 29, "--" + "_" * 30])
def test_an_id_that_starts_with_a_dash_is_an_id_not_an_option(sid: str) -> None:
    # One id in 64 starts with "-" (URL-safe base64): argparse would read "-f..." as -f with a value, "--s..." as
    # --service, anything else as an unknown option, and `SID=$(gateway session create ...)` would break.
    assert _args("exec", sid, "x", "--timeout", "2").session_id == sid
    assert _args("exec", "-f", "step.py", sid).session_id == sid
    assert _args("close", sid, "--json").session_id == sid
    assert _args("get", sid, "out/r.bin", "-").local == "-"
    assert _args("put", sid, "in.bin").session_id == sid


def test_without_a_service_or_a_token_nothing_is_sent_and_the_error_says_what_to_set(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATEWAY_URL", raising=False)
    monkeypatch.delenv("GATEWAY_TOKEN", raising=False)
    rc, out, err = _run(capsys, "ls")
    assert (rc, out) == (2, "")
    assert "pass --service URL or set $GATEWAY_URL" in err
    rc, out, err = _run(capsys, "ls", "--service", "http://127.0.0.1:9")
    assert (rc, out) == (2, "")
    assert "set $GATEWAY_TOKEN to the token `gateway principals add` printed" in err


def test_a_service_that_does_not_answer_is_a_gateway_failure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_TOKEN", TOKEN)
    rc, out, err = _run(capsys, "ls", "--service", "http://127.0.0.1:9")  # discard: nothing listens
    assert (rc, out) == (125, "")
    assert "error[service.unreachable]: no answer from the gateway service at http://127.0.0.1:9" in err
    assert TOKEN not in err


# --- what it prints -----------------------------------------------------------------------------------------


def test_create_prints_the_id_alone_and_sends_the_token_in_the_header(
    capsys: pytest.CaptureFixture[str], stub: Any
) -> None:
    stub.answer = (201, SESSION | {"request_id": "r1", "allowed": True, "error": None})
    rc, out, err = _run(capsys, "create", "--mode", "kernel", "--idle", "60")
    assert (rc, out, err) == (0, f"{SID}\n", "")  # SID=$(gateway session create ...); stderr is no terminal
    ((method, path, headers, body),) = stub.seen
    assert (method, path, json.loads(body)) == ("POST", "/v1/sessions", {"mode": "kernel", "idle_s": 60.0})
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    rc, out, _ = _run(capsys, "create", "--mode", "kernel", "--json")
    assert rc == 0
    assert json.loads(out)["session_id"] == SID


def test_a_denied_create_exits_77_with_the_rules_on_stderr(capsys: pytest.CaptureFixture[str], stub: Any) -> None:
    violation = {"rule": "sessions.enabled", "path": "$.mode", "message": "the policy allows no sessions"}
    stub.answer = (403, {"code": "policy.denied", "message": "denied", "request_id": "r9", "violations": [violation],
                         "warnings": [], "policy": {"name": "default", "sha256": "0" * 64}})  # fmt: skip
    rc, out, err = _run(capsys, "create", "--mode", "kernel")
    assert (rc, out) == (77, "")
    assert err.splitlines() == [
        "gateway: denied by policy default (request r9):",
        "  sessions.enabled at $.mode: the policy allows no sessions",
    ]


def test_exec_prints_the_output_then_the_value_and_exits_with_the_programs_status(
    capsys: pytest.CaptureFixture[str], stub: Any
) -> None:
    stub.answer = (200, _result(stdout="hi\n", stderr="warn\n", value="42"))
    rc, out, err = _run(capsys, "exec", SID, "print('hi'); x + 1")
    assert (rc, out, err) == (0, "hi\n42\n", "warn\n")
    assert stub.seen[0][1] == f"/v1/sessions/{SID}/executions"
    stub.answer = (200, _result(exit_code=3, exit_status=3, stderr="Traceback ...\n"))
    assert _run(capsys, "exec", SID, "raise SystemExit(3)") == (3, "", "Traceback ...\n")
    stub.answer = (200, _result(value="'v'"))
    rc, out, _ = _run(capsys, "exec", SID, "'v'", "--json")
    assert (rc, json.loads(out)["value"]) == (0, "'v'")


def test_an_unknown_or_foreign_session_is_said_as_such_with_exit_2(
    capsys: pytest.CaptureFixture[str], stub: Any
) -> None:
    stub.answer = (404, {"code": "session.not_found", "message": f"no session {SID} of principal 'alice'",
                         "request_id": "r2"})  # fmt: skip
    for argv in (["exec", SID, "x"], ["close", SID]):
        rc, out, err = _run(capsys, *argv)
        assert (rc, out) == (2, "")
        assert err.startswith(f"error[session.not_found]: no session {SID} (closed, expired, or not yours)\n")
        assert "`gateway session ls` lists yours" in err
    rc, out, _ = _run(capsys, "close", SID, "--json")
    assert rc == 2
    assert json.loads(out)["error"]["code"] == "session.not_found"


def test_ls_prints_one_line_per_session_and_nothing_when_there_is_none(
    capsys: pytest.CaptureFixture[str], stub: Any
) -> None:
    stub.answer = (200, {"sessions": [SESSION]})
    rc, out, _ = _run(capsys, "ls", "--all")
    assert rc == 0
    assert out == f"{SID}  kernel     ready  expires 2026-12-05T16:10:00Z  executions 0  principal alice\n"
    assert stub.seen[0][1] == "/v1/sessions?all=true"
    stub.answer = (200, {"sessions": []})
    assert _run(capsys, "ls") == (0, "", "")


def test_put_and_get_move_bytes_both_ways(
    capsys: pytest.CaptureFixture[str], stub: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "in.bin").write_bytes(b"\x00\xff")
    stub.answer = (200, {"path": "in.bin", "bytes": 2, "sha256": "ab" * 32})
    assert _run(capsys, "put", SID, str(tmp_path / "in.bin")) == (0, "", "")
    method, path, headers, body = stub.seen[-1]
    assert (method, path, headers["Content-Type"], body) == (
        "PUT", f"/v1/sessions/{SID}/files/in.bin", "application/octet-stream", b"\x00\xff",
    )  # fmt: skip
    stub.answer = (200, b"\x01\x02result")
    monkeypatch.chdir(tmp_path)
    assert _run(capsys, "get", SID, "out/r.bin") == (0, "", "")
    assert (tmp_path / "r.bin").read_bytes() == b"\x01\x02result"
    rc, _, err = _run(capsys, "put", SID, "-")
    assert (rc, err) == (2, "gateway session put: reading stdin (-), give the REMOTE path too\n")
    assert _run(capsys, "put", SID, "absent.bin")[0] == 2


# --- formatting ----------------------------------------------------------------------------------------------


def test_a_cell_interrupted_at_its_deadline_says_the_session_lives_and_a_killed_one_says_it_is_gone() -> None:
    interrupted = exec_lines(_result(timed_out=True, interrupted=True, exit_status=124))[1]
    assert interrupted == ["gateway: the cell was interrupted at its deadline; the session and its state remain"]
    killed = exec_lines(_result(timed_out=True, interrupted=True, session_ended="deadline_ignored"))[1]
    assert killed == [
        "gateway: killed at the deadline",
        "gateway: the session was killed (deadline_ignored); its state is gone",
    ]
    assert exec_lines(_result(value="x" * 10, value_truncated=True))[1] == [
        "gateway: the value was cut at the gateway's bound"
    ]


def test_session_lines_name_the_owner_only_when_asked() -> None:
    assert session_lines([SESSION]) == [f"{SID}  kernel     ready  expires 2026-12-05T16:10:00Z  executions 0"]


def test_stdin_is_read_for_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("y = 2\n"))
    assert exec_body(_args("exec", SID, "-")) == {"code": "y = 2\n"}

"""``gateway session`` against a real ``gateway serve`` on a loopback port, the real engine (runc) and the trail.

Each command is its own process, as from a shell: the session lives in the server, and the CLI reaches it with
``$GATEWAY_URL`` and the token in ``$GATEWAY_TOKEN``. alice and bob run under ``policies/examples/sessions.yaml``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from serve_process import ServeProcess, serve_env

from gateway.resources import policies_dir
from gateway.service.principals import PrincipalsStore

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("engine")]

SESSIONS_POLICY = str(policies_dir() / "examples" / "sessions.yaml")
REQUEST_LABEL = "io.agent-gateway.request"


class Shell:
    """``python -m gateway session ...`` as one principal of one server: (exit status, stdout, stderr)."""

    def __init__(self, server: ServeProcess, token: str, cwd: Path) -> None:
        self.env = serve_env({"GATEWAY_URL": server.url, "GATEWAY_TOKEN": token})
        self.cwd = cwd

    def __call__(self, *argv: str, stdin: bytes = b"") -> tuple[int, str, str]:
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "session", *argv],
            input=stdin, capture_output=True, env=self.env, cwd=self.cwd, timeout=180, check=False,
        )  # fmt: skip
        return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.fixture
def shells(tmp_path: Path, serve_process: Callable[..., ServeProcess]) -> tuple[ServeProcess, Shell, Shell]:
    """A server with alice and bob (both allowed sessions), and a shell for each."""
    store = PrincipalsStore(tmp_path / "principals.yaml")
    tokens = {name: store.add(name, policy=SESSIONS_POLICY) for name in ("alice", "bob")}
    server = serve_process("--drain", "0")
    return server, Shell(server, tokens["alice"], tmp_path), Shell(server, tokens["bob"], tmp_path)


def _containers(engine: Any, request_id: str) -> list[Any]:
    return list(engine.containers.list(all=True, filters={"label": f"{REQUEST_LABEL}={request_id}"}))


def test_a_kernel_session_from_the_shell_keeps_its_state_until_closed(
    shells: tuple[ServeProcess, Shell, Shell], engine: Any
) -> None:
    server, alice, bob = shells
    rc, out, err = alice("create", "--mode", "kernel", "--json")
    assert rc == 0, err
    created = json.loads(out)
    sid = created["session_id"]
    assert len(_containers(engine, created["request_id"])) == 1  # the kernel's one container

    assert alice("exec", sid, "x = 41") == (0, "", "")
    assert alice("exec", sid, "x + 1") == (0, "42\n", "")  # the value, as a REPL prints it
    assert alice("exec", sid, "-", stdin=b"print('out'); import sys; print('err', file=sys.stderr); 'v'") == (
        0, "out\n'v'\n", "err\n",
    )  # fmt: skip
    rc, out, err = alice("exec", sid, "1/0")
    assert (rc, out) == (1, "")
    assert "ZeroDivisionError: division by zero" in err
    rc, out, _ = alice("ls")
    assert (rc, out.split()[:3]) == (0, [sid, "kernel", "ready"])

    rc, out, err = bob("exec", sid, "x")  # another principal's session: the same answer as an unknown id
    assert (rc, out) == (2, "")
    assert err.startswith(f"error[session.not_found]: no session {sid} (closed, expired, or not yours)")
    assert bob("ls") == (0, "", "")

    assert alice("close", sid) == (0, "", "")
    assert _containers(engine, created["request_id"]) == []
    rc, out, err = alice("exec", sid, "x")  # its owner is told it ended; state gone
    assert (rc, out) == (2, "")
    assert f"error[session.gone]: session {sid} has ended: closed" in err
    assert alice("ls") == (0, "", "")
    assert [r["data"]["session_id"] for r in server.events("session.closed")] == [sid]


def test_the_id_alone_on_stdout_so_a_shell_can_keep_it(shells: tuple[ServeProcess, Shell, Shell]) -> None:
    _, alice, _ = shells
    script = (
        f'SID=$("{sys.executable}" -m gateway session create --mode kernel) && '
        f'"{sys.executable}" -m gateway session exec "$SID" "y = 6 * 7" && '
        f'"{sys.executable}" -m gateway session exec "$SID" y && '
        f'"{sys.executable}" -m gateway session close "$SID"'
    )
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=alice.env, timeout=300, check=False
    )
    assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr


def test_a_denied_profile_exits_77_and_creates_nothing(shells: tuple[ServeProcess, Shell, Shell]) -> None:
    _, alice, _ = shells
    rc, out, err = alice("create", "--mode", "kernel", "--image", "python:latest")
    assert (rc, out) == (77, "")
    assert "images.allowlist at $.image" in err
    assert alice("ls") == (0, "", "")


def test_put_and_get_move_binary_files_through_a_workspace_session(
    shells: tuple[ServeProcess, Shell, Shell], tmp_path: Path
) -> None:
    _, alice, _ = shells
    rc, sid, err = alice("create", "--mode", "workspace")
    assert rc == 0, err
    sid = sid.strip()
    try:
        (tmp_path / "in.bin").write_bytes(bytes(range(256)))
        rc, out, err = alice("put", sid, str(tmp_path / "in.bin"), "data/in.bin", "--json")
        assert rc == 0, err
        assert json.loads(out)["bytes"] == 256
        code = "d = open('data/in.bin', 'rb').read(); open('out/rev.bin', 'wb').write(d[::-1]); print(len(d))"
        assert alice("exec", sid, code) == (0, "256\n", "")
        assert alice("get", sid, "out/rev.bin") == (0, "", "")
        assert (tmp_path / "rev.bin").read_bytes() == bytes(range(255, -1, -1))
        rc, out, err = alice("get", sid, "../etc/passwd", "-")
        assert (rc, out) == (2, "")
        assert "error[request.workspace_path]: workspace path '../etc/passwd' contains '..'" in err
    finally:
        assert alice("close", sid)[0] == 0


def test_the_profile_flags_fix_the_session_runtime_gvisor(
    tmp_path: Path, serve_process: Callable[..., ServeProcess], runtimes: tuple[str, ...]
) -> None:
    if "runsc" not in runtimes:
        pytest.skip("gVisor (runsc) is not installed in this engine")
    policy = tmp_path / "sessions-both-runtimes.yaml"
    policy.write_text(
        "apiVersion: gateway.agent-exec/v1\nkind: Policy\n"
        f"extends: {SESSIONS_POLICY}\n"
        "metadata:\n  name: sessions-both-runtimes\n"
        "spec:\n  runtime:\n    allowed: [runc, runsc]\n    default: runc\n"
        "  limits:\n    pids: {default: 256, max: 256}\n"  # gVisor's own threads count against it
    )
    token = PrincipalsStore(tmp_path / "principals.yaml").add("gina", policy=str(policy))
    gina = Shell(serve_process("--drain", "0"), token, tmp_path)
    rc, out, err = gina("create", "--mode", "kernel", "--runtime", "runsc", "--memory", "128m", "--json")
    assert rc == 0, err
    created = json.loads(out)
    assert (created["settings"]["profile"]["runtime"], created["settings"]["profile"]["memory"]) == (
        "runsc", 128 * 1024 * 1024,
    )  # fmt: skip
    sid = created["session_id"]
    assert gina("exec", sid, "import platform; x = platform.release()") == (0, "", "")
    assert gina("exec", sid, "x") == (0, "'4.4.0'\n", "")  # gVisor's kernel release: the cell ran under runsc
    assert gina("close", sid) == (0, "", "")

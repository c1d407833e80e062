"""``gateway serve`` as a platform engineer runs it, a real process on a loopback port: the shipped
deploy/server.yaml, the access log (text and JSON lines, parsed), the SIGTERM drain (/readyz 503 while a run in
flight completes, exit 0), and the two start-up failures that are one line and an exit status of their own (a
port in use, an audit trail that refuses the key), with no "serving" line."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from serve_process import ROOT, ServeProcess, serve_env, until

from gateway.audit import JsonlAuditTrail
from gateway.cli.serve_cmd import EXIT_ADDRESS_UNAVAILABLE, EXIT_AUDIT_REFUSED
from gateway.resources import policies_dir
from gateway.service.principals import PrincipalsStore

SHIPPED = ROOT / "deploy" / "server.yaml"
KEY_A, KEY_B = "11" * 32, "22" * 32


@pytest.fixture
def alice(tmp_path: Path) -> str:
    return PrincipalsStore(tmp_path / "principals.yaml").add(
        "alice", policy=str(policies_dir() / "default.yaml"), role="agent"
    )


def test_the_shipped_server_yaml_serves_as_shipped(alice: str, serve_process: Callable[..., ServeProcess]) -> None:
    server = serve_process("--config", str(SHIPPED))  # the principals file, trail and port: flags, as the CLI allows
    answer = httpx.get(server.url + "/healthz", timeout=10)
    assert answer.status_code == 200
    assert answer.json() == {"status": "ok"}
    assert server.stop() == 0


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_access_log_has_one_text_line_per_request(alice: str, serve_process: Callable[..., ServeProcess]) -> None:
    server = serve_process("--drain", "0")
    before = datetime.now(UTC) - timedelta(seconds=1)
    answers = [
        httpx.get(server.url + "/healthz", timeout=10),
        httpx.get(server.url + "/v1/policy", headers=_auth(alice), timeout=10),
        httpx.get(server.url + "/v1/policy", headers=_auth("agw_nope_nope"), timeout=10),
        httpx.get(server.url + "/no/such?token=secret", timeout=10),
    ]
    after = datetime.now(UTC) + timedelta(seconds=1)
    assert server.stop() == 0
    lines = [line.split(" ") for line in server.out]
    assert len(lines) == len(answers), server.out
    for fields, answer in zip(lines, answers, strict=True):
        when, request_id, _principal, method, _path, status, duration = fields
        assert when.endswith("Z")
        assert before <= datetime.fromisoformat(when) <= after
        assert request_id == answer.headers["X-Request-Id"]
        assert (method, int(status)) == ("GET", answer.status_code)
        assert float(duration) >= 0
    assert [(f[2], f[4], f[5]) for f in lines] == [
        ("-", "/healthz", "200"),
        ("alice", "/v1/policy", "200"),
        ("-", "/v1/policy", "401"),
        ("-", "/no/such", "404"),  # the query (which may carry what a log must not) is left out
    ]


def test_the_access_log_in_json_names_the_principal_of_an_execution(
    alice: str, serve_process: Callable[..., ServeProcess]
) -> None:
    server = serve_process("--drain", "0", "--access-log-format", "json")
    ran = httpx.post(server.url + "/v1/executions", json={"code": "print(1)"}, headers=_auth(alice), timeout=120)
    assert ran.status_code == 200, ran.text
    assert server.stop() == 0
    (record,) = (json.loads(line) for line in server.out)
    assert record["request_id"] == ran.headers["X-Request-Id"] == ran.json()["request_id"]
    assert (record["principal"], record["method"], record["path"], record["status"]) == (
        "alice", "POST", "/v1/executions", 200,
    )  # fmt: skip
    assert record["time"].endswith("Z")
    assert record["duration_ms"] > 0


def test_sigterm_drains_with_readyz_503_while_a_run_in_flight_completes(
    alice: str, serve_process: Callable[..., ServeProcess], managed_containers: Callable[[], list[str]]
) -> None:
    server = serve_process("--drain", "4", "--grace", "30")
    assert httpx.get(server.url + "/readyz", timeout=30).status_code == 200
    box: dict[str, httpx.Response] = {}
    code = "import time; time.sleep(3); print('finished')"

    def run() -> None:
        body = {"code": code, "limits": {"timeout_s": 30}}
        box["run"] = httpx.post(server.url + "/v1/executions", json=body, headers=_auth(alice), timeout=120)

    thread = threading.Thread(target=run)
    thread.start()
    until(managed_containers, "the run's sandbox")  # in flight
    server.proc.send_signal(signal.SIGTERM)
    draining = until(
        lambda: (r := httpx.get(server.url + "/readyz", timeout=10)).status_code == 503 and r, "/readyz to say 503"
    )
    assert draining.json()["code"] == "service.draining"
    assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200  # still served, new requests too
    thread.join(120)
    assert box["run"].status_code == 200, box["run"].text
    assert box["run"].json()["stdout"] == "finished\n"
    assert server.proc.wait(timeout=120) == 0
    assert server.stop() == 0


def _refused(tmp: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, list[str], str]:
    """``gateway serve`` that must not start: its status, its stderr lines, its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--principals", str(tmp / "principals.yaml"), *args],
        cwd=tmp, env=serve_env(env), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return done.returncode, [line for line in done.stderr.splitlines() if line.strip()], done.stdout


def test_a_port_in_use_is_one_line_and_its_own_status_before_serving(tmp_path: Path, alice: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        status, err, out = _refused(tmp_path, "--port", str(port), "--audit-dir", str(tmp_path / "audit"))
    assert status == EXIT_ADDRESS_UNAVAILABLE
    (line,) = err
    assert line.startswith(f"gateway serve: error[service.address_unavailable]: cannot listen on 127.0.0.1:{port}: ")
    assert "another process listens there" in line
    assert "serving" not in line + out
    assert not (tmp_path / "audit").exists()  # refused before anything was opened


@pytest.mark.parametrize(
    ("written_with", "started_with", "why"),
    [
        (None, KEY_A, "a key is configured but the trail was written without one"),
        (KEY_A, KEY_B, "fails its HMAC (wrong key?)"),
        (KEY_A, None, "the trail is keyed (HMAC)"),
    ],
)
def test_an_audit_trail_that_refuses_the_key_is_one_line_and_its_own_status_before_serving(
    tmp_path: Path, alice: str, written_with: str | None, started_with: str | None, why: str
) -> None:
    audit = tmp_path / "audit"
    with JsonlAuditTrail(audit, key=bytes.fromhex(written_with) if written_with else None) as trail:
        trail.append("gateway.start", {"policy_source": "earlier"})
    env = {"GATEWAY_AUDIT_KEY": started_with} if started_with else {}
    status, err, out = _refused(tmp_path, "--port", "0", "--audit-dir", str(audit), env=env)
    assert status == EXIT_AUDIT_REFUSED
    (line,) = err
    assert line.startswith("gateway serve: error[audit.unavailable]: ")
    assert str(audit) in line
    assert why in line
    assert "GATEWAY_AUDIT_KEY" in line  # what to do
    assert "serving" not in line + out
    assert len(audit.joinpath("trail-000001.jsonl").read_text().splitlines()) == 1  # nothing was appended

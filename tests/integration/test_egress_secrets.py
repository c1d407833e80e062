"""Secrets brokered at the egress proxy, on the real engine under runc and runsc: the sandbox never holds the value,
the proxy sets it on requests to the bound host only, a redirect does not carry it, an echo of it is redacted, and
no record, result or export holds it.

The upstream is an HTTP server on 127.0.0.1 started by this test, reached as ``mirror.test`` (with the secret) and
``other.test`` (without) through the runner's table resolver; the secret's value comes from a store given to the
runner, as the gateway's environment (``GATEWAY_SECRET_MIRROR_TOKEN``) would give it.
"""

from __future__ import annotations

import base64
import http.server
import json
import shutil
import tempfile
import textwrap
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit.memory import MemoryAuditSink
from gateway.audit.ocsf import to_ocsf
from gateway.cli import main
from gateway.egress.secrets import SecretStore
from gateway.errors import SandboxError
from gateway.policy.loader import load_policy_text
from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.slots import HostSlots
from tests.egress_support import MIRROR_PORT, TableResolver, mirror_server
from tests.integration.conftest import gateway_containers

pytestmark = pytest.mark.integration

VALUE = "gw-it-secret-4f1d9a7c2b"
"""The secret's value: it must never appear inside a sandbox, nor in any record, result or export."""
FORMS = (VALUE.encode(), base64.b64encode(VALUE.encode()).rstrip(b"="))


class _Echo(http.server.BaseHTTPRequestHandler):
    """Answers with the request's headers (so an echoed credential reaches the run's output); ``/redirect``
    answers 302 to ``other.test``. Every request's headers are kept on the server."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.server.seen.append((self.headers["Host"], self.path, dict(self.headers.items())))  # type: ignore[attr-defined]
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", f"http://other.test:{self.server.server_address[1]}/landing")
            body = b""
        else:
            self.send_response(200)
            body = json.dumps(dict(self.headers.items())).encode()
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def upstream() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _policy(runtime: str, port: int) -> str:
    base = policies_dir() / ("strict.yaml" if runtime == "runsc" else "default.yaml")
    return textwrap.dedent(f"""\
        apiVersion: gateway.agent-exec/v1
        kind: Policy
        extends: {base}
        metadata: {{name: egress-secrets-it-{runtime}}}
        spec:
          images:
            default: gateway/sandbox-python:3.11-bookworm
            allow:
              - {{repository: gateway/sandbox-python, tags: ["3.11-bookworm"]}}
          network:
            default: none
            allowed: [none]
            egress:
              allow:
                - {{host: mirror.test, ports: [{port}], cidrs: [127.0.0.0/8]}}
                - {{host: other.test, ports: [{port}], cidrs: [127.0.0.0/8]}}
              secrets:
                - {{name: mirror-token, hosts: [mirror.test]}}
          sessions:
            modes: [kernel]
            max_per_principal: 1
            idle_s: {{default: 600, max: 600}}
            lifetime_s: {{default: 600, max: 600}}
            workspace_size: {{default: 16m, max: 16m}}
        """)


@pytest.fixture
def gateway(engine: Any, runtime: str, upstream: http.server.ThreadingHTTPServer, tmp_path: Path) -> Iterator[Gateway]:
    yield from _gateway(engine, runtime, upstream, tmp_path)


def _gateway(
    engine: Any,
    runtime: str,
    upstream: http.server.ThreadingHTTPServer,
    tmp_path: Path,
    workspace_root: str | None = None,
) -> Iterator[Gateway]:
    root = Path(tempfile.mkdtemp(prefix="gw-sec-", dir="/tmp")) / "egress"  # a unix socket's path is short
    resolver = TableResolver({"mirror.test": [["127.0.0.1"]], "other.test": [["127.0.0.1"]]})
    store = SecretStore.load({"GATEWAY_SECRET_MIRROR_TOKEN": VALUE})
    runner = DockerRunner(
        engine, egress_resolver=resolver, egress_root=str(root), secrets=store, workspace_root=workspace_root
    )
    policy = load_policy_text(_policy(runtime, upstream.server_address[1]), source=str(tmp_path / "secrets.yaml"))
    gateway = Gateway(policy, runner=runner, audit=MemoryAuditSink(), slots=HostSlots(tmp_path / "slots", 4))
    upstream.seen.clear()  # type: ignore[attr-defined]
    yield gateway
    gateway.close()
    runner.close()
    shutil.rmtree(root.parent, ignore_errors=True)


def _nowhere_but_names(gateway: Gateway, *results: Any) -> None:
    """No record of the trail, no OCSF export of it, no result holds the value in any form."""
    sink = gateway.audit
    assert isinstance(sink, MemoryAuditSink)
    texts = [json.dumps(r) for r in sink.records]
    texts += [json.dumps(to_ocsf(r, trail="memory")) for r in sink.records]
    texts += [json.dumps(r.to_dict()) for r in results]
    for text in texts:
        for form in FORMS:
            assert form.decode() not in text


DUMP = r"""
import base64, glob, os, zlib
parts = [repr(sorted(os.environ.items())).encode()]
for pattern in ("/proc/*/environ", "/proc/*/cmdline"):
    for path in glob.glob(pattern):
        try:
            parts.append(open(path, "rb").read())
        except OSError:
            pass
for top in ("/run/gateway-egress", "/tmp", os.getcwd(), os.path.expanduser("~")):
    for folder, _dirs, names in os.walk(top):
        for name in names:
            path = os.path.join(folder, name)
            try:
                if os.path.isfile(path) and os.path.getsize(path) < 1 << 16:
                    parts.append(path.encode() + b"\0" + open(path, "rb").read())
            except OSError:
                pass
print(base64.b64encode(zlib.compress(b"\n".join(parts))).decode())
"""


def test_the_sandbox_holds_no_trace_of_the_secret(gateway: Gateway, engine: Any) -> None:
    # Compressed, so the runner's redaction (which erases the value's plain and base64 forms) cannot hide a leak.
    result = gateway.execute({"code": DUMP, "network": "egress"})
    assert result.outcome is not None
    o = result.outcome
    assert o.exit_code == 0, (o.timed_out, o.output_limit_killed, o.resource_killed, o.oom_killed, o.stdout_bytes)
    dump = zlib.decompress(base64.b64decode(result.outcome.stdout))
    assert len(dump) > 1000  # the dump did read the environment and files
    for form in FORMS:
        assert form not in dump
    assert b"[secret:" not in result.outcome.stdout
    assert gateway_containers(engine) == []


FETCH = """
import json, urllib.request
def get(url, **headers):
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=20) as answer:
        return answer.read().decode()
chosen = get("http://mirror.test:{port}/echo", Authorization="Bearer chosen-by-sandbox")
print("echo", json.loads(chosen)["Authorization"])
print("other", json.loads(get("http://other.test:{port}/direct")).get("Authorization"))
print("followed", json.loads(get("http://mirror.test:{port}/redirect")).get("Authorization"))
"""


def test_the_header_reaches_the_bound_host_only_and_its_echo_is_redacted(
    gateway: Gateway, upstream: http.server.ThreadingHTTPServer, engine: Any
) -> None:
    port = upstream.server_address[1]
    chunks: list[bytes] = []
    result = gateway.execute(
        {"code": FETCH.format(port=port), "network": "egress"}, on_output=lambda _stream, data: chunks.append(data)
    )
    assert result.outcome is not None
    assert b"".join(chunks) == result.outcome.stdout  # streamed live, erased as well
    assert result.outcome is not None
    assert result.outcome.exit_code == 0, result.outcome.stderr.decode()
    assert result.outcome.stdout.decode().splitlines() == [
        "echo Bearer [secret:mirror-token]",  # the upstream saw the value; the run's output shows its name
        "other None",
        "followed None",  # the redirect went back to the program; its follow-up to other.test carried nothing
    ]
    seen = [(host.split(":")[0], path, headers.get("Authorization")) for host, path, headers in upstream.seen]  # type: ignore[attr-defined]
    assert seen == [
        ("mirror.test", "/echo", f"Bearer {VALUE}"),  # replacing the header the sandbox chose
        ("other.test", "/direct", None),
        ("mirror.test", "/redirect", f"Bearer {VALUE}"),
        ("other.test", "/landing", None),
    ]
    sink = gateway.audit
    assert isinstance(sink, MemoryAuditSink)
    connections = [r["data"] for r in sink.records if r["event_type"] == "network.connection"]
    assert [(c["host"], c.get("secret")) for c in connections] == [
        ("mirror.test", "mirror-token"),
        ("other.test", None),
        ("mirror.test", "mirror-token"),
        ("other.test", None),
    ]
    (outcome,) = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    assert outcome["data"]["egress"]["redactions"] == [{"secret": "mirror-token", "where": "stdout", "count": 1}]
    (decision,) = [r for r in sink.records if r["event_type"] == "policy.decision"]
    assert decision["data"]["decision"]["plan"]["egress"]["secrets"] == [
        {"name": "mirror-token", "hosts": ["mirror.test"], "header": "Authorization"}
    ]
    _nowhere_but_names(gateway, result)
    assert gateway_containers(engine) == []


def test_a_secret_without_a_value_refuses_the_run_before_any_container(
    engine: Any, runtime: str, upstream: http.server.ThreadingHTTPServer, tmp_path: Path
) -> None:
    root = Path(tempfile.mkdtemp(prefix="gw-sec-", dir="/tmp")) / "egress"
    runner = DockerRunner(engine, egress_root=str(root), secrets=SecretStore.load({}))
    policy = load_policy_text(_policy(runtime, upstream.server_address[1]), source=str(tmp_path / "secrets.yaml"))
    gateway = Gateway(policy, runner=runner, audit=MemoryAuditSink(), slots=HostSlots(tmp_path / "slots", 4))
    try:
        result = gateway.execute({"code": "print('never')", "network": "egress"})
    finally:
        gateway.close()
        runner.close()
        shutil.rmtree(root.parent, ignore_errors=True)
    assert result.error is not None
    assert isinstance(result.error, SandboxError)
    assert "GATEWAY_SECRET_MIRROR_TOKEN" in result.error.message
    assert result.outcome is None or result.outcome.container_id is None
    assert gateway_containers(engine) == []


KERNEL_FETCH = FETCH.split("print(", maxsplit=1)[0] + 'print(json.loads(chosen)["Authorization"])\n'


def test_a_kernel_cells_echo_of_the_secret_is_redacted(
    engine: Any, runtime: str, upstream: http.server.ThreadingHTTPServer, tmp_path: Path, workspace_root: str
) -> None:
    made = _gateway(engine, runtime, upstream, tmp_path, workspace_root)
    gateway = next(made)
    try:
        created = gateway.sessions.create({"mode": "kernel", "principal": "alice", "network": "egress"})
        assert created.session is not None, created.to_dict()
        sid = created.session.session_id
        code = KERNEL_FETCH.format(port=upstream.server_address[1])
        chunks: list[bytes] = []
        result = gateway.sessions.execute(
            sid, {"code": code, "principal": "alice"}, on_output=lambda _stream, data: chunks.append(data)
        )
        assert result.outcome is not None, result.to_dict()
        assert result.outcome.exit_code == 0, result.outcome.stderr.decode()
        assert result.outcome.stdout == b"Bearer [secret:mirror-token]\n"
        assert b"".join(chunks) == result.outcome.stdout  # streamed live, erased as well
        assert result.outcome.egress is not None
        assert [r.to_dict() for r in result.outcome.egress.redactions] == [
            {"secret": "mirror-token", "where": "stdout", "count": 1}
        ]
        gateway.sessions.close(sid, principal="alice")
        _nowhere_but_names(gateway, result)
    finally:
        next(made, None)
    assert gateway_containers(engine) == []


@pytest.fixture
def mirror_echo() -> Iterator[http.server.ThreadingHTTPServer]:
    with mirror_server(_Echo) as server:
        server.seen = []  # type: ignore[attr-defined]
        yield server


def test_the_shipped_policy_with_the_secret_from_the_environment(
    mirror_echo: http.server.ThreadingHTTPServer,
    engine: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``gateway run`` under policies/examples/egress-mirror-secret.yaml, the value in GATEWAY_SECRET_MIRROR_TOKEN."""
    code = (
        "import json, urllib.request\n"
        f"answer = urllib.request.urlopen('http://mirror.internal:{MIRROR_PORT}/simple/', timeout=20).read()\n"
        "print(json.loads(answer)['Authorization'])\n"
    )
    policy = str(policies_dir() / "examples" / "egress-mirror-secret.yaml")
    audit = tmp_path / "audit"
    argv = ["run", "--json", "--policy", policy, "--audit-dir", str(audit), "--network", "egress", "--code", code]
    monkeypatch.delenv("GATEWAY_SECRETS_FILE", raising=False)
    monkeypatch.delenv("GATEWAY_SECRET_MIRROR_TOKEN", raising=False)
    refused = main(argv)
    assert "GATEWAY_SECRET_MIRROR_TOKEN" in capsys.readouterr().out
    assert refused != 0
    assert mirror_echo.seen == []  # type: ignore[attr-defined]
    monkeypatch.setenv("GATEWAY_SECRET_MIRROR_TOKEN", VALUE)
    rc = main(argv)
    out = capsys.readouterr().out
    result = json.loads(out)
    assert rc == 0, out[:3000]
    assert result["stdout"] == "Bearer [secret:mirror-token]\n"
    assert [headers.get("Authorization") for _, _, headers in mirror_echo.seen] == [f"Bearer {VALUE}"]  # type: ignore[attr-defined]
    trail = b"".join(path.read_bytes() for path in audit.rglob("*") if path.is_file())
    assert b"mirror-token" in trail
    for form in FORMS:
        assert form not in trail
        assert form.decode() not in out
    assert gateway_containers(engine) == []

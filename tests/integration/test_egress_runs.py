"""Egress through the run's own proxy on the real engine, under runc and runsc: what reaches the named hosts, what is
refused (each attack of issue 31 from inside a sandbox), and that everything ends with the run.

The upstreams are servers this test starts on 127.0.0.1; the policy allows them through an explicit CIDR entry
(127.0.0.0/8), the way an operator allows an internal mirror. Names resolve through a fake resolver (the runner's
``egress_resolver``), so no name outside is ever looked up; the last test uses the shipped
``policies/examples/egress-mirror.yaml`` and the system resolver (``mirror.internal`` is mapped to 127.0.0.1 in
/etc/hosts by ``scripts/setup.sh``).
"""

from __future__ import annotations

import contextlib
import datetime
import http.server
import json
import shutil
import socket
import ssl
import tempfile
import textwrap
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit.memory import MemoryAuditSink
from gateway.cli import main
from gateway.egress import EgressReport
from gateway.policy.loader import load_policy_text
from gateway.resources import policies_dir
from gateway.result import ExecutionResult
from gateway.runner.docker.runner import DockerRunner
from gateway.slots import HostSlots
from tests.egress_support import MIRROR_PORT, TableResolver, mirror_server
from tests.integration.conftest import gateway_containers

pytestmark = pytest.mark.integration

NODE_IMAGES = ("gateway/sandbox-node:24-bookworm", "gateway/sandbox-node:18-bookworm")
"""The Node.js sandbox images, newest first: the JavaScript test uses the first one present."""
BIG = 256 * 1024
"""Bytes of the upstream's ``/big`` body: past the byte cap the tests ask for."""


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = b"x" * BIG if self.path == "/big" else f"hello {self.path} via {self.headers['Host']}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *args: Any) -> None:
        pass


class Holder:
    """A server that reads what a client sends and never answers; notes each client's end (EOF) as it comes."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.accepted = threading.Event()
        self.ended = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def fresh(self) -> Holder:
        """This holder with what an earlier test's clients did forgotten (the module's tests share it)."""
        self.accepted.clear()
        self.ended.clear()
        return self

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                self.accepted.set()
                threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while conn.recv(65536):
                pass
            self.ended.set()


@dataclass
class Upstreams:
    http: int
    tls: int
    holder: Holder
    cert: bytes
    """The TLS server's self-signed certificate (PEM) for ``mirror.test``: the sandbox verifies against it."""


def _self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    secure = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    cert, key = _self_signed(tmp_path_factory.mktemp("tls"), "mirror.test")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    for server in (plain, secure):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    holder = Holder()
    yield Upstreams(plain.server_address[1], secure.server_address[1], holder, cert.read_bytes())
    for server in (plain, secure):
        server.shutdown()
        server.server_close()
    holder.listener.close()


def policy_text(
    runtime: str, up: Upstreams, *, connections: int = 64, bytes_in: str = "64m", node: str = NODE_IMAGES[0]
) -> str:
    base = policies_dir() / ("strict.yaml" if runtime == "runsc" else "default.yaml")
    ports = f"[{up.http}, {up.tls}, {up.holder.port}]"
    return textwrap.dedent(f"""\
        apiVersion: gateway.agent-exec/v1
        kind: Policy
        extends: {base}
        metadata: {{name: egress-it-{runtime}}}
        spec:
          languages:
            allowed: [python, javascript]
            default: python
            images:
              python: {{default: "gateway/sandbox-python:3.11-bookworm"}}
              javascript: {{default: "{node}"}}
          images:
            default: gateway/sandbox-python:3.11-bookworm
            allow:
              - {{repository: gateway/sandbox-python, tags: ["3.11-bookworm"]}}
              - {{repository: gateway/sandbox-node, tags: ["{node.split(":")[1]}"]}}
          env:
            allowed: ["HTTP_PROXY", "NO_PROXY"]
          network:
            default: none
            allowed: [none]
            egress:
              allow:
                - {{host: mirror.test, ports: {ports}, cidrs: [127.0.0.0/8]}}
                - {{host: rebind.test, ports: [{up.http}], cidrs: [127.0.0.0/8]}}
                - {{host: private.test, ports: [{up.http}]}}
                - {{host: metadata.test, ports: [80]}}
              limits:
                connections: {{default: {connections}, max: 64}}
                bytes_out: {{default: 1m, max: 1m}}
                bytes_in: {{default: {bytes_in}, max: 64m}}
                rate: {{default: 1000, max: 1000}}
          sessions:
            modes: [workspace, kernel]
            max_per_principal: 2
            idle_s: {{default: 600, max: 1800}}
            lifetime_s: {{default: 600, max: 3600}}
            workspace_size: {{default: 16m, max: 64m}}
        """)


ANSWERS: dict[str, Sequence[Sequence[str]]] = {
    "mirror.test": [["127.0.0.1"]],
    "rebind.test": [["127.0.0.1"], ["10.0.0.1"]],  # public enough the first time, private the second
    "private.test": [["10.1.2.3"]],
    "metadata.test": [["169.254.169.254"]],
}


@dataclass
class Egress:
    """A Gateway whose runner's proxies use the test's resolver, and the root of their directories."""

    gateway: Gateway
    resolver: TableResolver
    root: Path

    def run(self, code: str, **request: Any) -> ExecutionResult:
        result = self.gateway.execute({"code": textwrap.dedent(code), "network": "egress", **request})
        assert result.outcome is not None, result.to_dict()
        return result

    def session(self, mode: str) -> str:
        """The id of a new session of ``mode`` for alice, with egress."""
        created = self.gateway.sessions.create({"mode": mode, "principal": "alice", "network": "egress"})
        assert created.session is not None, created.to_dict()
        return created.session.session_id


@pytest.fixture
def make_egress(engine: Any, runtime: str, upstreams: Upstreams, tmp_path: Path) -> Iterator[Callable[..., Egress]]:
    made: list[tuple[Gateway, Path]] = []

    def make(workspace_root: str | None = None, **limits: Any) -> Egress:
        # A short root: a unix socket's path is at most 107 bytes.
        root = Path(tempfile.mkdtemp(prefix="gw-eg-", dir="/tmp")) / "egress"
        resolver = TableResolver(ANSWERS)
        runner = DockerRunner(engine, egress_resolver=resolver, egress_root=str(root), workspace_root=workspace_root)
        policy = load_policy_text(policy_text(runtime, upstreams, **limits), source=str(tmp_path / "egress.yaml"))
        gateway = Gateway(policy, runner=runner, audit=MemoryAuditSink(), slots=HostSlots(tmp_path / "slots", 4))
        made.append((gateway, root))
        return Egress(gateway, resolver, root)

    yield make
    for gateway, root in made:
        gateway.close()
        gateway.runner.close()
        shutil.rmtree(root.parent, ignore_errors=True)


def report_of(result: ExecutionResult) -> EgressReport:
    assert result.outcome is not None
    report = result.outcome.egress
    assert report is not None
    return report


def assert_ended_cleanly(egress: Egress, engine: Any) -> None:
    """No container of the run is left, and its proxy's directory is gone."""
    assert gateway_containers(engine) == []
    assert list(egress.root.iterdir()) == []


def connections_in_trail(egress: Egress) -> list[tuple[str | None, str, str]]:
    """The ``network.connection`` records of ``egress``'s trail: request id, host, decision; each right before its
    execution's ``execution.outcome`` (or another connection of it), or those a kernel's end cut (no request id)
    right before the session's end."""
    sink = egress.gateway.audit
    assert isinstance(sink, MemoryAuditSink)
    found = []
    for record, following in zip(sink.records, sink.records[1:], strict=False):
        if record["event_type"] == "network.connection":
            ends = ("execution.outcome",) if record["request_id"] else ("session.closed", "session.expired")
            assert following["event_type"] in ("network.connection", *ends)
            assert following["request_id"] == record["request_id"]
            found.append((record["request_id"], record["data"]["host"], record["data"]["decision"]))
    return found


def lines(result: ExecutionResult) -> dict[str, str]:
    assert result.outcome is not None
    found = {}
    for line in result.outcome.stdout.decode().splitlines():
        name, _, value = line.partition(" ")
        found[name] = value
    return found


def test_a_run_fetches_over_http_and_https_through_its_proxy(
    make_egress: Callable[..., Egress], upstreams: Upstreams, engine: Any
) -> None:
    egress = make_egress()
    code = f"""
        import os, ssl, urllib.request
        print("env", os.environ["HTTP_PROXY"], os.environ["https_proxy"], os.environ["NO_PROXY"],
              os.environ["npm_config_https_proxy"])
        print("http", urllib.request.urlopen("http://mirror.test:{upstreams.http}/plain", timeout=20).read().decode())
        context = ssl.create_default_context(cafile="ca.pem")
        with urllib.request.urlopen("https://mirror.test:{upstreams.tls}/secure", timeout=20, context=context) as r:
            print("https", r.read().decode())
        """
    # The request's own proxy variables are overridden: the gateway's proxy is the only way out anyway.
    result = egress.run(
        code, files={"ca.pem": upstreams.cert.decode()}, env={"HTTP_PROXY": "http://evil:1", "NO_PROXY": "*"}
    )
    assert result.outcome is not None
    assert result.outcome.exit_code == 0, result.outcome.stderr.decode()
    out = lines(result)
    proxy = "http://127.0.0.1:3128"
    assert out["env"] == f"{proxy} {proxy} localhost,127.0.0.1 {proxy}"
    assert out["http"] == f"hello /plain via mirror.test:{upstreams.http}"
    assert out["https"] == f"hello /secure via mirror.test:{upstreams.tls}"
    report = report_of(result)
    assert (report.connections, report.denied, report.dropped) == (2, 0, 0)
    plain, tunnel = report.records
    for record, method, port in ((plain, "GET", upstreams.http), (tunnel, "CONNECT", upstreams.tls)):
        assert (record.method, record.host, record.port, record.address) == (method, "mirror.test", port, "127.0.0.1")
        assert (record.allowed, record.rule, record.ended) == (True, "network.egress.allowed", "closed")
        assert record.bytes_out > 0
        assert record.bytes_in > 0
    assert report.bytes_in == plain.bytes_in + tunnel.bytes_in
    assert egress.resolver.calls == ["mirror.test", "mirror.test"]
    assert_ended_cleanly(egress, engine)


def test_direct_sockets_have_no_route(make_egress: Callable[..., Egress], upstreams: Upstreams, engine: Any) -> None:
    egress = make_egress()
    code = f"""
        import socket
        for name, address in (("loopback", ("127.0.0.1", {upstreams.http})), ("outside", ("192.0.2.1", 80))):
            s = socket.socket()
            s.settimeout(10)
            try:
                s.connect(address)
                print(name, "connected")
            except OSError as e:
                print(name, e.errno)
        """
    result = egress.run(code)
    out = lines(result)
    # 127.0.0.1 is the sandbox's own loopback (nothing listens there but the bridge); no route leads out.
    assert out["loopback"] == "111"  # ECONNREFUSED
    assert out["outside"] in ("101", "113")  # ENETUNREACH (runc), EHOSTUNREACH (gVisor's netstack)
    report = report_of(result)
    assert (report.records, report.connections) == ((), 0)
    assert egress.resolver.calls == []
    assert_ended_cleanly(egress, engine)


# Each attack is a raw request through the bridge: (name, request head or a CONNECT target, expected rule).
_ATTACKS = """
import socket, ssl
def ask(head):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(head.encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    status = data.split(b"\\r\\n", 1)[0].decode()
    body = data.split(b"\\r\\n\\r\\n", 1)[-1].split(b"\\n", 1)[0].decode()
    return status.split(" ")[1] if " " in status else "none", body
def connect(target):
    return ask("CONNECT %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % (target, target))
def get(url, host):
    return ask("GET %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % (url, host))
"""


def test_attacks_through_the_proxy_are_refused_with_the_rule(
    make_egress: Callable[..., Egress], upstreams: Upstreams, engine: Any
) -> None:
    egress = make_egress()
    up, tls = upstreams.http, upstreams.tls
    attacks = {
        "other-host": f"get('http://elsewhere.test:{up}/', 'elsewhere.test:{up}')",
        "other-port": "connect('mirror.test:22')",
        "host-header": f"get('http://mirror.test:{up}/', 'elsewhere.test')",
        "host-in-uri": f"get('http://elsewhere.test:{up}/', 'mirror.test:{up}')",
        "decimal": f"connect('2130706433:{up}')",
        "octal": f"connect('0177.0.0.1:{up}')",
        "mapped": f"connect('[::ffff:127.0.0.1]:{up}')",
        "literal": f"get('http://127.0.0.1:{up}/', '127.0.0.1:{up}')",
        "localhost": f"get('http://localhost:{up}/', 'localhost:{up}')",
        "metadata-name": "get('http://metadata.google.internal/computeMetadata/v1/', 'metadata.google.internal')",
        "metadata": "get('http://metadata.test/', 'metadata.test')",
        "private": f"get('http://private.test:{up}/', 'private.test:{up}')",
        "rebind-1": f"get('http://rebind.test:{up}/first', 'rebind.test:{up}')",
        "rebind-2": f"get('http://rebind.test:{up}/second', 'rebind.test:{up}')",
    }
    code = _ATTACKS + "".join(f"print({name!r}, *{call})\n" for name, call in attacks.items())
    # Domain fronting: a tunnel to the allowed name whose ClientHello names another host.
    code += textwrap.dedent(f"""
        s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
        s.sendall(b"CONNECT mirror.test:{tls} HTTP/1.1\\r\\nHost: mirror.test:{tls}\\r\\n\\r\\n")
        head = s.recv(4096).split(b"\\r\\n", 1)[0].decode()
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        try:
            context.wrap_socket(s, server_hostname="elsewhere.test").do_handshake()
            print("fronting", head.split(" ")[1], "handshake")
        except (OSError, ssl.SSLError) as e:
            print("fronting", head.split(" ")[1], type(e).__name__)
        """)
    result = egress.run(code)
    assert result.outcome is not None
    assert result.outcome.exit_code == 0, result.outcome.stderr.decode()
    out = lines(result)
    expected = {
        "other-host": "403 network.egress.host",
        "other-port": "403 network.egress.port",
        "host-header": "403 network.egress.host-mismatch",
        "host-in-uri": "403 network.egress.host-mismatch",
        "decimal": "403 network.egress.literal",
        "octal": "403 network.egress.literal",
        "mapped": "403 network.egress.literal",
        "literal": "403 network.egress.literal",
        "localhost": "403 network.egress.host",
        "metadata-name": "403 network.egress.host",
        "metadata": "403 network.egress.address.link-local",
        "private": "403 network.egress.address.private",
        "rebind-1": f"200 hello /first via rebind.test:{up}",
        "rebind-2": "403 network.egress.address.private",
    }
    assert {name: out[name] for name in expected} == expected
    # The tunnel was opened (200), then ended at the ClientHello naming another host than the CONNECT's.
    status, ending = out["fronting"].split(" ")
    assert status == "200"
    assert ending != "handshake"
    report = report_of(result)
    records = report.records
    assert len(records) == len(attacks) + 1
    fronting = records[-1]
    assert (fronting.method, fronting.host, fronting.allowed, fronting.rule) == (
        "CONNECT",
        "mirror.test",
        False,
        "network.egress.sni",
    )
    allowed = [r for r in records if r.allowed]
    assert [(r.host, r.address, r.ended) for r in allowed] == [("rebind.test", "127.0.0.1", "closed")]
    assert report.denied == len(attacks)  # every attack but the first rebind, and the fronting tunnel
    # Names never on the list are refused before any lookup; listed ones are looked up once per connection (the
    # rebinding answer is checked, and connected to, as it is: never looked up twice for one connection; mirror.test
    # is the fronting tunnel's, the other port's is refused before any lookup).
    calls = egress.resolver.calls
    assert sorted(calls) == ["metadata.test", "mirror.test", "private.test", "rebind.test", "rebind.test"]
    assert_ended_cleanly(egress, engine)


def test_a_flood_past_the_connection_limit_is_refused(
    make_egress: Callable[..., Egress], upstreams: Upstreams, engine: Any
) -> None:
    egress = make_egress(connections=3)
    code = (
        _ATTACKS
        + f"target = 'mirror.test:{upstreams.http}'\n"
        + "for i in range(6):\n    print('c%d' % i, *get('http://%s/' % target, target))\n"
    )
    result = egress.run(code)
    out = {name: value.split(" ")[:2] for name, value in lines(result).items()}
    assert [out[f"c{i}"][0] for i in range(6)] == ["200"] * 3 + ["403"] * 3
    assert out["c5"][1] == "network.egress.limit.connections"
    report = report_of(result)
    assert (report.connections, report.denied) == (3, 3)
    assert [r.rule for r in report.records[3:]] == ["network.egress.limit.connections"] * 3
    assert_ended_cleanly(egress, engine)


def test_the_byte_cap_ends_a_download(make_egress: Callable[..., Egress], upstreams: Upstreams, engine: Any) -> None:
    egress = make_egress(bytes_in="64k")
    code = f"""
        import urllib.request
        try:
            data = urllib.request.urlopen("http://mirror.test:{upstreams.http}/big", timeout=20).read()
            print("got", len(data))
        except Exception as e:
            print("cut", type(e).__name__)
        """
    result = egress.run(code)
    assert lines(result)["cut"]  # never the whole body
    (record,) = report_of(result).records
    assert (record.allowed, record.ended, record.rule) == (True, "limit", "network.egress.limit.bytes-in")
    assert record.bytes_in <= 64 * 1024 < BIG
    assert_ended_cleanly(egress, engine)


def test_connections_held_past_the_deadline_end_with_the_run(
    make_egress: Callable[..., Egress], upstreams: Upstreams, engine: Any
) -> None:
    egress = make_egress()
    holder = upstreams.holder.fresh()
    code = f"""
        import socket, time
        s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
        target = "mirror.test:{holder.port}"
        s.sendall(("GET http://%s/hold HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % (target, target)).encode())
        print("holding", flush=True)
        time.sleep(600)
        """
    result = egress.run(code, limits={"timeout_s": 6})
    assert result.outcome is not None
    assert result.outcome.timed_out
    assert holder.accepted.is_set()
    assert holder.ended.wait(10)  # the upstream saw the connection end when the run did
    (record,) = report_of(result).records
    assert (record.host, record.port, record.allowed, record.ended) == ("mirror.test", holder.port, True, "run-ended")
    assert_ended_cleanly(egress, engine)


def test_javascript_reaches_its_host_through_the_proxy_environment(
    make_egress: Callable[..., Egress], upstreams: Upstreams, engine: Any
) -> None:
    present = [name for name in NODE_IMAGES if engine.api.images(name=name)]
    if not present:
        pytest.skip(f"no Node.js sandbox image ({', '.join(NODE_IMAGES)}); run scripts/build-image.sh --all")
    egress = make_egress(node=present[0])
    code = f"""
        const http = require('http');
        const proxy = new URL(process.env.HTTP_PROXY);
        const target = 'http://mirror.test:{upstreams.http}/node';
        http.get({{host: proxy.hostname, port: proxy.port, path: target,
                   headers: {{Host: 'mirror.test:{upstreams.http}'}}}}, (res) => {{
          let body = '';
          res.on('data', (c) => body += c);
          res.on('end', () => console.log('node', res.statusCode, body));
        }});
        """
    result = egress.run(code, language="javascript")
    assert result.outcome is not None
    assert result.outcome.exit_code == 0, result.to_dict()
    assert lines(result)["node"] == f"200 hello /node via mirror.test:{upstreams.http}"
    (record,) = report_of(result).records
    assert (record.host, record.allowed, record.ended) == ("mirror.test", True, "closed")
    assert_ended_cleanly(egress, engine)


def test_each_execution_of_a_workspace_session_has_its_own_proxy(
    make_egress: Callable[..., Egress], upstreams: Upstreams, engine: Any, workspace_root: str
) -> None:
    egress = make_egress(workspace_root=workspace_root)
    sessions = egress.gateway.sessions
    sid = egress.session("workspace")
    code = (
        "import urllib.request\n"
        f"data = urllib.request.urlopen('http://mirror.test:{upstreams.http}/ws', timeout=20).read()\n"
        "open('kept.txt', 'wb').write(data)\n"
        "print(data.decode())\n"
    )
    first = sessions.execute(sid, {"code": code, "principal": "alice"})
    second = sessions.execute(sid, {"code": "print(open('kept.txt').read())", "principal": "alice"})
    expected = f"hello /ws via mirror.test:{upstreams.http}\n".encode()
    assert (first.outcome.stdout, second.outcome.stdout) == (expected, expected)
    assert [r.host for r in report_of(first).records] == ["mirror.test"]
    assert report_of(second).records == ()  # its own proxy: nothing of the first execution's
    assert list(egress.root.iterdir()) == []
    assert connections_in_trail(egress) == [(first.request_id, "mirror.test", "allowed")]
    sessions.close(sid, principal="alice")
    assert_ended_cleanly(egress, engine)


_FETCH = """
import os, socket
def fetch(path):
    # Read to the end: the proxy records a connection when it ends, so this cell's outcome has it.
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    target = "mirror.test:%d" % PORT
    s.sendall(("GET http://%s%s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % (target, path, target)).encode())
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    s.close()
    return data.split(b"\\r\\n\\r\\n", 1)[1].decode()
"""


def test_a_kernel_session_has_one_proxy_for_its_life_and_each_cell_its_connections(
    make_egress: Callable[..., Egress], upstreams: Upstreams, engine: Any, workspace_root: str
) -> None:
    egress = make_egress(workspace_root=workspace_root)
    holder = upstreams.holder.fresh()
    sessions = egress.gateway.sessions
    sid = egress.session("kernel")
    (directory,) = egress.root.iterdir()  # the kernel's proxy, for its whole life

    def cell(code: str) -> ExecutionResult:
        result = sessions.execute(sid, {"code": textwrap.dedent(code), "principal": "alice"})
        assert result.outcome is not None, result.to_dict()
        assert result.outcome.exit_code == 0, result.outcome.stderr.decode()
        return result

    first = cell(f"PORT = {upstreams.http}\n{_FETCH}\nkept = fetch('/one')\nprint(os.environ['HTTP_PROXY'], kept)")
    second = cell("again = fetch('/two')\nprint(kept, '|', again)")
    proxy = "http://127.0.0.1:3128"
    assert first.outcome is not None
    assert second.outcome is not None
    assert first.outcome.stdout.decode() == f"{proxy} hello /one via mirror.test:{upstreams.http}\n"
    assert second.outcome.stdout.decode() == (
        f"hello /one via mirror.test:{upstreams.http} | hello /two via mirror.test:{upstreams.http}\n"
    )
    for result in (first, second):  # each cell: the connection it made, and no other
        report = report_of(result)
        assert [(r.host, r.port, r.allowed, r.ended) for r in report.records] == [
            ("mirror.test", upstreams.http, True, "closed")
        ]
        assert (report.connections, report.denied) == (1, 0)
    # A connection the session still holds when it is closed: ended with it.
    code = f"""
        held = socket.create_connection(("127.0.0.1", 3128), timeout=20)
        target = "mirror.test:{holder.port}"
        held.sendall(("GET http://%s/hold HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % (target, target)).encode())
        """
    third = cell(code)
    assert holder.accepted.wait(10)
    assert directory.exists()
    sessions.close(sid, principal="alice")
    assert holder.ended.wait(10)  # the upstream saw the connection end with the session
    assert report_of(third).records == ()  # still open when the cell returned
    assert connections_in_trail(egress) == [
        (first.request_id, "mirror.test", "allowed"), (second.request_id, "mirror.test", "allowed"),
        (None, "mirror.test", "allowed"),
    ]  # fmt: skip
    sink = egress.gateway.audit
    assert isinstance(sink, MemoryAuditSink)
    cut, end = sink.records[-2:]
    assert (cut["event_type"], cut["request_id"], cut["data"]["ended"]) == ("network.connection", None, "run-ended")
    assert cut["data"]["port"] == holder.port
    assert (end["event_type"], end["data"]["session_id"]) == ("session.closed", sid)
    assert_ended_cleanly(egress, engine)


def test_a_cell_that_gets_its_kernel_killed_has_the_connections_the_end_cut(
    make_egress: Callable[..., Egress], upstreams: Upstreams, engine: Any, workspace_root: str
) -> None:
    egress = make_egress(workspace_root=workspace_root)
    holder = upstreams.holder.fresh()
    sessions = egress.gateway.sessions
    sid = egress.session("kernel")
    code = f"""
        import signal, socket, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # past its deadline and the grace: the kernel is killed
        held = socket.create_connection(("127.0.0.1", 3128), timeout=20)
        target = "mirror.test:{holder.port}"
        held.sendall(("GET http://%s/hold HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n" % (target, target)).encode())
        while True:
            time.sleep(1)
        """
    result = sessions.execute(
        sid, {"code": textwrap.dedent(code), "principal": "alice", "limits": {"timeout_s": 3}}
    )  # fmt: skip
    assert result.session_ended is not None, result.to_dict()
    assert holder.accepted.is_set()
    assert holder.ended.wait(10)
    (record,) = report_of(result).records
    assert (record.port, record.allowed, record.ended) == (holder.port, True, "run-ended")
    assert connections_in_trail(egress) == [(result.request_id, "mirror.test", "allowed")]
    assert_ended_cleanly(egress, engine)


@pytest.fixture
def mirror_upstream() -> Iterator[int]:
    with mirror_server(_Handler):
        yield MIRROR_PORT


def test_the_shipped_mirror_policy_end_to_end(
    mirror_upstream: int, engine: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``gateway run --network egress`` under policies/examples/egress-mirror.yaml, the system resolver."""
    code = (
        "import urllib.request\n"
        f"url = 'http://mirror.internal:{mirror_upstream}/simple/'\n"
        "print(urllib.request.urlopen(url, timeout=20).read().decode())\n"
        "try:\n"
        "    urllib.request.urlopen('http://elsewhere.internal:18089/', timeout=20)\n"
        "except Exception as e:\n"
        "    print(e.read().decode().split(chr(10))[0])\n"
    )
    mirror = str(policies_dir() / "examples" / "egress-mirror.yaml")
    argv = ["run", "--json", "--policy", mirror, "--audit-dir", str(tmp_path / "audit"), "--network", "egress"]
    rc = main([*argv, "--code", code])
    result = json.loads(capsys.readouterr().out)
    assert rc == 0, json.dumps(result)[:3000]
    assert result["stdout"] == f"hello /simple/ via mirror.internal:{mirror_upstream}\nnetwork.egress.host\n"
    assert gateway_containers(engine) == []

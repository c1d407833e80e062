"""A workspace session's file API over HTTP, against a real server on loopback and the real engine: binary files
in and out byte for byte around a real execution, the listing, links a program planted, path tricks in the URL,
the caps, another principal, a busy session, a kernel session, and the trail (``session.file.put`` / ``get``
with path, bytes and sha256) verifying. Sessions are created over HTTP (POST /v1/sessions); the executions
that read and plant files go through the manager of the server's own Gateway (their results are the objects)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.audit import verify_trail
from gateway.cli import main
from gateway.client import AsyncClient, Client
from gateway.errors import SessionNotFoundError, WorkspaceFileNotFoundError, WorkspacePathError
from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.workspace import WorkspaceFile, WorkspaceListing
from gateway.service.config import ServerConfig
from gateway.service.principals import PrincipalsStore
from gateway.service.service import Service
from gateway.sessions import SessionFile

pytestmark = pytest.mark.integration

EVERY_BYTE = bytes(range(256)) * 64
"""16 KiB holding every byte value, NUL and invalid UTF-8 included."""
MAX_BODY = 2 << 20
"""The server's max_body_bytes: larger than the default policy's 1 MiB files_size ceiling."""


class Served:
    """A server on loopback whose principals (alice, bob) may hold workspace and kernel sessions."""

    def __init__(self, url: str, service: Service, audit_dir: Path, tokens: dict[str, str]) -> None:
        self.url, self.service, self.audit_dir, self.tokens = url, service, audit_dir, tokens

    def client(self, principal: str = "alice") -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[principal]}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def session(self, mode: str = "workspace", **body: Any) -> str:
        with self.client() as client:
            created = client.post("/v1/sessions", json={"mode": mode, **body})
        assert created.status_code == 201, created.text
        session_id: str = created.json()["session_id"]
        return session_id

    def execute(self, session_id: str, code: str, **body: Any) -> Any:
        return self.service.gateway.sessions.execute(session_id, {"code": code, "principal": "alice", **body})

    def raw(self, method: str, target: str, principal: str = "alice", body: bytes | None = None) -> tuple[int, bytes]:
        """A request whose target is sent exactly as written (httpx would normalise dot segments and escapes)."""
        host, port = self.url.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            headers = {"Authorization": f"Bearer {self.tokens[principal]}"}
            if body is not None:
                headers["Content-Type"] = "application/octet-stream"
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def records(self, event_type: str) -> list[dict[str, Any]]:
        return [
            record
            for segment in sorted(self.audit_dir.glob("trail-*.jsonl"))
            for record in map(json.loads, segment.read_text().splitlines())
            if record["event_type"] == event_type
        ]


def _policy(directory: Path, runtime: str) -> Path:
    """The default (runc) or strict (runsc) policy plus both session modes."""
    base = "strict.yaml" if runtime == "runsc" else "default.yaml"
    path = directory / f"files-{runtime}.yaml"
    path.write_text(
        "apiVersion: gateway.agent-exec/v1\nkind: Policy\n"
        f"extends: {policies_dir() / base}\n"
        f"metadata:\n  name: files-{runtime}\n"
        "spec:\n  sessions:\n    modes: [workspace, kernel]\n    max_per_principal: 4\n"
        "    idle_s: {default: 600, max: 1800}\n    lifetime_s: {default: 3600, max: 14400}\n"
        "    workspace_size: {default: 16m, max: 64m}\n"
    )
    return path


@pytest.fixture
def serve_files(tmp_path: Path, workspace_root: str, engine: Any) -> Iterator[Callable[[str], Served]]:
    from tests.integration.servers import start

    stops: list[Callable[[], None]] = []

    def make(runtime: str = "runc") -> Served:
        policy = _policy(tmp_path, runtime)
        store = PrincipalsStore(tmp_path / "principals.yaml")
        tokens = {name: store.add(name, policy=str(policy), role="agent") for name in ("alice", "bob")}
        audit = tmp_path / "audit"
        config = ServerConfig(principals=tmp_path / "principals.yaml", audit_dir=audit, max_body_bytes=MAX_BODY)
        port, service, stop = start(config, functools.partial(DockerRunner, workspace_root=workspace_root))
        stops.append(stop)
        return Served(f"http://127.0.0.1:{port}", service, audit, tokens)

    yield make
    for stop in stops:
        stop()


def _octets(data: bytes) -> dict[str, Any]:
    return {"content": data, "headers": {"Content-Type": "application/octet-stream"}}


def test_binary_files_go_in_and_out_byte_for_byte_around_an_execution(
    serve_files: Callable[[str], Served], runtime: str, capsys: pytest.CaptureFixture[str]
) -> None:
    served = serve_files(runtime)
    sid = served.session()
    with served.client() as client:
        put = client.put(f"/v1/sessions/{sid}/files/data/every.bin", **_octets(EVERY_BYTE))
        assert put.status_code == 200, put.text
        digest = hashlib.sha256(EVERY_BYTE).hexdigest()
        assert put.json() == {"session_id": sid, "path": "data/every.bin", "bytes": len(EVERY_BYTE), "sha256": digest}
        code = (
            "data = open('data/every.bin', 'rb').read()\n"
            "assert data == bytes(range(256)) * 64, len(data)\n"
            "open('out/reversed.bin', 'wb').write(data[::-1])\n"
            "open('kept.bin', 'wb').write(bytes([0, 255, 10, 13]))\n"
        )
        ran = served.execute(sid, code)
        assert ran.exit_status == 0, ran.to_dict()
        assert dict(ran.outcome.files) == {"reversed.bin": EVERY_BYTE[::-1]}
        back = client.get(f"/v1/sessions/{sid}/files/data/every.bin")
        assert (back.status_code, back.headers["content-type"]) == (200, "application/octet-stream")
        assert back.content == EVERY_BYTE
        assert client.get(f"/v1/sessions/{sid}/files/out/reversed.bin").content == EVERY_BYTE[::-1]
        assert client.get(f"/v1/sessions/{sid}/files/kept.bin").content == bytes([0, 255, 10, 13])
        listing = client.get(f"/v1/sessions/{sid}/files")
        assert listing.status_code == 200
        assert listing.json() == {
            "session_id": sid,
            "files": [
                {"path": "data/every.bin", "bytes": len(EVERY_BYTE)},
                {"path": "kept.bin", "bytes": 4},
                {"path": "main.py", "bytes": len(code)},  # the program stays until the next execution's start
                {"path": "out/reversed.bin", "bytes": len(EVERY_BYTE)},
            ],
            "truncated": False,
        }
    (recorded_put,) = served.records("session.file.put")
    assert recorded_put["principal"] == "alice"
    assert recorded_put["request_id"] == put.headers["x-request-id"]
    assert {k: recorded_put["data"][k] for k in ("session_id", "path", "bytes", "sha256")} == put.json()
    assert recorded_put["data"]["caller"]["principal"] == "alice"
    gets = served.records("session.file.get")
    assert [(g["data"]["path"], g["data"]["bytes"]) for g in gets] == [
        ("data/every.bin", len(EVERY_BYTE)), ("out/reversed.bin", len(EVERY_BYTE)), ("kept.bin", 4),
    ]  # fmt: skip
    assert gets[0]["data"]["sha256"] == digest
    assert gets[1]["data"]["sha256"] == hashlib.sha256(EVERY_BYTE[::-1]).hexdigest()
    assert verify_trail(served.audit_dir).ok
    assert main(["audit", "verify", str(served.audit_dir)]) == 0
    capsys.readouterr()


def test_links_a_program_planted_are_never_followed(serve_files: Callable[[str], Served], tmp_path: Path) -> None:
    served = serve_files("runc")
    sid = served.session()
    host_file = tmp_path / "host-secret.txt"
    host_file.write_text("the host's")
    planted = served.execute(
        sid,
        "import os\nos.makedirs('data', exist_ok=True)\n"
        "os.symlink('/', 'root')\n"
        f"os.symlink({str(host_file)!r}, 'host')\n"
        "os.symlink('/etc/passwd', 'data/passwd')\n"
        "os.symlink('..', 'data/up')\n",
    )
    assert planted.exit_status == 0, planted.to_dict()
    with served.client() as client:
        for path in ("root/etc/passwd", "host", "data/passwd", "data/up/host", f"root{host_file}"):
            got = client.get(f"/v1/sessions/{sid}/files/{path}")
            assert got.status_code == 422, (path, got.status_code, got.text)
            assert got.json()["code"] == "request.workspace_path"
            assert "symlink" in got.json()["message"]
            assert repr(path) in got.json()["message"]
        for path in ("host", f"root{tmp_path}/written.txt", "data/passwd"):
            put = client.put(f"/v1/sessions/{sid}/files/{path}", **_octets(b"overwritten"))
            assert (put.status_code, put.json()["code"]) == (422, "request.workspace_path"), (path, put.text)
        listing = client.get(f"/v1/sessions/{sid}/files").json()
    assert [f["path"] for f in listing["files"]] == ["main.py"]  # the planted symlinks are not listed
    assert host_file.read_text() == "the host's"
    assert not (tmp_path / "written.txt").exists()
    refused = served.records("session.file.get")
    assert {r["data"]["error"]["code"] for r in refused} == {"request.workspace_path"}
    assert all("sha256" not in r["data"] for r in refused)
    assert verify_trail(served.audit_dir).ok


@pytest.mark.parametrize(
    "target",
    [
        "../escape", "a/../../escape", "%2e%2e/escape", "%2E%2E%2Fescape", "data%2f..%2f..%2fescape",
        "/etc/passwd", "%2fetc%2fpasswd", "a%00b", "a%5cb", "a/./b", "a//b",
    ],
)  # fmt: skip
def test_path_tricks_in_the_url_are_refused_naming_the_path(
    serve_files: Callable[[str], Served], target: str, tmp_path: Path
) -> None:
    served = serve_files("runc")
    sid = served.session()
    decoded = target.replace("%2e", ".").replace("%2E", ".").replace("%2f", "/").replace("%2F", "/")
    decoded = decoded.replace("%00", "\0").replace("%5c", "\\")
    for method, body in (("PUT", b"x"), ("GET", None)):
        status, answer = served.raw(method, f"/v1/sessions/{sid}/files/{target}", body=body)
        assert status == 422, (method, target, status, answer)
        error = json.loads(answer)
        assert error["code"] == "request.workspace_path"
        assert repr(decoded) in error["message"], error["message"]
    with served.client() as client:
        assert client.get(f"/v1/sessions/{sid}/files").json()["files"] == []
    assert not (tmp_path / "escape").exists()


def test_the_caps_refuse_oversized_files_both_ways(serve_files: Callable[[str], Served]) -> None:
    served = serve_files("runc")
    sid = served.session(workspace_size="4m")
    one_mib = 1 << 20  # the default policy's limits.files_size ceiling
    with served.client() as client:
        over = client.put(f"/v1/sessions/{sid}/files/big.bin", **_octets(b"\0" * (one_mib + 1)))
        assert (over.status_code, over.json()["code"]) == (413, "request.file_too_large"), over.text
        assert str(one_mib) in over.json()["message"]
        beyond = client.put(f"/v1/sessions/{sid}/files/big.bin", **_octets(b"\0" * (MAX_BODY + 1)))
        assert (beyond.status_code, beyond.json()["code"]) == (413, "request.too_large")
        assert client.get(f"/v1/sessions/{sid}/files").json()["files"] == []  # nothing was written
        at_cap = client.put(f"/v1/sessions/{sid}/files/a.bin", **_octets(b"\1" * one_mib))
        assert at_cap.status_code == 200
        full = [client.put(f"/v1/sessions/{sid}/files/f{i}.bin", **_octets(b"\2" * one_mib)) for i in range(4)]
        statuses = [r.status_code for r in full]
        assert 507 in statuses, statuses
        assert statuses[statuses.index(507) :] == [507] * (4 - statuses.index(507)), statuses
        assert full[-1].json()["code"] == "request.workspace_full"
        missing_file = client.get(f"/v1/sessions/{sid}/files/nothing-here")
        assert (missing_file.status_code, missing_file.json()["code"]) == (404, "request.workspace_not_found")
        wrong_type = client.put(f"/v1/sessions/{sid}/files/t.txt", content=b"x", headers={"Content-Type": "text/plain"})
        assert (wrong_type.status_code, wrong_type.json()["code"]) == (415, "request.media_type")
    refused = [r["data"] for r in served.records("session.file.put") if "error" in r["data"]]
    assert refused[0]["error"]["code"] == "request.file_too_large"
    assert refused[0]["bytes"] == one_mib + 1


def test_a_download_over_the_cap_is_refused_and_sends_nothing(serve_files: Callable[[str], Served]) -> None:
    served = serve_files("runc")
    sid = served.session()
    cap = 4 << 20  # the default policy's limits.output_files_bytes ceiling
    made = served.execute(
        sid, f"open('huge.bin', 'wb').write(b'x' * {cap + 1})\nopen('edge.bin', 'wb').write(b'y' * {cap})"
    )
    assert made.exit_status == 0, made.to_dict()
    with served.client() as client:
        over = client.get(f"/v1/sessions/{sid}/files/huge.bin")
        assert (over.status_code, over.json()["code"]) == (413, "request.file_too_large")
        assert len(client.get(f"/v1/sessions/{sid}/files/edge.bin").content) == cap
    (refused, _edge) = served.records("session.file.get")
    assert refused["data"]["error"]["code"] == "request.file_too_large"


def test_another_principal_gets_not_found_and_a_kernel_session_has_the_file_api(
    serve_files: Callable[[str], Served],
) -> None:
    served = serve_files("runc")
    sid = served.session()
    with served.client("alice") as alice:
        assert alice.put(f"/v1/sessions/{sid}/files/mine.txt", **_octets(b"alice's")).status_code == 200
    with served.client("bob") as bob:
        unknown = bob.get(f"/v1/sessions/{'x' * 32}/files/mine.txt")
        answers = [
            bob.get(f"/v1/sessions/{sid}/files/mine.txt"),
            bob.put(f"/v1/sessions/{sid}/files/mine.txt", **_octets(b"bob's")),
            bob.get(f"/v1/sessions/{sid}/files"),
        ]
    for answer in (unknown, *answers):
        assert (answer.status_code, answer.json()["code"]) == (404, "session.not_found"), answer.text
    for answer in answers:  # word for word the answer about an id that does not exist
        assert answer.json()["message"].replace(sid, "x" * 32) == unknown.json()["message"]
    with served.client("alice") as alice:
        assert alice.get(f"/v1/sessions/{sid}/files/mine.txt").content == b"alice's"
        kernel = served.session("kernel")  # on Docker a kernel's /workspace is a workspace: it has the file API
        assert alice.put(f"/v1/sessions/{kernel}/files/x.txt", **_octets(b"x")).status_code == 200
        ran = alice.post(f"/v1/sessions/{kernel}/executions", json={"code": "open('x.txt').read()"})
        assert ran.json()["value"] == "'x'", ran.text
    assert [r["principal"] for r in served.records("session.file.put")] == ["alice", "alice"]


def test_a_transfer_while_an_execution_runs_is_refused_busy(serve_files: Callable[[str], Served]) -> None:
    served = serve_files("runc")
    sid = served.session()
    sessions = served.service.gateway.sessions
    cancel = threading.Event()
    sleeper = {"code": "import time\ntime.sleep(60)", "principal": "alice"}
    running = threading.Thread(target=lambda: sessions.execute(sid, sleeper, cancel=cancel))
    running.start()
    try:
        while sessions.get(sid, principal="alice").state != "busy":
            assert running.is_alive()
            time.sleep(0.05)
        with served.client() as client:
            busy = client.put(f"/v1/sessions/{sid}/files/x.txt", **_octets(b"x"))
            assert (busy.status_code, busy.json()["code"]) == (409, "session.busy")
            assert client.get(f"/v1/sessions/{sid}/files/x.txt").status_code == 409
    finally:
        cancel.set()
        running.join(timeout=60)
    with served.client() as client:
        assert client.put(f"/v1/sessions/{sid}/files/x.txt", **_octets(b"x")).status_code == 200


def test_the_client_moves_files_whatever_their_names(serve_files: Callable[[str], Served]) -> None:
    served = serve_files("runc")
    sid = served.session()
    odd = "data/a b?#%&+é;=.bin"  # every character here means something in a URL
    with Client(served.url, served.tokens["alice"]) as client:
        stored = client.sessions.put_file(sid, odd, EVERY_BYTE)
        assert stored == SessionFile(odd, len(EVERY_BYTE), hashlib.sha256(EVERY_BYTE).hexdigest())
        assert client.sessions.get_file(sid, odd) == EVERY_BYTE
        assert client.sessions.list_files(sid) == WorkspaceListing(
            (WorkspaceFile(odd, len(EVERY_BYTE)),), truncated=False
        )
        for path in ("../escape", "data/../../escape", "./x", "/etc/passwd"):
            with pytest.raises(WorkspacePathError, match="workspace path"):
                client.sessions.put_file(sid, path, b"x")  # sent as given (httpx would resolve ..), refused
        with pytest.raises(WorkspaceFileNotFoundError):
            client.sessions.get_file(sid, "absent")
    with Client(served.url, served.tokens["bob"]) as bob, pytest.raises(SessionNotFoundError):
        bob.sessions.get_file(sid, odd)
    paths = [r["data"]["path"] for r in served.records("session.file.put")]
    assert paths == [odd, "../escape", "data/../../escape", "./x", "/etc/passwd"]

    async def from_asyncio() -> bytes:
        async with AsyncClient(served.url, served.tokens["alice"]) as client:
            await client.sessions.put_file(sid, "async.bin", b"\0\1")
            assert (await client.sessions.list_files(sid)).files[0].path == "async.bin"
            return await client.sessions.get_file(sid, "async.bin")

    assert asyncio.run(from_asyncio()) == b"\0\1"

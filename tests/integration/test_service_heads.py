"""The edges of HTTP handling against a real ``gateway serve`` application on a loopback port: a head larger
than ``max_header_bytes`` is answered 431 with the gateway's error body and closed before the service holds it;
a client leaving mid-body is a quiet, counted disconnect; a stop past its grace answers the error body; a
trailing slash is not redirected to a Location taken from the client's Host header.

The server runs in this process (``tests/integration/servers.py``), so its resident memory is this process's
and its log records reach ``caplog``.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from gateway.service.config import ServerConfig
from tests.integration.servers import one_principal, start

if TYPE_CHECKING:
    from conftest import Server  # the `serve` fixture lives in tests/integration/conftest.py

pytestmark = pytest.mark.usefixtures("engine")

ATTACK_BYTES = 8 * 1024 * 1024
"""How much header the attack sends at most: bounded, so the test stops whatever the server does."""
CHUNK = 64 * 1024


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _answer_so_far(sock: socket.socket) -> bytes | None:
    """What the server has sent (b"" once it closed), or None when it has sent nothing yet."""
    sock.setblocking(False)
    try:
        data = sock.recv(65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""
    finally:
        sock.setblocking(True)
    return data


def _send_huge_header(url: str) -> tuple[bytes, int, int]:
    """Send a request head whose one header grows in CHUNK pieces up to ATTACK_BYTES, stopping as soon as
    the server answers or closes; the answer, the bytes sent and this process's RSS growth meanwhile."""
    host, port = url.removeprefix("http://").split(":")
    before = _rss_bytes()
    sent = 0
    answer = b""
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: "
        sock.sendall(head)
        sent = len(head)
        piece = b"a" * CHUNK
        while sent < ATTACK_BYTES:
            got = _answer_so_far(sock)
            if got is not None:
                answer = got
                break
            try:
                sock.sendall(piece)
            except OSError:  # the server closed the connection
                break
            sent += len(piece)
        grown = _rss_bytes() - before
        sock.settimeout(10)
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass
    return answer, sent, grown


def test_a_request_head_over_max_header_bytes_gets_431_and_is_closed(serve: Callable[..., Server]) -> None:
    """A client sending an ever-growing header is answered 431 request.header_too_large (the gateway's error
    body) once its head passes max_header_bytes, and the connection is closed: the service never holds more
    than the bound of it. Without the bound the whole 8 MB is read and kept (uvicorn and httptools have none).
    The refusal is audited like the other connection refusals, and a normal request still works."""
    bound = 64 * 1024
    server = serve(max_header_bytes=bound)
    answer, sent, grown = _send_huge_header(server.url)
    assert answer, f"the server took {sent} bytes of head without answering (this process grew {grown >> 20} MiB)"
    head, _, body_bytes = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), answer[:200]
    headers = {k.lower(): v for k, _, v in (line.partition(b": ") for line in head.split(b"\r\n")[1:])}
    assert headers[b"connection"] == b"close"
    body = json.loads(body_bytes)
    assert body["code"] == "request.header_too_large"
    assert f"{bound} bytes" in body["message"]
    assert headers[b"x-request-id"].decode() == body["request_id"]
    with server.client(server.tokens["alice"]) as client:
        assert client.get("/v1/policy", headers={"X-Small": "b" * 1000}).status_code == 200
    deadline = time.monotonic() + 10
    while not server.records("request.refused"):  # written by the refusals' summariser
        assert time.monotonic() < deadline, "the refusal was not audited"
        time.sleep(0.05)
    (refused,) = server.records("request.refused")
    assert (refused["data"]["code"], refused["request_id"], refused["principal"]) == (
        "request.header_too_large", body["request_id"], None,
    )  # fmt: skip
    metrics = server.service.metrics.render().decode()
    assert 'gateway_http_requests_total{endpoint="connection",status="431",status_class="4xx"} 1.0' in metrics


def test_a_body_arriving_with_its_head_is_not_counted_as_head(serve: Callable[..., Server]) -> None:
    """A head within the bound followed, in the same packet, by a body longer than the bound is read as
    usual: only the head counts against max_header_bytes, and a second request on the connection too."""
    server = serve(max_header_bytes=1024)
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps({"language": "python", "code": "x = 1  " + "#" * 3000}).encode()
    head = (
        f"POST /v1/decisions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {server.tokens['alice']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + body + head + body)  # two requests, pipelined, in one write
        sock.settimeout(30)
        answers = b""
        while answers.count(b"HTTP/1.1 ") < 2 or not answers.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, answers
            answers += chunk
    assert answers.count(b"HTTP/1.1 200 OK") == 2, answers[:300]


def _metrics(server: Server) -> str:
    return server.service.metrics.render().decode()


def test_a_client_leaving_mid_body_is_a_quiet_counted_disconnect(
    serve: Callable[..., Server], caplog: pytest.LogCaptureFixture
) -> None:
    """A client that announces a body and leaves halfway is not a server failure: no traceback and no 500 in
    the log, counted as a client disconnect (499, nginx's "client closed request"), and the service goes on."""
    server = serve()
    host, port = server.url.removeprefix("http://").split(":")
    head = (
        f"POST /v1/decisions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {server.tokens['alice']}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    with caplog.at_level(logging.INFO):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(head + b'{"code": "print(1)", "language": ')
            time.sleep(0.2)  # the server is reading the body when the client leaves
        deadline = time.monotonic() + 10
        while 'status="499"' not in _metrics(server):
            assert time.monotonic() < deadline, f"the disconnect was not counted: {caplog.text[-2000:]}"
            time.sleep(0.05)
    assert [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
    assert 'status="500"' not in _metrics(server)
    with server.client(server.tokens["alice"]) as client:
        assert client.get("/v1/policy").status_code == 200


@pytest.mark.parametrize("path", ["/v1/policy/", "/healthz/"])
def test_a_trailing_slash_is_not_redirected_to_the_clients_host(server: Server, path: str) -> None:
    """A path with a trailing slash is the 404 error body, never a redirect whose Location the client's Host
    header chose (Starlette's redirect_slashes copies it: an open redirect through any cache or proxy)."""
    with server.client(server.tokens["alice"]) as client:
        response = client.get(path, headers={"Host": "evil.example"}, follow_redirects=False)
    assert "location" not in response.headers, response.headers
    assert response.status_code == 404
    assert response.json()["code"] == "http.not_found"


def test_a_stop_past_its_grace_answers_the_error_body(tmp_path: Path) -> None:
    """An execution still running when a stop's grace is over is answered 503 service.stopping with the
    gateway's error body (uvicorn alone answers a bare text 500 for the request it cancels)."""
    principals, token = one_principal(tmp_path)
    config = ServerConfig(principals=principals, audit_dir=tmp_path / "audit", grace_s=1.0)
    port, _service, stop = start(config, timeout_graceful_shutdown=1)
    answers: list[httpx.Response] = []
    code = "import time\nprint('started', flush=True)\ntime.sleep(20)"

    def run() -> None:
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
            body = {"code": code, "limits": {"timeout_s": 30}}
            answers.append(client.post(f"http://127.0.0.1:{port}/v1/executions", json=body))

    client = threading.Thread(target=run)
    client.start()
    time.sleep(3)  # the execution is running (its sandbox sleeps 20 s)
    stop()
    client.join(timeout=60)
    (answer,) = answers
    assert answer.status_code == 503, answer.text
    body = answer.json()
    assert body["code"] == "service.stopping"
    assert body["message"]
    assert answer.headers["x-request-id"] == body["request_id"]

"""Streamed executions (server-sent events) and client disconnects, on a real server and a real engine.

A stream's stdout/stderr events come before its result, the text they carry is the result's output, a flood is
capped as in a JSON response, refusals are plain JSON errors, and a client that goes away mid-run (JSON or
stream) has its container killed and removed with the outcome audited as ``gateway.cancelled``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import Server

pytestmark = pytest.mark.usefixtures("engine")
SSE = {"Accept": "text/event-stream"}


def _events(response: httpx.Response) -> Iterator[tuple[str, Any]]:
    name, data = "", ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            data = line[len("data: ") :]
        elif line == "" and name:
            yield name, json.loads(data)
            name, data = "", ""


def _stream(server: Server, request: dict[str, Any], who: str = "alice") -> list[tuple[str, Any]]:
    with (
        server.client(server.tokens[who]) as client,
        client.stream("POST", "/v1/executions", json=request, headers=SSE) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(_events(response))


def test_chunks_arrive_as_events_before_the_result_and_join_to_its_output(server: Server) -> None:
    code = (
        "import sys, time\nprint('first', flush=True)\nprint('oops', file=sys.stderr, flush=True)\n"
        "time.sleep(2)\nprint('s\\u00e9cond \\u2603', flush=True)\n"
    )
    events = _stream(server, {"code": code})
    names = [name for name, _ in events]
    assert names[-1] == "result"
    assert names.count("result") == 1
    assert names.index("stdout") < names.index("result")
    assert len([n for n in names if n == "stdout"]) >= 2  # the 2 s pause splits the output into two chunks
    result = events[-1][1]
    assert result["exit_code"] == 0
    assert result["stdout"] == "first\ns\u00e9cond \u2603\n"
    assert "".join(d for n, d in events if n == "stdout") == result["stdout"]
    assert "".join(d for n, d in events if n == "stderr") == result["stderr"] == "oops\n"
    assert [r["data"]["exit_code"] for r in server.records("execution.outcome")] == [0]


def test_a_flood_is_capped_the_same_as_in_a_json_response(server: Server) -> None:
    request = {"code": "import sys\nwhile True: sys.stdout.write('x' * 65536)\n", "limits": {"output_bytes": 100_000}}
    events = _stream(server, request)
    result = events[-1][1]
    with server.client(server.tokens["alice"]) as client:
        plain = client.post("/v1/executions", json=request).json()
    streamed = "".join(d for n, d in events if n == "stdout")
    assert result["stdout_truncated"] is plain["stdout_truncated"] is True
    assert len(result["stdout"]) == len(plain["stdout"]) == 100_000
    assert streamed == result["stdout"]


def test_refusals_before_the_run_are_json_errors_not_streams(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as anonymous:
        response = anonymous.post("/v1/executions", json={"code": "print(1)"}, headers=SSE)
        assert response.status_code == 401
        assert response.json()["code"] == "auth.failed"
    with server.client(server.tokens["bob"]) as bob:  # bob's ceiling is 10 s
        denied = bob.post("/v1/executions", json={"code": "print(1)", "limits": {"timeout_s": 30}}, headers=SSE)
        assert denied.status_code == 403
        assert denied.headers["content-type"].startswith("application/json")
        assert denied.json()["code"] == "policy.denied"
        invalid = bob.post("/v1/executions", json={"code": 1}, headers=SSE)
        assert invalid.status_code == 422
        assert invalid.json()["code"] == "request.invalid"
        quiet = _stream(server, {"code": "pass"}, who="bob")  # no output at all: still a stream, one result
        assert [name for name, _ in quiet] == ["result"]
        assert quiet[0][1]["exit_code"] == 0
    assert len(server.records("execution.outcome")) == 1  # only the quiet run ran


def _raw_request(server: Server, body: bytes, accept: str) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = (
        f"POST /v1/executions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {server.tokens['alice']}\r\n"
        f"Content-Type: application/json\r\nAccept: {accept}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def _wait_for(predicate: Callable[[], Any], what: str, within: float = 60) -> Any:
    deadline = time.monotonic() + within
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.1)
    return value


@pytest.mark.parametrize("accept", ["application/json", "text/event-stream"])
def test_a_client_that_disconnects_mid_run_gets_its_container_killed_and_removed(
    server: Server, managed_containers: Callable[[], list[str]], accept: str
) -> None:
    code = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"
    body = json.dumps({"code": code, "limits": {"timeout_s": 50}}).encode()
    sock = _raw_request(server, body, accept)
    if accept == "text/event-stream":
        seen = b""
        while b"event: stdout" not in seen:  # the stream has started: headers, then the first chunk
            more = sock.recv(65536)
            assert more, seen
            seen += more
        assert b" 200 OK" in seen.split(b"\r\n", 1)[0]
    running = _wait_for(managed_containers, "the sandbox exists")
    sock.close()
    outcomes = _wait_for(lambda: server.records("execution.outcome"), "the outcome is recorded")
    assert len(outcomes) == 1
    assert outcomes[0]["data"]["error"]["code"] == "gateway.cancelled"
    assert outcomes[0]["principal"] == "alice"
    assert managed_containers() == []
    assert running[0] not in managed_containers()


def test_a_client_that_stops_reading_a_stream_holds_no_slot_once_the_run_ends_and_is_cut_off(
    serve: Callable[..., Server], managed_containers: Callable[[], list[str]]
) -> None:
    """A hostile client opens a stream and never reads it. Its run still ends (cap, deadline or the stall limit),
    its container is removed, its admission slot is given back at once (not when the response would have been
    read), and the server stops writing to it after ``stream_stall_s`` and closes the connection."""
    server = serve(stream_stall_s=1)
    # 4 MiB of output (the ceiling) is twice over, as events and in the result: more than the socket buffers hold.
    flood = "import sys\nwhile True: sys.stdout.write('x' * 65536)\n"
    request = {"code": flood, "limits": {"timeout_s": 20, "output_bytes": 4 << 20}}
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a tiny window: the server's writes block soon
    sock.connect((host, int(port)))
    body = json.dumps(request).encode()
    head = (
        f"POST /v1/executions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {server.tokens['alice']}\r\n"
        f"Content-Type: application/json\r\nAccept: text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    try:
        outcomes = _wait_for(lambda: server.records("execution.outcome"), "the outcome is recorded")
        assert len(outcomes) == 1
        _wait_for(lambda: server.service.quota_gate.running_of("alice") == 0, "the slot is given back", within=15)
        assert managed_containers() == []
        assert b"\ngateway_running_executions 0.0\n" in server.service.metrics.render()
        time.sleep(3)  # still not reading, past the 1 s stall limit: the server gives up writing
        sock.settimeout(30)
        received = b""
        while chunk := sock.recv(1 << 20):  # only now read: what was written, then the server's close (EOF)
            received += chunk
        assert b"event: stdout" in received
        assert b"event: result" not in received  # cut off mid-stream, not a completed (keep-alive) response
    finally:
        sock.close()

"""Connections that send no complete request head, as an attack, against a real ``gateway serve`` application
on a loopback port: however many a client holds open (idle, or dribbling a head), authenticated requests on
new connections are served, and a connection that has sent its whole head is never the one closed for it.

The server runs in this process (``tests/integration/servers.py``); the attack is bounded (a few hundred
sockets, all closed at the end), so the test stops whatever the server does.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from conftest import Server  # the `serve` fixture lives in tests/integration/conftest.py

pytestmark = pytest.mark.usefixtures("engine")

MAX_CONNECTIONS = 64
IDLE = 200
"""Connections the attacker opens and never writes to: three times the service's whole bound."""
DRIBBLING = 20
"""Connections that send part of a head and no more (slowloris)."""
VICTIMS = 20


def _address(server: Server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


@contextmanager
def _held(server: Server, count: int, first: bytes = b"") -> Iterator[list[socket.socket]]:
    """``count`` connections to ``server``, each having sent ``first`` and nothing more; closed at the end."""
    with ExitStack() as stack:
        socks = []
        for _ in range(count):
            sock = stack.enter_context(socket.create_connection(_address(server), timeout=10))
            if first:
                sock.sendall(first)
            socks.append(sock)
        yield socks


def _closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def test_idle_connections_cannot_keep_authenticated_requests_out(serve: Callable[..., Server]) -> None:
    """A client holding three times max_connections idle (and some dribbling a head) does not get one
    authenticated request refused: connections without a complete head have their own, smaller bound
    (max_headless_connections, a quarter of max_connections by default) and the oldest of them is closed to
    make room for a new one. A request whose head was complete before the flood is not closed: its body, sent
    after the flood, is answered. The service holds at most the bound of the attacker's connections."""
    server = serve(max_connections=MAX_CONNECTIONS)
    token = server.tokens["alice"]
    body = json.dumps({"language": "python", "code": "print(1)"}).encode()
    head = (
        f"POST /v1/decisions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    statuses: list[int] = []
    with socket.create_connection(_address(server), timeout=30) as started:
        started.sendall(head)  # a whole head; its body comes after the flood
        time.sleep(0.2)  # the server has read the head
        with (
            _held(server, IDLE) as idle,
            _held(server, DRIBBLING, b"GET /v1/policy HTTP/1.1\r\nHost: 127.0.0.1\r\n") as dribbling,
        ):
            for _ in range(VICTIMS):  # each on a new connection, as a new client would come
                with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}) as client:
                    try:
                        statuses.append(client.get("/v1/policy").status_code)
                    except httpx.TransportError:
                        statuses.append(0)
            refused = len(statuses) - statuses.count(200)
            assert refused == 0, f"{refused} of {VICTIMS} authenticated requests failed: {statuses}"
            attackers = idle + dribbling
            deadline = time.monotonic() + 10
            while (still := sum(not _closed_by_server(sock) for sock in attackers)) > MAX_CONNECTIONS // 4:
                assert time.monotonic() < deadline, f"the service still holds {still} of the attacker's connections"
                time.sleep(0.1)
        started.sendall(body)
        started.settimeout(30)
        answer = b""
        while not answer.endswith(b"}"):
            chunk = started.recv(65536)
            assert chunk, f"the connection with a whole head was closed: {answer!r}"
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]

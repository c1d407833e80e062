"""What the egress tests share, unit and integration alike: a name service from a table (nothing outside is ever
looked up), two connections as a run's proxy records them (one allowed, one denied), and the shipped mirror
policies' upstream on loopback."""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import socket
import threading
from collections.abc import Iterator, Sequence

import pytest

from gateway.egress import ConnectionRecord
from gateway.egress.addresses import IPAddress


class TableResolver:
    """Answers from a table: a name's answers in turn (the last one repeats); every name asked is noted, and a name
    not in the table does not resolve."""

    def __init__(self, answers: dict[str, Sequence[Sequence[str]]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        self.calls.append(host)
        answers = self.answers.get(host)
        if answers is None:
            raise OSError(f"test resolver: no such name {host}")
        return [ipaddress.ip_address(a) for a in answers[min(self.calls.count(host), len(answers)) - 1]]


def loopback_resolver(host: str) -> TableResolver:
    """Only ``host`` resolves, to 127.0.0.1."""
    return TableResolver({host: [["127.0.0.1"]]})


ALLOWED = ConnectionRecord(
    method="CONNECT", host="mirror.internal", port=18443, address="127.0.0.1", allowed=True,
    rule="network.egress.allowed", message="", bytes_out=517, bytes_in=4096, duration=0.0504, ended="closed",
)  # fmt: skip
"""A tunnel to the mirror: 50 ms once rounded."""
DENIED = ConnectionRecord(
    method="GET", host="evil.example", port=80, address=None, allowed=False, rule="network.egress.host",
    message="evil.example is not an allowed destination", bytes_out=0, bytes_in=0, duration=0.0002, ended="denied",
)  # fmt: skip
"""A plain-HTTP request to a host the policy does not name, refused before any lookup."""


MIRROR_PORT = 18089
"""The plain-HTTP port the shipped mirror policies (policies/examples/egress-mirror*.yaml) name for mirror.internal."""


@contextlib.contextmanager
def mirror_server(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[http.server.ThreadingHTTPServer]:
    """``handler`` served on 127.0.0.1:``MIRROR_PORT``, the shipped mirror policies' upstream through the system
    resolver; the test is skipped when mirror.internal does not resolve to 127.0.0.1 alone (scripts/setup.sh maps it
    in /etc/hosts) or the port is taken."""
    try:
        answers = {info[4][0] for info in socket.getaddrinfo("mirror.internal", MIRROR_PORT, type=socket.SOCK_STREAM)}
    except OSError:
        answers = set()
    if answers != {"127.0.0.1"}:
        pytest.skip("mirror.internal does not resolve to 127.0.0.1 only: scripts/setup.sh adds it to /etc/hosts")
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", MIRROR_PORT), handler)
    except OSError as exc:
        pytest.skip(f"127.0.0.1:{MIRROR_PORT} is taken ({exc.strerror}): the shipped mirror policies name that port")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()

"""Request bodies as an attack on the memory of a real ``gateway serve`` process (issue 28, M7): several clients
of one principal, within its rate, each announce a body of the largest size and send all of it but its last byte,
so that the service holds what it takes of them. The service holds at most its body budget
(``max_body_bytes_in_flight``; by default ``2 x max_concurrent_executions x max_body_bytes``, one principal at
most half): the bodies past it are refused before they are read (429 ``service.over_quota``, quota
``body_bytes``; audited as ``request.refused``), another principal still gets in, and the bytes come back
when the clients leave. The process's resident memory is read from ``/proc/<pid>/status`` and reported.

Bounded and self-stopping: a fixed number of clients and bytes, every wait with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
from serve_process import ServeProcess, until

from gateway.resources import policies_dir
from gateway.service.principals import PrincipalsStore, Quotas

MIB = 1024 * 1024
BODY = 4 * MIB
"""``max_body_bytes`` of the server under attack, and the size of every attacking body."""
CLIENTS = 6
BUDGET = 2 * 1 * BODY
"""The default budget with ``max_concurrent_executions: 1``: one principal may hold one body of BODY bytes."""
GAUGE = re.compile(r"^gateway_body_bytes_in_flight (\S+)$", re.MULTILINE)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


class _Attacker:
    """One connection announcing a body of BODY bytes and sending all of it but its last byte, in a thread (the
    server may stop reading it); :attr:`answer` is what the server sent back, once it has."""

    def __init__(self, port: int, token: str) -> None:
        code = "#" * (BODY - len('{"code": ""}'))
        self.body = json.dumps({"code": code}).encode()
        assert len(self.body) == BODY
        head = (
            f"POST /v1/executions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {BODY}\r\n\r\n"
        ).encode()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.answer = b""
        self.sent = False
        self._thread = threading.Thread(target=self._run, args=(head,), daemon=True)
        self._thread.start()

    def _run(self, head: bytes) -> None:
        try:
            self.sock.sendall(head + self.body[:-1])
            self.sent = True
            self.sock.settimeout(60)
            self.answer = self.sock.recv(65536)
        except OSError:
            pass

    def status(self) -> int | None:
        line = self.answer.partition(b"\r\n")[0].split()
        return int(line[1]) if len(line) > 1 else None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread's recv; close alone would wait for it
        self.sock.close()
        self._thread.join(10)


def _held(server: ServeProcess, operator: str) -> float:
    metrics = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {operator}"}, timeout=30)
    assert metrics.status_code == 200, metrics.text
    match = GAUGE.search(metrics.text)
    assert match, "no gateway_body_bytes_in_flight in /metrics"
    return float(match.group(1))


def test_bodies_in_flight_stay_within_the_budget(tmp_path: Path, serve_process: Callable[..., ServeProcess]) -> None:
    store = PrincipalsStore(tmp_path / "principals.yaml")
    policy = str(policies_dir() / "default.yaml")
    roomy = Quotas(max_concurrent=8, rpm=10_000, queue=64)
    alice = store.add("alice", policy=policy, role="agent", quotas=roomy)
    bob = store.add("bob", policy=policy, role="agent", quotas=roomy)
    operator = store.add("ops", policy=policy, role="operator")
    config = tmp_path / "server.yaml"
    config.write_text(
        "apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\n"
        f"max_body_bytes: {BODY}\nmax_concurrent_executions: 1\nbody_read_s: 120\ndecision_workers: 1\n"
    )
    server = serve_process("--config", str(config), "--drain", "0")
    pid = server.proc.pid
    port = int(server.url.rsplit(":", 1)[1])
    before = _rss_mib(pid)
    attackers = [_Attacker(port, alice) for _ in range(CLIENTS)]
    try:
        until(lambda: all(a.sent or a.answer for a in attackers), "every client to send its body but a byte")
        during = _rss_mib(pid)
        figures = f"server RSS {before:.0f} -> {during:.0f} MiB with {CLIENTS} bodies of {BODY >> 20} MiB sent"
        try:
            until(lambda: sum(a.status() is not None for a in attackers) >= CLIENTS - 1, "the refusals", timeout=20)
        except AssertionError:
            refused = sum(a.status() is not None for a in attackers)
            raise AssertionError(f"{refused} of {CLIENTS - 1} bodies past the budget refused; {figures}") from None
        assert sorted(a.status() or 0 for a in attackers) == [0] + [429] * (CLIENTS - 1), figures
        answer = json.loads(next(a for a in attackers if a.status()).answer.partition(b"\r\n\r\n")[2])
        assert (answer["code"], answer["quota"]) == ("service.over_quota", "body_bytes"), answer
        assert _held(server, operator) == BODY, figures
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {bob}"}, timeout=60) as client:
            other = client.post("/v1/decisions", json={"code": "print(1)"})
        assert other.status_code == 200, other.text  # alice holds her half; the rest is bob's to use
        refused = until(
            lambda: [r for r in server.events("request.refused") if r["data"].get("quota") == "body_bytes"],
            "the refusal's record",
        )
        assert refused[0]["principal"] == "alice"
        print(figures)  # the benchmark (benchmarks/request_bodies.py) gives the before/after figures
    finally:
        for attacker in attackers:
            attacker.close()
    until(lambda: _held(server, operator) == 0, "the bodies' bytes to come back once their clients left")

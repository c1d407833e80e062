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
from typing import TYPE_CHECKING

import anyio
import httpx
import httpx2
import pytest
from serve_process import ServeProcess, until

from gateway.resources import policies_dir
from gateway.service.principals import PrincipalsStore, Quotas
from tests.integration.conftest import default_policy_variant

if TYPE_CHECKING:
    from conftest import Server

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


# --- code above every policy's ceiling, refused before the queue -------------------------------------------------


def _code(size: int) -> str:
    return "#" * size


def _post(server: Server, who: str, body: dict[str, object]) -> httpx.Response:
    with server.client(server.tokens[who]) as client:
        return client.post("/v1/executions", json=body)


@pytest.mark.parametrize("workers", [0, 1], ids=["in-process", "decision-worker"])
def test_code_above_every_policys_ceiling_is_refused_before_the_queue(
    tmp_path: Path, serve: Callable[..., Server], workers: int
) -> None:
    """alice (code_size 64k, one slot, no queue) is running; bob's policy has the set's largest ceiling, 256k.
    alice's 300 KiB of code is refused at intake, 413 request.code_too_large with $.code and that ceiling,
    although her slot is taken (before the fix: 429, it went for the queue and would have been held there).
    The ceiling follows the policy set across reloads: raised, the same request reaches her own policy (403);
    lowered, 100 KiB is refused at intake. The intake runs in a decision worker (which gets the reloaded
    policies) or, without one, in the service's process."""
    here = tmp_path / "own"  # the serve fixture's principals file is tmp_path's
    here.mkdir()
    small = default_policy_variant(here, "small", ("code_size: {max: 256k}", "code_size: {max: 64k}"))
    roomy = default_policy_variant(here, "roomy")
    store = PrincipalsStore(here / "principals.yaml")
    tokens = {
        "alice": store.add("alice", policy=str(small), role="agent", quotas=Quotas(max_concurrent=1, queue=0)),
        "bob": store.add("bob", policy=str(roomy), role="agent"),
    }
    # The service's default policy counts too (a bound over the whole set, as a decision worker's set has it).
    server = serve(principals=here / "principals.yaml", policy=small, max_body_bytes=4 * MIB, decision_workers=workers)
    until(lambda: server.service.decisions.ready == workers, "the decision workers")  # the intake runs there
    server.tokens = tokens
    runs: list[httpx.Response] = []
    running = threading.Thread(
        target=lambda: runs.append(_post(server, "alice", {"code": "import time; time.sleep(3)"}))
    )
    running.start()
    try:
        until(lambda: server.service.quota_gate.running_of("alice") == 1, "alice's run to take her slot")
        refused = _post(server, "alice", {"code": _code(300 * 1024)})
        assert refused.status_code == 413, refused.text
        body = refused.json()
        assert body["code"] == "request.code_too_large", body
        (error,) = body["errors"]
        assert error["path"] == "$.code"
        assert "307200 bytes" in error["message"], error
        assert "262144" in error["message"], error
        queued = _post(server, "alice", {"code": _code(100 * 1024)})  # within the set's ceiling: on to the queue
        assert (queued.status_code, queued.json().get("quota")) == (429, "queue"), queued.text
    finally:
        running.join(60)
    assert [run.status_code for run in runs] == [200], runs

    roomy.write_text(roomy.read_text().replace("code_size: {max: 256k}", "code_size: {max: 512k}"))
    assert server.service.reload()
    decided = _post(server, "alice", {"code": _code(300 * 1024)})
    assert (decided.status_code, decided.json()["code"]) == (403, "policy.denied"), decided.text

    roomy.write_text(roomy.read_text().replace("code_size: {max: 512k}", "code_size: {max: 64k}"))
    assert server.service.reload()
    lowered = _post(server, "bob", {"code": _code(100 * 1024)})
    assert (lowered.status_code, lowered.json()["code"]) == (413, "request.code_too_large"), lowered.text
    assert "65536" in lowered.json()["errors"][0]["message"]


def test_an_mcp_tool_calls_body_is_held_until_its_run_ends(server: Server) -> None:
    """A tool call over /mcp holds its body in the budget for as long as its request runs (the SDK holds the
    parsed message that long), not only while the body is read and checked: many large calls waiting for a
    slot are bounded like POST /v1/executions."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from gateway.tool import TOOL_NAME

    code = "import time\nprint('ready', flush=True)\ntime.sleep(4)\n" + "#" * 1000
    held_while_running: list[int] = []

    async def call() -> None:
        headers = {"Authorization": f"Bearer {server.tokens['alice']}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60)) as http,
            streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write),
            ClientSession(read, write) as client,
        ):
            await client.initialize()
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while server.service.quota_gate.running_of("alice") < 1:  # the call holds its slot
                        await anyio.sleep(0.05)
                    held_while_running.append(server.service.bodies.held)

                group.start_soon(watch)
                result = await client.call_tool(TOOL_NAME, {"code": code, "timeout": 30})
            assert result.is_error is False, result

    anyio.run(call)
    assert held_while_running, "the run was never seen"
    assert held_while_running[0] > len(code), held_while_running  # the tools/call body, held while it ran
    until(lambda: server.service.bodies.held == 0, "the body's bytes to come back after the call")

"""Quotas and the global bound of ``gateway serve``, on a real server, a real engine and a real trail.

Concurrency is observed where it matters, in the engine: a sampler thread counts this session's sandbox
containers while the runs are in flight, and the count never exceeds the bound. No test asserts a duration;
ordering is asserted by what had finished when another response arrived.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from gateway.resources import policies_dir
from gateway.service.principals import DEFAULT_QUOTAS, PrincipalsStore, Quotas

if TYPE_CHECKING:
    from conftest import Server

pytestmark = pytest.mark.usefixtures("engine")

SLOW = {"code": "import time; time.sleep(2); print('slow')"}
QUICK = {"code": "print(2 + 2)"}
MINUTE = {"code": "import time; time.sleep(60)", "limits": {"timeout_s": 60}}


def _principals(directory: Path, **quotas: dict[str, int]) -> tuple[Path, dict[str, str]]:
    """A principals file with one principal per keyword, each setting only the quota fields given."""
    path = directory / "quota-principals.yaml"
    store = PrincipalsStore(path)
    tokens = {}
    for name, given in quotas.items():
        full = Quotas(**{**DEFAULT_QUOTAS.to_dict(), **given})
        tokens[name] = store.add(
            name, policy=str(policies_dir() / "default.yaml"), quotas=full, quotas_set=frozenset(given)
        )
    return path, tokens


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60  # generous: a hang fails the test instead of blocking the suite
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


class _Sampler:
    """The most containers of this session seen at once while it runs."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.most = max(self.most, self._count())
            time.sleep(0.02)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=16) as executor:
        yield executor


def _post(server: Server, token: str, path: str, body: dict[str, Any]) -> httpx.Response:
    with server.client(token) as client:
        return client.post(path, json=body)


def _assert_over_quota(response: httpx.Response, quota: str) -> int:
    assert response.status_code == 429, response.text
    body = response.json()
    assert body["code"] == "service.over_quota"
    assert body["quota"] == quota
    assert body["message"]
    assert body["request_id"] == response.headers["X-Request-Id"]
    retry_after = response.headers["Retry-After"]
    assert retry_after.isdigit(), retry_after
    assert int(retry_after) == body["retry_after_s"] >= 1
    return int(retry_after)


def test_rpm_counts_executions_and_decisions_and_answers_429_with_retry_after(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    path, tokens = _principals(tmp_path, alice={"rpm": 3}, bob={})
    server = serve(principals=path)
    alice = tokens["alice"]
    assert _post(server, alice, "/v1/decisions", QUICK).status_code == 200
    assert _post(server, alice, "/v1/executions", QUICK).status_code == 200
    denied = _post(server, alice, "/v1/executions", {"code": "print(1)", "limits": {"timeout_s": 3600}})
    assert denied.status_code == 403  # a request denied by policy is a request: it counts
    retry = _assert_over_quota(_post(server, alice, "/v1/decisions", QUICK), "rpm")
    assert retry <= 60  # until the oldest of the three leaves the minute
    _assert_over_quota(_post(server, alice, "/v1/executions", QUICK), "rpm")
    with server.client(alice) as client:
        assert client.get("/v1/policy").status_code == 200  # the read-only endpoints do not count
    assert _post(server, tokens["bob"], "/v1/decisions", QUICK).status_code == 200  # bob's own minute
    received = [r for r in server.records("request.received") if r["principal"] == "alice"]
    assert len(received) == 3  # the refused ones never reached the Gateway
    (first,) = server.records("request.refused")
    assert first["principal"] == "alice"
    assert first["data"]["quota"] == "rpm"
    assert first["data"]["code"] == "service.over_quota"
    assert first["data"]["count"] == 1
    assert first["data"]["summary"] is False
    assert first["data"]["caller"]["principal"] == "alice"
    assert first["data"]["path"] == "/v1/decisions"
    server.stop()
    records = server.records("request.refused")
    assert [(r["data"]["count"], r["data"]["summary"]) for r in records] == [(1, False), (1, True)]


def test_a_full_queue_is_429_at_once_and_concurrency_stays_at_max_concurrent(
    serve: Callable[..., Server],
    tmp_path: Path,
    pool: ThreadPoolExecutor,
    managed_containers: Callable[[], list[str]],
) -> None:
    path, tokens = _principals(tmp_path, alice={"max_concurrent": 2, "queue": 3})
    server = serve(principals=path)
    gate = server.service.quota_gate
    alice = tokens["alice"]
    with _Sampler(lambda: len(managed_containers())) as sampler:
        runs = [pool.submit(_post, server, alice, "/v1/executions", SLOW) for _ in range(5)]
        # Stop waiting as soon as a run is answered too: one refused at once (a bound off by one) fails now,
        # not after the wait's deadline.
        _wait_for(
            lambda: gate.waiting_of("alice") == 3 or any(run.done() for run in runs), "three of alice's runs waiting"
        )
        early = [run.result().status_code for run in runs if run.done()]
        assert early == [], f"answered before all five were in the service: {early}"
        refused = _post(server, alice, "/v1/executions", QUICK)
        assert not all(run.done() for run in runs)  # refused while the others were still in the service
        assert _assert_over_quota(refused, "queue") == 1
        results = [run.result(timeout=120) for run in runs]
    assert [r.status_code for r in results] == [200] * 5
    assert all(r.json()["stdout"] == "slow\n" for r in results)
    assert 1 <= sampler.most <= 2
    assert managed_containers() == []
    assert (gate.running, gate.waiting()) == (0, 0)  # the refused request left nothing behind in the gate
    (record,) = server.records("request.refused")
    assert record["data"]["quota"] == "queue"
    assert len(server.records("execution.outcome")) == 5


def test_the_global_bound_caps_all_principals_together(
    serve: Callable[..., Server],
    tmp_path: Path,
    pool: ThreadPoolExecutor,
    managed_containers: Callable[[], list[str]],
) -> None:
    path, tokens = _principals(tmp_path, alice={}, bob={})
    server = serve(principals=path, max_concurrent_executions=1)
    with _Sampler(lambda: len(managed_containers())) as sampler:
        runs = [pool.submit(_post, server, tokens[name], "/v1/executions", SLOW) for name in ("alice", "bob") * 2]
        results = [run.result(timeout=120) for run in runs]
    assert [r.status_code for r in results] == [200] * 4
    assert sampler.most == 1
    assert server.service.quota_gate.running == 0


def _hold(server: Server, token: str, body: dict[str, Any]) -> socket.socket:
    """``POST /v1/executions`` over a bare socket whose answer is never read: the request stays in the service
    until the socket is closed (a client that goes away cancels its run)."""
    url = httpx.URL(server.url)
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/executions HTTP/1.1\r\nHost: {url.host}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock = socket.create_connection((url.host, url.port or 80), timeout=10)
    sock.sendall(head.encode() + payload)
    return sock


def test_a_flooding_principal_leaves_a_slot_for_another(
    serve: Callable[..., Server], tmp_path: Path, managed_containers: Callable[[], list[str]]
) -> None:
    """M6: mallory, under the default quotas (max_concurrent 8), floods a service bounded at two runs with runs of
    a minute. She holds one slot, never both, so victim's print(2 + 2) runs at once instead of waiting in its
    queue for one of hers to end (it did: 55.7 s in the review, here 429 queue_wait after 5 s)."""
    path, tokens = _principals(tmp_path, mallory={}, victim={})
    server = serve(principals=path, max_concurrent_executions=2, queue_wait_s=5)
    gate = server.service.quota_gate
    held = [_hold(server, tokens["mallory"], MINUTE) for _ in range(3)]
    try:
        _wait_for(lambda: gate.running_of("mallory") + gate.waiting_of("mallory") == 3, "mallory's three runs in")
        victim = _post(server, tokens["victim"], "/v1/executions", QUICK)
        assert victim.status_code == 200, victim.text
        assert victim.json()["stdout"] == "4\n"
        assert gate.running_of("mallory") == 1  # her share: the global bound less one
    finally:
        for sock in held:
            sock.close()  # her running run is cancelled, her waiting ones leave at queue_wait_s
    _wait_for(lambda: (gate.running, gate.waiting()) == (0, 0), "mallory's runs ended")
    _wait_for(lambda: managed_containers() == [], "mallory's sandbox removed")


def test_the_client_gets_the_retry_after_of_a_refusal(serve: Callable[..., Server], tmp_path: Path) -> None:
    from gateway.client import Client
    from gateway.errors import OverQuotaError

    path, tokens = _principals(tmp_path, alice={"rpm": 1})
    server = serve(principals=path)
    with Client(server.url, tokens["alice"]) as client:
        assert client.decide(QUICK).allowed
        refused = client.decide(QUICK)
    assert isinstance(refused.error, OverQuotaError)
    assert refused.error.code == "service.over_quota"
    assert refused.error.quota == "rpm"
    assert 1 <= refused.error.retry_after_s <= 60
    assert refused.error.request_id

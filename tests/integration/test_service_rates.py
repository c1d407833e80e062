"""Every authenticated request of ``gateway serve`` counts against its principal's ``all_rpm`` (M2 and L3 of
issue 28), on a real server on loopback: the ``GET`` endpoints, ``/metrics`` (403 for an agent too) and MCP
messages that run nothing (``initialize``, ``tools/list``, ``ping``). Before, none of them counted: 1,500 of
1,500 ``tools/list`` and ``GET /v1/policy`` passed under ``rpm: 300``.

Each flood is bounded (it stops at its first 429 or after a fixed number of requests) and asserts counts,
never durations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from gateway.resources import policies_dir
from gateway.service.principals import DEFAULT_QUOTAS, PrincipalsStore, Quotas

if TYPE_CHECKING:
    from conftest import Server

pytestmark = pytest.mark.usefixtures("engine")

MCP_HEADERS = {"Accept": "application/json, text/event-stream"}
QUICK = {"code": "print(2 + 2)"}


def _principals(directory: Path, **who: tuple[str, dict[str, int]]) -> tuple[Path, dict[str, str]]:
    """A principals file: name -> (role, the quota fields it sets)."""
    path = directory / "rate-principals.yaml"
    store = PrincipalsStore(path)
    tokens = {}
    for name, (role, given) in who.items():
        tokens[name] = store.add(
            name,
            policy=str(policies_dir() / "default.yaml"),
            role=role,  # type: ignore[arg-type]
            quotas=Quotas(**{**DEFAULT_QUOTAS.to_dict(), **given}),
            quotas_set=frozenset(given),
        )
    return path, tokens


def _mcp(method: str, number: int) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if method == "initialize":
        params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    return {"jsonrpc": "2.0", "id": number, "method": method, "params": params}


def _request(client: httpx.Client, number: int) -> httpx.Response:
    """The ``number``-th request of a mixed flood of requests that run nothing."""
    kind = number % 6
    if kind == 0:
        return client.get("/v1/policy")
    if kind == 1:
        return client.get("/v1/tools")
    if kind == 2:
        return client.get("/metrics")  # an agent: 403, still a request the service serves
    method = ("initialize", "tools/list", "ping")[kind - 3]
    return client.post("/mcp", json=_mcp(method, number), headers=MCP_HEADERS)


def _flood(server: Server, token: str, most: int) -> list[httpx.Response]:
    """Requests until the first 429 or ``most`` of them."""
    answers: list[httpx.Response] = []
    with server.client(token) as client:
        while len(answers) < most and (not answers or answers[-1].status_code != 429):
            answers.append(_request(client, len(answers)))
    return answers


def _assert_over_all_rpm(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    body = response.json()
    assert (body["code"], body["quota"]) == ("service.over_quota", "all_rpm")
    assert body["request_id"] == response.headers["X-Request-Id"]
    assert 1 <= int(response.headers["Retry-After"]) == body["retry_after_s"] <= 60


def test_requests_that_run_nothing_count_against_all_rpm(serve: Callable[..., Server], tmp_path: Path) -> None:
    path, tokens = _principals(tmp_path, alice=("agent", {"rpm": 2, "all_rpm": 12}), bob=("agent", {}))
    server = serve(principals=path)
    answers = _flood(server, tokens["alice"], most=100)
    assert len(answers) == 13, [a.status_code for a in answers]
    assert {a.status_code for a in answers[:12]} <= {200, 202, 403}
    _assert_over_all_rpm(answers[-1])
    with server.client(tokens["alice"]) as client:
        _assert_over_all_rpm(client.post("/mcp", json=_mcp("tools/list", 99), headers=MCP_HEADERS))
        _assert_over_all_rpm(client.post("/v1/decisions", json=QUICK))  # a run is a request too
    with server.client(tokens["bob"]) as client:
        assert client.get("/v1/policy").status_code == 200  # bob's minute is his own
    assert [r for r in server.records("request.received") if r["principal"] == "alice"] == []
    (first,) = server.records("request.refused")
    assert (first["principal"], first["data"]["quota"], first["data"]["count"]) == ("alice", "all_rpm", 1)
    server.stop()
    refused = server.records("request.refused")
    assert [(r["data"]["count"], r["data"]["summary"]) for r in refused] == [(1, False), (2, True)]


def test_an_operators_polling_does_not_spend_an_agents_rate(serve: Callable[..., Server], tmp_path: Path) -> None:
    """A dashboard polling /metrics past its own all_rpm is refused; the agents' runs are not: each principal
    has its own minute, and the runs an agent sends count against its rpm and its all_rpm only."""
    path, tokens = _principals(
        tmp_path, ops=("operator", {"rpm": 1, "all_rpm": 5}), alice=("agent", {"rpm": 3, "all_rpm": 4})
    )
    server = serve(principals=path)
    with server.client(tokens["ops"]) as ops:
        polls = [ops.get("/metrics") for _ in range(6)]
    assert [p.status_code for p in polls] == [200] * 5 + [429]
    _assert_over_all_rpm(polls[-1])
    with server.client(tokens["alice"]) as alice:
        runs = [alice.post("/v1/executions", json=QUICK) for _ in range(3)]
        assert [r.status_code for r in runs] == [200] * 3
        assert all(r.json()["stdout"] == "4\n" for r in runs)
        over = alice.post("/v1/executions", json=QUICK)  # over rpm first: the run window is the tighter one
        assert (over.status_code, over.json()["quota"]) == (429, "rpm")
        assert alice.get("/v1/tools").status_code == 429  # the run refused by rpm was the fourth request

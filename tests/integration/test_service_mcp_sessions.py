"""``/mcp`` with MCP sessions (``mcp.session`` in the server configuration) on a real ``gateway serve``: the
real engine (runc), the real trail, and the official SDK's streamable HTTP client, used as a model's host would.

alice (two tokens) and bob run under ``policies/examples/sessions.yaml``, dave under the shipped default (no
sessions). A model's consecutive calls in one MCP session share a variable (kernel) or a file (workspace); two
MCP sessions of one principal share nothing; another token with my ``Mcp-Session-Id`` (bob's, or alice's other
one) gets the 404 of an unknown id and nothing else; the MCP session's end (the client's DELETE, a reload that
revokes its token, idleness, the service's stop) closes its gateway session; the bounds on live MCP sessions
answer 429.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.service.authlog import presented_token_id
from gateway.service.config import McpSettings
from gateway.service.principals import PrincipalsStore, load_principals
from gateway.service.principals.store import issue_token, render
from gateway.tool import TOOL_NAME

if TYPE_CHECKING:
    from conftest import Server

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("engine")]

SESSIONS_POLICY = policies_dir() / "examples" / "sessions.yaml"
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
}  # fmt: skip


@dataclasses.dataclass
class Served:
    server: Server
    tokens: dict[str, str]
    """alice, alice2 (alice's second token), bob, dave."""
    principals: Path


@pytest.fixture
def served(serve: Callable[..., Server], tmp_path: Path, workspace_root: str) -> Callable[..., Served]:
    def make(**mcp: Any) -> Served:
        path = tmp_path / "mcp-principals.yaml"
        store = PrincipalsStore(path)
        tokens = {name: store.add(name, policy=str(SESSIONS_POLICY)) for name in ("alice", "bob")}
        tokens["dave"] = store.add("dave", policy=str(policies_dir() / "default.yaml"))
        principals = load_principals(path)
        tokens["alice2"], record = issue_token(principals.token_ids())
        alice = principals.get("alice")
        path.write_text(render(principals.with_principal(dataclasses.replace(alice, tokens=(*alice.tokens, record)))))
        server = serve(
            runner=functools.partial(DockerRunner, workspace_root=workspace_root),
            principals=path,
            max_body_bytes=64 * 1024,
            mcp=McpSettings(**{"session": "kernel", **mcp}),
        )
        return Served(server, tokens, path)

    return make


@contextlib.asynccontextmanager
async def _mcp(url: str, token: str, seen: list[str] | None = None) -> AsyncIterator[ClientSession]:
    """An initialized MCP session as the SDK's client keeps it; ``seen`` gets its Mcp-Session-Id. Leaving it
    sends the SDK's DELETE."""

    async def note(response: httpx2.Response) -> None:
        session_id = response.headers.get("mcp-session-id")
        if seen is not None and session_id is not None and session_id not in seen:
            seen.append(session_id)

    headers = {"Authorization": f"Bearer {token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(120), event_hooks={"response": [note]}) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        yield client


async def _run(client: ClientSession, code: str) -> dict[str, Any]:
    result = await client.call_tool(TOOL_NAME, {"code": code})
    assert result.structured_content is not None
    return dict(result.structured_content)


def _raw(server: Server, token: str, body: dict[str, Any], session_id: str | None = None) -> httpx.Response:
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {token}"}
    if session_id is not None:
        headers["Mcp-Session-Id"] = session_id
    return httpx.post(f"{server.url}/mcp", json=body, headers=headers, timeout=60)


def _wait_for(server: Server, event_type: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 60
    while len(records := server.records(event_type)) < count:
        assert time.monotonic() < deadline, f"{event_type}: {len(records)} of {count} records after 60 s"
        time.sleep(0.1)
    return records


def test_calls_in_one_mcp_session_share_a_kernel_and_two_sessions_share_nothing(
    served: Callable[..., Served],
) -> None:
    """The model's second call reads the first one's variable; alice's other MCP session does not see it. Each
    client's DELETE (leaving the SDK's client) closes its gateway session before the DELETE is answered."""
    s = served()

    async def steps() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], int]:
        async with _mcp(s.server.url, s.tokens["alice"]) as first, _mcp(s.server.url, s.tokens["alice"]) as second:
            await _run(first, "x = 21")
            shared = await _run(first, "print(x * 2)")
            other = await _run(second, "print(x)")
            isolated = await _run(second, "x = 'mine'\nx")
            closed_before = len(s.server.records("session.closed"))
        return shared, other, isolated, closed_before

    shared, other, isolated, closed_before = anyio.run(steps)
    assert (shared["stdout"], shared["session"]["new"]) == ("42\n", False)
    assert other["exit_code"] != 0
    assert "NameError" in other["stderr"]
    assert isolated["value"] == "'mine'"
    assert closed_before == 0
    created = s.server.records("session.created")
    closed = s.server.records("session.closed")  # both DELETEs were answered: both sessions closed by then
    assert len(created) == len(closed) == 2
    assert {r["principal"] for r in created + closed} == {"alice"}
    assert {r["data"]["session_id"] for r in closed} == {r["data"]["session_id"] for r in created}
    assert {r["data"]["caller"]["token_id"] for r in created} == {presented_token_id(s.tokens["alice"])}


def test_calls_in_one_mcp_session_share_a_workspace(served: Callable[..., Served]) -> None:
    s = served(session="workspace")

    async def steps() -> tuple[dict[str, Any], dict[str, Any]]:
        async with _mcp(s.server.url, s.tokens["bob"]) as client:
            wrote = await _run(client, "open('note.txt', 'w').write('kept')")
            read = await _run(client, "print(open('note.txt').read())")
        return wrote, read

    wrote, read = anyio.run(steps)
    assert wrote["exit_code"] == 0
    assert read["stdout"] == "kept\n"
    (created,) = s.server.records("session.created")
    assert created["data"]["mode"] == "workspace"


def test_another_token_with_my_session_id_gets_the_404_of_an_unknown_id_and_changes_nothing(
    served: Callable[..., Served],
) -> None:
    """bob's token, and alice's own other token, with alice's Mcp-Session-Id: the very answer of an id that
    never existed; nothing runs, and alice's session goes on as before."""
    s = served()
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": TOOL_NAME, "arguments": {"code": "x = 'stolen'"}}}  # fmt: skip

    async def steps() -> tuple[list[httpx.Response], httpx.Response, dict[str, Any]]:
        seen: list[str] = []
        async with _mcp(s.server.url, s.tokens["alice"], seen) as client:
            await _run(client, "x = 'alice'")
            (mine,) = seen
            foreign = [
                await anyio.to_thread.run_sync(_raw, s.server, s.tokens[who], call, mine) for who in ("bob", "alice2")
            ]
            unknown = await anyio.to_thread.run_sync(_raw, s.server, s.tokens["bob"], call, "f" * 32)
            still = await _run(client, "x")
        return foreign, unknown, still

    foreign, unknown, still = anyio.run(steps)
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == "Session not found"
    for answer in foreign:
        assert (answer.status_code, answer.content) == (unknown.status_code, unknown.content)
        assert answer.headers["content-type"] == unknown.headers["content-type"]
        assert "mcp-session-id" not in answer.headers
    assert still["value"] == "'alice'"
    assert len(s.server.records("session.created")) == 1  # bob's calls opened nothing, ran nothing
    assert {r["principal"] for r in s.server.records("request.received")} == {"alice"}


def test_a_policy_without_sessions_answers_the_call_with_rule_sessions_enabled(served: Callable[..., Served]) -> None:
    s = served()

    async def steps() -> dict[str, Any]:
        async with _mcp(s.server.url, s.tokens["dave"]) as client:
            return await _run(client, "print(1)")

    answer = anyio.run(steps)
    assert answer["ok"] is False
    assert answer["allowed"] is False
    assert "sessions.enabled" in [d["rule"] for d in answer["denied_because"]]
    assert s.server.records("execution.outcome") == []
    assert s.server.records("session.created") == []


def test_a_reload_that_revokes_the_token_closes_its_mcp_sessions_gateway_session(
    served: Callable[..., Served],
) -> None:
    s = served()

    async def steps() -> tuple[dict[str, Any], int]:
        seen: list[str] = []
        async with _mcp(s.server.url, s.tokens["bob"], seen) as client:
            ran = await _run(client, "y = 1")
            PrincipalsStore(s.principals).revoke("bob")
            assert await anyio.to_thread.run_sync(s.server.service.reload)
            await anyio.to_thread.run_sync(_wait_for, s.server, "session.closed", 1)
            refused = await anyio.to_thread.run_sync(_raw, s.server, s.tokens["bob"], INITIALIZE, seen[0])
            return ran, refused.status_code

    ran, status = anyio.run(steps)
    assert ran["exit_code"] == 0
    assert status == 401  # the revoked token stops at once
    (closed,) = s.server.records("session.closed")
    assert closed["principal"] == "bob"


def test_an_idle_mcp_session_ends_and_the_stop_closes_the_others(served: Callable[..., Served]) -> None:
    """idle_s 1: bob's MCP session, left without a request, ends and its gateway session is closed; alice's,
    still open at the service's stop, is closed by the stop."""
    s = served(idle_s=1)

    async def steps() -> None:
        async with _mcp(s.server.url, s.tokens["bob"]) as client:
            await _run(client, "pass")
            await anyio.to_thread.run_sync(_wait_for, s.server, "session.closed", 1)
            async with _mcp(s.server.url, s.tokens["alice"]) as other:
                await _run(other, "pass")
                await anyio.to_thread.run_sync(s.server.stop)

    with contextlib.suppress(BaseException):  # the stopped server fails the client's last requests
        anyio.run(steps)
    closed = s.server.records("session.closed")
    assert sorted(r["principal"] for r in closed) == ["alice", "bob"]


def test_live_mcp_sessions_are_bounded_per_principal_and_in_all(served: Callable[..., Served]) -> None:
    """One per principal and two in all: alice's second initialize, then dave's (bob and alice hold the two),
    get 429 service.over_quota naming the bound, audited; an ended session frees its place."""
    s = served(max_sessions_per_principal=1, max_sessions=2)
    alice = _raw(s.server, s.tokens["alice"], INITIALIZE)
    assert alice.status_code == 200
    assert alice.headers["mcp-session-id"]
    again = _raw(s.server, s.tokens["alice2"], INITIALIZE)
    assert again.status_code == 429
    assert again.json()["code"] == "service.over_quota"
    assert "mcp.max_sessions_per_principal" in again.json()["message"]
    assert int(again.headers["retry-after"]) >= 1
    assert _raw(s.server, s.tokens["bob"], INITIALIZE).status_code == 200
    full = _raw(s.server, s.tokens["dave"], INITIALIZE)
    assert full.status_code == 429
    assert "mcp.max_sessions)" in full.json()["message"]
    refused = s.server.records("request.refused")
    assert {(r["principal"], r["data"]["path"]) for r in refused} == {("alice", "/mcp"), ("dave", "/mcp")}
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {s.tokens['alice']}"}
    ended = httpx.delete(
        f"{s.server.url}/mcp", headers={**headers, "Mcp-Session-Id": alice.headers["mcp-session-id"]}, timeout=60
    )
    assert ended.status_code == 200
    assert _raw(s.server, s.tokens["dave"], INITIALIZE).status_code == 200

"""``/mcp`` on a real ``gateway serve`` (real engine, real trail), driven by the official SDK's streamable HTTP
client: the tool with the caller's ceilings, a real run audited as the token's principal, a denial under the
caller's own policy, and no MCP at all without a valid token."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import httpx2
import pytest
from mcp import ClientSession, MCPError
from mcp.client.streamable_http import streamable_http_client

from gateway.service.authlog import presented_token_id
from gateway.tool import TOOL_NAME

if TYPE_CHECKING:
    from conftest import Server

pytestmark = pytest.mark.usefixtures("engine")


async def _session(
    url: str, token: str | None, calls: list[dict[str, Any]], statuses: list[int] | None = None
) -> tuple[Any, list[Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}

    async def note(response: httpx2.Response) -> None:
        if statuses is not None:
            statuses.append(response.status_code)

    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60), event_hooks={"response": [note]}) as http,
        streamable_http_client(f"{url}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        tools = await client.list_tools()
        results = [await client.call_tool(TOOL_NAME, arguments) for arguments in calls]
        return tools, results


def test_sdk_client_lists_the_tool_and_runs_code_as_the_tokens_principal(server: Server) -> None:
    tools, (ran,) = anyio.run(_session, server.url, server.tokens["alice"], [{"code": "print(2+2)"}])
    (tool,) = tools.tools
    assert tool.name == TOOL_NAME
    assert tool.input_schema["properties"]["timeout"]["maximum"] == 60  # alice: the default policy's ceiling
    assert ran.is_error is False
    assert ran.structured_content["stdout"] == "4\n"
    assert ran.structured_content["exit_code"] == 0
    assert json.loads(ran.content[0].text)["stdout"] == "4\n"
    (outcome,) = server.records("execution.outcome")
    assert outcome["request_id"] == ran.structured_content["request_id"]
    assert outcome["principal"] == "alice"
    (received,) = server.records("request.received")
    assert received["data"]["caller"]["token_id"] == presented_token_id(server.tokens["alice"])


def test_each_token_is_decided_under_its_own_principals_policy(server: Server) -> None:
    """bob's policy caps the timeout at 10 s: his tool says so and a longer run is denied (nothing runs)."""
    tools, (denied,) = anyio.run(_session, server.url, server.tokens["bob"], [{"code": "print(1)", "timeout": 30}])
    assert tools.tools[0].input_schema["properties"]["timeout"]["maximum"] == 10
    assert denied.is_error is False
    assert denied.structured_content["allowed"] is False
    assert [v["rule"] for v in denied.structured_content["denied_because"]] == ["limits.timeout"]
    assert server.records("execution.outcome") == []
    assert {r["principal"] for r in server.records("policy.decision")} == {"bob"}


@pytest.mark.parametrize("who", [None, "carol", "garbage"])  # no token, a revoked one, not a token
def test_no_mcp_without_a_valid_token(server: Server, who: str | None) -> None:
    token = {None: None, "carol": server.tokens["carol"], "garbage": "not-a-token"}[who]
    statuses: list[int] = []
    with pytest.RaisesGroup(MCPError, flatten_subgroups=True):  # initialize fails
        anyio.run(_session, server.url, token, [{"code": "print(2+2)"}], statuses)
    assert statuses == [401]  # the SDK's initialize was refused by the gateway, nothing else was sent
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    raw = httpx.post(
        f"{server.url}/mcp", json=initialize, headers={**headers, "Accept": "application/json, text/event-stream"}
    )
    assert raw.status_code == 401
    assert raw.json()["code"] == "auth.failed"
    assert raw.headers["WWW-Authenticate"].startswith("Bearer")
    assert server.records("request.received") == []


def test_a_call_whose_client_goes_away_has_its_sandbox_removed(
    server: Server, managed_containers: Callable[[], list[str]]
) -> None:
    """The MCP client is closed while its call runs: the HTTP request is gone, so the run is cancelled."""

    async def abandon() -> None:
        async with anyio.create_task_group() as group:
            code = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"
            group.start_soon(_session, server.url, server.tokens["alice"], [{"code": code, "timeout": 50}])
            while not managed_containers():  # the sandbox exists: the call is in flight
                await anyio.sleep(0.1)
            group.cancel_scope.cancel()  # closes the client and its connection

    anyio.run(abandon)
    deadline = time.monotonic() + 60
    while not server.records("execution.outcome"):
        assert time.monotonic() < deadline, "the cancelled run's outcome was never recorded"
        time.sleep(0.1)
    (outcome,) = server.records("execution.outcome")
    assert outcome["data"]["error"]["code"] == "gateway.cancelled"
    assert outcome["principal"] == "alice"
    assert managed_containers() == []


def test_tool_calls_over_mcp_count_against_the_callers_quota(
    serve: Callable[..., Server], principals_file: tuple[Any, dict[str, str]]
) -> None:
    """Two requests a minute for dave: the third tool call is refused (a tool error, nothing runs), as a third
    POST /v1/executions would be."""
    from gateway.resources import policies_dir
    from gateway.service.principals import PrincipalsStore, Quotas

    token = PrincipalsStore(principals_file[0]).add(
        "dave", policy=str(policies_dir() / "default.yaml"), quotas=Quotas(rpm=2), quotas_set=frozenset({"rpm"})
    )
    server = serve()
    calls = [{"code": "print(1)"}, {"code": "print(2)"}, {"code": "print(3)"}]
    _, (first, second, third) = anyio.run(_session, server.url, token, calls)
    assert (first.is_error, second.is_error) == (False, False)
    assert third.is_error is True
    assert third.structured_content["error"]["code"] == "service.over_quota"
    assert len(server.records("execution.outcome")) == 2  # the refused call ran nothing
    (refused,) = server.records("request.refused")
    assert (refused["principal"], refused["data"]["path"]) == ("dave", "/mcp")


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_the_stateless_transport_refuses_get_and_delete_instead_of_holding_a_stream_open(
    server: Server, method: str
) -> None:
    """The stateless transport has no server-to-client stream and no sessions: GET and DELETE get 405 with the
    gateway's error body at once (a GET used to be answered with an event stream that never ended, one open
    connection per request for as long as the client liked)."""
    headers = {"Authorization": f"Bearer {server.tokens['alice']}", "Accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=server.url, timeout=10) as client:
        response = client.request(method, "/mcp", headers=headers)
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    body = response.json()
    assert body["code"] == "http.method_not_allowed"
    assert body["request_id"]


@pytest.mark.parametrize(
    ("declared", "sent", "status", "code"),
    [(10**9, b"", 413, "request.too_large"), (100, b'{"jsonrpc": ', 408, "request.timeout")],
)
def test_an_mcp_body_is_bounded_like_every_v1_body(
    serve: Callable[..., Server], declared: int, sent: bytes, status: int, code: str
) -> None:
    """/mcp reads the body itself, with the service's bounds, before the SDK sees it: a declared gigabyte gets
    413 before one byte of it is sent, a trickled body 408 after body_read_s (the SDK has no deadline, and its
    own 4 MiB limit answers in plain text, unaudited); either refusal is the gateway's error body, audited."""
    server = serve(body_read_s=1.0)
    host, port = server.url.removeprefix("http://").split(":")
    head = (
        "POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\n"
        f"Authorization: Bearer {server.tokens['alice']}\r\nContent-Length: {declared}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode() + sent)
        answer = b""
        while code.encode() not in answer:
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
    assert answer.startswith(f"HTTP/1.1 {status} ".encode())
    (refused,) = server.records("request.refused")
    assert (refused["principal"], refused["data"]["code"], refused["data"]["path"]) == ("alice", code, "/mcp")

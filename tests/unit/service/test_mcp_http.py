"""The ``mcp:`` section of the server configuration (the stateful ``/mcp`` itself is tested against a real
service in tests/integration/test_service_mcp_sessions.py)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from gateway.errors import ServerConfigError
from gateway.service.config import McpSettings, load_server_config_text

HEAD = "apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\n"


def test_mcp_is_stateless_unless_a_session_mode_is_set() -> None:
    assert load_server_config_text(HEAD).mcp == McpSettings(session=None)
    assert load_server_config_text(HEAD + "mcp: {session: null}\n").mcp.session is None
    given = load_server_config_text(
        HEAD + "mcp: {session: workspace, max_sessions: 10, max_sessions_per_principal: 2, idle_s: 30}\n"
    ).mcp
    assert given == McpSettings(session="workspace", max_sessions=10, max_sessions_per_principal=2, idle_s=30.0)
    assert isinstance(given.idle_s, float)


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("mcp: {session: shell}", "$.mcp.session"),
        ("mcp: {max_sessions: 0}", "$.mcp.max_sessions"),
        ("mcp: {max_sessions_per_principal: -1}", "$.mcp.max_sessions_per_principal"),
        ("mcp: {idle_s: 0}", "$.mcp.idle_s"),
        ("mcp: {sessions: kernel}", "$.mcp.sessions"),  # a typo of session
    ],
)
def test_a_bad_mcp_section_is_refused_with_its_path(text: str, path: str) -> None:
    with pytest.raises(ServerConfigError) as refused:
        load_server_config_text(HEAD + text + "\n")
    assert [p.path for p in refused.value.problems] == [path]


def test_another_callers_session_id_gets_the_sdks_own_answer_to_an_unknown_id() -> None:
    """The endpoint refuses an id that is not the caller's itself (before the SDK sees the request): its answer
    must stay the SDK's answer to an id that never existed, byte for byte, or a foreign id would be told apart."""
    from mcp.server import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.types import Message

    from gateway import Caller
    from gateway.service.auth import CallerUser
    from gateway.service.mcp_http import McpEndpoint

    def scope(user: object) -> dict[str, object]:
        headers = [
            (b"mcp-session-id", b"f" * 32), (b"content-type", b"application/json"),
            (b"accept", b"application/json, text/event-stream"),
        ]  # fmt: skip
        return {
            "type": "http", "method": "POST", "path": "/mcp", "raw_path": b"/mcp", "query_string": b"",
            "headers": headers, "http_version": "1.1", "scheme": "http", "root_path": "", "server": None,
            "client": None, "user": user,
        }  # fmt: skip

    async def answer(app: Any, user: object) -> tuple[int, dict[bytes, bytes], bytes]:
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}'}

        async def send(message: Message) -> None:
            sent.append(message)

        await app(scope(user), receive, send)
        head = dict(sent[0]["headers"])
        head.pop(b"content-length", None)
        return sent[0]["status"], head, b"".join(m.get("body", b"") for m in sent[1:])

    async def both() -> tuple[Any, Any]:
        sdk = StreamableHTTPSessionManager(Server("x"))
        endpoint = McpEndpoint(
            None,  # type: ignore[arg-type]  # never reached: the request is refused first
            read_body=None,  # type: ignore[arg-type]
            admit=None,  # type: ignore[arg-type]
            error=None,  # type: ignore[arg-type]
            settings=McpSettings(session="kernel"),
        )
        async with sdk.run(), endpoint.run():
            return await answer(sdk.handle_request, None), await answer(endpoint, CallerUser(Caller("bob", "0a0b")))

    theirs, ours = anyio.run(both)
    assert theirs[0] == 404
    assert ours == theirs

"""The ``mcp:`` section of the server configuration (the stateful ``/mcp`` itself is tested against a real
service in tests/integration/test_service_mcp_sessions.py)."""

from __future__ import annotations

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

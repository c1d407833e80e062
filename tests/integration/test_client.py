"""``gateway.client`` against the real service: a uvicorn server on a loopback port, the real engine and trail.

The server is the one ``test_service_http.py`` starts (fixtures in conftest.py): alice runs under the default
policy (timeout ceiling 60 s), bob under ``tight`` (ceiling 10 s), carol is revoked. Where the client claims to
answer like the library, the test asks the server's own in-process :class:`Gateway` the same question and
compares.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from gateway import Caller, ExecutionResult
from gateway.client import AsyncClient, Client, RemoteResult, error_from_response
from gateway.errors import (
    EXIT_DENIED,
    AuditUnavailableError,
    AuthenticationError,
    EngineUnavailableError,
    GatewayError,
    PrincipalMismatchError,
    RequestError,
    ServiceUnreachableError,
)
from gateway.runner.docker.runner import DockerRunner
from gateway.simple import run_in_sandbox
from gateway.tool import TOOL_NAME, ToolHandler, handle_tool_call

if TYPE_CHECKING:
    from collections.abc import Callable

    from conftest import Server

pytestmark = pytest.mark.usefixtures("engine")

README = Path(__file__).resolve().parents[2] / "README.md"
TOO_LONG_FOR_BOB = {"code": "print(1)", "limits": {"timeout_s": 30}}
INVALID = {"code": 42, "limits": {"memory": "lots"}, "colour": "blue"}


def _local(server: Server, principal: str, request: dict[str, Any], *, run: bool = True) -> ExecutionResult:
    """The same request through the server's own Gateway, in process, as ``principal``."""
    caller = Caller(principal, "local-comparison")
    gateway = server.service.gateway
    return gateway.execute(request, caller=caller) if run else gateway.decide(request, caller=caller)


def _comparable(data: dict[str, Any]) -> dict[str, Any]:
    """A result object without what differs between two requests (ids, timings)."""
    out = {k: v for k, v in data.items() if k not in ("request_id", "decision_id", "duration_ms")}
    if out["error"] is not None:
        out["error"] = {"code": out["error"]["code"], "paths": sorted(p["path"] for p in out["error"]["problems"])}
    return out


# --- execute --------------------------------------------------------------------------------------------


def test_execute_runs_and_returns_the_result_object(server: Server) -> None:
    with Client(server.url, server.tokens["alice"]) as client:
        result = client.execute({"code": "print(2+2)"})
    assert isinstance(result, RemoteResult)
    assert result.stdout == "4\n"
    assert (result.allowed, result.ran, result.exit_code, result.exit_status, result.error) == (True, True, 0, 0, None)
    [outcome] = [r for r in server.records("execution.outcome") if r["request_id"] == result.request_id]
    assert outcome["principal"] == "alice"
    local = _local(server, "alice", {"code": "print(2+2)"})
    assert set(result.to_dict()) == set(local.to_dict())
    assert _comparable(result.to_dict()) == _comparable(local.to_dict())


def test_a_denial_is_a_result_with_its_violations_like_gateway_execute(server: Server) -> None:
    with Client(server.url, server.tokens["bob"]) as client:
        result = client.execute(TOO_LONG_FOR_BOB)
    assert result.status == 403
    assert (result.allowed, result.ran, result.error, result.exit_status) == (False, False, None, EXIT_DENIED)
    assert [v["rule"] for v in result.violations] == ["limits.timeout"]
    assert result.to_dict()["policy"]["name"] == "tight"
    assert not [r for r in server.records("execution.outcome") if r["request_id"] == result.request_id]
    local = _local(server, "bob", TOO_LONG_FOR_BOB)
    assert set(result.to_dict()) == set(local.to_dict())
    assert _comparable(result.to_dict()) == _comparable(local.to_dict())


def test_an_invalid_request_is_a_result_with_a_request_error_and_every_path(server: Server) -> None:
    with Client(server.url, server.tokens["alice"]) as client:
        result = client.execute(INVALID)
    assert result.status == 422
    assert isinstance(result.error, RequestError)
    assert result.error.code == "request.invalid"
    assert result.error.request_id == result.request_id
    assert result.error.request_id
    paths = sorted(p.path for p in result.error.problems)
    assert "$.code" in paths
    assert "$.colour" in paths or "$" in paths
    local = _local(server, "alice", INVALID)
    assert local.error is not None
    assert paths == sorted(p.path or "$" for p in local.error.problems)
    assert _comparable(result.to_dict()) == _comparable(local.to_dict())


def test_a_body_naming_another_principal_is_the_librarys_mismatch_error(server: Server) -> None:
    with Client(server.url, server.tokens["bob"]) as client:
        result = client.execute({"code": "print(1)", "principal": "alice"})
    assert type(result.error) is PrincipalMismatchError
    assert result.exit_status == 2


def test_an_engine_that_does_not_answer_is_the_librarys_engine_error(
    serve: Callable[..., Server], tmp_path: Path
) -> None:
    server = serve(runner=lambda: DockerRunner(base_url=f"unix://{tmp_path}/no-engine.sock"))
    with Client(server.url, server.tokens["alice"]) as client:
        result = client.execute({"code": "print(1)"})
    assert result.status == 503
    assert isinstance(result.error, EngineUnavailableError)
    assert result.error.request_id == result.request_id


def test_a_closed_trail_is_the_librarys_audit_error(server: Server) -> None:
    server.service.gateway.audit.close()
    with Client(server.url, server.tokens["alice"]) as client:
        result = client.execute({"code": "print(1)"})
    assert isinstance(result.error, AuditUnavailableError)
    assert not result.ran


# --- decide, policy, tools ----------------------------------------------------------------------------------


def test_decide_runs_nothing_and_reports_like_gateway_decide(server: Server) -> None:
    with Client(server.url, server.tokens["alice"]) as alice, Client(server.url, server.tokens["bob"]) as bob:
        allowed = alice.decide(TOO_LONG_FOR_BOB)
        denied = bob.decide(TOO_LONG_FOR_BOB)
    assert allowed.allowed
    assert allowed.decision is not None
    assert allowed.decision["options"] is not None
    assert not allowed.ran
    assert (denied.allowed, denied.error, denied.exit_status) == (False, None, EXIT_DENIED)
    assert [v["rule"] for v in denied.violations] == ["limits.timeout"]
    assert server.records("execution.outcome") == []
    for remote, principal in ((allowed, "alice"), (denied, "bob")):
        local = _local(server, principal, TOO_LONG_FOR_BOB, run=False)
        assert _comparable(remote.to_dict()) == _comparable(local.to_dict())


def test_policy_and_tools_are_the_callers(server: Server) -> None:
    with Client(server.url, server.tokens["bob"]) as client:
        policy = client.policy()
        tools = client.tools()
    assert policy["principal"] == "bob"
    assert policy["policy"]["name"] == "tight"
    assert policy["ceilings"]["limits"]["timeout_s"] == 10
    [tool] = tools
    assert tool["function"]["name"] == TOOL_NAME
    assert tool["function"]["parameters"]["properties"]["timeout"]["maximum"] == 10


# --- errors about the client ----------------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["wrong-token", "carol"])
def test_a_bad_token_raises_the_librarys_auth_error_with_the_request_id(server: Server, token: str) -> None:
    token = server.tokens.get(token, token)
    with Client(server.url, token) as client:
        calls = {
            "execute": lambda: client.execute({"code": "print(1)"}),
            "decide": lambda: client.decide({"code": "print(1)"}),
            "policy": client.policy,
            "tools": client.tools,
        }
        for name, call in calls.items():
            with pytest.raises(AuthenticationError) as caught:
                call()
            err = caught.value
            assert err.code == "auth.failed", name
            assert re.fullmatch(r"[0-9a-f]{32}", err.request_id or ""), name
            for text in (str(err), repr(err), json.dumps(err.to_dict()), err.diagnostics(), repr(client)):
                assert token not in text
    assert server.records("request.received") == []


def test_unknown_codes_map_to_the_base_class_of_their_status_family(server: Server) -> None:
    with httpx.Client(base_url=server.url) as http:
        missing = error_from_response(http.get("/v1/nothing-here"))
    assert isinstance(missing, RequestError)
    assert missing.code == "http.not_found"
    assert missing.request_id
    response = httpx.Response(502, text="<html>bad gateway</html>", request=httpx.Request("GET", server.url))
    proxy = error_from_response(response)
    assert type(proxy) is GatewayError
    assert "not the gateway's error format" in proxy.message


def test_no_server_is_service_unreachable_and_the_token_stays_out(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token = "gw_secret_token_value"
    with (
        Client(f"http://127.0.0.1:{port}", token, timeout=5) as client,
        pytest.raises(ServiceUnreachableError) as caught,
    ):
        client.execute({"code": "print(1)"})
    err = caught.value
    assert err.code == "service.unreachable"
    chain = [err, err.__cause__]
    for text in [str(e) for e in chain] + [repr(e) for e in chain]:
        assert token not in text


def test_the_token_is_never_logged(server: Server, caplog: pytest.LogCaptureFixture) -> None:
    token = server.tokens["alice"]
    with caplog.at_level(logging.DEBUG), Client(server.url, token) as client:
        client.execute({"code": "print(1)"})
        client.tools()
        assert token not in repr(client)
    assert caplog.records, "httpx/httpcore debug logging was expected to say something"
    assert token not in caplog.text


# --- async ------------------------------------------------------------------------------------------------------


def test_the_async_client_answers_like_the_sync_one(server: Server) -> None:
    async def scenario() -> tuple[RemoteResult, RemoteResult, RemoteResult, dict[str, Any], AuthenticationError]:
        async with (
            AsyncClient(server.url, server.tokens["alice"]) as alice,
            AsyncClient(server.url, server.tokens["bob"]) as bob,
        ):
            ran, denied, decided, policy = await asyncio.gather(
                alice.execute({"code": "print(2+2)"}), bob.execute(TOO_LONG_FOR_BOB), bob.decide(TOO_LONG_FOR_BOB),
                bob.policy(),
            )  # fmt: skip
        async with AsyncClient(server.url, "nope") as stranger:
            try:
                await stranger.tools()
            except AuthenticationError as exc:
                return ran, denied, decided, policy, exc
        raise AssertionError("a bad token was accepted")

    ran, denied, decided, policy, auth = asyncio.run(scenario())
    assert (ran.stdout, ran.exit_status) == ("4\n", 0)
    assert [v["rule"] for v in denied.violations] == ["limits.timeout"]
    assert not denied.allowed
    assert not decided.allowed
    assert policy["policy"]["name"] == "tight"
    assert auth.request_id


# --- the tool and run_in_sandbox with a remote client -------------------------------------------------------------


def test_handle_tool_call_with_the_remote_client(server: Server) -> None:
    with Client(server.url, server.tokens["alice"]) as alice, Client(server.url, server.tokens["bob"]) as bob:
        answer = handle_tool_call(TOOL_NAME, json.dumps({"code": "print(2+2)"}), gateway=alice)
        denied = handle_tool_call(TOOL_NAME, {"code": "print(1)", "timeout": 30}, gateway=bob)
        handler = ToolHandler(bob)
        assert handler.definition() == bob.tools()[0]
        with pytest.raises(ValueError, match="principal"):
            ToolHandler(bob, principal="mallory")
    assert answer["ok"] is True
    assert answer["stdout"] == "4\n"
    assert answer["exit_code"] == 0
    assert denied["ok"] is False
    assert denied["allowed"] is False
    assert [d["rule"] for d in denied["denied_because"]] == ["limits.timeout"]
    [outcome] = [r for r in server.records("execution.outcome") if r["request_id"] == answer["request_id"]]
    assert outcome["principal"] == "alice"


def test_run_in_sandbox_with_the_remote_client(server: Server) -> None:
    with Client(server.url, server.tokens["alice"]) as alice, Client(server.url, server.tokens["bob"]) as bob:
        assert run_in_sandbox("print(2+2)", gateway=alice) == {"success": True, "output": "4\n"}
        denied = run_in_sandbox("print(1)", timeout=30, gateway=bob)
        with pytest.raises(ValueError, match="either"):
            run_in_sandbox("print(1)", gateway=alice, policy="policies/default.yaml")
    assert denied["success"] is False
    assert "limits.timeout" in denied["error"]


# --- the README's function-calling loop -----------------------------------------------------------------------------


def _readme_loop() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    [loop] = [b for b in blocks if "gateway.client" in b and "tool_calls" in b]
    return loop


def test_the_readme_function_calling_loop_runs_against_the_service(server: Server) -> None:
    """The README's loop, verbatim but for the URL, with a fake model: it asks for one tool call, then answers
    with what the tool returned. Nothing leaves the loopback interface."""
    seen: list[list[dict[str, Any]]] = []

    def model(messages: list[dict[str, Any]], *, tools: list[dict[str, Any]]) -> dict[str, Any]:
        seen.append(tools)
        if messages[-1]["role"] == "user":
            call = {"name": TOOL_NAME, "arguments": json.dumps({"code": "print(2**100)", "timeout": 5})}
            return {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": call}],
            }
        answer = json.loads(messages[-1]["content"])
        return {"role": "assistant", "content": f"2**100 = {answer['stdout'].strip()}"}

    code = _readme_loop()
    assert "http://127.0.0.1:8787" in code
    namespace: dict[str, Any] = {"model": model, "token": server.tokens["bob"]}
    exec(compile(code.replace("http://127.0.0.1:8787", server.url), str(README), "exec"), namespace)  # noqa: S102
    messages = namespace["messages"]
    assert messages[-1]["content"] == f"2**100 = {2**100}"
    [tool_message] = [m for m in messages if m["role"] == "tool"]
    assert tool_message["tool_call_id"] == "c1"
    assert json.loads(tool_message["content"])["exit_code"] == 0
    assert len(seen) == 2
    assert seen[0][0]["function"]["parameters"]["properties"]["timeout"]["maximum"] == 10  # bob's ceiling
    outcomes = server.records("execution.outcome")
    assert [r["principal"] for r in outcomes] == ["bob"]

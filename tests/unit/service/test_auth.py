"""gateway.service.auth: the bearer backend's user for each kind of token, the reason each failure is recorded
with, the 401 of an endpoint behind it, the 429 past the principal's all_rpm, and no token read (nor failure
recorded) on an open route."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway import Caller
from gateway.audit import MemoryAuditSink
from gateway.errors import AuthenticationError
from gateway.resources import default_policy_path
from gateway.service.auth import BearerTokens, CallerUser, caller_of
from gateway.service.endpoints import v1
from gateway.service.principals import DEFAULT_QUOTAS, PrincipalsStore, Quotas
from gateway.service.quotas import QuotaGate, Refusals


@dataclass
class Failures:
    """Stands in for the service's AuthFailures: what each ``note`` was called with."""

    noted: list[dict[str, Any]] = field(default_factory=list)

    def note(self, reason: str, *, token_id: str | None, client: str | None, path: str) -> None:
        self.noted.append({"reason": reason, "token_id": token_id, "path": path})


@v1
async def whoami(request: Request, caller: Caller, request_id: str) -> Response:
    user = request.user
    assert isinstance(user, CallerUser)
    return JSONResponse({"caller": caller.to_dict(), "principal": user.principal, "scopes": request.auth.scopes})


async def open_endpoint(request: Request) -> Response:
    return JSONResponse({"user": "user" in request.scope})


@pytest.fixture
def served(tmp_path: Path) -> tuple[TestClient, Failures, dict[str, str]]:
    store = PrincipalsStore(tmp_path / "principals.yaml")
    tokens = {
        "alice": store.add("alice", policy=default_policy_path()),
        "bob": store.add("bob", policy=default_policy_path()),
        "carl": store.add("carl", policy=default_policy_path(), quotas=Quotas(rpm=1, all_rpm=2)),
    }
    store.revoke("bob")
    failures = Failures()
    bearer = [Middleware(AuthenticationMiddleware, backend=BearerTokens())]
    app = Starlette(
        routes=[
            Route("/v1/whoami", whoami, middleware=bearer),
            Route("/v1/unguarded", whoami),  # a v1 endpoint whose route forgot the backend
            Route("/healthz", open_endpoint),
        ]
    )
    app.state.service = SimpleNamespace(
        principals=store.load(), auth_failures=failures, config=SimpleNamespace(quotas=DEFAULT_QUOTAS),
        quota_gate=QuotaGate(4), refusals=Refusals(MemoryAuditSink()),
    )  # fmt: skip
    return TestClient(app), failures, tokens


def test_a_valid_token_makes_the_caller_the_user(served: tuple[TestClient, Failures, dict[str, str]]) -> None:
    client, failures, tokens = served
    answer = client.get("/v1/whoami", headers={"Authorization": f"Bearer {tokens['alice']}"})
    assert answer.status_code == 200
    body = answer.json()
    assert body["caller"] == {"principal": "alice", "token_id": tokens["alice"][4:12]}
    assert body["principal"] == "alice"
    assert body["scopes"] == ["authenticated"]
    assert failures.noted == []


@pytest.mark.parametrize(
    ("header", "reason", "token_id"),
    [
        (None, "missing", None),
        ("Basic dXNlcjpwYXNz", "malformed", None),
        ("Bearer", "malformed", None),
        ("Bearer not-a-token", "malformed", None),
        ("Bearer agw_0000000a_" + "A" * 43, "unknown", "0000000a"),
        ("Bearer {bob}", "unknown", "{bob}"),  # revoked
    ],
)
def test_each_failure_is_answered_401_and_recorded_with_its_reason(
    served: tuple[TestClient, Failures, dict[str, str]], header: str | None, reason: str, token_id: str | None
) -> None:
    client, failures, tokens = served
    if header is not None and "{bob}" in header:
        header, token_id = header.format(bob=tokens["bob"]), tokens["bob"][4:12]
    answer = client.get("/v1/whoami", headers={"Authorization": header} if header is not None else {})
    assert answer.status_code == 401
    assert answer.json()["code"] == "auth.failed"
    assert answer.json()["request_id"] == answer.headers["X-Request-Id"]
    assert answer.headers["WWW-Authenticate"] == 'Bearer realm="gateway"'
    assert failures.noted == [{"reason": reason, "token_id": token_id, "path": "/v1/whoami"}]


@pytest.mark.parametrize("scheme", ["Basic", "Token", "Bearer:", "Bearerx"])
def test_a_valid_token_under_another_scheme_is_refused(
    served: tuple[TestClient, Failures, dict[str, str]], scheme: str
) -> None:
    client, failures, tokens = served
    answer = client.get("/v1/whoami", headers={"Authorization": f"{scheme} {tokens['alice']}"})
    assert answer.status_code == 401
    assert failures.noted == [{"reason": "malformed", "token_id": tokens["alice"][4:12], "path": "/v1/whoami"}]
    assert client.get("/v1/whoami", headers={"Authorization": f"bearer {tokens['alice']}"}).status_code == 200


def test_an_endpoint_whose_route_checks_no_token_refuses_rather_than_serves(
    served: tuple[TestClient, Failures, dict[str, str]],
) -> None:
    client, _failures, tokens = served
    answer = client.get("/v1/unguarded", headers={"Authorization": f"Bearer {tokens['alice']}"})
    assert answer.status_code == 401
    assert "checks no bearer token" in answer.json()["message"]


def test_an_open_route_reads_no_token(served: tuple[TestClient, Failures, dict[str, str]]) -> None:
    client, failures, _tokens = served
    assert client.get("/healthz", headers={"Authorization": "Bearer not-a-token"}).json() == {"user": False}
    assert failures.noted == []


def test_caller_of_a_connection_without_a_user_is_an_authentication_error() -> None:
    with pytest.raises(AuthenticationError):
        caller_of(Request({"type": "http", "method": "GET", "path": "/x", "headers": []}))


def test_past_its_all_rpm_a_valid_token_is_answered_429(served: tuple[TestClient, Failures, dict[str, str]]) -> None:
    client, failures, tokens = served
    headers = {"Authorization": f"Bearer {tokens['carl']}"}
    answers = [client.get("/v1/whoami", headers=headers) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    body = answers[2].json()
    assert (body["code"], body["quota"]) == ("service.over_quota", "all_rpm")
    assert answers[2].headers["Retry-After"] == str(body["retry_after_s"])
    assert failures.noted == []  # not an authentication failure
    assert client.get("/v1/whoami", headers={"Authorization": f"Bearer {tokens['alice']}"}).status_code == 200

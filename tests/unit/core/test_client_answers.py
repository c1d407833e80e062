"""``gateway.client``'s reading of the service's answers, without a server (the real-server tests are in
tests/integration/test_client.py): every error class of the library comes back as itself, by its code."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway import ExecutionResult, errors
from gateway.client import Client, _result, _result_data, error_from_response
from gateway.errors import AuthenticationError, GatewayError, RequestError, http_status_for

CLASSES = sorted(
    (c for c in (getattr(errors, n) for n in errors.__all__) if isinstance(c, type) and issubclass(c, GatewayError)),
    key=lambda c: c.__name__,
)


def _response(status: int, body: Any) -> httpx.Response:
    return httpx.Response(status, json=body, request=httpx.Request("POST", "http://127.0.0.1:1/v1/executions"))


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_error_class_comes_back_as_itself_with_its_request_id(cls: type[GatewayError]) -> None:
    status = http_status_for(cls)
    body = {"code": cls.code, "message": "it failed", "request_id": "r-1", "errors": [{"path": "$.x", "message": "m"}]}
    err = error_from_response(_response(status, body))
    assert type(err) is cls
    assert (err.code, err.message, err.request_id) == (cls.code, "it failed", "r-1")
    assert [p.path for p in err.problems] == ["$.x"]


@pytest.mark.parametrize(
    ("status", "base"), [(401, AuthenticationError), (404, RequestError), (429, RequestError), (503, GatewayError)]
)
def test_an_unknown_code_is_the_base_class_of_its_family_and_keeps_its_code(status: int, base: type) -> None:
    err = error_from_response(_response(status, {"code": "brand.new", "message": "m", "request_id": "r"}))
    assert isinstance(err, base)
    assert err.code == "brand.new"
    assert err.request_id == "r"


def test_a_synthesised_result_has_exactly_the_librarys_keys() -> None:
    local = ExecutionResult("r", None, error=RequestError("bad")).to_dict()
    remote = _result_data("r", allowed=False, decision=None, error=RequestError("bad"))
    assert set(remote) == set(local)
    assert remote == local


def test_only_authentication_raises_from_execute() -> None:
    with pytest.raises(AuthenticationError):
        _result(_response(401, {"code": "auth.failed", "message": "m", "request_id": "r"}), dry_run=False)
    result = _result(
        _response(503, {"code": "runner.engine_unavailable", "message": "m", "request_id": "r"}), dry_run=False
    )
    assert isinstance(result.error, errors.EngineUnavailableError)
    assert result.request_id == "r"
    assert not result.allowed


@pytest.mark.parametrize("token", ["", "two words", "line\nbreak"])
def test_a_token_that_cannot_be_a_header_is_refused_without_echoing_it(token: str) -> None:
    with pytest.raises(ValueError, match="token") as caught:
        Client("http://127.0.0.1:1", token)
    assert token.strip() == "" or token not in str(caught.value)

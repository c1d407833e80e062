"""The service's body check: JSON, and for an MCP message a bounded number of values (counted without walking
more of a hostile body than the bound)."""

from __future__ import annotations

import json

import pytest

from gateway.errors import BodiesInFlightError, MalformedRequestError, ServiceStoppingError
from gateway.service.replies import BODIES_RETRY_AFTER_S, MESSAGE_MAX_VALUES, check_json_body, gateway_error_reply


def _values(n: int) -> bytes:
    """An object of ``n`` values in all: itself and ``n - 1`` members, nested one level."""
    return json.dumps({"params": {str(i): i for i in range(n - 2)}}).encode()


def test_a_body_of_at_most_the_bound_passes_and_one_more_is_refused() -> None:
    check_json_body(_values(MESSAGE_MAX_VALUES), max_values=MESSAGE_MAX_VALUES)
    with pytest.raises(MalformedRequestError, match=f"more than {MESSAGE_MAX_VALUES} JSON values"):
        check_json_body(_values(MESSAGE_MAX_VALUES + 1), max_values=MESSAGE_MAX_VALUES)


@pytest.mark.parametrize(
    ("body", "values"),
    [(b"1", 1), (b"[]", 1), (b"[[], {}]", 3), (b'{"a": [1, {"b": null}]}', 5), (b'"[[[[[[["', 1)],
)
def test_values_are_counted_by_structure_not_by_text(body: bytes, values: int) -> None:
    check_json_body(body, max_values=values)
    with pytest.raises(MalformedRequestError):
        check_json_body(body, max_values=values - 1)


def test_deep_nesting_is_counted_too() -> None:
    deep = b"[" * 500 + b"]" * 500
    check_json_body(deep, max_values=500)
    with pytest.raises(MalformedRequestError):
        check_json_body(deep, max_values=499)


def test_without_a_bound_any_json_passes_and_text_that_is_not_json_never_does() -> None:
    check_json_body(b"[" + b",".join([b"[]"] * 10_000) + b"]")
    with pytest.raises(MalformedRequestError, match="the body is not JSON"):
        check_json_body(b'{"code": ', max_values=MESSAGE_MAX_VALUES)


def test_a_full_body_budget_says_when_to_retry_and_a_stop_does_not() -> None:
    full = gateway_error_reply(BodiesInFlightError("no room"), "req-1")
    assert full.status == 503
    assert full.headers == {"Retry-After": str(BODIES_RETRY_AFTER_S)}
    stopping = gateway_error_reply(ServiceStoppingError("stopping"), "req-2")
    assert stopping.status == 503
    assert not stopping.headers

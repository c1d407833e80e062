"""The body budget (``max_body_bytes_in_flight``) and how a body is read against it: the room is taken from the
head's ``Content-Length`` before anything of the body is read, a refusal reads nothing, and every way out of
the read gives the room back."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from gateway.errors import (
    BodiesInFlightError,
    BodyTooLargeError,
    MalformedRequestError,
    OverQuotaError,
    ServerConfigError,
    http_status_for,
)
from gateway.service.bodies import BodyBudget, BodyHold, default_body_budget, read_json_body
from gateway.service.config import ServerConfig, load_server_config_text

MIB = 1024 * 1024


def test_a_principal_holds_at_most_half_and_the_service_at_most_the_total() -> None:
    budget = BodyBudget(8 * MIB, largest=2 * MIB)
    assert budget.per_principal == 4 * MIB
    alice = [budget.take("alice", 2 * MIB), budget.take("alice", 2 * MIB)]
    with pytest.raises(OverQuotaError) as over:
        budget.take("alice", 1)
    assert (over.value.quota, over.value.retry_after_s, http_status_for(over.value)) == ("body_bytes", 1, 429)
    assert "'alice' has 4194304 bytes of request bodies in flight" in over.value.message
    bob = budget.take("bob", 3 * MIB)  # another principal still finds room: the half alice cannot take
    carol_fits = budget.take("carol", MIB)
    with pytest.raises(BodiesInFlightError) as full:
        budget.take("carol", 1)
    assert http_status_for(full.value) == 503
    assert full.value.code == "service.bodies_in_flight"
    assert "max_body_bytes_in_flight 8388608" in full.value.message
    assert full.value.to_dict()["hint"]
    assert (budget.held, budget.held_by("carol")) == (8 * MIB, MIB)
    for hold in (*alice, bob, carol_fits):
        hold.release()
    assert (budget.held, budget.held_by("alice")) == (0, 0)


def test_a_refusal_holds_nothing_and_a_release_counts_once() -> None:
    budget = BodyBudget(4 * MIB, largest=MIB)
    hold = budget.take("alice", MIB)
    with pytest.raises(OverQuotaError):
        budget.take("alice", 2 * MIB)
    assert budget.held == MIB
    hold.release()
    hold.release()
    hold.shrink(10)
    assert (budget.held, hold.size) == (0, 0)


def test_a_shrunk_hold_gives_back_the_difference() -> None:
    budget = BodyBudget(4 * MIB, largest=MIB)
    hold = budget.take("alice", MIB)
    hold.shrink(100)
    hold.shrink(1000)  # never grows
    assert (budget.held, budget.held_by("alice"), hold.size) == (100, 100, 100)


def test_one_principal_may_always_send_one_body_of_the_largest_size() -> None:
    """A total below two bodies of the largest size still lets a principal's largest body in (at least
    ``largest``, at most the total)."""
    budget = BodyBudget(3 * MIB, largest=2 * MIB)
    assert budget.per_principal == 2 * MIB
    budget.take("alice", 2 * MIB)
    assert BodyBudget(MIB, largest=2 * MIB).per_principal == MIB


def test_the_default_budget_and_the_config_key() -> None:
    assert default_body_budget(4 * MIB, 4) == 32 * MIB
    config = load_server_config_text(
        "apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\nmax_body_bytes: 1048576\n"
        "max_body_bytes_in_flight: 8388608\n"
    )
    assert config.max_body_bytes_in_flight == 8 * MIB
    assert ServerConfig().max_body_bytes_in_flight is None
    with pytest.raises(ServerConfigError, match="max_body_bytes_in_flight 1024 is below max_body_bytes 4194304"):
        ServerConfig(max_body_bytes_in_flight=1024)


# --- reading a body against the budget -------------------------------------------------------------------------


class _Client:
    """An ASGI ``receive`` sending ``chunks`` of a body; counts what was asked of it."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)
        self.asked = 0

    async def receive(self) -> dict[str, Any]:
        self.asked += 1
        body = self.chunks.pop(0) if self.chunks else b""
        return {"type": "http.request", "body": body, "more_body": bool(self.chunks)}


def _request(client: _Client, length: int | None) -> Request:
    headers = [(b"content-type", b"application/json")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    scope = {"type": "http", "method": "POST", "path": "/v1/executions", "headers": headers}
    return Request(scope, client.receive)


def _read(
    client: _Client, length: int | None, budget: BodyBudget, *, limit: int = MIB, check_json: bool = True
) -> tuple[bytes, BodyHold]:
    def hold(size: int) -> BodyHold:
        return budget.take("alice", size)

    return asyncio.run(read_json_body(_request(client, length), limit, 5.0, hold=hold, check_json=check_json))


def test_the_room_is_taken_from_content_length_before_the_body_is_read() -> None:
    budget = BodyBudget(4 * MIB, largest=MIB)
    taken = budget.take("alice", 2 * MIB - 10)  # alice's half is nearly spent
    client = _Client(b'{"code": "1"}')
    with pytest.raises(OverQuotaError):
        _read(client, 11, budget)
    assert client.asked == 0, "the body was read although the budget had no room for it"
    taken.release()
    body, hold = _read(_Client(b'{"code": "1"}'), 13, budget)
    assert (body, hold.size, budget.held) == (b'{"code": "1"}', 13, 13)
    hold.release()
    assert budget.held == 0


def test_a_body_without_content_length_is_held_at_the_limit_then_at_its_size() -> None:
    budget = BodyBudget(4 * MIB, largest=MIB)
    body, hold = _read(_Client(b'{"code":', b' "1"}'), None, budget)
    assert body == b'{"code": "1"}'
    assert (hold.size, budget.held) == (len(body), len(body))
    budget.take("alice", 2 * MIB - len(body))  # the rest of alice's half
    with pytest.raises(OverQuotaError):
        _read(_Client(b"{}"), None, budget)  # without a length it needs room for the largest body


@pytest.mark.parametrize(
    ("chunks", "length", "error"),
    [
        ((b"x" * 600, b"x" * 600), None, BodyTooLargeError),
        ((b"{not json",), 9, MalformedRequestError),
    ],
)
def test_a_body_refused_while_or_after_reading_gives_its_room_back(
    chunks: tuple[bytes, ...], length: int | None, error: type[Exception]
) -> None:
    budget = BodyBudget(4 * MIB, largest=1024)
    with pytest.raises(error):
        _read(_Client(*chunks), length, budget, limit=1024)
    assert budget.held == 0

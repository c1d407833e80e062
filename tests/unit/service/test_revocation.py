"""A reload that removes a principal or revokes a token refuses that token's queued executions at once
(:meth:`QuotaGate.refuse_waiting`, issue 28 H1): they never get a slot, and no slot is lost."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gateway.errors import AuthenticationError, GatewayError
from gateway.service.principals import Quotas
from gateway.service.quotas import QuotaGate


def test_waiters_of_a_refused_token_fail_at_once_and_the_others_keep_their_place() -> None:
    async def scenario() -> None:
        gate = QuotaGate(1)
        quotas = Quotas(max_concurrent=1, queue=4)
        held = contextlib.AsyncExitStack()
        await held.enter_async_context(gate.execution("a", quotas, token_id="aaaaaaaa"))
        ran: list[str] = []

        async def waiter(principal: str, token_id: str) -> None:
            async with gate.execution(principal, quotas, token_id=token_id):
                ran.append(token_id)

        gone = [asyncio.create_task(waiter("a", "aaaaaaaa")) for _ in range(2)]
        kept = asyncio.create_task(waiter("b", "bbbbbbbb"))
        await asyncio.sleep(0)  # all three queue
        assert (gate.waiting_of("a"), gate.waiting_of("b")) == (2, 1)

        def refusal(principal: str, token_id: str | None) -> GatewayError | None:
            return AuthenticationError(f"{principal} revoked") if token_id == "aaaaaaaa" else None

        assert gate.refuse_waiting(refusal) == 2
        for task in gone:
            with pytest.raises(AuthenticationError, match="a revoked"):
                await task  # at once: the slot is still held
        assert (gate.waiting_of("a"), gate.waiting_of("b"), gate.running) == (0, 1, 1)
        await held.aclose()
        await kept
        assert ran == ["bbbbbbbb"]  # the refused ones never ran
        assert gate.running == 0  # a refused waiter gave back nothing it did not hold
        async with gate.execution("c", Quotas(queue=0)):  # with a global bound of 1, a lost slot admits nothing
            assert gate.running == 1

    asyncio.run(scenario())


def test_a_waiter_already_granted_is_not_refused_by_the_gate() -> None:
    """Granted before the reload's refusal ran: the gate leaves it (the endpoint checks the caller again)."""

    async def scenario() -> None:
        gate = QuotaGate(1)
        async with gate.execution("a", Quotas(queue=1), token_id="aaaaaaaa"):
            assert gate.refuse_waiting(lambda _p, _t: AuthenticationError("revoked")) == 0
            assert gate.running == 1

    asyncio.run(scenario())

"""Admission control of the service: per-principal quotas and one global bound on running executions, enforced
before any work starts.

Four bounds, checked in this order when a request arrives:

* **Requests per minute** (``all_rpm``): a sliding 60 s window of every authenticated request of the principal,
  counted when its token authenticates (:class:`~gateway.service.auth.BearerTokens`): the ``GET`` endpoints,
  ``/metrics`` (a 403 too), ``/mcp`` messages that run nothing (``initialize``, ``tools/list``, ``ping``) and
  the runs below. None of them is free (authentication, a body read and checked, a record), so no principal can
  spend the service's CPU without bound; each principal has its own window, so an operator's dashboard that
  polls ``/metrics`` spends its own minute, never its agents'.
* **Runs per minute** (``rpm``, smaller; an ``all_rpm`` below it counts as ``rpm``): a sliding 60 s window of
  the principal's admitted executions and dry runs: every ``POST /v1/executions``, ``POST /v1/decisions`` and
  MCP tool call counts, allowed or denied by policy (each writes audit records and costs a policy evaluation,
  so a flood of dry runs or of denied requests is work too). Over either window a request is refused at once
  with 429 ``service.over_quota`` (quota ``all_rpm`` or ``rpm``) and ``Retry-After`` = the seconds until the
  oldest request in the window leaves it.
* **Concurrent executions** of the principal (``max_concurrent``) and of the whole service
  (``max_concurrent_executions`` in the server config, default :func:`default_global_bound`: two per core).
  An execution that cannot start waits in its principal's queue;
* **Queue** (``queue``): at most that many of the principal's executions wait; one more is refused at once with
  429 (``Retry-After: 1``). With ``queue: 0`` an execution either starts now or is refused. No execution waits
  longer than ``queue_wait_s`` (server config, default 60 s): then it leaves the queue with 429
  (``queue_wait``) and nothing runs, so the server-side deadline covers the wait too.

Shares: a principal runs at most :meth:`QuotaGate.share` executions at once, its ``max_concurrent`` but never
more than the global bound less one (at least one): however much it sends, one principal never holds the whole
service, so another principal's execution starts at once while the service holds runs of only one principal
(the review measured a 55.7 s wait when the default ``max_concurrent`` 8 was above the bound 4). A principal
whose ``max_concurrent`` the share cuts is named in a warning at start and at reload
(:meth:`QuotaGate.share_warning`).

Fairness: whenever a slot frees, it goes to the waiting principal with the **fewest running** executions
(oldest waiter first among equals), never simply to the oldest waiter. A principal that floods the service
with long runs holds at most its share and, once another principal is waiting, the next free slot goes to that
other principal; its own backlog is bounded by its own queue. So the service never holds more work than
``global bound + sum of queues``, and no principal can starve another.

A waiting request whose client goes away (the task is cancelled) leaves the queue; a granted slot is always
given back (the ``async with`` block). A reload that removes a principal or revokes a token refuses that
token's waiting requests at once (:meth:`QuotaGate.refuse_waiting`): they never get a slot. Everything here
runs on the event loop's thread: no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.audit import AuditSink
from gateway.errors import GatewayError, OverQuotaError
from gateway.service.principals import Quotas

__all__ = ["RPM_WINDOW_S", "QuotaGate", "Refusals", "default_global_bound"]

RPM_WINDOW_S = 60.0
"""The length of the requests-per-minute window."""
QUEUE_RETRY_AFTER_S = 1
"""``Retry-After`` when a principal's queue is full: its runs end at their deadlines, one may end any moment."""


def default_global_bound() -> int:
    """Two running executions per CPU core (as the host slots' default): enough to keep the machine busy."""
    return max(2, 2 * (os.cpu_count() or 1))


@dataclass
class _State:
    """One principal's share of the service."""

    running: int = 0
    waiting: deque[tuple[int, asyncio.Future[None], str | None]] = field(default_factory=deque)
    """(ticket, future, token id) of its executions waiting for a slot, oldest first."""
    admitted: deque[float] = field(default_factory=deque)
    """Monotonic times of its runs in the rpm window, oldest first."""
    requests: deque[float] = field(default_factory=deque)
    """Monotonic times of its requests in the all_rpm window, oldest first."""
    max_concurrent: int = 1
    """Its share (:meth:`QuotaGate.share`), as of its latest execution."""


class QuotaGate:
    """The quotas of every principal and the global bound of one service: the service's admission control (not
    the Gateway's admission hook, :data:`gateway.Admission`, which a decision cannot wait in)."""

    def __init__(
        self, global_bound: int, *, queue_wait_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if global_bound < 1:
            raise ValueError(f"the global bound must be at least 1, got {global_bound}")
        if queue_wait_s <= 0:
            raise ValueError(f"queue_wait_s must be positive, got {queue_wait_s}")
        self.global_bound = global_bound
        self.queue_wait_s = queue_wait_s
        """The longest an execution waits for a slot; then :class:`OverQuotaError` (``queue_wait``)."""
        self.running = 0
        """Executions running now, all principals."""
        self._clock = clock
        self._states: dict[str, _State] = {}
        self._tickets = itertools.count()

    def _state(self, principal: str) -> _State:
        return self._states.setdefault(principal, _State())

    def running_of(self, principal: str) -> int:
        """Executions of ``principal`` running now."""
        state = self._states.get(principal)
        return state.running if state is not None else 0

    def waiting_of(self, principal: str) -> int:
        """Executions of ``principal`` waiting for a slot now."""
        state = self._states.get(principal)
        return len(state.waiting) if state is not None else 0

    def waiting(self) -> int:
        """Executions of every principal waiting for a slot now (the ``gateway_queue_depth`` gauge)."""
        return sum(len(state.waiting) for state in self._states.values())

    def share(self, quotas: Quotas) -> int:
        """The most executions of one principal running at once: its ``max_concurrent``, at most the global bound
        less one, so that a slot is left for the others (at least one: a bound of 1 cannot be shared)."""
        return min(quotas.max_concurrent, max(1, self.global_bound - 1))

    def share_warning(self, quotas: Mapping[str, Quotas]) -> str | None:
        """What to tell the operator when the share cuts the ``max_concurrent`` of principals (name -> effective
        quotas), or None: their setting is at or above the global bound, which would let one hold every slot."""
        cut = sorted(name for name, given in quotas.items() if given.max_concurrent > self.share(given))
        if not cut:
            return None
        named = ", ".join(cut[:5]) + (f" and {len(cut) - 5} more" if len(cut) > 5 else "")
        return (
            f"max_concurrent of principal(s) {named} is at or above the service's bound of {self.global_bound} "
            f"running executions; each runs at most {max(1, self.global_bound - 1)} at once, so that the others "
            "always find a slot; lower their max_concurrent (quotas) or raise max_concurrent_executions"
        )

    def count_request(self, principal: str, quotas: Quotas) -> None:
        """Count one execution or dry run against the principal's rpm; :class:`OverQuotaError` (``rpm``) when it
        is spent. A refused request is not counted (a client that keeps retrying does not push its window on)."""
        state = self._state(principal)
        self._count(principal, state.admitted, quotas.rpm, "rpm", "executions and dry runs")

    def count_authenticated(self, principal: str, quotas: Quotas) -> None:
        """Count one authenticated request of any kind against the principal's all_rpm (never below its rpm: the
        runs count in both); :class:`OverQuotaError` (``all_rpm``) when it is spent, and then it is not counted."""
        state = self._state(principal)
        self._count(principal, state.requests, max(quotas.all_rpm, quotas.rpm), "all_rpm", "requests")

    def _count(self, principal: str, window: deque[float], limit: int, quota: str, what: str) -> None:
        now = self._clock()
        while window and now - window[0] >= RPM_WINDOW_S:
            window.popleft()
        if len(window) >= limit:
            frees_in = window[len(window) - limit] + RPM_WINDOW_S - now
            raise OverQuotaError(
                f"{principal!r} made {len(window)} {what} in the last minute; its quota ({quota}) is {limit} "
                f"{what} per minute",
                retry_after_s=math.ceil(frees_in),
                quota=quota,
            )
        window.append(now)

    @contextlib.asynccontextmanager
    async def execution(self, principal: str, quotas: Quotas, *, token_id: str | None = None) -> AsyncIterator[None]:
        """Hold one execution slot of ``principal`` (and of the service) for the block: now if both bounds
        allow, else after waiting in its queue; :class:`OverQuotaError` (``queue``) when the queue is full, the
        error of :meth:`refuse_waiting` when its ``token_id`` is refused while it waits."""
        state = self._state(principal)
        state.max_concurrent = self.share(quotas)
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (next(self._tickets), granted, token_id)
        state.waiting.append(entry)
        self._dispatch()
        if not granted.done() and len(state.waiting) > quotas.queue:
            state.waiting.remove(entry)
            raise OverQuotaError(
                f"{principal!r} has {state.running} execution(s) running and {len(state.waiting)} waiting, its "
                f"quota (max_concurrent {quotas.max_concurrent}, share {state.max_concurrent}, queue {quotas.queue});"
                f" the service runs at most {self.global_bound} at once",
                retry_after_s=QUEUE_RETRY_AFTER_S,
                quota="queue",
            )
        try:
            async with asyncio.timeout(self.queue_wait_s):
                await granted
        except BaseException as exc:
            if granted.done() and not granted.cancelled() and granted.exception() is None:
                self._release(state)  # granted as the waiter was cancelled or timed out: give the slot back
            else:
                with contextlib.suppress(ValueError):
                    state.waiting.remove(entry)
            if isinstance(exc, TimeoutError):
                raise OverQuotaError(
                    f"{principal!r} waited {self.queue_wait_s:g} s in its queue without getting an execution slot "
                    f"({state.running} of its share {state.max_concurrent} running, {self.running} of the "
                    f"service's {self.global_bound}); nothing ran",
                    retry_after_s=QUEUE_RETRY_AFTER_S,
                    quota="queue_wait",
                ) from None
            raise
        try:
            yield
        finally:
            self._release(state)

    def refuse_waiting(self, refusal: Callable[[str, str | None], GatewayError | None]) -> int:
        """Take every waiting execution for which ``refusal(principal, token_id)`` returns an error out of its
        queue and fail it with that error at once (a reload removed its principal or revoked its token); the
        number refused."""
        refused = 0
        for principal, state in self._states.items():
            for entry in list(state.waiting):
                _, granted, token_id = entry
                error = refusal(principal, token_id)
                if error is not None and not granted.done():
                    state.waiting.remove(entry)
                    granted.set_exception(error)
                    refused += 1
        return refused

    def _release(self, state: _State) -> None:
        state.running -= 1
        self.running -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        """Give free slots to waiters: the principal with the fewest running first, then the oldest waiter."""
        while self.running < self.global_bound:
            eligible = [
                (state.running, state.waiting[0][0], state)
                for state in self._states.values()
                if state.waiting and state.running < state.max_concurrent
            ]
            if not eligible:
                return
            _, _, state = min(eligible, key=lambda item: (item[0], item[1]))
            _, granted, _ = state.waiting.popleft()
            if granted.cancelled():
                continue
            state.running += 1
            self.running += 1
            granted.set_result(None)


class Refusals:
    """``request.refused`` records, bounded like ``auth.failed``: per principal and error code, the first
    refusal of an interval at once (``count`` 1, ``summary`` false), the number of the rest when the interval
    has passed (written with the next such refusal, or at stop; ``summary`` true). A principal hammering the
    service over its quota, or with bodies it cannot take, cannot fill the trail: at most two records per
    principal and code per interval."""

    def __init__(self, audit: AuditSink, *, interval_s: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.audit = audit
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._open: dict[tuple[str | None, str], tuple[float, int]] = {}
        """(principal, code) -> (start of its open interval, refusals counted after the first); principal None
        for the connections refused before any request was read."""

    def note(
        self,
        error: GatewayError,
        *,
        principal: str | None,
        token_id: str | None,
        request_id: str | None,
        path: str | None,
    ) -> None:
        """One refusal: an :class:`OverQuotaError` (429), a body the service could not take (400, 408, 413,
        415) or a job its decision worker did not answer (503 ``service.decision_failed``), for the authenticated
        ``principal``; or a connection over the service's bound (503
        ``service.too_many_connections``), refused before any request or principal was read (``principal``,
        ``token_id`` and ``path`` None). ``request_id`` None: refused before any request id was given (over
        ``all_rpm``, at authentication)."""
        now = self._clock()
        key = (principal, error.code)
        summary: tuple[float, int] | None = None
        with self._lock:
            since, rest = self._open.get(key, (None, 0))
            if since is not None and now - since < self.interval_s:
                self._open[key] = (since, rest + 1)
                return
            if since is not None and rest:
                summary = (since, rest)
            self._open[key] = (now, 0)
        if summary is not None:
            self._summary(key, *summary)
        data: dict[str, Any] = {"count": 1, "summary": False, "code": error.code}
        if isinstance(error, OverQuotaError):
            data.update(quota=error.quota, retry_after_s=error.retry_after_s)
        else:
            data["message"] = error.message
        if path is not None:
            data["path"] = path
        data["interval_ms"] = round(self.interval_s * 1000)
        if principal is not None and token_id is not None:
            data["caller"] = {"principal": principal, "token_id": token_id}
        self._write(data, principal=principal, request_id=request_id)

    def stop(self) -> None:
        """Write the count of every open interval's refusals after its first."""
        with self._lock:
            pending, self._open = self._open, {}
        for key, (since, rest) in pending.items():
            if rest:
                self._summary(key, since, rest)

    def _summary(self, key: tuple[str | None, str], since: float, rest: int) -> None:
        principal, code = key
        since_text = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
        data = {
            "count": rest, "summary": True, "code": code, "since": since_text,
            "interval_ms": round(self.interval_s * 1000),
        }  # fmt: skip
        self._write(data, principal=principal, request_id=None)

    def _write(self, data: dict[str, Any], *, principal: str | None, request_id: str | None) -> None:
        # refused either way; the trail's own failure shows in /readyz and every request that needs it
        with contextlib.suppress(GatewayError):
            self.audit.append("request.refused", data, principal=principal, request_id=request_id)

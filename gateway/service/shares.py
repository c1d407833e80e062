"""Each principal's share of the decision workers, as values: what its dry runs are expected to cost, what it
has on the workers, what it used lately, and whose waiting dry run goes next, and whether a worker takes it.
Nothing here reads a clock: the caller passes ``now`` (seconds of a monotonic clock) and keeps the values.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Final

__all__ = ["FIRST_COST_MS", "SHARE_MS", "USED_HALF_LIFE_S", "WORKER_MS", "Share", "next_principal", "worker_takes"]

SHARE_MS: Final = 60.0
"""A principal's dry runs on the workers at once: as many as fit in this much of the workers' CPU, estimated from
what its recent dry runs cost (at least one). Cheap dry runs (1.5-2.5 ms) go out 24 or more at a time, more
than a client's 16 connections (30 ms cost one such client ~5 % of its decisions/s); a principal whose dry runs
cost 300 ms each (a hostile body) has one on the workers and its others wait their turn, so that it cannot fill
the workers' queues ahead of everyone else's dry runs."""
WORKER_MS: Final = 30.0
"""A worker takes a dry run when it is idle, or when the dry runs it holds and this one are expected to cost at
most this much of its CPU: cheap dry runs (1.5-2.5 ms) go out a dozen or more to a worker, enough for its batches,
and an expensive one (a hostile body) only to an idle worker. What no worker takes waits in the service."""
USED_HALF_LIFE_S: Final = 1.0
"""How fast a principal's use of the workers is forgotten: the dispatcher sends first the dry run of the principal
that used them least lately."""
FIRST_COST_MS: Final = SHARE_MS
"""The cost expected of a principal's jobs until one has been timed (its first answer then sets it): its whole
share, on an idle worker, so that a principal new to the service has one job on the workers until its cost is
known (an expensive one cannot take every worker first); a cheap principal is held back for one answer."""


@dataclass(frozen=True, slots=True)
class Share:
    """One principal's account with the decision workers (a new principal's is ``Share()``).

    Its dry runs go to the workers only while what they are expected to cost fits in :data:`SHARE_MS` (at least
    one at a time); a dry run holds its room from :meth:`granted` until it leaves the worker (:meth:`given_back`),
    even when its client has gone. The request quotas count requests, not their cost: this is what keeps some
    principals' expensive dry runs from holding back everyone else's. Each method returns the account after the
    event; none changes this one."""

    cost_ms: float = FIRST_COST_MS
    """What one of its dry runs is expected to cost (:meth:`learnt`); a dry run granted holds this much."""
    timed: bool = False
    """Whether one of its dry runs has been timed (before, :data:`FIRST_COST_MS` is a guess)."""
    in_flight: int = 0
    """Its dry runs granted and not yet given back."""
    in_flight_ms: float = 0.0
    """What they are expected to cost, together."""
    recent_ms: float = 0.0
    """The worker CPU it used lately, as of ``recent_at`` (:meth:`used_ms` halves it since)."""
    recent_at: float = 0.0

    def fits(self) -> bool:
        """Whether one more of its dry runs fits its share (at least one always does)."""
        return self.in_flight == 0 or self.in_flight_ms + self.cost_ms <= SHARE_MS

    def used_ms(self, now: float) -> float:
        """The worker CPU its dry runs used lately (sent ones counted at their expected cost until answered),
        halving every :data:`USED_HALF_LIFE_S`."""
        return self.recent_ms * math.pow(0.5, max(0.0, now - self.recent_at) / USED_HALF_LIFE_S)

    def _used(self, ms: float, now: float) -> Share:
        return dataclasses.replace(self, recent_ms=max(0.0, self.used_ms(now) + ms), recent_at=now)

    def granted(self, now: float) -> Share:
        """One more of its dry runs in flight, holding :attr:`cost_ms` until it is given back."""
        held = dataclasses.replace(self, in_flight=self.in_flight + 1, in_flight_ms=self.in_flight_ms + self.cost_ms)
        return held._used(self.cost_ms, now)

    def given_back(self, cost: float) -> Share:
        """One of its dry runs, granted at ``cost``, left the workers (or was decided in process)."""
        in_flight = self.in_flight - 1
        return dataclasses.replace(
            self, in_flight=in_flight, in_flight_ms=self.in_flight_ms - cost if in_flight else 0.0
        )

    def learnt(self, cpu_ms: float, cost: float, now: float) -> Share:
        """A dry run granted at ``cost`` took ``cpu_ms`` on a worker: its use is corrected, and the expected cost
        is the first one timed, then a moving average (a fifth of it the last one), so that one expensive dry run
        (300 ms) closes the share to one at a time, a few cheap ones do not open it again, and the odd slow one
        of a cheap principal (a collection, a new segment) changes little."""
        cost_ms = 0.8 * self.cost_ms + 0.2 * cpu_ms if self.timed else cpu_ms
        return dataclasses.replace(self._used(cpu_ms - cost, now), cost_ms=cost_ms, timed=True)


def next_principal(waiting: Iterable[tuple[str, Share]], now: float) -> str | None:
    """Of the principals with a dry run waiting (in the order given), the one whose dry run goes next: of those
    whose share has room, the one that used the workers least lately (the first of equals); None when none has
    room. So a principal's expensive dry runs, or those of several principals together, never go ahead of
    another principal's: they wait in the service, not on a worker."""
    fitting = [(name, share) for name, share in waiting if share.fits()]
    if not fitting:
        return None
    return min(fitting, key=lambda item: item[1].used_ms(now))[0]


def worker_takes(held: Collection[float], cost_ms: float) -> bool:
    """Whether a worker holding dry runs expected to cost ``held`` takes one expected to cost ``cost_ms``: when
    it is idle, or when they all fit in :data:`WORKER_MS` (an expensive dry run goes only to an idle worker)."""
    return not held or sum(held) + cost_ms <= WORKER_MS

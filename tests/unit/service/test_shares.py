"""Each principal's share of the decision workers, as values of a clock the test holds: what a share lets on the
workers, what it learns from a timed dry run, what it used lately, and whose dry run goes next."""

from __future__ import annotations

from gateway.service.shares import (
    FIRST_COST_MS,
    SHARE_MS,
    USED_HALF_LIFE_S,
    WORKER_MS,
    Share,
    next_principal,
    worker_takes,
)

NOW = 1000.0
"""The fake clock's reading (seconds); a test adds to it to let time pass."""


def _timed(cpu_ms: float, at: float) -> Share:
    """A new principal's share after one dry run, sent and answered at ``at``, took ``cpu_ms`` on a worker."""
    share = Share().granted(at)
    return share.given_back(FIRST_COST_MS).learnt(cpu_ms, FIRST_COST_MS, at)


def test_a_share_counts_dry_runs_in_flight_against_their_expected_cost() -> None:
    share = Share(cost_ms=SHARE_MS / 2)  # each dry run expected to cost half the share
    first = share.cost_ms
    share = share.granted(NOW).granted(NOW)
    assert not share.fits()  # no room: a third waits
    share = share.given_back(first)
    assert share.fits()
    share = share.given_back(first)
    assert (share.in_flight, share.in_flight_ms) == (0, 0.0)
    share = share.learnt(10 * SHARE_MS, share.cost_ms, NOW)  # one expensive dry run closes the share to one...
    assert share.cost_ms > SHARE_MS
    assert share.fits()  # ...which still gets one on the workers
    held = share.cost_ms
    share = share.granted(NOW)
    assert not share.fits()
    for _ in range(3):
        share = share.learnt(1.0, 1.0, NOW)  # a few cheap ones do not open it again
    assert share.cost_ms > SHARE_MS
    assert share.given_back(held).fits()


def test_a_share_is_a_value_each_event_gives_a_new_one() -> None:
    share = Share()
    share.granted(NOW)
    share.learnt(1.0, FIRST_COST_MS, NOW)
    assert share == Share()


def test_a_principals_first_dry_runs_are_expected_expensive_until_one_is_timed() -> None:
    share = Share()
    assert share.cost_ms == FIRST_COST_MS > WORKER_MS  # an idle worker of its own...
    first = share.cost_ms
    share = share.granted(NOW)
    assert not share.fits()  # ...and one at a time: new principals cannot take every worker
    share = share.given_back(first).learnt(1.5, first, NOW)
    assert (share.cost_ms, share.timed) == (1.5, True)  # the first timing replaces the guess
    share = share.learnt(101.5, 1.5, NOW)
    assert share.cost_ms == 0.8 * 1.5 + 0.2 * 101.5  # then a moving average


def test_a_share_counts_what_it_used_lately_at_the_cost_sent_then_at_the_cost_measured() -> None:
    share = Share(cost_ms=10.0).granted(NOW)
    assert share.used_ms(NOW) == 10.0  # sent: counted at its expected cost
    share = share.learnt(30.0, 10.0, NOW)  # it took 30 ms
    assert share.used_ms(NOW) == 30.0
    assert share.used_ms(NOW + USED_HALF_LIFE_S) == 15.0  # forgotten by half every half-life
    assert share.used_ms(NOW - 5.0) == 30.0  # a clock read before the last use forgets nothing
    assert share.learnt(0.0, 1000.0, NOW).used_ms(NOW) == 0.0  # never below nothing


def test_the_principal_that_used_the_workers_least_lately_goes_next() -> None:
    """Several principals' expensive dry runs, each timed and each with one on the workers (their shares are
    full), and another principal's cheap one: the cheap one goes next, not after one of each of the others."""
    on_the_workers = _timed(300.0, NOW).granted(NOW)
    waiting = [(f"heavy{n}", on_the_workers) for n in range(3)] + [("light", Share())]
    assert next_principal(waiting, NOW) == "light"
    assert next_principal(waiting[:3], NOW) is None  # the expensive ones wait for their own to leave
    done = [(name, share.given_back(300.0)) for name, share in waiting[:3]]
    assert next_principal(done, NOW) == "heavy0"  # equals: the first one waiting


def test_use_is_forgotten_so_a_principal_that_used_much_long_ago_is_not_held_back() -> None:
    much, little = _timed(1000.0, NOW), _timed(10.0, NOW)
    assert next_principal([("much", much), ("little", little)], NOW) == "little"
    lately = _timed(10.0, NOW + 10 * USED_HALF_LIFE_S)
    assert next_principal([("lately", lately), ("long-ago", much)], NOW + 10 * USED_HALF_LIFE_S) == "long-ago"


def test_a_worker_takes_cheap_dry_runs_many_at_a_time_and_an_expensive_one_only_when_idle() -> None:
    assert worker_takes([], 10 * WORKER_MS)
    assert not worker_takes([1.0], 10 * WORKER_MS)
    assert worker_takes([2.0] * 10, 2.0)
    assert not worker_takes([2.0] * 15, 2.0)

"""Each principal's trail bytes per minute (gateway/service/trailbudget.py): measured from a real trail's lines
across segments, charged to the envelope's principal, and refused past the budget (a fake clock)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.audit import JsonlAuditTrail
from gateway.errors import OverQuotaError
from gateway.service.trailbudget import WINDOW_S, TrailBudget, TrailMeter, TrailTail


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _sizes(directory: Path) -> dict[str | None, int]:
    import json

    sizes: dict[str | None, int] = {}
    for segment in sorted(directory.glob("trail-*.jsonl")):
        for line in segment.read_bytes().splitlines(keepends=True):
            principal = json.loads(line)["principal"]
            sizes[principal] = sizes.get(principal, 0) + len(line)
    return sizes


def test_the_tail_charges_each_line_to_its_envelopes_principal_across_segments(tmp_path: Path) -> None:
    """Lines written before the tail was made are not read; a record whose data names another principal (a
    refusal's caller) is charged to the envelope's; records of nobody are left out."""
    directory = tmp_path / "trail"
    with JsonlAuditTrail(directory, segment_max_bytes=4096) as trail:
        trail.append("gateway.start", {})
        trail.append("request.received", {"request": {"code": "before"}}, principal="alice")
        tail = TrailTail(directory)
        before = _sizes(directory)
        for n in range(30):  # several segments
            trail.append("request.received", {"request": {"code": "x" * (50 * n)}}, principal="alice")
            refused = {"count": 1, "summary": False, "caller": {"principal": "alice", "token_id": "0123abcd"}}
            trail.append("request.refused", refused, principal="bob")
            trail.append("auth.failed", {"count": 1, "summary": False, "path": '"principal":"alice"'})
            if n == 10:
                first = tail.read()
        rest = tail.read()
    assert len(list(directory.glob("trail-*.jsonl"))) > 3
    after = _sizes(directory)
    read = {p: first.get(p, 0) + rest.get(p, 0) for p in ("alice", "bob")}
    assert read == {p: after[p] - before.get(p, 0) for p in ("alice", "bob")}
    assert set(first) | set(rest) == {"alice", "bob"}
    assert tail.read() == {}


def test_past_the_budget_new_work_is_refused_until_charges_leave_the_window() -> None:
    clock = Clock()
    budget = TrailBudget(1000, clock=clock)
    budget.charge({"alice": 600})
    clock.now += 20
    budget.charge({"alice": 300, "bob": 2000})
    budget.check("alice")  # 900 of 1000
    clock.now += 10
    budget.charge({"alice": 100})
    with pytest.raises(OverQuotaError) as info:
        budget.check("alice")
    assert (info.value.quota, info.value.retry_after_s) == ("trail_bytes", 30)  # when the 600 leave the window
    assert "1000 bytes a minute (trail_bytes_per_minute)" in info.value.message
    with pytest.raises(OverQuotaError):
        budget.check("bob")
    budget.check("carol")
    clock.now += 30
    budget.check("alice")  # 400 left in the window
    assert budget.used("alice") == 400
    clock.now += WINDOW_S
    assert budget.used("alice") == 0
    budget.check("bob")


def test_the_meter_charges_what_the_tail_read(tmp_path: Path) -> None:
    budget = TrailBudget(1 << 20)
    with JsonlAuditTrail(tmp_path) as trail:
        meter = TrailMeter(TrailTail(tmp_path), budget)
        trail.append("request.received", {"request": {"code": "x"}}, principal="alice")
        meter.tick()
    assert budget.used("alice") == _sizes(tmp_path)["alice"]


def test_a_budget_below_one_byte_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 byte"):
        TrailBudget(0)

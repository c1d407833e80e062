"""The control checks of the report (gateway/report/controls.py): every part of an ``all`` check counts, and
``equals`` compares the type too."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.report.controls import CATALOGUE_FILE, ControlTally, load_catalogue


def status(number: str, facts: dict[str, Any]) -> str:
    """The status of control ``number`` after one execution with ``facts``."""
    tally = ControlTally(load_catalogue())
    tally.add(("2026-01-01T00:00:00Z", 0, 1), "r1", facts)
    (row,) = [row for row in tally.results() if row["number"] == number]
    return str(row["status"])


# Per control with an `all` check: facts that hold every part, then one fact per part that breaks only it.
ALL_CHECKS = {
    "5.4": ({"cap_drop": ["ALL"], "cap_add": []}, [{"cap_drop": []}, {"cap_add": ["NET_ADMIN"]}]),
    "5.9": ({"ports": {}, "publish_all_ports": False}, [{"ports": {"80/tcp": 8080}}, {"publish_all_ports": True}]),
    "5.18": (
        {"devices": [], "device_requests": []},
        [{"devices": ["/dev/kmsg:/dev/kmsg:rwm"]}, {"device_requests": [{"Count": -1}]}],
    ),
}


def test_the_table_covers_every_all_check_of_the_catalogue_part_by_part() -> None:
    raw = json.loads(CATALOGUE_FILE.read_text(encoding="utf-8"))
    alls = {c["number"]: len(c["check"]["of"]) for c in raw["controls"] if c.get("check", {}).get("op") == "all"}
    assert {number: len(breaks) for number, (_good, breaks) in ALL_CHECKS.items()} == alls


@pytest.mark.parametrize(
    ("number", "good", "breaking"),
    [(number, good, broken) for number, (good, breaks) in ALL_CHECKS.items() for broken in breaks],
)
def test_each_part_of_an_all_check_can_violate_the_control(
    number: str, good: dict[str, Any], breaking: dict[str, Any]
) -> None:
    assert status(number, good) == "enforced"
    assert status(number, {**good, **breaking}) == "violated"  # e.g. cap_add beside cap_drop: ALL


@pytest.mark.parametrize("value", [1, "true", 1.0])
def test_equals_keeps_the_type(value: object) -> None:
    assert status("5.13", {"read_only": True}) == "enforced"
    assert status("5.13", {"read_only": value}) == "violated"  # 1 == True in Python, not a read-only root

"""The engine's state for ``GET /readyz`` is remembered for a second (a fake clock, a counting engine); the trail's
check fails below its watermark."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from gateway.audit import JsonlAuditTrail, MemoryAuditSink
from gateway.service.readiness import Check, EngineState, ask_engine, trail_check


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Engine:
    """Counts the questions; ``images`` are present, ``down`` makes it unreachable."""

    def __init__(self, images: set[str]) -> None:
        self.images = images
        self.asked = 0
        self.down = False

    def image_id(self, image: str) -> str | None:
        self.asked += 1
        if self.down:
            raise ConnectionError("engine socket refused")
        return f"sha256:{image}" if image in self.images else None


def _state(engine: Engine, clock: Clock) -> EngineState:
    def ask(images: Sequence[str]) -> dict[str, Check]:
        return ask_engine(engine, images)

    return EngineState(ask, ttl_s=1.0, clock=clock)


def test_a_second_call_within_the_second_does_not_ask_the_engine_and_one_after_it_does() -> None:
    engine, clock = Engine({"python:3.11"}), Clock()
    state = _state(engine, clock)
    assert state(["python:3.11"]) == {"engine": (True, ""), "image": (True, "")}
    assert engine.asked == 1
    clock.now += 0.999
    assert state(["python:3.11"])["engine"] == (True, "")
    assert engine.asked == 1
    clock.now += 0.001
    engine.down = True
    assert state(["python:3.11"])["engine"] == (False, "ConnectionError: engine socket refused")
    assert engine.asked == 2


def test_other_images_are_asked_at_once() -> None:
    """A reload that changes the policies' images is not answered from the old images' state."""
    engine, clock = Engine({"a"}), Clock()
    state = _state(engine, clock)
    assert state(["a"])["image"] == (True, "")
    assert state(["a", "b"])["image"] == (False, "missing: b")
    assert engine.asked == 3


def test_a_caller_cannot_change_the_remembered_answer() -> None:
    engine, clock = Engine({"a"}), Clock()
    state = _state(engine, clock)
    state(["a"])["engine"] = (False, "edited")
    assert state(["a"])["engine"] == (True, "")


def test_the_trail_check_fails_below_the_watermark_with_the_reason(tmp_path: Path) -> None:
    """A trail that can create files but whose file system is below its watermark is not ready: every request
    would get 507. A sink in memory has no disk to check."""
    fs = os.statvfs(tmp_path)
    with JsonlAuditTrail(tmp_path / "roomy") as roomy:
        roomy.append("gateway.start", {})
        assert trail_check(roomy) == (True, "")
    with JsonlAuditTrail(tmp_path / "full", min_free=fs.f_blocks * fs.f_frsize) as full:
        full.append("gateway.start", {})
        ok, why = trail_check(full)
    assert not ok
    assert "below the trail's watermark" in why
    assert str(tmp_path / "full") in why
    assert trail_check(MemoryAuditSink()) == (True, "")

"""Host-wide execution slots: a lock-file semaphore shared by every gateway process on the host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.errors import EXIT_GATEWAY_FAILURE, CapacityError
from gateway.policy import load_policy
from gateway.resources import default_policy_path
from gateway.runner.fake import FakeRunner
from gateway.slots import HostSlots, Slot

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from gateway.slots import HostSlots, Slot
    slots = HostSlots(Path(sys.argv[1]), count=int(sys.argv[2]), wait_s=0)
    with slots.acquire() as index:
        print(index, flush=True)
        time.sleep(60)
    """
)


def hold(directory: Path, count: int) -> subprocess.Popen[str]:
    """Another process holding one slot until it is killed; returns once it holds it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory), str(count)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip().isdigit()
    return proc


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGKILL) -> None:
    proc.send_signal(sig)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def test_a_slot_held_by_another_process_is_busy_and_freed_when_that_process_is_killed(tmp_path: Path) -> None:
    holder = hold(tmp_path, 1)
    try:
        with (
            pytest.raises(CapacityError, match="all 1 execution slots of this host"),
            HostSlots(tmp_path, 1, 0.1).acquire(),
        ):
            pass
    finally:
        stop(holder)
    # SIGKILL closed the holder's file: the slot is free at once, nothing to clean up
    with HostSlots(tmp_path, 1, 0).acquire() as index:
        assert index == 0


def test_slots_count_up_to_their_number(tmp_path: Path) -> None:
    holders = [hold(tmp_path, 3) for _ in range(2)]
    try:
        with HostSlots(tmp_path, 3, 0).acquire() as index:
            assert index == 2  # the two others hold 0 and 1
            with pytest.raises(CapacityError), HostSlots(tmp_path, 3, 0).acquire():
                pass
    finally:
        for proc in holders:
            stop(proc)


def test_a_bad_setting_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GATEWAY_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("GATEWAY_SLOTS", "many")
    with pytest.raises(CapacityError, match="GATEWAY_SLOTS='many' is not a valid integer"):
        HostSlots.from_env()
    monkeypatch.setenv("GATEWAY_SLOTS", "0")
    with pytest.raises(CapacityError, match="at least 1"):
        HostSlots.from_env()
    monkeypatch.setenv("GATEWAY_SLOTS", "3")
    monkeypatch.setenv("GATEWAY_SLOT_WAIT", "1.5")
    assert HostSlots.from_env() == HostSlots(tmp_path / "slots", 3, 1.5)


def test_an_unusable_slot_directory_fails_closed(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(CapacityError, match="cannot be used"), HostSlots(blocker / "slots", 1, 0).acquire():
        pass


def test_a_gateway_with_every_slot_busy_runs_nothing_and_audits_why(tmp_path: Path) -> None:
    runner, sink = FakeRunner(), MemoryAuditSink()
    gw = Gateway(load_policy(default_policy_path()), runner=runner, audit=sink, slots=HostSlots(tmp_path, 1, 0.05))
    holder = hold(tmp_path, 1)
    try:
        result = gw.execute({"code": "print(1)"})
    finally:
        stop(holder)
    assert result.exit_status == EXIT_GATEWAY_FAILURE
    data: dict[str, Any] = result.to_dict()
    assert data["error"]["code"] == "gateway.capacity"
    assert data["allowed"] is False
    assert runner.prepared == []  # no sandbox was even prepared
    outcome = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    assert outcome[0]["data"]["error"]["code"] == "gateway.capacity"
    assert outcome[0]["data"]["container_id"] is None
    # and once the slot is free the same gateway runs again
    assert gw.execute({"code": "print(1)"}).exit_status == 0


def test_a_run_waiting_for_a_slot_is_seen_host_wide_until_it_has_one(tmp_path: Path) -> None:
    slots = HostSlots(tmp_path, 1, 0)
    assert not slots.wanted()
    holder = hold(tmp_path, 1)
    got: list[Slot] = []
    waiter = threading.Thread(target=lambda: got.append(HostSlots(tmp_path, 1, 60).take()))
    try:
        assert not slots.wanted()  # every slot is busy, but nobody waits
        waiter.start()
        assert _eventually(slots.wanted)  # what a warm pool in any process on the host asks
    finally:
        stop(holder)
        waiter.join(60)
    (slot,) = got
    assert not slots.wanted()  # it has its slot: it waits no more
    slot.release()


def _eventually(check: Callable[[], bool], tries: int = 600) -> bool:
    for _ in range(tries):
        if check():
            return True
        time.sleep(0.05)
    return False

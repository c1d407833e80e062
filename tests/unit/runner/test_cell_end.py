"""``frames.cell_end`` and ``frames.cell_frame``: what one kernel cell's frames come to, whatever the backend."""

from __future__ import annotations

import pytest

from gateway.runner.frames import Collected, ProtocolError, cell_end, cell_frame


def test_a_cell_that_ran_to_its_end_or_raised() -> None:
    ran = cell_end(Collected(), {"seq": 1, "interrupted": False}, b"\x01'kept'", gone=None)
    assert (ran.killed, ran.exit_code, ran.value, ran.timed_out, ran.interrupted) == (None, 0, "'kept'", False, False)
    raised = cell_end(Collected(), {"seq": 1, "interrupted": False}, b"\x04", gone=None)
    assert (raised.exit_code, raised.value) == (1, None)
    cut = cell_end(Collected(), {"seq": 1}, b"\x03[0, 1", gone=None)
    assert (cut.value, cut.value_truncated) == ("[0, 1", True)


def test_an_interrupt_at_the_deadline_or_for_a_flood() -> None:
    deadline = cell_end(Collected(), {"seq": 2, "interrupted": True}, b"\x04", gone=None)
    assert (deadline.exit_code, deadline.timed_out, deadline.killed) == (None, True, None)
    flood = Collected(output_limit_killed=True)
    assert cell_end(flood, {"seq": 2, "interrupted": True}, b"\x04", gone=None).timed_out is False


def test_the_kernels_end_and_its_reason() -> None:
    ignored = Collected(final={"status": 137, "killed": "interrupt_ignored"})
    end = cell_end(ignored, None, b"\0", gone=None)
    assert (end.killed, end.exit_code, end.timed_out) == ("interrupt_ignored", None, True)
    exited = cell_end(Collected(final={"status": 3, "killed": "exited"}), None, b"\0", gone=None)
    assert (exited.killed, exited.exit_code) == ("exited", 3)
    oom = cell_end(Collected(final={"status": 137, "killed": "exited"}, oom_reported=True), None, b"\0", gone=None)
    assert (oom.killed, oom.exit_code) == ("memory", 137)
    assert cell_end(Collected(timed_out=True), None, b"\0", gone=None).killed == "unresponsive"
    assert cell_end(Collected(cancelled=True), None, b"\0", gone=None).killed == "cancelled"
    assert cell_end(Collected(), None, b"\0", gone=None, memory=lambda: True).killed == "memory"
    lost = cell_end(Collected(files={"a": bytearray(b"x")}), None, b"\0", gone=None)
    assert (lost.killed, lost.files_truncated) == ("lost", True)
    asked: list[bool] = []
    closed = cell_end(Collected(), None, b"\0", gone="closed", memory=lambda: asked.append(True) or True)
    assert (closed.killed, asked) == ("closed", [])  # closed meanwhile: the engine is not asked why


@pytest.mark.parametrize("data", [b"{", b"[]", b'{"seq": 2}'])
def test_a_cell_frame_for_another_cell_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        cell_frame(data, 1)
    assert cell_frame(b'{"seq": 1, "interrupted": false}', 1) == {"seq": 1, "interrupted": False}

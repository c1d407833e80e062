"""The supervisor's own deadline, run locally (no engine): a real program racing a real clock.

The program must say ``up`` before the supervisor's deadline of one second, which this machine may not grant
when it is busy: the race belongs here, not among the unit tests (``tests/unit/runner/test_supervisor_protocol.py``
tests the rest of the protocol locally).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.runner.frames import FRAME_STDOUT
from tests.unit.runner.supervisor_support import SLEEPER, ended, needs_system_python, supervise

pytestmark = pytest.mark.integration


@needs_system_python
def test_supervisor_enforces_its_own_deadline_without_the_host(tmp_path: Path) -> None:
    status, frames = supervise(tmp_path, SLEEPER, {}, timeout_s=1.0)
    assert status == 124  # the deadline, not the program's exit
    assert [(f.kind, f.data) for f in frames] == [
        (FRAME_STDOUT, b"up")
    ]  # no final frame: nobody is told the program's status
    assert ended(int((tmp_path / "pid").read_text()))

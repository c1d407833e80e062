"""The supervisor's kernel mode run locally (no engine): cells over the frame protocol, one namespace kept from
cell to cell, and every way a program can break the kernel's own channels ending it with a reason.

Deadlines, interrupts and containment are tested against the real engine (``tests/integration/test_kernel.py``).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.runner.frames import (
    FRAME_CELL,
    FRAME_ERROR,
    FRAME_EXIT,
    FRAME_FILE_DATA,
    FRAME_FILE_NAME,
    FRAME_STDERR,
    FRAME_STDOUT,
    FRAME_VALUE,
    Frame,
)
from gateway.runner.supervisor import STARTUP_ENV, STARTUP_ENV_PREFIXES, SUPERVISOR
from tests.unit.runner.supervisor_support import LocalKernel, needs_system_python

pytestmark = needs_system_python


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[LocalKernel]:
    k = LocalKernel(tmp_path / "w")
    try:
        yield k
    finally:
        k.close()


def data(frames: list[Frame], kind: bytes) -> bytes:
    return b"".join(f.data for f in frames if f.kind == kind)


def cell(frames: list[Frame]) -> dict[str, object]:
    assert frames[-1].kind == FRAME_CELL, frames
    found: dict[str, object] = json.loads(frames[-1].data)
    return found


def killed(frames: list[Frame]) -> str:
    assert frames[-1].kind == FRAME_EXIT, frames
    reason: str = json.loads(frames[-1].data)["killed"]
    return reason


def test_kernel_says_it_is_ready_then_keeps_one_namespace(kernel: LocalKernel) -> None:
    assert [(f.kind, json.loads(f.data)["seq"]) for f in kernel.ready] == [(FRAME_CELL, 0)]
    first = kernel.cell("import math\nx = 40")
    assert cell(first) == {"seq": 1, "interrupted": False, "files_truncated": False}
    assert data(first, FRAME_VALUE) == b"\x00"  # no value: the last statement is an assignment
    second = kernel.cell("print(math.floor(2.5))\nx + 2")
    assert cell(second)["seq"] == 2
    assert data(second, FRAME_STDOUT) == b"2\n"
    assert data(second, FRAME_VALUE) == b"\x0142"


def test_value_is_a_bounded_repr_and_none_is_no_value(kernel: LocalKernel) -> None:
    assert data(kernel.cell("'a' * 5000"), FRAME_VALUE) == b"\x03'" + b"a" * 4095  # cut at value_cap
    assert data(kernel.cell("None"), FRAME_VALUE) == b"\x00"
    assert data(kernel.cell("b'\\xff'"), FRAME_VALUE) == b"\x01b'\\xff'"


def test_an_exception_is_a_traceback_of_the_cell_and_the_kernel_goes_on(kernel: LocalKernel) -> None:
    frames = kernel.cell("y = 1\n1 / 0")
    assert data(frames, FRAME_VALUE) == b"\x04"
    err = data(frames, FRAME_STDERR).decode()
    assert err.startswith('Traceback (most recent call last):\n  File "<cell 1>", line 2, in <module>\n    1 / 0')
    assert err.endswith("ZeroDivisionError: division by zero\n")
    assert "<string>" not in err  # none of the supervisor's own frames
    assert data(kernel.cell("raise SystemExit(3)"), FRAME_VALUE) == b"\x04"  # exit() is an exception here too
    assert data(kernel.cell("y"), FRAME_VALUE) == b"\x011"


def test_output_past_the_cap_is_dropped_and_the_cell_interrupted(kernel: LocalKernel) -> None:
    frames = kernel.cell("x = 1\nwhile True:\n    print('x' * 1000)")
    assert data(frames, FRAME_STDOUT) == (b"x" * 1000 + b"\n") * 4 + b"x" * 93  # the cap and one byte: past it
    assert data(frames, FRAME_STDERR).endswith(b"KeyboardInterrupt\n")
    assert cell(frames)["interrupted"] is True
    assert data(kernel.cell("x"), FRAME_VALUE) == b"\x011"


def test_only_the_files_a_cell_changed_come_back(kernel: LocalKernel) -> None:
    frames = kernel.cell("open('out/a.txt', 'w').write('one')\nopen('out/b.txt', 'w').write('b')")
    assert data(frames, FRAME_FILE_NAME) == b"a.txtb.txt"
    assert data(frames, FRAME_FILE_DATA) == b"oneb"
    assert data(kernel.cell("pass"), FRAME_FILE_NAME) == b""
    frames = kernel.cell("open('out/a.txt', 'w').write('two!')")
    assert data(frames, FRAME_FILE_NAME) == b"a.txt"
    assert data(frames, FRAME_FILE_DATA) == b"two!"


def test_a_fork_in_a_cell_does_not_report_for_the_kernel(kernel: LocalKernel) -> None:
    frames = kernel.cell("import os\npid = os.fork()\n'parent' if pid else 'child'")
    assert data(frames, FRAME_VALUE) == b"\x01'parent'"
    assert data(kernel.cell("'still here'"), FRAME_VALUE) == b"\x01'still here'"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import os\nos._exit(3)", "exited"),
        ("import os\nos.close(1)", "protocol"),  # its stdout closed: the kernel's output could no longer come back
        ("import os\nos.close(4)", "exited"),  # its result pipe closed: its report fails, the interpreter ends
        ("import os\nos.write(4, b'\\xff' * 64)", "protocol"),  # garbage on the result pipe
        ("import os\nos.write(4, (13).to_bytes(4, 'big') + (9).to_bytes(8, 'big') + b'\\x00')", "protocol"),
    ],
)
def test_a_program_breaking_the_kernels_channels_ends_it_with_the_reason(
    kernel: LocalKernel, code: str, reason: str
) -> None:
    frames = kernel.cell(code)
    assert killed(frames) == reason
    assert kernel.cell("1") == []  # nothing answers any more
    assert kernel.close() != 0


def test_kernel_refuses_a_start_up_environment_it_cannot_honour(tmp_path: Path) -> None:
    k = LocalKernel(tmp_path / "w", env={"PYTHONPATH": "/x"})
    assert [f.kind for f in k.ready] == [FRAME_ERROR]
    assert "kernel mode needs the pre-started interpreter" in json.loads(k.ready[0].data)["error"]
    assert k.close() == 125


def test_a_cells_env_is_set_for_it_alone_and_restored_exactly(tmp_path: Path) -> None:
    k = LocalKernel(tmp_path / "w", env={"APP_OPEN": "kernel"})
    try:
        k.cell("import os\nos.environ['APP_MINE'] = 'mine'")
        inside = k.cell(
            "(os.environ['APP_OPEN'], os.environ['APP_MINE'], os.environ['APP_NEW'])",
            env={"APP_OPEN": "cell", "APP_MINE": "cell", "APP_NEW": "new"},
        )
        assert data(inside, FRAME_VALUE)[1:] == b"('cell', 'cell', 'new')"
        after = k.cell("(os.environ.get('APP_OPEN'), os.environ.get('APP_MINE'), os.environ.get('APP_NEW'))")
        assert data(after, FRAME_VALUE)[1:] == b"('kernel', 'mine', None)"
    finally:
        k.close()


def test_a_cells_files_are_written_before_it_runs_over_what_is_there(kernel: LocalKernel, tmp_path: Path) -> None:
    (tmp_path / "w" / "old.txt").write_text("old")
    frames = kernel.cell("open('old.txt').read() + open('d/e/new.bin', 'rb').read().hex()",
                        files={"old.txt": b"new", "d/e/new.bin": b"\x00\xff"})  # fmt: skip
    assert data(frames, FRAME_VALUE)[1:] == b"'new00ff'"
    assert (tmp_path / "w" / "d" / "e" / "new.bin").read_bytes() == b"\x00\xff"


@pytest.mark.parametrize(
    ("plant", "name", "errno"),
    [
        ("os.symlink(OUT, 'link')", "link/x", 40),  # ELOOP: a directory on the way is a symlink
        ("os.symlink(OUT + '/x', 'link')", "link", 40),  # the file itself is a symlink
        ("open('file', 'w').close()", "file/x", 20),  # ENOTDIR
        ("os.mkfifo('fifo')", "fifo", 6),  # ENXIO: not a regular file (and never blocks on it)
        ("os.mkdir('dir')", "dir", 21),  # EISDIR
    ],
)
def test_a_cells_file_is_refused_where_a_cell_planted_something_and_the_kernel_goes_on(
    kernel: LocalKernel, tmp_path: Path, plant: str, name: str, errno: int
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    kernel.cell(f"import os\nOUT = {str(outside)!r}\n{plant}")
    refused = kernel.cell("ran = True", files={"a.txt": b"a", name: b"x"})
    found = cell(refused)
    assert found["refused"] == {"name": name, "errno": errno, "strerror": found["refused"]["strerror"]}  # type: ignore[index]
    assert list(outside.iterdir()) == []
    assert (tmp_path / "w" / "a.txt").read_bytes() == b"a"  # the files before it in name order were written
    after = kernel.cell("globals().get('ran')")
    assert cell(after)["seq"] == 3
    assert data(after, FRAME_VALUE) == b"\x00"  # the refused cell did not run


def test_the_start_up_variables_are_the_supervisors() -> None:
    line = next(line for line in SUPERVISOR.splitlines() if line.startswith("STARTUP = "))
    assert ast.literal_eval(line.removeprefix("STARTUP = ")) == STARTUP_ENV
    assert '"python": (("PYTHON", "LC_"), STARTUP)' in SUPERVISOR  # the FRESH rule of the forked Python
    assert STARTUP_ENV_PREFIXES == ("PYTHON", "LC_")

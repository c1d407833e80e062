"""The supervisor runs shell and JavaScript programs from a file, exec'ing their interpreter fresh, with the same
frames, files and environment handling as Python's (run locally: no engine)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from supervisor_support import ended, needs_system_python, supervise

from gateway.runner.frames import FRAME_ERROR, FRAME_EXIT, FRAME_FILE_DATA, FRAME_FILE_NAME, FRAME_STDOUT, Frame

pytestmark = needs_system_python
needs_node = pytest.mark.skipif(shutil.which("node") != "/usr/bin/node", reason="no /usr/bin/node on this host")


def _stdout(frames: list[Frame]) -> bytes:
    return b"".join(f.data for f in frames if f.kind == FRAME_STDOUT)


def _files(frames: list[Frame]) -> dict[bytes, bytes]:
    names = [f.data for f in frames if f.kind == FRAME_FILE_NAME]
    return dict(zip(names, [f.data for f in frames if f.kind == FRAME_FILE_DATA], strict=True))


def test_a_shell_program_runs_from_main_sh_verbatim_with_files_in_and_out(tmp_path: Path) -> None:
    # Quotes, $(...) and a trailing backslash reach bash as the file's bytes: nothing quoted them on the way.
    code = "echo 4\nprintf '%s\\n' \"$0\" '$(not run)'\ntr a-z A-Z < data/in.txt > out/up.txt\nexit 3 \\\n"
    status, frames = supervise(tmp_path, code, {"data/in.txt": b"abc"}, language="shell")
    assert status == 3
    assert _stdout(frames) == f"4\n{tmp_path}/main.sh\n$(not run)\n".encode()
    assert _files(frames) == {b"up.txt": b"ABC"}
    assert json.loads(frames[-1].data) == {"status": 3, "files_truncated": False}


def test_a_shell_programs_background_jobs_die_with_it(tmp_path: Path) -> None:
    code = "sleep 1000 &\necho $! > job.pid\nnohup sleep 1000 >/dev/null 2>&1 &\necho $! > nohup.pid\necho done\n"
    status, frames = supervise(tmp_path, code, {}, language="shell")
    assert status == 0
    assert _stdout(frames) == b"done\n"
    for name in ("job.pid", "nohup.pid"):
        assert ended(int((tmp_path / name).read_text()))


def test_bash_reads_no_start_up_file_it_is_not_given(tmp_path: Path) -> None:
    # The image's environment cannot make bash source a file either: only an explicitly allowed BASH_ENV
    # (env.dangerous) would, and --norc/--noprofile keep ~/.bashrc and /etc/profile out.
    (tmp_path / "rc.sh").write_text("echo sourced\n")
    status, frames = supervise(
        tmp_path, "echo $-", {}, language="shell",
        image_env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ENV": str(tmp_path / "rc.sh")},
    )  # fmt: skip
    assert status == 0
    assert b"sourced" not in _stdout(frames)


@needs_node
def test_a_javascript_program_runs_from_main_js_with_files_in_and_out(tmp_path: Path) -> None:
    code = (
        "const fs = require('fs');\n"
        "console.log(2+2, require.main.filename.endsWith('/main.js'), process.argv.length);\n"
        "fs.writeFileSync('out/r.json', JSON.stringify(fs.readFileSync('in.txt', 'utf8')));\n"
        "process.exitCode = 5;\n"
    )
    status, frames = supervise(tmp_path, code, {"in.txt": b"x`${y}`"}, language="javascript")
    assert status == 5
    assert _stdout(frames) == b"4 true 2\n"
    assert _files(frames) == {b"r.json": b'"x`${y}`"'}


def test_an_unknown_language_and_a_kernel_of_another_language_are_refused(tmp_path: Path) -> None:
    status, frames = supervise(tmp_path, "puts 1", {}, language="ruby")
    assert status == 125
    assert frames[-1].kind == FRAME_ERROR
    assert b"cannot run language 'ruby'" in frames[-1].data
    assert not (tmp_path / "main.py").exists()
    status, frames = supervise(tmp_path, "", {}, language="shell", kernel=True)
    assert status == 125
    assert frames[-1].kind == FRAME_ERROR
    assert b"cannot run language 'shell' in kernel mode" in frames[-1].data


def test_a_program_file_left_in_a_session_workspace_is_replaced_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text("keep")
    work = tmp_path / "w"
    work.mkdir()
    (work / "main.sh").symlink_to(outside)
    status, frames = supervise(work, "echo ran", {}, language="shell")
    assert (status, _stdout(frames)) == (0, b"ran\n")
    assert outside.read_text() == "keep"
    assert frames[-1].kind == FRAME_EXIT

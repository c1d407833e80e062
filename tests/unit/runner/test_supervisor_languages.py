"""The supervisor runs shell and JavaScript programs from a file, in the interpreter it started ahead (a container
made for the language) or in a fresh one, alike, with the same frames, files and environment handling as Python's
(run locally: no engine)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from supervisor_support import ended, needs_system_python, supervise

from gateway.runner.frames import (
    FRAME_ERROR,
    FRAME_EXIT,
    FRAME_FILE_DATA,
    FRAME_FILE_NAME,
    FRAME_STDERR,
    FRAME_STDOUT,
    Frame,
)

pytestmark = needs_system_python
needs_node = pytest.mark.skipif(shutil.which("node") != "/usr/bin/node", reason="no /usr/bin/node on this host")


def _stdout(frames: list[Frame]) -> bytes:
    return b"".join(f.data for f in frames if f.kind == FRAME_STDOUT)


def _stderr(frames: list[Frame]) -> bytes:
    return b"".join(f.data for f in frames if f.kind == FRAME_STDERR)


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


PROBES = {
    "shell": (
        "main.sh",
        '. ./lib.sh\necho "$0|$#|$(greet)|$V|${BASH_EXECUTION_STRING+set}"\n'
        "case $(tr '\\0' ' ' < /proc/$$/cmdline) in *' -c '*) echo ahead;; "
        "*) echo fresh;; esac >&2\nexit 7\n",
        {"lib.sh": b"greet() { echo hi; }\n"},
    ),
    "javascript": (
        "main.js",
        "const lib = require('./lib')\n"
        "console.log([process.argv.slice(1), require.main === module, __filename, lib.greet(), process.env.V,"
        " process.execArgv, Object.getOwnPropertyNames(globalThis).sort(), Object.keys(require.cache)])\n"
        "const cmd = require('fs').readFileSync('/proc/self/cmdline', 'utf8')\n"
        "console.error(cmd.includes('\\0-e\\0') ? 'ahead' : 'fresh')\n"
        "process.exitCode = 7\n",
        {"lib.js": b"exports.greet = () => 'hi'\n"},
    ),
}


@pytest.mark.parametrize("lang", ["shell", pytest.param("javascript", marks=needs_node)])
def test_the_interpreter_started_ahead_runs_the_program_as_a_fresh_one_does(tmp_path: Path, lang: str) -> None:
    # The same workspace path both times: what the program sees must be equal, only how it started differs.
    _, code, files = PROBES[lang]
    seen = {}
    for ahead in ("python", lang):
        shutil.rmtree(tmp_path / "w", ignore_errors=True)
        status, frames = supervise(tmp_path / "w", code, files, env={"V": "a b\nc"}, language=lang, ahead=ahead)
        seen[ahead] = (status, _stdout(frames))
        assert _stderr(frames) == (b"fresh\n" if ahead == "python" else b"ahead\n")
    assert seen[lang] == seen["python"]
    assert seen[lang][0] == 7
    assert b"hi" in seen[lang][1]


@needs_node
def test_an_uncaught_exception_in_the_node_started_ahead_is_nodes_own_report(tmp_path: Path) -> None:
    status, frames = supervise(
        tmp_path, "\nthrow new TypeError('boom')\n", {}, language="javascript", ahead="javascript"
    )
    assert status == 1
    err = _stderr(frames).decode()
    assert err.startswith(f"{tmp_path}/main.js:2\nthrow new TypeError('boom')\n^\n\nTypeError: boom\n"), err
    assert f"at Object.<anonymous> ({tmp_path}/main.js:2:7)" in err


@pytest.mark.parametrize(
    ("lang", "env"),
    [
        ("shell", {"LANG": "C"}),
        ("shell", {"SHLVL": "5"}),
        ("shell", {"BASH_FUNC_f%%": "() { :; }"}),
        pytest.param("javascript", {"NODE_DEBUG": "x"}, marks=needs_node),
        pytest.param("javascript", {"TZ": "UTC"}, marks=needs_node),
        pytest.param("javascript", {"UV_THREADPOOL_SIZE": "2"}, marks=needs_node),
    ],
)
def test_a_variable_read_only_at_start_gets_a_fresh_interpreter(tmp_path: Path, lang: str, env: dict[str, str]) -> None:
    _, code, files = PROBES[lang]
    _, frames = supervise(tmp_path, code, files, env=env, language=lang, ahead=lang)
    assert _stderr(frames) == b"fresh\n"


@pytest.mark.parametrize("ahead", ["shell", pytest.param("javascript", marks=needs_node)])
def test_an_unused_interpreter_started_ahead_is_killed_before_the_program_runs(tmp_path: Path, ahead: str) -> None:
    # A Python request in a container made for another language: the waiting process is killed (and reaped)
    # before the go pipe closes, so it never runs the program file the Python program then leaves.
    program = f"{tmp_path}/main.{'sh' if ahead == 'shell' else 'js'}"
    code = (
        "import os, time\n"
        f"open({program!r}, 'w').write('echo ran > out/ran.txt' if {ahead == 'shell'} else "
        '\'require("fs").writeFileSync("out/ran.txt", "")\')\n'
        "left = []\n"
        "for p in os.listdir('/proc'):\n"
        "    try:\n"
        "        cmd = open('/proc/%s/cmdline' % p, 'rb').read()\n"
        "    except OSError:\n"
        "        continue\n"
        f"    if {program.encode()!r} in cmd:\n"
        "        left.append(p)\n"
        "time.sleep(0.5)\n"
        "print(left)\n"
    )
    status, frames = supervise(tmp_path, code, {}, ahead=ahead)
    assert (status, _stdout(frames)) == (0, b"[]\n")
    assert _files(frames) == {}


@needs_node
def test_the_deadline_ends_a_waiting_program_in_the_node_started_ahead(tmp_path: Path) -> None:
    status, _ = supervise(
        tmp_path, "setInterval(() => {}, 1000)\n", {}, timeout_s=1, language="javascript", ahead="javascript"
    )
    assert status == 124

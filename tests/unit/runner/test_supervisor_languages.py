"""The supervisor runs shell and JavaScript programs from a file, in the interpreter it started ahead (a container
made for the language) or in a fresh one, alike, with the same frames, files and environment handling as Python's
(run locally: no engine)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from supervisor_support import IMAGE_ENV, ended, needs_system_python, supervise

from gateway.runner.frames import (
    FRAME_ERROR,
    FRAME_EXIT,
    FRAME_FILE_DATA,
    FRAME_FILE_NAME,
    FRAME_STDERR,
    FRAME_STDOUT,
    Frame,
)
from gateway.runner.supervisor import SUPERVISOR

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


def _bootstrap_says(workspace: Path, code: str) -> bytes:
    """What node's bootstrap (``NODE_BOOT``) writes on fd 4 for ``code`` in main.js: ``x`` and the exit code when
    it ends the run early (node is then waiting: killed here), nothing when node ends by itself."""
    (workspace / "main.js").write_text(code)
    go_r, go_w = os.pipe()
    back_r, back_w = os.pipe()
    boot = SUPERVISOR.split("NODE_BOOT = r'''", 1)[1].split("'''", 1)[0]
    argv = [
        "/bin/bash",
        "-c",
        f'exec "$0" "$@" 3<&{go_r} 4>&{back_w}',
        "/usr/bin/node",
        "-e",
        boot,
        str(workspace / "main.js"),
    ]
    with subprocess.Popen(
        argv,
        pass_fds=(go_r, back_w),
        cwd=workspace,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=IMAGE_ENV,
    ) as proc:
        os.close(go_r)
        os.close(back_w)
        os.write(go_w, b"\0\0\0\1r")
        os.close(go_w)
        with os.fdopen(back_r, "rb") as back:
            said = back.read(2)
            proc.kill()
    return said


@needs_node
@pytest.mark.parametrize(
    ("code", "said"),
    [
        ("console.log(4)\n", b"x\0"),
        ("process.exitCode = 3\n", b"x\3"),
        ("setTimeout(() => {}, 1e6).unref()\nsetTimeout(() => console.log('later'), 10)\n", b"x\0"),
        ("process.emit('beforeExit', 0)\nPromise.resolve().then(() => process.emit('beforeExit'))\n", b"x\0"),
        ("process.on('exit', () => {})\n", b""),
        ("process.once('beforeExit', () => {})\n", b""),
        ("throw new Error('boom')\n", b""),
        ("Promise.reject(new Error('no'))\n", b""),
        ("process.exit(0)\n", b""),
        ("process.exitCode = 300\n", b""),
        ("require('worker_threads')\n", b""),
        ("setImmediate(() => process.kill(process.pid, 'SIGTERM'))\n", b""),
    ],
)
def test_nodes_bootstrap_ends_early_only_when_nothing_else_can_run(tmp_path: Path, code: str, said: bytes) -> None:
    # Early (node's teardown skipped): the loop is empty, no exit or beforeExit listener is left to run, no worker
    # or native addon could do anything at exit, and the exit code is a status. Anything else: node's own end.
    assert _bootstrap_says(tmp_path, code) == said


ENDINGS = {
    "exit listener": "process.on('exit', (c) => console.log('exit', c))\nconsole.log('main')\n",
    "beforeExit schedules more work": (
        "let n = 0\nprocess.on('beforeExit', () => { if (n++ < 2) setTimeout(() => console.log('more', n), 1) })\n"
    ),
    "uncaught exception": "console.log('before')\nthrow new RangeError('boom')\n",
    "exit code": "console.log('set')\nprocess.exitCode = 3\n",
    "unhandled rejection": "Promise.reject(new Error('no'))\n",
    "unref'd timer": "setTimeout(() => console.log('never'), 1e6).unref()\nsetTimeout(() => console.log('once'), 5)\n",
    "process.exit": "console.log('a')\nprocess.exit(4)\n",
    "a program's own beforeExit emit": (
        "process.emit('beforeExit', 0)\nsetTimeout(() => process.emit('beforeExit'), 1)\nconsole.log('after')\n"
    ),
    "large output": "process.stdout.write('b'.repeat(300000))\nconsole.error('done')\n",
}


@needs_node
@pytest.mark.parametrize("name", list(ENDINGS))
def test_a_program_in_the_node_started_ahead_ends_as_in_a_fresh_node(tmp_path: Path, name: str) -> None:
    # Status, stdout and the first lines of stderr (an exception's report: node's internal frames below the
    # program's differ) are a fresh node's, whether the bootstrap ended the run early or node ended it.
    seen = {}
    for ahead in ("python", "javascript"):
        shutil.rmtree(tmp_path / "w", ignore_errors=True)
        status, frames = supervise(tmp_path / "w", ENDINGS[name], {}, language="javascript", ahead=ahead)
        seen[ahead] = (status, _stdout(frames), _stderr(frames).decode().split("\n    at ")[0])
        assert frames[-1].kind == FRAME_EXIT
    assert seen["javascript"] == seen["python"]

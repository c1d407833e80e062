"""The hand-over protocol: payload encoding, verified frames, and the supervisor run locally (no engine).

The supervisor is exercised here on the host with a temporary workspace only to test the protocol and the
file handling; containment is tested against a real engine in tests/integration, and so is the supervisor's own
deadline (``test_supervisor_deadline.py``: a real program racing a real clock).
"""

from __future__ import annotations

import json
import marshal
import os
import struct
import subprocess
from pathlib import Path

import pytest

from gateway.runner.frames import (
    FRAME_EXIT,
    FRAME_FILE_DATA,
    FRAME_FILE_NAME,
    FRAME_STDERR,
    FRAME_STDOUT,
    MAX_FRAME,
    FrameDecoder,
    ProtocolError,
    encode_frame,
)
from gateway.runner.supervisor import MAGIC, encode_payload, new_key, supervisor_command
from tests.unit.runner.supervisor_support import IMAGE_ENV, SLEEPER, ended, needs_system_python, supervise


def test_payload_is_length_prefixed_marshal_data_without_shell_quoting() -> None:
    key = new_key()
    code = "print('it''s \"quoted\"; $(rm -rf /) `x` \\n')"
    raw = encode_payload(key, code, {"a/b.bin": b"\x00\xff"}, 10)
    assert raw[:4] == MAGIC
    (size,) = struct.unpack(">I", raw[4:8])
    assert size == len(raw) - 8
    body = marshal.loads(raw[8:])  # noqa: S302 - bytes this test just encoded
    assert body["code"] == code
    assert body["files"] == {"a/b.bin": b"\x00\xff"}
    assert body["key"] == key
    assert body["files_cap"] == 10
    assert body["files_max"] == 256


def test_decoder_accepts_frames_split_anywhere() -> None:
    key = new_key()
    stream = b"".join(
        encode_frame(key, i, kind, data)
        for i, (kind, data) in enumerate([(FRAME_STDOUT, b"4\n"), (FRAME_STDERR, b"warn"), (FRAME_EXIT, b"{}")])
    )
    for step in (1, 3, 7, len(stream)):
        decoder = FrameDecoder(key)
        frames = [f for i in range(0, len(stream), step) for f in decoder.feed(stream[i : i + step])]
        assert [(f.kind, f.data) for f in frames] == [
            (FRAME_STDOUT, b"4\n"),
            (FRAME_STDERR, b"warn"),
            (FRAME_EXIT, b"{}"),
        ]
        assert decoder.finished
        assert decoder.pending == 0


def test_decoder_rejects_a_frame_under_another_key() -> None:
    forged = encode_frame(new_key(), 0, FRAME_STDOUT, b"forged")
    with pytest.raises(ProtocolError, match="verification"):
        list(FrameDecoder(new_key()).feed(forged))


def test_decoder_rejects_replayed_or_reordered_frames() -> None:
    key = new_key()
    first = encode_frame(key, 0, FRAME_STDOUT, b"a")
    decoder = FrameDecoder(key)
    assert [f.data for f in decoder.feed(first)] == [b"a"]
    with pytest.raises(ProtocolError):
        list(decoder.feed(first))  # same frame again: sequence 0 where 1 is expected


def test_decoder_rejects_unknown_types_oversized_frames_and_trailing_data() -> None:
    key = new_key()
    with pytest.raises(ProtocolError, match="unknown"):
        list(FrameDecoder(key).feed(b"Z" + struct.pack(">I", 0) + b"\0" * 16))
    with pytest.raises(ProtocolError, match="exceeds"):
        list(FrameDecoder(key).feed(FRAME_STDOUT + struct.pack(">I", MAX_FRAME + 1)))
    decoder = FrameDecoder(key)
    with pytest.raises(ProtocolError, match="after the final"):
        list(decoder.feed(encode_frame(key, 0, FRAME_EXIT, b"{}") + encode_frame(key, 1, FRAME_STDOUT, b"x")))


def test_supervisor_command_carries_no_caller_content() -> None:
    cmd = supervisor_command("/workspace")
    assert cmd[:4] == ["/usr/bin/python3", "-I", "-S", "-c"]
    assert cmd[-1] == "/workspace"
    assert len(cmd) == 6


@needs_system_python
def test_supervisor_runs_code_relays_streams_and_returns_files(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "print(open('data/in.bin', 'rb').read().hex())\n"
        "print('to stderr', file=sys.stderr)\n"
        "open('out/result.bin', 'wb').write(bytes(range(256)))\n"
        "import os; os.makedirs('out/sub'); open('out/sub/n.txt', 'w').write('nested')\n"
        "sys.exit(7)\n"
    )
    status, frames = supervise(tmp_path, code, {"data/in.bin": b"\x00\x01\xfe"})
    assert status == 7
    stdout = b"".join(f.data for f in frames if f.kind == FRAME_STDOUT)
    stderr = b"".join(f.data for f in frames if f.kind == FRAME_STDERR)
    assert stdout == b"0001fe\n"
    assert stderr == b"to stderr\n"
    names = [f.data for f in frames if f.kind == FRAME_FILE_NAME]
    assert names == [b"result.bin", b"sub/n.txt"]
    data = [f.data for f in frames if f.kind == FRAME_FILE_DATA]
    assert data == [bytes(range(256)), b"nested"]
    assert frames[-1].kind == FRAME_EXIT
    assert json.loads(frames[-1].data) == {"status": 7, "files_truncated": False}


_PROBE = (
    "import os, signal, sys\n"
    "print(os.environ.get('APP_X'), os.environ.get('LANG'), __name__, sys.argv, sys.path[0])\n"
    "print(sorted(k for k in globals() if not k.startswith('__')))\n"
    "print(sys.path, sys.dont_write_bytecode)\n"
    "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.getsignal(signal.SIGPIPE))\n"
    "if __name__ == '__main__':\n    open('no-such-file')\n"
)


def _probe(workspace: Path, env: dict[str, str], image_env: dict[str, str] | None = None) -> tuple[int, str, str]:
    status, frames = supervise(workspace, _PROBE, {}, env=env, image_env=image_env)
    stdout = b"".join(f.data for f in frames if f.kind == FRAME_STDOUT).decode()
    stderr = b"".join(f.data for f in frames if f.kind == FRAME_STDERR).decode()
    return status, stdout.replace(str(workspace), "W"), stderr.replace(str(workspace), "W")


@needs_system_python
def test_the_forked_program_runs_as_a_fresh_interpreter_would(tmp_path: Path) -> None:
    """The program's process is forked from the supervisor before the payload (one interpreter start per run):
    it sees the same environment, ``__main__``, ``sys.argv``, ``sys.path`` (site-packages included), globals,
    signal handlers, traceback and exit status as a fresh ``python3 main.py``, which is what a request setting
    a variable the interpreter reads while starting (here ``LANG``, to the value it has anyway) gets. The
    program's error is an ``OSError``: no handler of the supervisor's may catch what the program raises."""
    forked = _probe(tmp_path / "forked", {"APP_X": "1"})
    fresh = _probe(tmp_path / "fresh", {"APP_X": "1", "LANG": IMAGE_ENV["LANG"]})
    assert forked == fresh
    status, stdout, stderr = forked
    assert status == 1
    lines = stdout.splitlines()
    assert lines[0] == "1 C.UTF-8 __main__ ['W/main.py'] W"
    assert lines[1] == "['os', 'signal', 'sys']"
    assert lines[3].startswith("True ")  # SIGINT raises KeyboardInterrupt (the supervisor itself ignores it)
    assert stderr.startswith('Traceback (most recent call last):\n  File "W/main.py"')
    assert stderr.endswith("FileNotFoundError: [Errno 2] No such file or directory: 'no-such-file'\n")


@needs_system_python
def test_an_image_environment_the_interpreter_reads_at_start_gets_a_fresh_interpreter(tmp_path: Path) -> None:
    """The supervisor starts with ``-I`` (it ignores ``PYTHON*``), so a forked program would too: an image that
    sets one (here ``PYTHONDONTWRITEBYTECODE``) has its program started fresh, and the setting holds."""
    status, stdout, _ = _probe(tmp_path, {}, image_env={**IMAGE_ENV, "PYTHONDONTWRITEBYTECODE": "1"})
    assert status == 1
    assert stdout.splitlines()[2].endswith(" True")


@needs_system_python
def test_supervisor_reports_signals_as_128_plus_n_and_caps_files(tmp_path: Path) -> None:
    code = "import os, signal\nopen('out/big', 'wb').write(b'x' * 100)\nos.kill(os.getpid(), signal.SIGTERM)\n"
    status, frames = supervise(tmp_path, code, {}, cap=10)
    assert status == 128 + 15
    assert json.loads(frames[-1].data) == {"status": 143, "files_truncated": True}
    assert not [f for f in frames if f.kind == FRAME_FILE_NAME]


@needs_system_python
def test_supervisor_sends_at_most_files_max_files(tmp_path: Path) -> None:
    code = "for i in range(10):\n    open('out/f%d' % i, 'w').write('x')\n"
    status, frames = supervise(tmp_path, code, {}, most=3)
    assert status == 0
    assert [f.data for f in frames if f.kind == FRAME_FILE_NAME] == [b"f0", b"f1", b"f2"]
    assert json.loads(frames[-1].data) == {"status": 0, "files_truncated": True}
    status, frames = supervise(tmp_path / "exact", "open('out/only', 'w').write('x')\n", {}, most=1)
    assert json.loads(frames[-1].data) == {"status": 0, "files_truncated": False}


@needs_system_python
def test_empty_files_and_directories_cost_their_names_against_the_byte_cap(tmp_path: Path) -> None:
    """Item 5: 200,000 empty files cost nothing against the byte cap before; now each costs its path."""
    empty = "for i in range(200):\n    open('out/' + 'n' * 40 + '%03d' % i, 'w').close()\n"
    status, frames = supervise(tmp_path / "files", empty, {}, cap=1000, most=10_000)
    names = [f.data for f in frames if f.kind == FRAME_FILE_NAME]
    assert status == 0
    assert 0 < len(names) <= 1000 // 43
    assert sum(len(n) for n in names) <= 1000
    assert json.loads(frames[-1].data)["files_truncated"] is True
    dirs = (
        "import os\nfor i in range(300):\n    os.mkdir('out/' + 'd' * 40 + '%03d' % i)\nopen('out/z', 'w').write('x')\n"
    )
    status, frames = supervise(tmp_path / "dirs", dirs, {}, cap=1000, most=10_000)
    assert [f for f in frames if f.kind == FRAME_FILE_NAME] == []
    assert json.loads(frames[-1].data)["files_truncated"] is True


@needs_system_python
def test_supervisor_does_not_follow_symlinks_out_of_the_workspace(tmp_path: Path) -> None:
    secret = tmp_path.parent / f"{tmp_path.name}-secret"
    secret.write_text("host secret")
    try:
        code = f"import os\nos.symlink({str(secret)!r}, 'out/link')\n"
        (tmp_path / "ws").mkdir()
        status, frames = supervise(tmp_path / "ws", code, {})
        assert status == 0
        assert not [f for f in frames if f.kind in (FRAME_FILE_NAME, FRAME_FILE_DATA)]
    finally:
        secret.unlink()


@needs_system_python
@pytest.mark.parametrize("name", ["../escape.txt", "/abs.txt", "a/../../b", "main.py"])
def test_supervisor_refuses_escaping_file_names(tmp_path: Path, name: str) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    status, frames = supervise(workspace, "print('ran')", {name: b"x"})
    assert status == 125
    assert frames[-1].kind == b"!"
    assert not (tmp_path / "escape.txt").exists()
    assert not any(f.kind == FRAME_STDOUT for f in frames)


@needs_system_python
def test_supervisor_rejects_a_malformed_payload(tmp_path: Path) -> None:
    proc = subprocess.run(
        supervisor_command(str(tmp_path)), input=b"not a payload", capture_output=True, timeout=30, check=False
    )
    assert proc.returncode == 125
    assert proc.stdout == b""


@needs_system_python
def test_supervisor_ends_the_run_when_the_host_goes_away(tmp_path: Path) -> None:
    key = new_key()
    with subprocess.Popen(
        supervisor_command(str(tmp_path)), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(encode_payload(key, SLEEPER, {}, 1 << 20, timeout_s=600))
        proc.stdin.flush()
        assert next(FrameDecoder(key).feed(os.read(proc.stdout.fileno(), 1 << 16))).data == b"up"
        proc.stdin.close()  # the gateway died: the engine closes the container's stdin
        status = proc.wait(timeout=60)
        proc.stdout.read()
    assert status == 137
    assert ended(int((tmp_path / "pid").read_text()))

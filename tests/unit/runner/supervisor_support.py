"""The supervisor run locally, as the runner drives it (no engine): shared by the protocol's unit tests and the
integration test of its own deadline."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
from pathlib import Path

import pytest

from gateway.runner.frames import FRAME_CELL, FRAME_ERROR, FRAME_EXIT, Frame, FrameDecoder
from gateway.runner.supervisor import encode_cell, encode_payload, new_key, supervisor_command

needs_system_python = pytest.mark.skipif(
    not os.access("/usr/bin/python3", os.X_OK), reason="the supervisor runs the program with /usr/bin/python3"
)

IMAGE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
"""The sandbox image's environment (``docker image inspect``), which the supervisor starts with."""

SLEEPER = "import os, time\nopen('pid', 'w').write(str(os.getpid()))\nos.write(1, b'up')\ntime.sleep(600)\n"
"""A program that writes its pid to ``pid``, says ``up`` and sleeps until it is killed."""


def supervise(
    workspace: Path,
    code: str,
    files: dict[str, bytes],
    cap: int = 1 << 20,
    most: int = 256,
    *,
    timeout_s: float = 60,
    env: dict[str, str] | None = None,
    image_env: dict[str, str] | None = None,
    language: str = "python",
    kernel: bool = False,
    ahead: str = "python",
    packages: bool = False,
) -> tuple[int, list[Frame]]:
    """Run the supervisor as the runner does: stdin stays open until the final frame, then it is closed.

    The supervisor's own environment is the sandbox image's (``image_env``, default ``IMAGE_ENV``), not this
    test process's: a ``PYTHON*`` variable there would change how it starts the program. ``ahead``: the interpreter
    the supervisor starts ahead (the container's profile's)."""
    key = new_key()
    workspace.mkdir(exist_ok=True)
    decoder = FrameDecoder(key)
    frames: list[Frame] = []
    with subprocess.Popen(
        supervisor_command(str(workspace), ahead),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=IMAGE_ENV if image_env is None else image_env,
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        payload = encode_payload(
            key,
            code,
            files,
            cap,
            most,
            timeout_s=timeout_s,
            env=env,
            language=language,
            kernel=kernel,
            packages=packages,
        )
        proc.stdin.write(payload)
        proc.stdin.flush()
        while not decoder.finished:
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            frames.extend(decoder.feed(chunk))
        proc.stdin.close()
        proc.stdout.read()
        status = proc.wait(timeout=60)
    return status, frames


def ended(pid: int) -> bool:
    """Whether ``pid`` has ended (it is gone, or a zombie): waits for it on a pidfd, which becomes readable when the
    process ends, for at most a minute (a bound on the wait, not a pace)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], 60)
    finally:
        os.close(fd)
    return bool(readable)


class LocalKernel:
    """A kernel-mode supervisor run locally, driven as the Docker kernel drives it: one payload, then cells;
    ``cell`` returns the frames of one cell (up to its ``FRAME_CELL``, or the final frame). ``value_cap`` is
    also the cap of a cell's stdout and stderr (the runner gives both its ``output_bytes``)."""

    def __init__(
        self, workspace: Path, *, lifetime_s: float = 60, grace_s: float = 1.0, value_cap: int = 4096,
        env: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        workspace.mkdir(exist_ok=True)
        self.key = new_key()
        self.decoder = FrameDecoder(self.key)
        self.proc = subprocess.Popen(
            supervisor_command(str(workspace)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=IMAGE_ENV,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(
            encode_payload(
                self.key, "", {}, 1 << 20, 16, timeout_s=lifetime_s, kernel=True, value_cap=value_cap,
                grace_s=grace_s, env=env,
            )
        )  # fmt: skip
        self.proc.stdin.flush()
        self.pending: list[Frame] = []
        self.ready = self._frames()

    def _frames(self) -> list[Frame]:
        assert self.proc.stdout is not None
        frames: list[Frame] = []
        while True:
            while self.pending:
                frame = self.pending.pop(0)
                frames.append(frame)
                if frame.kind in (FRAME_CELL, FRAME_EXIT, FRAME_ERROR):
                    return frames
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return frames
            self.pending.extend(self.decoder.feed(chunk))

    def cell(
        self, code: str, timeout_s: float = 30, *, files: dict[str, bytes] | None = None,
        env: dict[str, str] | None = None,
    ) -> list[Frame]:  # fmt: skip
        assert self.proc.stdin is not None
        self.proc.stdin.write(encode_cell(code, timeout_s, files=files, env=env))
        self.proc.stdin.flush()
        return self._frames()

    def close(self) -> int:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.close()
        status = self.proc.wait(timeout=60)
        self.proc.stdout.close()
        return status

"""The supervisor run locally, as the runner drives it (no engine): shared by the protocol's unit tests and the
integration test of its own deadline."""

from __future__ import annotations

import os
import select
import subprocess
from pathlib import Path

import pytest

from gateway.runner.frames import Frame, FrameDecoder
from gateway.runner.supervisor import encode_payload, new_key, supervisor_command

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
) -> tuple[int, list[Frame]]:
    """Run the supervisor as the runner does: stdin stays open until the final frame, then it is closed.

    The supervisor's own environment is the sandbox image's (``image_env``, default ``IMAGE_ENV``), not this
    test process's: a ``PYTHON*`` variable there would change how it starts the program."""
    key = new_key()
    workspace.mkdir(exist_ok=True)
    decoder = FrameDecoder(key)
    frames: list[Frame] = []
    with subprocess.Popen(
        supervisor_command(str(workspace)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=IMAGE_ENV if image_env is None else image_env,
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(encode_payload(key, code, files, cap, most, timeout_s=timeout_s, env=env))
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

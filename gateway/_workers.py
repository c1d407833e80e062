"""Worker processes for work split over the CPUs (verify, report, OCSF export): one way to start them.

A worker is a fresh interpreter (``sys.executable``; never a fork of a process that may run threads, and never a
re-run of the caller's ``__main__``) that imports this very package, wherever the caller imported it from. It is
started with ``-P``: ``python -c`` would otherwise put the current directory first on its import path, and a
``gateway/`` directory there (a checkout, or a file planted by whoever can write to it) would be what the worker
imports and runs instead of the caller's package.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Final

__all__ = ["start_worker"]

_PACKAGE_ROOT: Final = str(Path(__file__).resolve().parents[1])
"""The directory holding the ``gateway`` package the caller runs: first on each worker's ``PYTHONPATH``."""


def start_worker(code: str, *, stderr: int | None = None) -> subprocess.Popen[bytes]:
    """Start ``python -P -c code`` with pipes on stdin and stdout (``stderr``: inherited unless given)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, "-P", "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        close_fds=True,
        env=env,
    )

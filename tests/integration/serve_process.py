"""``gateway serve`` as a real process on a loopback port (``--port 0``), for the tests of its life cycle: start-up,
SIGHUP, SIGTERM with drain and grace, the access log (fixture: ``serve_process`` in conftest.py). Its stdout (the
access log) and stderr are collected line by line; its port is read from the "serving" line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SERVING = re.compile(r"^gateway: serving principals .* on http://127\.0\.0\.1:(\d+)$")


def serve_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without trail keys (a test names its own), with this checkout first on the import path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_AUDIT_KEY")}
    return {**env, "PYTHONPATH": str(ROOT), **(extra or {})}


def until(check: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """``check()``'s first true answer, asked every 50 ms; an AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := check():
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class ServeProcess:
    """``gateway serve --port 0 ...`` with its principals file (``tmp/principals.yaml``) and trail (``tmp/audit``)."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.audit = tmp / "audit"
        self.principals = tmp / "principals.yaml"
        cmd = [sys.executable, "-m", "gateway", "serve", "--principals", str(self.principals)]
        self.proc = subprocess.Popen(
            [*cmd, "--audit-dir", str(self.audit), "--port", "0", *args],
            cwd=tmp, env=serve_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._collect, args=(stream, lines), daemon=True)
            for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()
        port = until(self._port, "the serving line")
        self.url = f"http://127.0.0.1:{port}"

    @staticmethod
    def _collect(stream: Any, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def _port(self) -> int | None:
        for line in list(self.err):
            if match := SERVING.match(line):
                return int(match.group(1))
        assert self.proc.poll() is None, f"gateway serve exited {self.proc.returncode}: {self.err}"
        return None

    def events(self, kind: str) -> list[dict[str, Any]]:
        """The trail's records of ``kind`` so far."""
        return [
            record
            for segment in sorted(self.audit.glob("*.jsonl"))
            for line in segment.read_text().splitlines()
            if line and (record := json.loads(line))["event_type"] == kind
        ]

    def stop(self) -> int:
        """SIGTERM (unless it has ended), then its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=120)
        for reader in self._readers:
            reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return code

"""Segment files of a trail directory: naming, listing, the lock file, and the injectable system calls."""

from __future__ import annotations

import fcntl
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from gateway.errors import AuditUnavailableError

__all__ = [
    "DEFAULT_DIRECTORY",
    "LOCK_NAME",
    "QUARANTINE_DIR",
    "AuditIO",
    "key_from_env",
    "list_segments",
    "load_key",
    "resolve_directory",
    "segment_name",
]

DEFAULT_DIRECTORY: Final = "audit"
LOCK_NAME: Final = ".lock"
"""Lock file inside the trail directory; writers hold ``flock(LOCK_EX)`` on it, verifiers ``LOCK_SH``."""
QUARANTINE_DIR: Final = "quarantine"
"""Where ``repair`` moves the bytes it cuts off (kept as evidence, never deleted)."""
_SEGMENT = re.compile(r"trail-(\d{6,})\.jsonl\Z")
_MIN_KEY_BYTES: Final = 16


def segment_name(index: int) -> str:
    """File name of segment ``index`` (1-based): ``trail-000001.jsonl``."""
    return f"trail-{index:06d}.jsonl"


def list_segments(directory: str | Path) -> list[tuple[int, Path]]:
    """``(index, path)`` of every segment in the directory, in chain order."""
    found = []
    for entry in os.scandir(directory):
        match = _SEGMENT.match(entry.name)
        if match is not None and entry.is_file(follow_symlinks=False):
            found.append((int(match.group(1)), Path(entry.path)))
    found.sort()
    return found


def resolve_directory(directory: str | Path | None, environ: Mapping[str, str] | None = None) -> Path:
    """Trail directory precedence: argument, ``GATEWAY_AUDIT_DIR``, ``./audit``."""
    env = os.environ if environ is None else environ
    if directory is not None and str(directory) != "":
        return Path(directory)
    return Path(env.get("GATEWAY_AUDIT_DIR") or DEFAULT_DIRECTORY)


def _parse_key(raw: bytes, origin: str) -> bytes:
    text = raw.strip()
    key = raw
    if len(text) >= 2 * _MIN_KEY_BYTES and len(text) % 2 == 0:
        try:
            key = bytes.fromhex(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            key = raw
    if len(key) < _MIN_KEY_BYTES:
        raise AuditUnavailableError(
            f"audit HMAC key from {origin} is too short ({len(key)} bytes; at least {_MIN_KEY_BYTES} needed)",
            hint="generate one with `openssl rand -hex 32`",
        )
    return key


def load_key(path: str | Path) -> bytes:
    """Read an HMAC key file: hex text (``openssl rand -hex 32``) or, failing that, the raw bytes."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise AuditUnavailableError(f"cannot read the audit key file {path}: {exc.strerror}") from exc
    return _parse_key(raw, str(path))


def key_from_env(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The trail key from ``GATEWAY_AUDIT_KEY_FILE`` (a file) or ``GATEWAY_AUDIT_KEY`` (hex), else ``None``."""
    env = os.environ if environ is None else environ
    key_file = env.get("GATEWAY_AUDIT_KEY_FILE")
    if key_file:
        return load_key(key_file)
    key_hex = env.get("GATEWAY_AUDIT_KEY")
    if key_hex:
        try:
            key = bytes.fromhex(key_hex.strip())
        except ValueError as exc:
            raise AuditUnavailableError("GATEWAY_AUDIT_KEY is not hex") from exc
        return _parse_key(key, "GATEWAY_AUDIT_KEY")
    return None


class AuditIO:
    """The system calls the trail makes, as methods, so tests can inject failures (ENOSPC, EROFS, EIO).

    The default implementation is plain :mod:`os` / :mod:`fcntl`; a test subclass overrides one method.
    """

    def open(self, path: str, flags: int, mode: int = 0o640) -> int:
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def flock(self, fd: int, operation: int) -> None:
        fcntl.flock(fd, operation)

    def mkdir(self, path: str) -> None:
        os.makedirs(path, mode=0o750, exist_ok=True)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

"""Seal a broken trail: quarantine everything from the first break on and chain a ``recovery`` record.

An explicit operator action (``gateway audit repair``), never automatic: the writer refuses to extend a
broken chain, so every request is denied until someone looks. Nothing is deleted; the bytes cut off are
copied under ``quarantine/`` first, and the ``recovery`` record names them.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.audit.canonical import digest
from gateway.audit.pipeline import RecordPipeline, chain
from gateway.audit.segments import LOCK_NAME, QUARANTINE_DIR, AuditIO, list_segments
from gateway.audit.verify import BreakInfo, verify_trail
from gateway.errors import AuditError

__all__ = ["RepairReport", "repair_trail"]


@dataclass(frozen=True, slots=True)
class RepairReport:
    """What ``repair_trail`` found and did."""

    repaired: bool
    """Whether a recovery record was written (``False`` when the trail was already intact)."""
    reason: str
    """Why: the verifier's first break, or ``"intact"``."""
    last_good_seq: int
    last_good_hash: str
    dropped_bytes: int
    """Bytes moved to ``quarantine/`` (the torn or untrusted tail)."""
    quarantined: tuple[str, ...]
    """Files written under ``quarantine/``."""
    recovery_seq: int | None
    """``seq`` of the recovery record written, if any."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "repaired": self.repaired,
            "reason": self.reason,
            "last_good_seq": self.last_good_seq,
            "last_good_hash": self.last_good_hash,
            "dropped_bytes": self.dropped_bytes,
            "quarantined": list(self.quarantined),
            "recovery_seq": self.recovery_seq,
        }


def _copy_out(src: Path, offset: int, dest: Path) -> int:
    dest.parent.mkdir(parents=True, exist_ok=True)
    copied = 0
    with src.open("rb") as fin, dest.open("xb") as fout:
        fin.seek(offset)
        while chunk := fin.read(1 << 20):
            fout.write(chunk)
            copied += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return copied


def _quarantine(root: Path, brk: BreakInfo) -> tuple[list[str], int]:
    """Move every byte from the break on into ``quarantine/``; returns ``(files written, bytes moved)``."""
    stamp = str(os.getpid()) + "-" + digest(os.urandom(16))[:8]
    quarantine = root / QUARANTINE_DIR
    moved: list[str] = []
    dropped = 0
    segments = list_segments(root)
    break_index = next(index for index, path in segments if path.name == brk.segment)
    for index, path in segments:
        if index < break_index:
            continue
        if index == break_index:
            dest = quarantine / f"{path.name}.from-{brk.offset}.{stamp}.dropped"
            dropped += _copy_out(path, brk.offset, dest)
            moved.append(dest.name)
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, brk.offset)
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            dest = quarantine / f"{path.name}.{stamp}.dropped"
            quarantine.mkdir(parents=True, exist_ok=True)
            dropped += path.stat().st_size
            os.rename(path, dest)
            moved.append(dest.name)
    AuditIO().fsync_dir(str(root))
    return moved, dropped


def _append_recovery(
    target: Path, data: dict[str, Any], *, seq: int, prev_hash: str, key: bytes | None, pipeline: RecordPipeline
) -> None:
    """Chain the ``recovery`` record after the last good one and make it durable."""
    record = pipeline.build("recovery", data, request_id=None, principal=None, policy=None)
    sealed = chain(record, seq=seq, prev_hash=prev_hash, key=key)
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        os.write(fd, sealed.line)
        os.fsync(fd)
    finally:
        os.close(fd)


def repair_trail(
    directory: str | Path,
    *,
    key: bytes | None = None,
    host: str | None = None,
    code_max_bytes: int = 65536,
) -> RepairReport:
    """Seal a broken trail: cut everything from the first break on into ``quarantine/`` and append a
    ``recovery`` record chained to the last good one. An explicit operator action (``gateway audit repair``).

    Refuses when no record at all verifies under the given key and the break is an HMAC failure (a wrong key
    would otherwise quarantine the whole trail).
    """
    root = Path(directory)
    if not root.is_dir():
        raise AuditError(f"no audit trail directory at {root}")
    lock_fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        report = verify_trail(root, key=key, lock=False)
        if report.first_break is None:
            return RepairReport(False, "intact", report.last_seq, report.last_hash, 0, (), None)
        brk = report.first_break
        if brk.reason == "bad_hmac" and brk.seq == 1:
            raise AuditError(
                "the first record fails its HMAC: the key does not match this trail; refusing to quarantine it all"
            )
        last_seq, last_hash = brk.seq - 1, brk.prev_hash
        moved, dropped = _quarantine(root, brk)
        reason = f"{brk.reason} at seq {brk.seq} ({brk.segment} line {brk.line}): {brk.detail}"
        data = {
            "reason": reason,
            "dropped_bytes": dropped,
            "last_good_seq": last_seq,
            "last_good_hash": last_hash,
            "quarantined": moved,
        }
        pipeline = RecordPipeline(code_max_bytes=code_max_bytes, host=host)
        _append_recovery(root / brk.segment, data, seq=last_seq + 1, prev_hash=last_hash, key=key, pipeline=pipeline)
        return RepairReport(True, reason, last_seq, last_hash, dropped, tuple(moved), last_seq + 1)
    finally:
        os.close(lock_fd)

"""Verify a trail: recompute the chain across segments, streaming, in constant memory.

Each line is checked from the bytes on disk, never by re-serialising the record: the hashed body is the line
minus its fixed-length ``hash``/``hmac`` suffix (see :mod:`gateway.audit.canonical`), ``seq`` and
``prev_hash`` are read at known places in it. On the first anomaly a short look-ahead (and, for a gap, one
scan of the rest) names what happened:

``modified``   a record's bytes do not match its hash, or a record was altered and re-hashed (its
               successor still chains to the original hash)
``bad_hmac``   the hash matches but the HMAC does not (or is missing) under the given key: the chain was
               re-forged by someone without the key; or, with or without a key, a record's HMAC is missing
               while the records before it carry one (or the other way round): a trail is keyed throughout
               or not at all, so a mix is a record forged or stripped by someone without the key
``deleted``    records are missing (``seq`` jumps and the missing ones appear nowhere later)
``inserted``   an extra record sits in the chain
``duplicated`` a record appears twice
``reordered``  records (or whole segments) are out of order: the expected one appears later
``truncated``  the trail ends in a torn (incomplete) line, e.g. a writer killed mid-write

``first_break.seq`` is the first ``seq`` that cannot be trusted; every record before it verified, and
``records_checked`` counts them (the intact prefix). Removing whole records from the *end* of the trail leaves
a valid shorter chain and is not detectable from the trail alone: :mod:`gateway.audit.anchor` checks it
against a stored head.

Large trails are verified in parallel: each segment's internal chain is self-contained, so worker processes
(one per CPU) check whole segments, each on its own, and the parent stitches them in trail order (the first
record of a segment must carry the next ``seq`` and the previous segment's last ``hash``). At the first segment
that does not verify or stitch, the parent takes over in process from that segment's start with the chain
state it has reached, so the break it reports (seq, segment, line, reason, look-ahead) is exactly the one a
single pass reports. The per-line work itself is in :mod:`gateway.audit._scan`.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from gateway._workers import WorkerPool, pool_size
from gateway.audit._classify import REASONS, BreakInfo, Classifier, Line
from gateway.audit._scan import SegmentScan, decode_scan, scan_segment
from gateway.audit.canonical import GENESIS_HASH
from gateway.audit.segments import LOCK_NAME, list_segments
from gateway.errors import AuditError

__all__ = ["REASONS", "BreakInfo", "VerifyReport", "verify_trail"]


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Outcome of :func:`verify_trail`."""

    records_checked: int
    """Records in the intact prefix."""
    ok: bool
    first_break: BreakInfo | None
    last_seq: int
    """``seq`` of the last intact record (0 for an empty trail)."""
    last_hash: str
    """``hash`` of the last intact record (:data:`GENESIS_HASH` for an empty trail)."""
    segments: int
    """Segment files examined."""
    hmac_checked: bool
    """Whether HMACs were verified (a key was given)."""
    hmac_present: bool
    """Whether records carry HMACs (a keyed trail verified without its key has only its hashes checked)."""

    @property
    def hmac_status(self) -> str:
        """``checked`` (a key was given: every record's HMAC verified), ``not_checked`` (records carry HMACs but
        no key was given: anyone could have re-forged the chain), ``absent`` (no record carries one: the chain
        proves order and integrity only against someone who cannot recompute sha256, i.e. no one)."""
        if self.hmac_checked:
            return "checked"
        return "not_checked" if self.hmac_present else "absent"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hmac_status": self.hmac_status}


def _read_lines(lines: Iterator[bytes], segment: str, line_no: int, offset: int) -> Iterator[Line]:
    for raw in lines:
        line_no += 1
        yield Line(segment, line_no, offset, raw)
        offset += len(raw)


def _later(segments: list[tuple[Path, int | None]]) -> Iterator[Line]:
    for path, limit in segments:
        with path.open("rb") as fh:
            yield from _read_lines(fh if limit is None else _limited(fh, limit), path.name, 0, 0)


def _snapshot(root: Path, lock: bool) -> list[tuple[Path, int | None]]:
    """Segments and the size of the newest, read under a shared lock so no line is half written."""
    lock_fd = None
    if lock:
        try:
            lock_fd = os.open(root / LOCK_NAME, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            lock_fd = None  # no writer ever ran here, or the directory is read-only to us
    try:
        if lock_fd is not None:
            fcntl.flock(lock_fd, fcntl.LOCK_SH)
        segments = list_segments(root)
        out: list[tuple[Path, int | None]] = [(path, None) for _i, path in segments]
        if out:
            out[-1] = (out[-1][0], out[-1][0].stat().st_size)
        return out
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


@dataclass(slots=True)
class _Chain:
    """Where the chain stands after the segments verified so far."""

    expected: int = 1
    prev: bytes = GENESIS_HASH.encode("ascii")
    prev_prev: bytes | None = None  # hash of the record before the previous one
    p_name: str = ""  # where the previous record is
    p_line: int = 0
    p_off: int = 0
    hmac_present: bool = False
    keyed: bool | None = None  # whether the records verified so far carry an hmac (None: no record yet)

    def advance(self, name: str, scan: SegmentScan) -> None:
        """Move past the ``scan.lines`` records of ``name`` that verified."""
        self.hmac_present = self.hmac_present or scan.hmac_present
        if self.keyed is None and scan.lines > 0:
            self.keyed = scan.keyed
        if scan.lines == 0:
            return
        self.prev_prev = scan.before_last_hash if scan.lines > 1 else self.prev
        self.prev = scan.last_hash
        self.expected += scan.lines
        self.p_name, self.p_line, self.p_off = name, scan.lines, scan.last_offset

    def stitches(self, scan: SegmentScan) -> bool:
        """Whether a worker's segment verified on its own and its first record chains to the previous one."""
        if scan.broken:
            return False
        if scan.lines > 0 and self.keyed is not None and scan.keyed != self.keyed:
            return False  # the in-process pass names the first record that differs
        return scan.lines == 0 or (scan.first_seq == b"%d" % self.expected and scan.first_prev == self.prev)


_WORKER: Final = "from gateway.audit._scan import worker_main; raise SystemExit(worker_main())"


def _answer(data: bytes) -> SegmentScan | None:
    """A worker's answer: the segment's scan, or ``None`` when it could not read the segment."""
    return None if data == b"null" else decode_scan(data)


def _verify_parallel(
    segments: list[tuple[Path, int | None]],
    key: bytes | None,
    workers: int,
    state: _Chain,
    worker_pool: Callable[..., WorkerPool],
) -> int:
    """Verify segments in worker processes and stitch them in order; returns the position of the first segment
    that did not verify or stitch (``len(segments)`` when all did), for the in-process pass to take over there.

    The workers (:class:`~gateway._workers.WorkerPool`) take one segment at a time and stream it (constant
    memory); the key, if any, travels in the pool's head frame, never on a command line. Any failure (a worker
    cannot start or dies, a segment cannot be read) hands over to the in-process pass at that segment, which
    then reports or raises exactly as it would have. Workers still running when a break is found are killed.
    """
    position = 0
    head = json.dumps({"key": None if key is None else key.hex()}).encode("ascii")
    tasks = (json.dumps({"path": str(path), "limit": limit}).encode("utf-8") for path, limit in segments)
    try:
        with worker_pool(_WORKER, workers, head=head, name="verify worker") as pool:
            for scan in pool.map(tasks, _answer):
                if scan is None or not state.stitches(scan):
                    return position
                state.advance(segments[position][0].name, scan)
                position += 1
    except Exception:  # noqa: BLE001 - redone in process, where a real error (e.g. OSError) is raised as before
        return position
    return len(segments)


def verify_trail(
    directory: str | Path,
    *,
    key: bytes | None = None,
    lock: bool = True,
    workers: int | None = None,
    worker_pool: Callable[..., WorkerPool] = WorkerPool,
) -> VerifyReport:
    """Recompute the chain of the trail in ``directory``; stops at the first break.

    ``lock=False`` only for callers that already hold the trail lock (``repair``); either way the segment list
    and the size of the newest segment are snapshotted (under the shared lock by default) and nothing beyond
    that snapshot is read.

    ``workers``: processes that verify segments in parallel (at most ``os.cpu_count()``). ``None`` picks one
    per CPU for trails of several segments and at least :data:`~gateway._workers.PARALLEL_MIN_BYTES`, else
    verifies in process;
    ``1`` always verifies in process. The report is the same either way: the first break in trail order.
    ``worker_pool`` makes the workers' pool (:class:`~gateway._workers.WorkerPool`, or a test's own).
    """
    root = Path(directory)
    if not root.is_dir():
        raise AuditError(f"no audit trail directory at {root}")
    segments = _snapshot(root, lock)
    state = _Chain()
    count = pool_size(workers, [path for path, _limit in segments])
    start = _verify_parallel(segments, key, count, state, worker_pool) if count > 1 else 0
    for position in range(start, len(segments)):
        path, limit = segments[position]
        scan = scan_segment(str(path), limit, key, state.expected, state.prev, keyed=state.keyed)
        state.advance(path.name, scan)
        if scan.broken:
            return _broken(segments, position, key, scan, state)
    return VerifyReport(
        state.expected - 1,
        True,
        None,
        state.expected - 1,
        state.prev.decode("ascii"),
        len(segments),
        key is not None,
        state.hmac_present,
    )


def _broken(
    segments: list[tuple[Path, int | None]], position: int, key: bytes | None, scan: SegmentScan, state: _Chain
) -> VerifyReport:
    """Name the break found at line ``scan.lines + 1`` of segment ``position``, looking ahead as needed."""
    path, limit = segments[position]
    raw = scan.break_raw
    line_no = scan.lines + 1
    here = Line(path.name, line_no, scan.break_offset, raw)
    before = None if state.expected == 1 else Line(state.p_name, state.p_line, state.p_off, b"")
    after = scan.break_offset + len(raw)
    rest = _read_lines(_lines_from(path, after, limit), path.name, line_no, after)
    brk = Classifier(_chain(rest, _later(segments[position + 1 :])), key, state.keyed).classify(
        here,
        state.expected,
        state.prev.decode("ascii"),
        None if state.prev_prev is None else state.prev_prev.decode("ascii"),
        before,
    )
    return VerifyReport(
        brk.seq - 1, False, brk, brk.seq - 1, brk.prev_hash, len(segments), key is not None, state.hmac_present
    )


def _lines_from(path: Path, offset: int, limit: int | None) -> Iterator[bytes]:
    """The lines of a segment from ``offset`` (up to ``limit`` bytes of the file when given)."""
    with path.open("rb") as fh:
        fh.seek(offset)
        yield from (fh if limit is None else _limited(fh, limit - offset))


def _limited(lines: Iterator[bytes], limit: int) -> Iterator[bytes]:
    """The lines of the newest segment up to the size snapshotted under the lock (a last partial line cut)."""
    offset = 0
    for whole in lines:
        if offset + len(whole) > limit:
            if offset < limit:
                yield whole[: limit - offset]
            return
        offset += len(whole)
        yield whole


def _chain(first: Iterator[Line], second: Iterator[Line]) -> Iterator[Line]:
    yield from first
    yield from second

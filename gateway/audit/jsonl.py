"""The hash-chained, append-only JSONL audit trail.

Layout of a trail directory (see ``audit/README.md``)::

    trail-000001.jsonl   segments, one sealed record per line, rotated by size
    trail-000002.jsonl   the first record of a segment chains to the last of the previous one
    .lock                flock(2): writers exclusive, verifiers shared
    .interrupted.lock    flock(2): one start at a time marks a dead writer's open runs (:mod:`.interrupted`)
    quarantine/          bytes cut off by ``repair`` (:mod:`gateway.audit.repair`; evidence, never deleted)

Every ``append`` builds its record (the record pipeline), then runs, under a thread lock and the directory's
file lock: re-read the tail if another process wrote since (so ``seq`` is contiguous across processes; only the
last record, through the open segment, when the other one appended to it), chain, write the line with one
``O_APPEND`` write, and ``fsync`` — or, with ``group_commit``, leave the fsync to one leader thread that
syncs every record written so far; ``append`` still returns only once its record is durable. A writer with
several records at once (a decision worker's batch) builds each (``build``) and appends them together
(``append_built``): one hold of the locks and one look at the tail for them all.

Fail closed: any failure (directory missing or read-only, disk full, lock failure, fsync error, broken
tail) raises :class:`~gateway.errors.AuditUnavailableError`. A failed write is rolled back with
``ftruncate`` so the trail stays well formed; when even that fails the writer refuses all further appends.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Self

from gateway.audit.canonical import (
    GENESIS_HASH,
    CanonicalError,
    LineError,
    digest,
    extract_prev_hash,
    extract_seq,
    mac,
    split_line,
)
from gateway.audit.interface import AuditReceipt
from gateway.audit.pipeline import Record, RecordPipeline, SealedRecord, chain, stamper, utc_timestamp
from gateway.audit.segments import LOCK_NAME, AuditIO, key_from_env, list_segments, resolve_directory, segment_name
from gateway.errors import AuditError, AuditIntegrityError, AuditSpaceError, AuditUnavailableError
from gateway.sizes import SizeError, parse_size

__all__ = [
    "DEFAULT_MIN_FREE",
    "NEW_WORK_EVENTS",
    "RESERVE_EVENTS",
    "JsonlAuditTrail",
    "TailState",
    "Watermark",
    "min_free_bytes",
    "read_tail",
]

DEFAULT_MIN_FREE: Final = "64m|1%"
"""The default free-space watermark: 64 MiB, or 1 % of the file system when that is smaller (a small disk)."""
NEW_WORK_EVENTS: Final = frozenset(
    {
        "request.received",
        "request.invalid",
        "policy.decision",
        "session.created",
        "session.file.put",
        "session.file.get",
        "approval.requested",
        "approval.granted",
        "approval.denied",
        "approval.used",
        "approval.refused",
    }
)
"""Records that start new work (an approval's records lead to a run, or are an operator's action on one); below
the watermark they are refused (:class:`AuditSpaceError`), and the caller fails closed (507)."""
RESERVE_EVENTS: Final = frozenset(
    {
        "execution.outcome", "image.pulled", "network.connection", "container.left", "containers.reaped", "recovery",
        "gateway.stop", "gateway.start", "policy.loaded", "policy.reloaded", "policy.rejected", "session.expired",
        "session.closed", "session.killed",
    }
)  # fmt: skip
"""The only records written below the watermark, into the space kept in reserve: those that finish work already
started (a run's pulled image, connections and outcome, the sandboxes reaped or left, a session's end, a recovery,
the stop record) and the service's own start and (re)loads, which only an operator causes. Every other record is
refused there (:class:`AuditSpaceError`): new work (:data:`NEW_WORK_EVENTS`), and what any client can cause at will
without starting anything (``auth.failed``, ``auth.forbidden``, ``request.refused``), whose writers drop it; each
refusal is reported to :attr:`JsonlAuditTrail.on_low_space` (the service counts them in ``/metrics``)."""

_TAIL_CHUNK = 65536


@dataclass(frozen=True, slots=True)
class TailState:
    """Where the chain ends on disk."""

    index: int
    """Index of the newest segment (0 when the directory holds none)."""
    size: int
    """Size in bytes of that segment."""
    seq: int
    """``seq`` of the last record (0 for an empty trail)."""
    hash: str
    """``hash`` of the last record (:data:`GENESIS_HASH` for an empty trail)."""
    keyed: bool | None
    """Whether the last record carries an ``hmac`` (``None`` for an empty trail)."""


def _last_line(fd: int, size: int) -> bytes:
    """The last line of a file whose last byte is a newline, reading backwards in chunks."""
    end = size - 1  # skip the final newline
    pieces: list[bytes] = []
    pos = end
    while pos > 0:
        start = max(0, pos - _TAIL_CHUNK)
        chunk = os.pread(fd, pos - start, start)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            pieces.append(chunk[cut + 1 :])
            break
        pieces.append(chunk)
        pos = start
    pieces.reverse()
    return b"".join(pieces) + b"\n"


def _integrity(message: str) -> AuditUnavailableError:
    """A broken trail refuses appends: unavailable for the caller, integrity as the cause."""
    cause = AuditIntegrityError(message)
    error = AuditUnavailableError(
        f"the audit trail is broken and will not be extended: {message}", hint=AuditIntegrityError.hint
    )
    error.__cause__ = cause
    return error


def _last_record(fd: int, size: int, name: str, key: bytes | None, check_key: bool) -> tuple[int, str, bool]:
    """``seq``, ``hash`` and whether it is keyed, of the last record of the segment open as ``fd`` (``size``
    bytes, not empty), checked: a torn line, a line that is not a sealed record, a wrong hash or HMAC raise."""
    if os.pread(fd, 1, size - 1) != b"\n":
        raise _integrity(f"{name} ends with a torn (incomplete) line")
    line = _last_line(fd, size)
    try:
        body, stored_hash, stored_mac = split_line(line)
        seq = extract_seq(body)
        extract_prev_hash(body)
    except LineError as exc:
        raise _integrity(f"the last line of {name} is not a sealed record ({exc})") from None
    if digest(body) != stored_hash:
        raise _integrity(f"the last record of {name} (seq {seq}) does not match its hash")
    if check_key:
        if key is not None and stored_mac is None:
            raise _integrity("a key is configured but the trail was written without one; start a new directory")
        if key is None and stored_mac is not None:
            raise _integrity("the trail is keyed (HMAC); configure its key (GATEWAY_AUDIT_KEY_FILE)")
        if key is not None and stored_mac is not None and mac(key, body) != stored_mac:
            raise _integrity(f"the last record of {name} (seq {seq}) fails its HMAC (wrong key?)")
    return seq, stored_hash, stored_mac is not None


def read_tail(directory: Path, key: bytes | None, *, check_key: bool = True) -> TailState:
    """Read and check the end of the chain: a torn or altered last record raises (the writer refuses)."""
    segments = list_segments(directory)
    if not segments:
        return TailState(0, 0, 0, GENESIS_HASH, None)
    newest_index, newest_path = segments[-1]
    newest_size = newest_path.stat().st_size
    for _index, path in reversed(segments):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            seq, stored_hash, keyed = _last_record(fd, size, path.name, key, check_key)
        finally:
            os.close(fd)
        return TailState(newest_index, newest_size, seq, stored_hash, keyed)
    return TailState(newest_index, newest_size, 0, GENESIS_HASH, None)


@dataclass(frozen=True, slots=True)
class Watermark:
    """A free-space watermark as parsed once (see :func:`min_free_bytes`): sizes and percentages, the smallest
    of which applies."""

    sizes: tuple[int, ...]
    """Sizes in bytes."""
    percents: tuple[float, ...]
    """Percentages (0 to 100) of the file system's size."""

    @classmethod
    def parse(cls, spec: str | int) -> Watermark:
        """``spec`` as :func:`min_free_bytes` reads it; raises :class:`ValueError` with what was wrong."""
        if isinstance(spec, int):
            if spec < 0:
                raise ValueError(f"the free-space watermark must be >= 0 bytes, got {spec}")
            return cls((spec,), ())
        sizes: list[int] = []
        percents: list[float] = []
        for part in spec.strip().split("|"):
            item = part.strip()
            if item.endswith("%"):
                try:
                    percent = float(item[:-1])
                except ValueError:
                    percent = -1.0
                if not 0 <= percent <= 100:
                    raise ValueError(f"{item!r} is not a percentage between 0% and 100%")
                percents.append(percent)
            else:
                try:
                    sizes.append(parse_size(item))
                except SizeError as exc:
                    raise ValueError(f"{item!r}: {exc}; or a percentage such as 1%") from None
        return cls(tuple(sizes), tuple(percents))

    def bytes_for(self, total: int) -> int:
        """The watermark in bytes for a file system of ``total`` bytes."""
        return min([*self.sizes, *(int(total * percent / 100) for percent in self.percents)])


def min_free_bytes(spec: str | int, total: int) -> int:
    """The watermark in bytes for a file system of ``total`` bytes: ``spec`` is a size (``64m``, bytes), a
    percentage (``1%``), or several joined by ``|`` of which the smallest applies; ``0`` turns it off.

    Raises :class:`ValueError` with what was wrong for anything else.
    """
    return Watermark.parse(spec).bytes_for(total)


def _unavailable(action: str, exc: OSError) -> AuditUnavailableError:
    reason = exc.strerror or errno.errorcode.get(exc.errno or 0, str(exc))
    return AuditUnavailableError(f"cannot {action}: {reason}")


class JsonlAuditTrail:
    """Append-only, hash-chained JSONL segments in one directory; safe across threads and processes."""

    def __init__(
        self,
        directory: str | Path,
        *,
        key: bytes | None = None,
        segment_max_bytes: int = 64 << 20,
        group_commit: bool = False,
        code_max_bytes: int = 65536,
        host: str | None = None,
        io: AuditIO | None = None,
        min_free: str | int = DEFAULT_MIN_FREE,
        clock: Callable[[], datetime] | None = None,
        id_factory: Callable[[], str] | None = None,
    ) -> None:
        if segment_max_bytes <= 0:
            raise ValueError("segment_max_bytes must be positive")
        self.min_free = min_free
        """Free-space watermark of the trail's file system (see :func:`min_free_bytes`); below it only the records
        of :data:`RESERVE_EVENTS` are written."""
        self.on_low_space: Callable[[str], None] | None = None
        """Called with the event type of each record refused below the watermark (set by the service, which
        counts them in ``/metrics``: the refusal records it drops are not lost without a trace)."""
        self._watermark = Watermark.parse(min_free)  # a bad watermark is refused here, not at the first request
        self.directory = Path(directory)
        self._protected = (os.path.realpath(self.directory),)
        self.key = key
        self.segment_max_bytes = segment_max_bytes
        self.group_commit = group_commit
        self._pipeline = RecordPipeline(code_max_bytes=code_max_bytes, host=host)
        if id_factory is not None:
            self._pipeline.processors[-1] = stamper(host, id_factory)
        self._clock = clock
        """Where record times come from (``None``: the system clock); a fixed clock and ``id_factory`` make a
        trail whose records are the same on every run (golden tests of reports), written by this very code."""
        self._io = io if io is not None else AuditIO()
        self._lock = threading.Lock()  # serialises writers of this instance; taken before the file lock
        self._sync = threading.Condition(threading.Lock())  # group commit state below
        self._written_gen = 0
        self._durable_gen = 0
        self._syncing = False
        self._failed: str | None = None
        self._closed = False
        self._pid = -1
        self._lock_fd: int | None = None
        self._fd: int | None = None
        self._tail: TailState | None = None

    @classmethod
    def from_env(cls, directory: str | Path | None = None, **kwargs: Any) -> JsonlAuditTrail:
        """Directory: argument > ``GATEWAY_AUDIT_DIR`` > ``./audit``; key: ``GATEWAY_AUDIT_KEY_FILE`` or
        ``GATEWAY_AUDIT_KEY`` (hex) when set; code kept: ``GATEWAY_AUDIT_CODE_MAX_BYTES`` (default 65536);
        free-space watermark: ``GATEWAY_AUDIT_MIN_FREE`` (default ``64m|1%``: 64 MiB or 1 %, the smaller)."""
        min_free = os.environ.get("GATEWAY_AUDIT_MIN_FREE")
        if min_free is not None and "min_free" not in kwargs:
            try:
                min_free_bytes(min_free, 1 << 40)
            except ValueError as exc:
                raise AuditUnavailableError(f"GATEWAY_AUDIT_MIN_FREE={min_free!r}: {exc}") from None
            kwargs["min_free"] = min_free
        raw = os.environ.get("GATEWAY_AUDIT_CODE_MAX_BYTES")
        if raw is not None and "code_max_bytes" not in kwargs:
            if not raw.isdigit():
                raise AuditUnavailableError(
                    f"GATEWAY_AUDIT_CODE_MAX_BYTES={raw!r}: expected a whole number of bytes (0 keeps no code)"
                )
            kwargs["code_max_bytes"] = int(raw)
        return cls(resolve_directory(directory), key=key_from_env(), **kwargs)

    # --- public -------------------------------------------------------------------------------------

    def append(
        self,
        event_type: str,
        data: Mapping[str, Any],
        *,
        request_id: str | None = None,
        principal: str | None = None,
        policy: Mapping[str, str] | None = None,
        durable: bool = True,
    ) -> AuditReceipt:
        record = self.build(event_type, data, request_id=request_id, principal=principal, policy=policy)
        (receipt,) = self.append_built([record], durable=durable)
        return receipt

    def build(
        self,
        event_type: str,
        data: Mapping[str, Any],
        *,
        request_id: str | None = None,
        principal: str | None = None,
        policy: Mapping[str, str] | None = None,
    ) -> Record:
        """The record one :meth:`append` would write, before it is chained: stamped, its data copied into plain
        JSON, redacted and bounded (the record pipeline). For a writer that appends several records in one
        :meth:`append_built`. Raises :class:`AuditUnavailableError` when the record cannot be built."""
        try:
            return self._pipeline.build(event_type, data, request_id=request_id, principal=principal, policy=policy)
        except (CanonicalError, KeyError, TypeError) as exc:
            raise AuditUnavailableError(f"cannot build the {event_type!r} audit record: {exc}") from exc

    def append_built(self, records: Sequence[Record], *, durable: bool = True) -> list[AuditReceipt]:
        """Chain and write records made by :meth:`build`, in order, under one hold of the trail's locks: one
        look at the tail (another process may have moved it) and one free-space check for them all, so a
        writer that decides many requests takes turns on a shared trail once per batch, not once per record.
        ``durable`` as for :meth:`append` (one fsync covers them all). Below the free-space watermark, no record
        is written when any of them is not one of :data:`RESERVE_EVENTS`. When a write fails, the records
        before it are in the trail (not yet durable: :meth:`sync`, or the next durable append, flushes them)."""
        if not records:
            return []
        with self._lock:
            if self._closed:
                raise AuditUnavailableError("the audit trail is closed")
            if self._failed is not None:
                raise AuditUnavailableError(f"the audit trail failed earlier and refuses appends: {self._failed}")
            self._ensure_open()
            unreserved = next((r["event_type"] for r in records if r["event_type"] not in RESERVE_EVENTS), None)
            if unreserved is not None:
                self._check_space(unreserved)
            written, generation = self._append_locked(records, durable=durable)
        if self.group_commit and durable:
            self._await_durable(generation)
        return [AuditReceipt(s.record["event_id"], s.record["seq"], s.hash, name) for s, name in written]

    def sync(self) -> None:
        """Make every record this instance has written durable: one fsync covers them all.

        For a writer that batches: it appends each record with ``durable=False``, then calls ``sync`` once
        before it acts on (or answers for) any of them. Raises :class:`AuditUnavailableError` when the records
        cannot be made durable (the trail then refuses further appends, as after any failed fsync)."""
        with self._lock:
            if self._failed is not None:
                raise AuditUnavailableError(f"the audit trail failed earlier and refuses appends: {self._failed}")
            generation = self._written_gen
        self._await_durable(generation)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._retire_segment()
            finally:
                self._close_fd("_lock_fd")

    @property
    def protected_paths(self) -> tuple[str, ...]:
        """The trail directory as resolved when the trail last opened something in it (created, then every
        lock file, segment and re-read tail): segments, lock file and quarantine all live under it."""
        return self._protected

    def _resolve_directory(self) -> None:
        """Resolve the directory again right after an open through its path: where that open went."""
        self._protected = (os.path.realpath(self.directory),)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- internals (all called with self._lock held) --------------------------------------------------

    def _close_fd(self, attr: str) -> None:
        fd = getattr(self, attr)
        setattr(self, attr, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _ensure_open(self) -> None:
        if self._pid != os.getpid():  # first use, or a forked child: never share the parent's lock
            self._lock_fd = None
            self._fd = None
            self._tail = None
            self._pid = os.getpid()
        if self._lock_fd is None:
            try:
                self._io.mkdir(str(self.directory))
                self._lock_fd = self._io.open(str(self.directory / LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o640)
            except OSError as exc:
                raise _unavailable(f"open the audit directory {self.directory}", exc) from exc
            self._resolve_directory()

    def space(self) -> tuple[int, int]:
        """The trail's file system's free bytes and its watermark in bytes; :class:`AuditUnavailableError` when
        they cannot be read."""
        try:
            fs = os.statvfs(self.directory)
        except OSError as exc:
            raise _unavailable(f"check the free space of {self.directory}", exc) from exc
        return fs.f_bavail * fs.f_frsize, self._watermark.bytes_for(fs.f_blocks * fs.f_frsize)

    def _check_space(self, event_type: str) -> None:
        """Refuse a record outside :data:`RESERVE_EVENTS` when the trail's file system is below its watermark."""
        free, watermark = self.space()
        if free < watermark:
            if self.on_low_space is not None:
                self.on_low_space(event_type)
            what = f"new work ({event_type})" if event_type in NEW_WORK_EVENTS else f"the {event_type} record"
            raise AuditSpaceError(
                f"refusing {what}: the audit trail's file system ({self.directory}) has {free} bytes free, below "
                f"its watermark of {watermark} bytes ({self.min_free}); the space left is kept for the outcomes of "
                "runs in flight; free space there or move the trail (--audit-dir)"
            )

    def _segment_path(self, index: int) -> Path:
        return self.directory / segment_name(index)

    def _tail_in_segment(self, tail: TailState) -> TailState | None:
        """Where the chain ends, when it still ends in the segment this instance has open (still linked, no
        other process started the next one): ``tail`` itself when nobody wrote since, else the record another
        writer (a process on the same trail) appended last, checked as :func:`read_tail` checks it, read through
        this instance's own descriptor. None otherwise: the whole tail is read again."""
        if self._fd is None or tail.index == 0:
            return None
        st = os.fstat(self._fd)
        if st.st_nlink == 0 or st.st_size < tail.size:
            return None
        if os.path.exists(os.path.join(self.directory, segment_name(tail.index + 1))):
            return None
        if st.st_size == tail.size:
            return tail
        seq, last_hash, keyed = _last_record(self._fd, st.st_size, segment_name(tail.index), self.key, True)
        return TailState(tail.index, st.st_size, seq, last_hash, keyed)

    def _sync_tail(self) -> TailState:
        if self._tail is not None and (tail := self._tail_in_segment(self._tail)) is not None:
            self._tail = tail
            return tail
        self._retire_segment()
        tail = read_tail(self.directory, self.key)
        if tail.index == 0:
            tail = TailState(1, 0, tail.seq, tail.hash, tail.keyed)
            self._fd = self._create_segment(1)
        else:
            # Readable too: another writer's last record is checked through it (_tail_in_segment).
            self._fd = self._io.open(str(self._segment_path(tail.index)), os.O_RDWR | os.O_APPEND)
            self._resolve_directory()
        self._tail = tail
        return tail

    def _create_segment(self, index: int) -> int:
        fd = self._io.open(str(self._segment_path(index)), os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o640)
        self._resolve_directory()
        self._io.fsync_dir(str(self.directory))
        return fd

    def _retire_segment(self) -> None:
        """Make what this instance wrote to the current segment durable, then close it."""
        if self._fd is None:
            return
        try:
            if self._written_gen > self._durable_gen:
                self._io.fsync(self._fd)
                with self._sync:
                    self._durable_gen = self._written_gen
                    self._sync.notify_all()
        except OSError as exc:
            self._fail(f"fsync failed: {exc.strerror}")
            raise _unavailable("fsync the audit segment", exc) from exc
        finally:
            self._close_fd("_fd")

    def _fail(self, reason: str) -> None:
        self._failed = reason
        with self._sync:
            self._sync.notify_all()

    def _append_locked(self, records: Sequence[Record], *, durable: bool) -> tuple[list[tuple[SealedRecord, str]], int]:
        lock_fd = self._lock_fd
        if lock_fd is None:
            raise AuditUnavailableError("the audit lock file is not open")
        try:
            self._io.flock(lock_fd, fcntl.LOCK_EX)
        except OSError as exc:
            raise _unavailable("lock the audit trail", exc) from exc
        try:
            try:
                self._sync_tail()
            except AuditError:
                raise
            except OSError as exc:
                raise _unavailable(f"open the audit trail in {self.directory}", exc) from exc
            written = [self._write_record(record) for record in records]
            fd = self._fd
            if not self.group_commit and durable and fd is not None:  # without group commit: flushed here
                try:
                    self._io.fsync(fd)
                except OSError as exc:
                    self._fail(f"fsync failed: {exc.strerror}")
                    raise _unavailable("fsync the audit segment", exc) from exc
                self._durable_gen = self._written_gen
            return written, self._written_gen
        finally:
            try:
                self._io.flock(lock_fd, fcntl.LOCK_UN)
            except OSError:
                self._fail("cannot release the audit lock")

    def _write_record(self, record: Record) -> tuple[SealedRecord, str]:
        """Chain one record to the tail (``self._tail``, current under the file lock) and write it, starting the
        next segment first when it would not fit in this one."""
        tail = self._tail
        if tail is None:
            raise AuditUnavailableError("the audit trail's tail is unknown")
        try:
            stamp = None if self._clock is None else utc_timestamp(self._clock())
            sealed = chain(record, seq=tail.seq + 1, prev_hash=tail.hash, key=self.key, timestamp=stamp)
        except CanonicalError as exc:
            raise AuditUnavailableError(f"cannot serialise the audit record: {exc}") from exc
        line = sealed.line
        if tail.size > 0 and tail.size + len(line) > self.segment_max_bytes:
            self._retire_segment()
            try:
                self._fd = self._create_segment(tail.index + 1)
            except OSError as exc:
                raise _unavailable("create a new audit segment", exc) from exc
            tail = TailState(tail.index + 1, 0, tail.seq, tail.hash, tail.keyed)
            self._tail = tail
        self._write(line, tail.size)
        self._tail = TailState(tail.index, tail.size + len(line), tail.seq + 1, sealed.hash, self.key is not None)
        self._written_gen += 1
        return sealed, segment_name(tail.index)

    def _write_all(self, fd: int, line: bytes) -> None:
        view = memoryview(line)
        while view:
            written = self._io.write(fd, view)
            if written <= 0:
                raise OSError(errno.EIO, "short write")
            view = view[written:]

    def _write(self, line: bytes, start_size: int) -> int:
        fd = self._fd
        if fd is None:
            raise AuditUnavailableError("no audit segment is open")
        try:
            self._write_all(fd, line)
        except OSError as exc:
            try:
                self._io.ftruncate(fd, start_size)  # roll back a partial line: the trail stays well formed
            except OSError as trunc_exc:
                self._fail(f"write failed and could not be rolled back: {trunc_exc.strerror}")
            self._tail = None  # re-read the tail next time
            with contextlib.suppress(AuditUnavailableError):  # a failed fsync fails the trail (sync raises then)
                self._retire_segment()  # what this instance wrote before, not waited for, is made durable
            raise _unavailable("write the audit record", exc) from exc
        return fd

    # --- group commit ---------------------------------------------------------------------------------

    def _await_durable(self, generation: int) -> None:
        while True:
            with self._sync:
                while True:
                    if self._durable_gen >= generation:
                        return
                    if self._failed is not None:
                        raise AuditUnavailableError(f"the audit record could not be made durable: {self._failed}")
                    if not self._syncing:
                        self._syncing = True
                        break
                    self._sync.wait()
            try:
                with self._lock:
                    fd = os.dup(self._fd) if self._fd is not None else None
                    target = self._written_gen
                if fd is not None:
                    try:
                        self._io.fsync(fd)
                    finally:
                        os.close(fd)
            except OSError as exc:
                with self._sync:
                    self._failed = f"fsync failed: {exc.strerror}"
                    self._syncing = False
                    self._sync.notify_all()
                raise _unavailable("fsync the audit segment", exc) from exc
            with self._sync:
                self._durable_gen = max(self._durable_gen, target)
                self._syncing = False
                self._sync.notify_all()

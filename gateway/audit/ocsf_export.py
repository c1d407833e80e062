"""The OCSF export: the verified records of one or several trails as OCSF JSON lines, in constant memory.

Each trail is verified first (:func:`~gateway.audit.verify.verify_trail`) and only the records that verified are
mapped (:mod:`gateway.audit.ocsf`) and written: over a broken chain the intact prefix is written, and its
:class:`ExportReport` says where the chain broke, so that the caller (``gateway audit export``) says so and exits
non-zero. Several trails are merged by time. One large trail is exported in pieces of segments by the package's
worker pool (:class:`gateway._workers.WorkerPool`), each piece into a temporary file copied to the output in
trail order: the same bytes as in process.
"""

from __future__ import annotations

import gc
import heapq
import json
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final

from gateway._workers import WorkerError, WorkerPool, pool_size, serve
from gateway.audit.ocsf import OcsfMapper
from gateway.audit.query import QueryFilters
from gateway.audit.records import AuditRecordView, view_record
from gateway.audit.segments import list_segments
from gateway.audit.verify import VerifyReport, verify_trail
from gateway.errors import AuditError, AuditIntegrityError, GatewayError

_orjson: Any
try:  # the `siem` extra: faster to read records and write events than the json module
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    _orjson = None

__all__ = ["PIECE_BYTES", "ExportReport", "event_line", "export_ocsf", "worker_main"]


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What :func:`export_ocsf` did with one trail."""

    trail: Path
    trail_id: str | None
    """``event_id`` of the trail's first record (``None`` for an empty trail)."""
    verification: VerifyReport
    exported: int
    """Events written from this trail (the verified records within the time window)."""

    @property
    def intact(self) -> bool:
        return self.verification.ok


def _parse(raw: bytes) -> Any:
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass  # e.g. an integer beyond 64 bits, which orjson refuses and the json module reads
    return json.loads(raw)


_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode


def event_line(event: Mapping[str, Any]) -> bytes:
    """One event as a JSON line (UTF-8, compact, newline-terminated)."""
    if _orjson is not None:
        try:
            line: bytes = _orjson.dumps(event, option=_orjson.OPT_APPEND_NEWLINE)
        except TypeError:
            pass  # e.g. an integer beyond 64 bits copied from a record
        else:
            return line
    return _encode(event).encode("utf-8") + b"\n"


def _verified_records(root: Path, count: int) -> Iterator[dict[str, Any]]:
    """The first ``count`` records of the trail in segment order: exactly the ones verify checked."""
    if count <= 0:
        return
    left = count
    for _index, path in list_segments(root):
        with path.open("rb", buffering=1 << 20) as fh:
            for raw in fh:
                record = _parse(raw)
                if not isinstance(record, dict):  # pragma: no cover - verify checked each line
                    raise AuditError(f"{path}: not a JSON object")
                yield record
                left -= 1
                if left == 0:
                    return


def _trail_id(root: Path, report: VerifyReport) -> str | None:
    first = next(_verified_records(root, min(1, report.records_checked)), None)
    if first is None:
        return None
    event_id = first.get("event_id")
    return event_id if isinstance(event_id, str) else None


# --- one large trail, in pieces, in workers --------------------------------------------------------------

PIECE_BYTES: Final = 16 << 20
"""A segment (64 MiB by default) is exported in pieces of about this many bytes: with whole segments as tasks,
two workers over a trail of five segments would export three against two, one of them waiting at the end."""


@dataclass(frozen=True, slots=True)
class _Task:
    """A piece of one segment to export: the lines that start at byte ``start`` or later and before ``end``
    (to the end of the file: ``None``), at most ``max_lines`` of them (all: ``None``), with ``seq`` up to
    ``max_seq``."""

    path: Path
    max_lines: int | None
    max_seq: int
    start: int = 0
    end: int | None = None


def _plan(root: Path, report: VerifyReport) -> list[_Task]:
    """The pieces of the segments holding the verified prefix: every segment before the break, in pieces of
    about :data:`PIECE_BYTES`, then the break's segment up to its line (whole: its lines are counted from its start).

    Without a break the newest segment may have grown since it was verified (and new segments may have
    been started): each segment's last piece runs to the end of the file, and ``max_seq`` (the last verified
    seq) keeps the records appended since out.
    """
    tasks: list[_Task] = []
    brk = report.first_break
    piece = PIECE_BYTES
    for _index, path in list_segments(root):
        if brk is not None and path.name == brk.segment:
            if brk.line > 1:
                tasks.append(_Task(path, brk.line - 1, report.last_seq))
            break
        try:
            size = path.stat().st_size
        except OSError:
            size = 0  # one task: the worker reports what is wrong with the file
        cuts = list(range(0, size - piece // 2, piece)) or [0]  # no piece under half the size
        tasks.extend(
            _Task(path, None, report.last_seq, at, cuts[n + 1] if n + 1 < len(cuts) else None)
            for n, at in enumerate(cuts)
        )
    return tasks


def _export_segment(task: _Task, out: BinaryIO, trail: str, window: QueryFilters, mapper: OcsfMapper) -> int:
    """Write the events of the verified records of one piece of a segment; returns how many."""
    count = taken = 0
    windowed = window.since is not None or window.until is not None
    with task.path.open("rb", buffering=1 << 20) as fh:
        at = task.start
        if at > 0:  # the line holding byte start - 1 belongs to the piece before
            fh.seek(at - 1)
            at += len(fh.readline()) - 1
        for raw in fh:
            if (task.max_lines is not None and taken >= task.max_lines) or (task.end is not None and at >= task.end):
                break
            at += len(raw)
            taken += 1
            record = _parse(raw)
            if not isinstance(record, dict):  # pragma: no cover - verify checked each line
                raise AuditError(f"{task.path}: the line ending at byte {at} is not a JSON object")
            seq = record.get("seq")
            if isinstance(seq, int) and seq > task.max_seq:
                break  # appended after verification
            if windowed and not window.matches(record):
                continue
            out.write(event_line(mapper.event(view_record(record), trail)))
            count += 1
    return count


_WORKER: Final = "from gateway.audit.ocsf_export import worker_main; raise SystemExit(worker_main())"


def worker_main() -> int:
    """An export worker (:func:`gateway._workers.serve`): the head is ``{"trail", "since", "until"}``, each task
    one piece (``path``, ``max_lines``, ``max_seq``, ``start``, ``end``, ``out``), whose events it writes to
    ``out``, answered with ``{"count": N}`` or ``{"error": TEXT}``."""

    def start(head: bytes) -> Callable[[bytes], bytes]:
        given = json.loads(head)
        trail, window = given["trail"], QueryFilters(since=given["since"], until=given["until"])
        mapper = OcsfMapper()
        # The worker's modules live as long as it does: frozen out of the collector's reach, the collections that
        # the records' short-lived dicts trigger scan only those (~3 % of the export's CPU per record).
        gc.freeze()

        def piece(data: bytes) -> bytes:
            task = json.loads(data)
            try:
                with open(task["out"], "wb", buffering=1 << 20) as out:
                    part = _Task(Path(task["path"]), task["max_lines"], task["max_seq"], task["start"], task["end"])
                    answer: dict[str, Any] = {"count": _export_segment(part, out, trail, window, mapper)}
            except (GatewayError, OSError, ValueError) as exc:
                error = exc.diagnostics() if isinstance(exc, GatewayError) else f"{type(exc).__name__}: {exc}"
                answer = {"error": error}
            return json.dumps(answer).encode("utf-8")

        return piece

    return serve(start)


def _answer(data: bytes) -> int | str:
    """A worker's answer: the events it wrote, or the error that stopped it (a record without the schema's shape)."""
    answer = json.loads(data)
    if isinstance(answer, dict) and isinstance(answer.get("count"), int):
        return int(answer["count"])
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        return str(answer["error"])
    raise ValueError("neither a count nor an error")


def _export_parallel(
    tasks: list[_Task],
    out: BinaryIO,
    *,
    trail: str,
    window: QueryFilters,
    workers: int,
    on_progress: Callable[[int], None] | None,
) -> int:
    """Export pieces of segments in worker processes, each into a temporary file, and copy the files to ``out``
    in trail order. At most two pieces per worker are exported ahead of the one being copied, so the temporary
    files stay bounded. A worker's error (a malformed record) stops the export with that error, once the pieces
    before it are written; a worker that fails stops it with an :class:`AuditError` naming the worker and piece."""
    head = json.dumps({"trail": trail, "since": window.since, "until": window.until}).encode("utf-8")
    scratch = Path(tempfile.mkdtemp(prefix="gateway-export-"))
    orders = (
        json.dumps(
            {
                "path": str(task.path),
                "max_lines": task.max_lines,
                "max_seq": task.max_seq,
                "start": task.start,
                "end": task.end,
                "out": str(scratch / f"{n}.jsonl"),
            }
        ).encode("utf-8")
        for n, task in enumerate(tasks)
    )
    written = 0
    try:
        with WorkerPool(_WORKER, workers, head=head, ahead=2, name="export worker") as pool:
            for n, answer in enumerate(pool.map(orders, _answer)):
                if isinstance(answer, str):
                    raise AuditIntegrityError(f"{tasks[n].path}: {answer}")
                part = scratch / f"{n}.jsonl"
                with part.open("rb") as fh:
                    shutil.copyfileobj(fh, out, 1 << 20)
                part.unlink()
                written += answer
                if on_progress is not None:
                    on_progress(written)
    except WorkerError as exc:
        where = f" while exporting {tasks[exc.task].path}" if exc.task is not None else ""
        raise AuditError(f"the export stopped: {exc}{where}") from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return written


def export_ocsf(
    directories: Iterable[str | Path],
    out: BinaryIO,
    *,
    since: str | None = None,
    until: str | None = None,
    key: bytes | None = None,
    on_progress: Callable[[int], None] | None = None,
    workers: int | None = None,
) -> list[ExportReport]:
    """Write the verified records of every trail in ``directories`` to ``out`` as OCSF JSON lines.

    Each trail is verified first (with ``key``, when given); only its intact prefix is exported, so an event
    in the output is one that verified. ``since`` (inclusive) and ``until`` (exclusive) are trail timestamps
    (:func:`~gateway.audit.query.parse_time`). Several trails are merged by time (then trail order, then
    seq), holding one record per trail in memory. One large trail (:data:`~gateway._workers.PARALLEL_MIN_BYTES`,
    several segments) is exported by ``workers`` processes (default: one per CPU; ``1``: in process), in pieces
    of :data:`PIECE_BYTES`, in the same order and with the same output. ``on_progress`` is called with the running
    count (every 65,536 events, or every piece). Returns one report per trail, in the order given.
    """
    roots = [Path(d) for d in directories]
    if not roots:
        raise AuditError("no trail directory given")
    for root in roots:
        if not root.is_dir():
            raise AuditError(f"no audit trail directory at {root}")
    window = QueryFilters(since=since, until=until)
    verified = [verify_trail(root, key=key) for root in roots]
    ids = [_trail_id(root, report) for root, report in zip(roots, verified, strict=True)]
    if len(roots) == 1:
        count = pool_size(workers, [path for _index, path in list_segments(roots[0])])
        tasks = _plan(roots[0], verified[0])
        if count > 1 and len(tasks) > 1:
            written = _export_parallel(
                tasks, out, trail=ids[0] or "", window=window, workers=count, on_progress=on_progress
            )
            return [ExportReport(roots[0], ids[0], verified[0], written)]
    counts = [0] * len(roots)
    mapper = OcsfMapper()

    def events(position: int) -> Iterator[tuple[str, int, int, AuditRecordView]]:
        for record in _verified_records(roots[position], verified[position].records_checked):
            if (window.since is None and window.until is None) or window.matches(record):
                view = view_record(record)
                yield view.timestamp, position, view.seq, view

    streams = [events(position) for position in range(len(roots))]
    merged: Iterable[tuple[str, int, int, AuditRecordView]] = streams[0] if len(streams) == 1 else heapq.merge(*streams)
    for written, (_ts, position, _seq, view) in enumerate(merged, start=1):
        out.write(event_line(mapper.event(view, ids[position] or "")))
        counts[position] += 1
        if on_progress is not None and written & 0xFFFF == 0:
            on_progress(written)
    return [
        ExportReport(root, trail_id, report, n)
        for root, trail_id, report, n in zip(roots, ids, verified, counts, strict=True)
    ]

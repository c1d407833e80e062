"""Reading one segment's share of a trail into an :class:`~gateway.report.aggregate.Aggregate`.

A report is split into tasks, one per segment holding records of a trail's verified prefix; each task is
aggregated on its own (in this process, or in a worker process: :mod:`gateway.report._parallel`) and the
aggregates merge, whatever their order, into the aggregate of the whole.

Lines are parsed with ``orjson`` when it is installed (the ``report`` extra; ~2.5 times faster on a decision
line), else, and for any line it refuses (an integer beyond 64 bits), with :mod:`json`: the same values.
``request.received`` records are skipped before parsing (a byte test on the line): the report needs nothing
from them that the decision and the outcome do not carry, and they hold the submitted code, the bulk of a
trail. The test reads the envelope's ``event_type`` from the end of the line: in a canonical line (sorted
keys, and a quote inside a string is always escaped) the top-level members after it (``gateway``, ``hash``,
``policy`` … ``trace_id``) hold no ``event_type``, so its last occurrence is the envelope's, a few hundred bytes
from the end, whereas a search from the start would scan the whole ``data`` of every decision first.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gateway.audit.canonical import LineError, extract_seq, split_line
from gateway.audit.records import AuditRecordView, view_record
from gateway.audit.segments import list_segments
from gateway.report.aggregate import Aggregate

__all__ = ["ReportFilters", "SegmentTask", "aggregate_segment", "segment_tasks"]

_EVENT_TYPE: Final = b'"event_type":"'
_SKIPPED: Final = b'request.received"'

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - the report extra is not installed
    _orjson = None  # type: ignore[assignment]


def _skipped(raw: bytes) -> bool:
    """Whether the line is a ``request.received`` record (see the module)."""
    at = raw.rfind(_EVENT_TYPE)
    return at >= 0 and raw.startswith(_SKIPPED, at + len(_EVENT_TYPE))


def _parse(raw: bytes) -> Any:
    """One line as JSON values: ``orjson`` when present, :mod:`json` for what it refuses (same values)."""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except _orjson.JSONDecodeError:
            pass
    return json.loads(raw)


@dataclass(frozen=True, slots=True)
class ReportFilters:
    """What to report on; ``None`` means no constraint. Times are the trail's timestamp text (``parse_time``)."""

    since: str | None = None
    """Inclusive."""
    until: str | None = None
    """Exclusive."""
    principal: str | None = None
    policy: str | None = None
    """The name of the policy records were made under."""

    def matches(self, view: AuditRecordView) -> bool:
        if self.since is not None and view.timestamp < self.since:
            return False
        if self.until is not None and view.timestamp >= self.until:
            return False
        if self.principal is not None and view.principal != self.principal:
            return False
        return self.policy is None or (view.policy is not None and view.policy.name == self.policy)


@dataclass(frozen=True, slots=True)
class SegmentTask:
    """The lines of one segment that belong to a trail's verified prefix."""

    trail: int
    """Position of the trail in the report's list."""
    path: str
    lines: int
    """How many lines from the start (the rest is past the verified prefix, or was written since)."""


def segment_tasks(index: int, directory: Path, verified: int) -> list[SegmentTask]:
    """One task per segment holding records of the first ``verified`` records (their ``seq`` is contiguous from
    1 across segments, so a segment's share follows from the ``seq`` of its first line)."""
    starts: list[tuple[int, Path]] = []
    for _i, path in list_segments(directory):
        with path.open("rb") as fh:
            first = fh.readline()
        try:
            starts.append((extract_seq(split_line(first)[0]), path))
        except LineError:
            starts.append((verified + 1, path))  # empty, or the break itself: nothing verified from here
    tasks = []
    for position, (start, path) in enumerate(starts):
        end = starts[position + 1][0] if position + 1 < len(starts) else verified + 1
        lines = min(end, verified + 1) - start
        if lines > 0:
            tasks.append(SegmentTask(index, str(path), lines))
    return tasks


def aggregate_segment(
    task: SegmentTask, filters: ReportFilters, denied_cap: int, on_record: Callable[[int], None] | None = None
) -> Aggregate:
    """The aggregate of one task's records (``request.received`` skipped unparsed; see the module)."""
    agg = Aggregate(denied_cap=denied_cap)
    with open(task.path, "rb", buffering=1 << 20) as fh:
        for number, raw in enumerate(fh, start=1):
            if number > task.lines:
                break
            if on_record is not None and number % 4096 == 0:
                on_record(4096)
            if _skipped(raw):
                continue
            view = view_record(_parse(raw))
            if filters.matches(view):
                agg.add(view, task.trail)
    return agg

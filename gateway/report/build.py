"""Build a report from one or more trails: verify each, check its anchors, stream its records, merge by time.

Every trail is verified first by :func:`gateway.audit.verify.verify_trail` (the one chain checker) and checked
against the anchors that name it (:func:`gateway.audit.anchor.check_anchor`). Only the intact prefix is
reported on: the records after a break are not evidence. The records of several trails are merged by
timestamp (each trail is in time order on its own; ``heapq.merge`` keeps one record per trail in memory), read
through their typed views (:func:`gateway.audit.records.view_record`) and fed to one
:class:`~gateway.report.aggregate.Aggregate`.

``request.received`` records are skipped before parsing (a byte test on the line): the report needs nothing
from them that the decision and the outcome do not carry, and they hold the submitted code, the bulk of a
trail.
"""

from __future__ import annotations

import heapq
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, TextIO

from gateway.audit.anchor import Anchor, AnchorCheck, check_anchor, trail_id
from gateway.audit.pipeline import utc_timestamp
from gateway.audit.records import AuditRecordView, view_record
from gateway.audit.segments import list_segments
from gateway.audit.verify import VerifyReport, verify_trail
from gateway.errors import AuditError
from gateway.report.aggregate import DENIED_CAP, Aggregate
from gateway.report.model import AnchorRef, Head, Period, Report, Totals, TrailBreak, TrailVerification

__all__ = ["Progress", "ReportFilters", "build_report", "verify_for_report"]

_SKIP: Final = b'"event_type":"request.received"'


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


class Progress:
    """Progress on a terminal's stderr (at most twice a second); silent when stderr is not a TTY."""

    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self._last = 0.0
        self._shown = False

    def say(self, text: str) -> None:
        if self.enabled:
            self.stream.write(f"\r\x1b[K{text}")
            self.stream.flush()
            self._shown = True

    def tick(self, records: int, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < 0.5:
            return
        self._last = now
        share = f" ({100 * done // total}%)" if total else ""
        self.say(f"report: {records:,} records read{share}")

    def done(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _newest(checks: list[AnchorCheck]) -> AnchorCheck | None:
    failed = [c for c in checks if not c.ok]
    pool = failed or checks
    return max(pool, key=lambda c: (c.anchor.seq, c.anchor.time)) if pool else None


def verify_for_report(
    directory: Path, anchors: Sequence[Anchor], *, key: bytes | None
) -> tuple[TrailVerification, VerifyReport]:
    """Verify one trail and check it against ``anchors`` (those naming this trail, plus any for which no trail
    is given is the caller's business); the verification the report opens with."""
    report = verify_trail(directory, key=key)
    ident = trail_id(directory)
    checks = [check_anchor(directory, a, report, key=key, ident=ident) for a in anchors]
    chosen = _newest(checks)
    anchor = None
    if chosen is not None:
        a = chosen.anchor
        anchor = AnchorRef(a.source, a.seq, a.hash, a.time, chosen.ok, chosen.detail, chosen.hmac_checked, len(checks))
    brk: TrailBreak | None = None
    if report.first_break is not None:
        b = report.first_break
        brk = TrailBreak(b.seq, b.reason, b.detail, b.segment, b.line)
    elif chosen is not None and not chosen.ok:
        seq = report.last_seq + 1 if chosen.reason == "tail_deleted" else chosen.anchor.seq
        brk = TrailBreak(seq, f"anchor_{chosen.reason}", chosen.detail, None, None)
    verification = TrailVerification(
        trail=str(directory),
        trail_id=ident,
        records_checked=report.records_checked,
        intact=brk is None,
        first_break=brk,
        hmac_checked=report.hmac_checked,
        hmac_status=report.hmac_status,
        head=Head(report.last_seq, report.last_hash),
        anchor=anchor,
        segments=report.segments,
    )
    return verification, report


def _views(
    index: int, directory: Path, count: int, on_bytes: Callable[[int], None]
) -> Iterator[tuple[str, int, int, AuditRecordView]]:
    """``(timestamp, trail index, seq, view)`` of the first ``count`` records (the verified prefix)."""
    seen = 0
    for _i, path in list_segments(directory):
        with path.open("rb", buffering=1 << 20) as fh:
            for raw in fh:
                if seen >= count:
                    return
                seen += 1
                on_bytes(len(raw))
                if _SKIP in raw:
                    continue
                view = view_record(json.loads(raw))
                yield view.timestamp, index, view.seq, view


def build_report(
    trails: Sequence[str | Path],
    *,
    filters: ReportFilters | None = None,
    key: bytes | None = None,
    anchors: Sequence[Anchor] = (),
    now: datetime | None = None,
    progress: Progress | None = None,
    denied_cap: int = DENIED_CAP,
    title: str = "Agent execution gateway: compliance report",
) -> Report:
    """The report over ``trails`` (each a trail directory). Each anchor is checked against the trail whose id it
    names; an anchor that names none of them is an error (it was meant for another trail)."""
    filters = filters or ReportFilters()
    progress = progress or Progress(enabled=False)
    directories = [Path(t) for t in trails]
    if not directories:
        raise AuditError("no trail to report on")
    for directory in directories:
        if not directory.is_dir():
            raise AuditError(f"no audit trail directory at {directory}")
    ids = [trail_id(d) for d in directories]
    for anchor in anchors:
        if anchor.trail not in ids:
            raise AuditError(
                f"{anchor.source or 'an anchor'} is for trail {anchor.trail}, which is none of the trails given "
                f"({', '.join(i or '(empty)' for i in ids)})",
                hint="pass the trail the anchor was taken from with --trail DIR",
            )
    verifications = []
    for directory, ident in zip(directories, ids, strict=True):
        progress.say(f"report: verifying {directory} ...")
        mine = [a for a in anchors if a.trail == ident]
        verification, _report = verify_for_report(directory, mine, key=key)
        verifications.append(verification)
    total = sum(p.stat().st_size for d in directories for _i, p in list_segments(d))
    done = [0]

    def on_bytes(n: int) -> None:
        done[0] += n

    agg = Aggregate(denied_cap=denied_cap)
    streams = [
        _views(i, d, v.records_checked, on_bytes)
        for i, (d, v) in enumerate(zip(directories, verifications, strict=True))
    ]
    merged = heapq.merge(*streams, key=lambda item: item[:3])
    for read, (_ts, _i, _seq, view) in enumerate(merged, start=1):
        if read % 4096 == 0:
            progress.tick(read, done[0], total)
        if filters.matches(view):
            agg.add(view)
    progress.done()
    principals, omitted = agg.principals()
    stamp = utc_timestamp(now if now is not None else datetime.now(UTC))
    given = tuple(
        (name, value) for name, value in (("principal", filters.principal), ("policy", filters.policy)) if value
    )
    return Report(
        title=title,
        generated_at=stamp,
        period=Period(filters.since, filters.until, agg.first, agg.last),
        filters=given,
        verification=tuple(verifications),
        totals=Totals(
            requests=agg.allowed + agg.denied + agg.invalid,
            allowed=agg.allowed,
            denied=agg.denied,
            invalid=agg.invalid,
            errors=agg.errors,
            dry_runs=agg.dry_runs,
            refused=agg.refused,
            executions=agg.executions,
            records=agg.records,
        ),
        principals=principals,
        principals_omitted=omitted,
        policies=agg.policy_rows(),
        denial_rules=agg.rule_rows(agg.denials),
        warning_rules=agg.rule_rows(agg.warnings),
        images=agg.image_rows(),
        outcomes=agg.outcomes(),
        durations=agg.durations.result(),
        activity_bucket_s=agg.activity.width,
        activity=agg.activity.result(),
        denied=agg.denied_list(),
        controls=agg.controls(),
        policy_report=agg.policy_report(f"gateway-report-{stamp[:10]}"),
    )

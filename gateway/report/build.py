"""Build a report from one or more trails: verify each, check its anchors, aggregate its verified records.

Every trail is verified first by :func:`gateway.audit.verify.verify_trail` (the one chain checker) and checked
against the anchors that name it (:func:`gateway.audit.anchor.check_anchor`). Only the verified prefix is
reported on: the records after a break are not evidence. The records (through their typed views,
:func:`gateway.audit.records.view_record`) are aggregated one segment at a time (:mod:`gateway.report.scan`),
in parallel processes for large trails (:mod:`gateway.report._parallel`), and the aggregates merge into one:
several trails are merged by time (every list the report keeps is ordered by ``(timestamp, trail, seq)``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from gateway._workers import WorkerPool
from gateway.audit.anchor import Anchor, AnchorCheck, check_anchor, trail_id
from gateway.audit.pipeline import utc_timestamp
from gateway.audit.verify import VerifyReport, verify_trail
from gateway.errors import AuditError
from gateway.report._parallel import aggregate_tasks
from gateway.report.aggregate import DENIED_CAP
from gateway.report.model import AnchorRef, Head, Period, Report, Totals, TrailBreak, TrailVerification
from gateway.report.progress import Progress
from gateway.report.scan import ReportFilters, segment_tasks

__all__ = ["ReportFilters", "build_report", "verify_for_report"]


def _newest(checks: list[AnchorCheck]) -> AnchorCheck | None:
    failed = [c for c in checks if not c.ok]
    pool = failed or checks
    return max(pool, key=lambda c: (c.anchor.seq, c.anchor.time)) if pool else None


def verify_for_report(
    directory: Path, anchors: Sequence[Anchor], *, key: bytes | None
) -> tuple[TrailVerification, VerifyReport]:
    """Verify one trail and check it against ``anchors`` (the ones naming it); the verification the report
    opens with. With several anchors, the one named is the newest that failed, else the newest."""
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
    workers: int | None = None,
    worker_pool: Callable[..., WorkerPool] = WorkerPool,
) -> Report:
    """The report over ``trails`` (each a trail directory). Each anchor is checked against the trail whose id it
    names; an anchor that names none of them is an error (it was meant for another trail).

    ``workers``: processes that aggregate segments in parallel (:func:`~gateway.report._parallel.aggregate_tasks`;
    ``None``: one per CPU for large trails, else in process; ``1``: in process). The report is the same.
    ``worker_pool`` makes their pool (:class:`~gateway._workers.WorkerPool`, or a test's own).
    """
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
    tasks = [t for i, (d, v) in enumerate(zip(directories, verifications, strict=True))
             for t in segment_tasks(i, d, v.records_checked)]  # fmt: skip
    agg = aggregate_tasks(tasks, filters, denied_cap, progress=progress, workers=workers, worker_pool=worker_pool)
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
        egress=agg.egress_section(),
    )

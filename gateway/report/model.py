"""The report model: one frozen tree, built once from the trail, from which every format is rendered.

Field names are the JSON format's keys (:meth:`Report.to_dict`); Markdown, CSV and HTML read the same
objects. Nothing here reads a trail or formats text for a particular output.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "ActivityBucket",
    "AnchorRef",
    "ControlRow",
    "Controls",
    "Denied",
    "DeniedRow",
    "Durations",
    "Egress",
    "EgressDeniedRule",
    "EgressExample",
    "EgressRow",
    "Head",
    "ImageRow",
    "Outcomes",
    "Period",
    "PolicyReport",
    "PolicyReportResult",
    "PolicyRow",
    "PrincipalRow",
    "Report",
    "RuleRow",
    "Totals",
    "TrailBreak",
    "TrailVerification",
]


@dataclass(frozen=True, slots=True)
class Head:
    """The last record a trail verified up to."""

    seq: int
    hash: str


@dataclass(frozen=True, slots=True)
class TrailBreak:
    """Where a trail stops being evidence: the first record that cannot be trusted, and why."""

    seq: int
    reason: str
    """A verify reason (``modified``, ``deleted``, ``truncated``, ...) or ``anchor_<reason>`` when the chain is
    intact but no longer reaches a stored anchor (``anchor_tail_deleted``, ``anchor_forked``, ...)."""
    detail: str
    segment: str | None
    line: int | None


@dataclass(frozen=True, slots=True)
class AnchorRef:
    """The anchor a trail was checked against."""

    file: str | None
    seq: int
    hash: str
    time: str
    ok: bool
    detail: str
    hmac_checked: bool
    checked: int
    """How many anchors were checked for this trail (this one is the newest that failed, else the newest)."""


@dataclass(frozen=True, slots=True)
class TrailVerification:
    """The verification of one trail, as the report opens with it."""

    trail: str
    """The trail directory as given."""
    trail_id: str | None
    """The ``event_id`` of its first record."""
    records_checked: int
    intact: bool
    first_break: TrailBreak | None
    hmac_checked: bool
    hmac_status: str
    """``checked``, ``not_checked`` (records carry HMACs, no key given) or ``absent``."""
    head: Head
    anchor: AnchorRef | None
    segments: int

    def summary(self) -> str:
        """One sentence on this verification (the Markdown and HTML status line)."""
        hmac = {"checked": "HMACs checked", "not_checked": "HMACs NOT checked (no key given)", "absent": "no HMACs"}
        if self.first_break is None:
            state = f"chain intact up to seq {self.head.seq}"
        else:
            b = self.first_break
            where = f" ({b.segment} line {b.line})" if b.segment else ""
            state = f"BROKEN at seq {b.seq}{where}: {b.reason}: {b.detail}"
        if self.anchor is None:
            anchor = "no anchor checked"
        else:
            a = self.anchor
            verdict = "reached" if a.ok else "NOT reached"
            anchor = f"anchor {a.file} (seq {a.seq}, {a.time}) {verdict}"
        status = hmac[self.hmac_status]
        return f"{self.records_checked} records checked, {state}; {status}; head {self.head.hash[:16]}…; {anchor}"

    def broken_line(self) -> str | None:
        """``BROKEN: <trail>: first break at seq N (<why>)``, or None when intact."""
        if self.first_break is None:
            return None
        return f"BROKEN: {self.trail}: first break at seq {self.first_break.seq} ({self.first_break.reason})"


@dataclass(frozen=True, slots=True)
class Period:
    since: str | None
    """The ``--since`` bound (inclusive), or None."""
    until: str | None
    """The ``--until`` bound (exclusive), or None."""
    first_record: str | None
    """Time of the first record reported on."""
    last_record: str | None


@dataclass(frozen=True, slots=True)
class Totals:
    requests: int
    """``allowed + denied + invalid``: every request that reached the gateway and was judged or refused as
    malformed (dry runs are not requests to run anything: ``dry_runs``)."""
    allowed: int
    denied: int
    invalid: int
    errors: int
    """Executions whose run failed for a reason other than the program (an ``error`` in the outcome)."""
    dry_runs: int
    """Decisions of ``gateway check`` (nothing was meant to run)."""
    refused: int
    """Refusals before any decision (over a quota, or a body the service could not take), counted from the
    ``request.refused`` records (a summary record counts its ``count``); not in ``requests``."""
    executions: int
    """``execution.outcome`` records."""
    records: int
    """Records reported on (after the filters)."""


@dataclass(frozen=True, slots=True)
class PrincipalRow:
    principal: str
    requests: int
    allowed: int
    denied: int
    invalid: int
    errors: int
    dry_runs: int


@dataclass(frozen=True, slots=True)
class PolicyRow:
    name: str
    sha256: str
    first_seen: str
    """First record made under this policy version (or its load)."""
    last_seen: str
    decisions: int
    loaded: tuple[str, ...]
    """Times it was loaded or reloaded (``policy.loaded``/``policy.reloaded``; the first few)."""


@dataclass(frozen=True, slots=True)
class RuleRow:
    rule: str
    count: int
    examples: tuple[str, ...]
    """A few distinct messages."""


@dataclass(frozen=True, slots=True)
class ImageRow:
    image: str
    image_id: str | None
    executions: int
    sbom_digest: str | None = None
    """``sha256:<hex>`` of the SBOM recorded on this host for exactly that image id (``gateway sbom --image
    ... --record``); None when none is recorded here."""


@dataclass(frozen=True, slots=True)
class Outcomes:
    executions: int
    exit_codes: tuple[tuple[int | None, int], ...]
    """``(exit code, count)``, most frequent first; ``None``: the program never exited on its own."""
    timed_out: int
    oom_killed: int
    output_truncated: int
    """Runs whose stdout or stderr was cut at the cap."""
    output_limit_killed: int
    resource_killed: int
    error_codes: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class Durations:
    """Execution durations in milliseconds; percentiles from a fixed log histogram (within 1 %)."""

    count: int
    min: int | None
    max: int | None
    mean: int | None
    p50: int | None
    p90: int | None
    p95: int | None
    p99: int | None


@dataclass(frozen=True, slots=True)
class ActivityBucket:
    start: str
    allowed: int
    denied: int
    invalid: int
    errors: int


@dataclass(frozen=True, slots=True)
class DeniedRow:
    time: str
    principal: str | None
    policy: str | None
    rules: tuple[str, ...]
    request_id: str | None


@dataclass(frozen=True, slots=True)
class Denied:
    total: int
    shown: tuple[DeniedRow, ...]
    """The first ``cap`` denied requests in time order."""
    cap: int


@dataclass(frozen=True, slots=True)
class EgressRow:
    """The connections of one host, or of one principal's runs (``network.connection`` records)."""

    name: str
    """The host asked for, or the principal (:data:`~gateway.report.aggregate.OTHER` beyond the tracked maximum)."""
    connections: int
    """Allowed connections."""
    denied: int
    bytes_out: int
    bytes_in: int


@dataclass(frozen=True, slots=True)
class EgressExample:
    """One denied connection attempt."""

    time: str
    principal: str | None
    host: str
    port: int
    request_id: str | None


@dataclass(frozen=True, slots=True)
class EgressDeniedRule:
    rule: str
    """The check that denied (``network.egress.host``, a limit's rule...)."""
    count: int
    examples: tuple[EgressExample, ...]
    """The first few in time order."""

    def examples_text(self) -> str:
        """``host:port (request id)`` of each example, separated by `` / `` (the Markdown and HTML cell)."""
        return " / ".join(f"{x.host}:{x.port} ({x.request_id or '-'})" for x in self.examples)


@dataclass(frozen=True, slots=True)
class Egress:
    """What runs with network egress reached through their proxies."""

    runs: int
    """Executions whose outcome states egress totals."""
    connections: int
    """Their allowed connections, from the outcomes' totals (records dropped beyond the runner's cap included)."""
    denied: int
    bytes_out: int
    bytes_in: int
    records_dropped: int
    """Connections the totals count but no ``network.connection`` record names (not in the tables below)."""
    hosts: tuple[EgressRow, ...]
    """By host, most connections first."""
    principals: tuple[EgressRow, ...]
    denied_rules: tuple[EgressDeniedRule, ...]
    """Denied attempts by rule, most first."""


@dataclass(frozen=True, slots=True)
class ControlRow:
    id: str
    """``CIS-Docker-<version>-5.<n>``."""
    number: str
    title: str
    status: str
    """``enforced``, ``violated``, ``unproven`` or ``not_applicable``."""
    evidence: str
    executions_checked: int
    executions_failed: int
    executions_unproven: int
    offending_requests: tuple[str, ...]
    """Request ids of executions whose run options fail the control (the first ones)."""
    offending_omitted: int


@dataclass(frozen=True, slots=True)
class Controls:
    benchmark: str
    version: str
    section: str
    executions: int
    results: tuple[ControlRow, ...]


@dataclass(frozen=True, slots=True)
class PolicyReportResult:
    policy: str
    rule: str
    result: str
    """``pass``, ``fail``, ``warn``, ``error`` or ``skip``: the worst result of the rule in the period."""
    counts: tuple[tuple[str, int], ...]
    """How often the rule had each result."""
    message: str


@dataclass(frozen=True, slots=True)
class PolicyReport:
    """A ``wgpolicyk8s.io/v1alpha2`` PolicyReport-shaped summary (``schemas/policy-report.schema.json``)."""

    name: str
    results: tuple[PolicyReportResult, ...]

    def summary(self) -> dict[str, int]:
        out = {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}
        for result in self.results:
            out[result.result] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": "wgpolicyk8s.io/v1alpha2",
            "kind": "PolicyReport",
            "metadata": {"name": self.name, "labels": {"app.kubernetes.io/managed-by": "agent-exec-gateway"}},
            "summary": self.summary(),
            "results": [
                {
                    "source": "agent-exec-gateway",
                    "policy": r.policy,
                    "rule": r.rule,
                    "result": r.result,
                    "message": r.message,
                    "properties": {name: str(count) for name, count in r.counts},
                }
                for r in self.results
            ],
        }


@dataclass(frozen=True, slots=True)
class Report:
    """Everything a report says; rendered by :mod:`gateway.report.render`."""

    title: str
    generated_at: str
    period: Period
    filters: tuple[tuple[str, str], ...]
    """The filters given (``principal``, ``policy``), as ``(name, value)``."""
    verification: tuple[TrailVerification, ...]
    totals: Totals
    principals: tuple[PrincipalRow, ...]
    principals_omitted: int
    """Principals beyond the tracked maximum, counted together."""
    policies: tuple[PolicyRow, ...]
    denial_rules: tuple[RuleRow, ...]
    warning_rules: tuple[RuleRow, ...]
    images: tuple[ImageRow, ...]
    outcomes: Outcomes
    durations: Durations
    activity_bucket_s: int
    activity: tuple[ActivityBucket, ...]
    denied: Denied
    controls: Controls
    policy_report: PolicyReport
    egress: Egress

    @property
    def intact(self) -> bool:
        return all(v.intact for v in self.verification)

    def broken_lines(self) -> list[str]:
        return [line for v in self.verification if (line := v.broken_line()) is not None]

    def to_dict(self) -> dict[str, Any]:
        """The JSON format."""
        out: dict[str, Any] = {
            "title": self.title,
            "generated_at": self.generated_at,
            "intact": self.intact,
            "period": asdict(self.period),
            "filters": dict(self.filters),
            "verification": [asdict(v) for v in self.verification],
            "totals": asdict(self.totals),
            "principals": [asdict(p) for p in self.principals],
            "principals_omitted": self.principals_omitted,
            "policies": [asdict(p) for p in self.policies],
            "denial_rules": [asdict(r) for r in self.denial_rules],
            "warning_rules": [asdict(r) for r in self.warning_rules],
            "images": [asdict(i) for i in self.images],
            "outcomes": {
                **asdict(self.outcomes),
                "exit_codes": [{"exit_code": c, "count": n} for c, n in self.outcomes.exit_codes],
                "error_codes": [{"code": c, "count": n} for c, n in self.outcomes.error_codes],
            },
            "durations_ms": asdict(self.durations),
            "activity": {"bucket_seconds": self.activity_bucket_s, "buckets": [asdict(b) for b in self.activity]},
            "denied": {
                "total": self.denied.total,
                "cap": self.denied.cap,
                "shown": [asdict(d) for d in self.denied.shown],
            },
            "control_catalogue": {
                "benchmark": self.controls.benchmark,
                "version": self.controls.version,
                "section": self.controls.section,
                "executions": self.controls.executions,
            },
            "controls": [asdict(c) for c in self.controls.results],
            "egress": asdict(self.egress),
            "policy_report": self.policy_report.to_dict(),
        }
        for row in out["verification"]:
            row["broken_line"] = None if row["first_break"] is None else _broken(row)
        plain: dict[str, Any] = _plain(out)
        return plain


def _plain(value: Any) -> Any:
    """JSON types only: the tuples of the frozen model become lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _broken(row: dict[str, Any]) -> str:
    brk = row["first_break"]
    return f"BROKEN: {row['trail']}: first break at seq {brk['seq']} ({brk['reason']})"

"""Render a :class:`~gateway.report.model.Report` as JSON, Markdown, CSV or HTML (all from the same model).

Over a broken trail the first line of Markdown, CSV and HTML (its first heading too) is
``BROKEN: <trail>: first break at seq N (<why>)``; the JSON says ``verification[*].intact: false``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable
from typing import Final

from gateway.report.html import render_html
from gateway.report.model import Egress, Report

__all__ = ["FORMATS", "render", "render_csv", "render_json", "render_markdown"]


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _md(text: object) -> str:
    """A table cell: pipes escaped, newlines flattened."""
    return str("" if text is None else text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _table(head: list[str], rows: Iterable[Iterable[object]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out.extend("| " + " | ".join(_md(c) for c in row) + " |" for row in rows)
    return out


def render_markdown(report: Report) -> str:
    lines: list[str] = []
    broken = report.broken_lines()
    if broken:
        lines.extend(broken)
        lines.append("")
    lines.append(f"# {report.title}")
    lines.append("")
    p = report.period
    lines.append(
        f"Generated {report.generated_at}. Period: {p.since or p.first_record or '-'} to "
        f"{p.until or p.last_record or '-'} (records from {p.first_record or '-'} to {p.last_record or '-'})."
    )
    if report.filters:
        lines.append("Filters: " + ", ".join(f"{k} = {v}" for k, v in report.filters) + ".")
    lines += ["", "## Verification", ""]
    lines += _table(["trail", "id", "status"], [(v.trail, v.trail_id or "-", v.summary()) for v in report.verification])
    t = report.totals
    lines += ["", "## Totals", ""]
    lines += _table(
        ["requests", "allowed", "denied", "invalid", "errors", "dry runs", "refused", "executions"],
        [(t.requests, t.allowed, t.denied, t.invalid, t.errors, t.dry_runs, t.refused, t.executions)],
    )
    lines += ["", "## By principal", ""]
    lines += _table(
        ["principal", "requests", "allowed", "denied", "invalid", "errors", "dry runs"],
        [(r.principal, r.requests, r.allowed, r.denied, r.invalid, r.errors, r.dry_runs) for r in report.principals],
    )
    lines += ["", "## By policy", ""]
    lines += _table(
        ["policy", "sha256", "in force from", "to", "decisions", "loaded"],
        [(r.name, r.sha256, r.first_seen, r.last_seen, r.decisions, ", ".join(r.loaded)) for r in report.policies],
    )
    lines += ["", "## Top denial rules", ""]
    lines += _table(
        ["rule", "count", "example messages"], [(r.rule, r.count, " / ".join(r.examples)) for r in report.denial_rules]
    )
    lines += ["", "## Warnings (rules in audit mode)", ""]
    lines += _table(
        ["rule", "count", "example messages"], [(r.rule, r.count, " / ".join(r.examples)) for r in report.warning_rules]
    )
    lines += ["", "## By image", ""]
    lines += _table(
        ["image", "image id", "executions", "SBOM"],
        [(r.image, r.image_id or "-", r.executions, r.sbom_digest or "none recorded") for r in report.images],
    )
    o = report.outcomes
    lines += ["", "## Outcomes", ""]
    lines += _table(
        ["executions", "timed out", "OOM killed", "output truncated", "output limit killed", "resource killed"],
        [(o.executions, o.timed_out, o.oom_killed, o.output_truncated, o.output_limit_killed, o.resource_killed)],
    )
    lines.append("")
    lines += _table(["exit code", "count"], [("none" if c is None else c, n) for c, n in o.exit_codes])
    if o.error_codes:
        lines.append("")
        lines += _table(["error code", "count"], o.error_codes)
    d = report.durations
    lines += ["", "## Duration (ms)", ""]
    lines += _table(
        ["count", "min", "p50", "p90", "p95", "p99", "max", "mean"],
        [(d.count, d.min, d.p50, d.p90, d.p95, d.p99, d.max, d.mean)],
    )
    lines += ["", f"## Activity (buckets of {report.activity_bucket_s} s)", ""]
    lines += _table(
        ["from", "allowed", "denied", "invalid", "errors"],
        [(b.start, b.allowed, b.denied, b.invalid, b.errors) for b in report.activity],
    )
    dn = report.denied
    lines += ["", "## Denied requests", ""]
    if dn.total > len(dn.shown):
        lines.append(f"The first {len(dn.shown)} of {dn.total} denied requests (the list is capped at {dn.cap}).")
        lines.append("")
    lines += _table(
        ["time", "principal", "policy", "rules", "request id"],
        [(r.time, r.principal or "-", r.policy or "-", ", ".join(r.rules), r.request_id or "-") for r in dn.shown],
    )
    lines += ["", "## Egress", ""]
    lines += _egress_markdown(report.egress)
    c = report.controls
    lines += ["", f"## Control evidence: {c.benchmark} v{c.version}, section {c.section}", ""]
    lines.append(f"Judged from the run options recorded for each of the {c.executions} execution(s) in the period.")
    lines.append("")
    lines += _table(
        ["id", "title", "status", "evidence", "offending requests"],
        [
            (r.id, r.title, r.status, r.evidence, _offending(r.offending_requests, r.offending_omitted))
            for r in c.results
        ],
    )
    s = report.policy_report.summary()
    lines += ["", "## Policy rules (PolicyReport summary)", ""]
    lines.append(", ".join(f"{k}: {v}" for k, v in s.items()))
    lines.append("")
    lines += _table(
        ["policy", "rule", "result", "counts"],
        [
            (r.policy, r.rule, r.result, ", ".join(f"{k} {n}" for k, n in r.counts))
            for r in report.policy_report.results
        ],
    )
    return "\n".join(lines) + "\n"


_EGRESS_TOTALS: Final = ("runs", "connections", "denied", "bytes_out", "bytes_in", "records_dropped")


def _egress_markdown(egress: Egress) -> list[str]:
    if egress.runs == 0 and not egress.hosts:
        return ["No run with network egress in the period."]
    lines = _table(
        ["runs", "connections", "denied", "bytes out", "bytes in", "records dropped"],
        [tuple(getattr(egress, name) for name in _EGRESS_TOTALS)],
    )
    for head, rows in (("host", egress.hosts), ("principal", egress.principals)):
        lines += ["", f"### By {head}", ""]
        lines += _table(
            [head, "connections", "denied", "bytes out", "bytes in"],
            [(r.name, r.connections, r.denied, r.bytes_out, r.bytes_in) for r in rows],
        )
    lines += ["", "### Denied attempts", ""]
    lines += _table(
        ["rule", "count", "examples (host:port, request id)"],
        [(r.rule, r.count, r.examples_text()) for r in egress.denied_rules],
    )
    return lines


def _offending(ids: tuple[str, ...], omitted: int) -> str:
    text = ", ".join(ids)
    return f"{text} (+{omitted} more)" if omitted else text


def render_csv(report: Report) -> str:
    """Long format: ``section,id,field,value`` (one row per figure), so a spreadsheet can pivot it."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for line in report.broken_lines():
        w.writerow([line])
    w.writerow(["section", "id", "field", "value"])
    w.writerow(["report", "", "title", report.title])
    w.writerow(["report", "", "generated_at", report.generated_at])
    for name in ("since", "until", "first_record", "last_record"):
        w.writerow(["period", "", name, getattr(report.period, name) or ""])
    for name, value in report.filters:
        w.writerow(["filter", "", name, value])
    for v in report.verification:
        rows: list[tuple[str, object]] = [
            ("trail_id", v.trail_id or ""),
            ("records_checked", v.records_checked),
            ("intact", str(v.intact).lower()),
            ("hmac_checked", str(v.hmac_checked).lower()),
            ("hmac_status", v.hmac_status),
            ("head_seq", v.head.seq),
            ("head_hash", v.head.hash),
        ]
        if v.first_break is not None:
            rows += [
                ("break_seq", v.first_break.seq),
                ("break_reason", v.first_break.reason),
                ("break_detail", v.first_break.detail),
            ]
        if v.anchor is not None:
            rows += [
                ("anchor_file", v.anchor.file or ""),
                ("anchor_seq", v.anchor.seq),
                ("anchor_ok", str(v.anchor.ok).lower()),
            ]
        for name, cell in rows:
            w.writerow(["verification", v.trail, name, cell])
    for field in ("requests", "allowed", "denied", "invalid", "errors", "dry_runs", "refused", "executions", "records"):
        w.writerow(["totals", "", field, getattr(report.totals, field)])
    for r in report.principals:
        for field in ("requests", "allowed", "denied", "invalid", "errors", "dry_runs"):
            w.writerow(["principal", r.principal, field, getattr(r, field)])
    for pol in report.policies:
        ident = f"{pol.name}@{pol.sha256}"
        w.writerow(["policy", ident, "first_seen", pol.first_seen])
        w.writerow(["policy", ident, "last_seen", pol.last_seen])
        w.writerow(["policy", ident, "decisions", pol.decisions])
    for section, rules in (("denial_rule", report.denial_rules), ("warning_rule", report.warning_rules)):
        for rule in rules:
            w.writerow([section, rule.rule, "count", rule.count])
            for example in rule.examples:
                w.writerow([section, rule.rule, "example", example])
    for img in report.images:
        w.writerow(["image", f"{img.image}@{img.image_id or ''}", "executions", img.executions])
        w.writerow(["image", f"{img.image}@{img.image_id or ''}", "sbom", img.sbom_digest or ""])
    o = report.outcomes
    for field in (
        "executions",
        "timed_out",
        "oom_killed",
        "output_truncated",
        "output_limit_killed",
        "resource_killed",
    ):
        w.writerow(["outcomes", "", field, getattr(o, field)])
    for code, n in o.exit_codes:
        w.writerow(["exit_code", "none" if code is None else code, "count", n])
    for error_code, n in o.error_codes:
        w.writerow(["error_code", error_code, "count", n])
    for field in ("count", "min", "p50", "p90", "p95", "p99", "max", "mean"):
        ms = getattr(report.durations, field)
        w.writerow(["duration_ms", "", field, "" if ms is None else ms])
    for b in report.activity:
        for field in ("allowed", "denied", "invalid", "errors"):
            w.writerow(["activity", b.start, field, getattr(b, field)])
    w.writerow(["denied", "", "total", report.denied.total])
    w.writerow(["denied", "", "shown", len(report.denied.shown)])
    for row in report.denied.shown:
        ident = row.request_id or ""
        w.writerow(["denied_request", ident, "time", row.time])
        w.writerow(["denied_request", ident, "principal", row.principal or ""])
        w.writerow(["denied_request", ident, "rules", " ".join(row.rules)])
    eg = report.egress
    for name in _EGRESS_TOTALS:
        w.writerow(["egress", "", name, getattr(eg, name)])
    for kind, flows in (("egress_host", eg.hosts), ("egress_principal", eg.principals)):
        for flow in flows:
            for field in ("connections", "denied", "bytes_out", "bytes_in"):
                w.writerow([kind, flow.name, field, getattr(flow, field)])
    for refused in eg.denied_rules:
        w.writerow(["egress_denied_rule", refused.rule, "count", refused.count])
        for x in refused.examples:
            example = f"{x.host}:{x.port} {x.request_id or ''}".strip()
            w.writerow(["egress_denied_rule", refused.rule, "example", example])
    for c in report.controls.results:
        w.writerow(["control", c.id, "title", c.title])
        w.writerow(["control", c.id, "status", c.status])
        w.writerow(["control", c.id, "evidence", c.evidence])
        for rid in c.offending_requests:
            w.writerow(["control", c.id, "offending_request", rid])
        if c.offending_omitted:
            w.writerow(["control", c.id, "offending_omitted", c.offending_omitted])
    for name, n in report.policy_report.summary().items():
        w.writerow(["policy_report_summary", "", name, n])
    for result in report.policy_report.results:
        w.writerow(["policy_report", f"{result.policy}/{result.rule}", "result", result.result])
    return buf.getvalue()


FORMATS: Final[dict[str, Callable[[Report], str]]] = {
    "json": render_json,
    "md": render_markdown,
    "csv": render_csv,
    "html": render_html,
}


def render(report: Report, fmt: str) -> str:
    try:
        return FORMATS[fmt](report)
    except KeyError:
        raise ValueError(f"unknown report format {fmt!r}; one of {', '.join(FORMATS)}") from None

"""The HTML format: one self-contained file (inline CSS and SVG, no script, no external asset), for screen and
print. Charts: activity over time (stacked bars), outcomes, denials by rule."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import Final

from gateway.report.model import ActivityBucket, Egress, Report, TrailVerification

__all__ = ["render_html"]

_CSS: Final = """
:root { --ok: #2e7d32; --bad: #c62828; --warn: #ef6c00; --muted: #6b7280; --line: #d1d5db; --ink: #111827; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
       max-width: 1100px; margin: 2rem auto; padding: 0 1rem; }
h1 { font-size: 1.6rem; margin: 0 0 .25rem; } h2 { font-size: 1.2rem; margin: 1.8rem 0 .6rem;
     border-bottom: 1px solid var(--line); padding-bottom: .2rem; }
.meta { color: var(--muted); margin: 0 0 1rem; }
.broken { background: #fdecea; color: var(--bad); border: 2px solid var(--bad); padding: .6rem .8rem;
          font-weight: 700; margin: 0 0 1rem; font-size: 1.1rem; }
.intact { color: var(--ok); font-weight: 600; }
table { border-collapse: collapse; width: 100%; margin: .4rem 0 1rem; }
th, td { border-bottom: 1px solid var(--line); padding: .3rem .5rem; text-align: left; vertical-align: top;
         overflow-wrap: anywhere; }
th { background: #f3f4f6; font-weight: 600; } td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
.cards { display: flex; flex-wrap: wrap; gap: .6rem; margin: .5rem 0 1rem; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: .5rem .8rem; min-width: 8.5rem; }
.card .v { font-size: 1.5rem; font-weight: 700; } .card .k { color: var(--muted); font-size: .85rem; }
.status-enforced { color: var(--ok); font-weight: 600; } .status-violated { color: var(--bad); font-weight: 700; }
.status-unproven { color: var(--warn); font-weight: 600; } .status-not_applicable { color: var(--muted); }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: .85em; word-break: break-all; }
svg { max-width: 100%; height: auto; } .chart text { font-size: 11px; fill: var(--ink); }
.legend span { display: inline-block; margin-right: 1rem; } .sw { display: inline-block; width: .8rem;
       height: .8rem; margin-right: .3rem; vertical-align: -1px; }
@media print {
  body { margin: 0; max-width: none; font-size: 10pt; }
  h2 { break-after: avoid; } table, .chart, .cards { break-inside: avoid; }
  .broken { border-width: 3px; }
  a { color: inherit; text-decoration: none; }
}
@page { size: A4; margin: 14mm; }
"""

_CSP: Final = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
"""Nothing but the inline style may load: no script, no external asset, even if a value slipped through."""
_COLORS: Final = {"allowed": "#2e7d32", "denied": "#c62828", "invalid": "#ef6c00", "errors": "#6a1b9a"}


def _e(value: object) -> str:
    return escape("" if value is None else str(value))


def _table(head: Sequence[str], rows: Iterable[Sequence[object]], numeric: Sequence[int] = ()) -> str:
    out = ["<table><thead><tr>"]
    out.extend(f"<th{' class=n' if i in numeric else ''}>{_e(h)}</th>" for i, h in enumerate(head))
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>")
        out.extend(f"<td{' class=n' if i in numeric else ''}>{_e(c)}</td>" for i, c in enumerate(row))
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _activity_svg(buckets: Sequence[ActivityBucket]) -> str:
    if not buckets:
        return "<p class=meta>No activity in the period.</p>"
    width, height, left, bottom = 960, 220, 44, 34
    plot_w, plot_h = width - left - 10, height - bottom - 10
    peak = max(b.allowed + b.denied + b.invalid + b.errors for b in buckets) or 1
    bar = plot_w / len(buckets)
    parts = [
        f'<svg class=chart role="img" aria-label="Activity over time" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{left}" y1="{10 + plot_h}" x2="{width - 10}" y2="{10 + plot_h}" stroke="#9ca3af"/>',
        f'<text x="{left - 6}" y="16" text-anchor="end">{peak}</text>',
        f'<text x="{left - 6}" y="{10 + plot_h}" text-anchor="end">0</text>',
    ]
    for i, b in enumerate(buckets):
        x = left + i * bar
        y = 10 + plot_h
        for name in ("allowed", "denied", "invalid", "errors"):
            n = getattr(b, name)
            if not n:
                continue
            h = plot_h * n / peak
            y -= h
            parts.append(
                f'<rect x="{x + 0.5:.1f}" y="{y:.1f}" width="{max(bar - 1, 0.5):.1f}" height="{h:.1f}" '
                f'fill="{_COLORS[name]}"><title>{_e(b.start)}: {n} {name}</title></rect>'
            )
    step = max(1, len(buckets) // 6)
    for i in range(0, len(buckets), step):
        x = left + i * bar
        parts.append(f'<text x="{x:.1f}" y="{height - 12}">{_e(buckets[i].start[:16].replace("T", " "))}</text>')
    parts.append("</svg>")
    legend = "".join(f'<span><i class=sw style="background:{c}"></i>{n}</span>' for n, c in _COLORS.items())
    return "".join(parts) + f"<div class=legend>{legend}</div>"


def _bars_svg(label: str, items: Sequence[tuple[str, int, str]]) -> str:
    """Horizontal bars: ``(name, value, colour)``."""
    items = [i for i in items if i[1] > 0]
    if not items:
        return f"<p class=meta>No {label.lower()} in the period.</p>"
    width, row, left = 960, 24, 300
    height = row * len(items) + 10
    peak = max(v for _n, v, _c in items) or 1
    parts = [
        f'<svg class=chart role="img" aria-label="{_e(label)}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg">'
    ]
    for i, (name, value, colour) in enumerate(items):
        y = 5 + i * row
        w = (width - left - 80) * value / peak
        parts.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{_e(name[:48])}</text>')
        parts.append(f'<rect x="{left}" y="{y + 3}" width="{max(w, 1):.1f}" height="{row - 8}" fill="{colour}"/>')
        parts.append(f'<text x="{left + w + 6:.1f}" y="{y + 15}">{value}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _egress(egress: Egress) -> list[str]:
    if egress.runs == 0 and not egress.hosts:
        return ["<p class=meta>No run with network egress in the period.</p>"]
    out = ["<div class=cards>"]
    for key, value in (
        ("runs", egress.runs), ("connections", egress.connections), ("denied", egress.denied),
        ("bytes out", egress.bytes_out), ("bytes in", egress.bytes_in), ("records dropped", egress.records_dropped),
    ):  # fmt: skip
        out.append(
            f'<div class=card><div class=v id="egress-{_e(key.replace(" ", "-"))}">{value}</div>'
            f"<div class=k>{_e(key)}</div></div>"
        )
    out.append("</div>")
    flow = ["connections", "denied", "bytes out", "bytes in"]
    for head, rows in (("host", egress.hosts), ("principal", egress.principals)):
        out.append(f"<h3>By {head}</h3>")
        out.append(
            _table(
                [head, *flow], [(r.name, r.connections, r.denied, r.bytes_out, r.bytes_in) for r in rows], (1, 2, 3, 4)
            )
        )
    out.append("<h3>Denied attempts</h3>")
    out.append(
        _table(
            ["rule", "count", "examples (host:port, request id)"],
            [(r.rule, r.count, r.examples_text()) for r in egress.denied_rules],
            (1,),
        )
    )
    return out


def _verification(v: TrailVerification) -> str:
    cls, word = ("intact", "INTACT") if v.intact else ("status-violated", "BROKEN")
    return f'<p><span class="{cls}">{word}</span> <code>{_e(v.trail)}</code> — {_e(v.summary())}</p>'


def render_html(report: Report) -> str:
    broken = report.broken_lines()
    t, o, d, c = report.totals, report.outcomes, report.durations, report.controls
    p = report.period
    head = broken[0] if broken else report.title
    # The BROKEN lines come first, in a comment (allowed before the doctype; no quirks mode), and as the
    # first heading: whoever greps the file or reads the page sees them before anything else.
    out = [f"<!-- {line.replace('--', '- -')} -->" for line in broken]
    out += [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        f"<title>{_e(head)}</title><style>{_CSS}</style></head><body>",
    ]
    for line in broken:
        out.append(f'<h1 class="broken">{_e(line)}</h1>')
    out.append(f"<h1>{_e(report.title)}</h1>")
    out.append(
        f"<p class=meta>Generated {_e(report.generated_at)} · period {_e(p.since or p.first_record or '-')} to "
        f"{_e(p.until or p.last_record or '-')}" + "".join(f" · {_e(k)} = {_e(v)}" for k, v in report.filters) + "</p>"
    )
    out.append("<h2>Verification</h2>")
    out.extend(_verification(v) for v in report.verification)
    out.append("<h2>Totals</h2><div class=cards>")
    for key, value in (
        ("requests", t.requests), ("allowed", t.allowed), ("denied", t.denied), ("invalid", t.invalid),
        ("errors", t.errors), ("dry runs", t.dry_runs), ("refused", t.refused), ("executions", t.executions),
    ):  # fmt: skip
        out.append(
            f'<div class=card><div class=v id="total-{_e(key.split()[0])}">{value}</div>'
            f"<div class=k>{_e(key)}</div></div>"
        )
    out.append("</div>")
    out.append("<h2>Activity over time</h2>")
    out.append(f"<p class=meta>Buckets of {report.activity_bucket_s} s.</p>")
    out.append(_activity_svg(report.activity))
    out.append("<h2>Outcomes</h2>")
    exit_zero = sum(n for code, n in o.exit_codes if code == 0)
    bars = [
        ("exit 0", exit_zero, "#2e7d32"),
        ("non-zero exit", sum(n for code, n in o.exit_codes if code not in (0, None)), "#ef6c00"),
        ("no exit (killed)", sum(n for code, n in o.exit_codes if code is None), "#6b7280"),
        ("timed out", o.timed_out, "#c62828"),
        ("OOM killed", o.oom_killed, "#c62828"),
        ("output truncated", o.output_truncated, "#ef6c00"),
        ("output limit killed", o.output_limit_killed, "#c62828"),
        ("resource killed", o.resource_killed, "#c62828"),
        ("gateway/engine errors", t.errors, "#6a1b9a"),
    ]
    out.append(_bars_svg("Outcomes", bars))
    out.append(
        _table(["exit code", "count"], [("none" if code is None else code, n) for code, n in o.exit_codes], (1,))
    )
    if o.error_codes:
        out.append(_table(["error code", "count"], o.error_codes, (1,)))
    out.append("<h2>Duration (ms)</h2>")
    out.append(
        _table(
            ["count", "min", "p50", "p90", "p95", "p99", "max", "mean"],
            [(d.count, d.min, d.p50, d.p90, d.p95, d.p99, d.max, d.mean)],
            range(8),
        )
    )
    out.append("<h2>Denials by rule</h2>")
    out.append(_bars_svg("Denials by rule", [(r.rule, r.count, "#c62828") for r in report.denial_rules[:20]]))
    out.append(
        _table(
            ["rule", "count", "example messages"],
            [(r.rule, r.count, " / ".join(r.examples)) for r in report.denial_rules],
            (1,),
        )
    )
    out.append("<h2>Warnings (rules in audit mode)</h2>")
    out.append(
        _table(
            ["rule", "count", "example messages"],
            [(r.rule, r.count, " / ".join(r.examples)) for r in report.warning_rules],
            (1,),
        )
    )
    out.append("<h2>By principal</h2>")
    out.append(
        _table(
            ["principal", "requests", "allowed", "denied", "invalid", "errors", "dry runs"],
            [
                (r.principal, r.requests, r.allowed, r.denied, r.invalid, r.errors, r.dry_runs)
                for r in report.principals
            ],
            range(1, 7),
        )
    )
    out.append("<h2>By policy</h2>")
    out.append(
        _table(
            ["policy", "sha256", "in force from", "to", "decisions"],
            [(r.name, r.sha256, r.first_seen, r.last_seen, r.decisions) for r in report.policies],
            (4,),
        )
    )
    out.append("<h2>By image</h2>")
    out.append(
        _table(
            ["image", "image id", "executions", "SBOM"],
            [(r.image, r.image_id or "-", r.executions, r.sbom_digest or "none recorded") for r in report.images],
            (2,),
        )
    )
    out.append(f"<h2>Control evidence: {_e(c.benchmark)} v{_e(c.version)}, section {_e(c.section)}</h2>")
    out.append(
        f"<p class=meta>Judged from the run options recorded for each of the {c.executions} execution(s) in the "
        "period.</p>"
    )
    out.append(
        "<table><thead><tr><th>id</th><th>title</th><th>status</th><th>evidence</th><th>offending requests</th>"
        "</tr></thead><tbody>"
    )
    for r in c.results:
        offending = ", ".join(r.offending_requests) + (f" (+{r.offending_omitted} more)" if r.offending_omitted else "")
        out.append(
            f"<tr><td class=mono>{_e(r.id)}</td><td>{_e(r.title)}</td>"
            f'<td class="status-{_e(r.status)}">{_e(r.status)}</td>'
            f"<td>{_e(r.evidence)}</td><td class=mono>{_e(offending)}</td></tr>"
        )
    out.append("</tbody></table>")
    dn = report.denied
    out.append("<h2>Denied requests</h2>")
    if dn.total > len(dn.shown):
        out.append(f"<p class=meta>The first {len(dn.shown)} of {dn.total} denied requests (capped at {dn.cap}).</p>")
    out.append(
        _table(
            ["time", "principal", "policy", "rules", "request id"],
            [(r.time, r.principal or "-", r.policy or "-", ", ".join(r.rules), r.request_id or "-") for r in dn.shown],
        )
    )
    out.append("<h2>Egress</h2>")
    out.extend(_egress(report.egress))
    s = report.policy_report.summary()
    out.append("<h2>Policy rules (PolicyReport summary)</h2>")
    out.append("<p>" + " · ".join(f"{_e(k)}: {v}" for k, v in s.items()) + "</p>")
    out.append(
        _table(
            ["policy", "rule", "result", "counts"],
            [
                (r.policy, r.rule, r.result, ", ".join(f"{k} {n}" for k, n in r.counts))
                for r in report.policy_report.results
            ],
        )
    )
    out.append("</body></html>")
    return "\n".join(out) + "\n"

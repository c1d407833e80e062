"""``gateway report``: a compliance report from one or more audit trails (see :mod:`gateway.report`).

Trails: ``--trail DIR`` (repeatable), else ``$GATEWAY_AUDIT_DIR``, else ``./audit``, like ``gateway audit``.
Over a broken trail (or one that no longer reaches a given anchor) the report is still written, its first
line says ``BROKEN: ...``, the same line is the first on stderr, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gateway._files import output_file
from gateway.audit.anchor import load_anchor
from gateway.audit.segments import key_from_env, load_key, resolve_directory
from gateway.cli.arguments import time_argument
from gateway.report import FORMATS, Progress, ReportFilters, build_report, render
from gateway.report.aggregate import DENIED_CAP

__all__ = ["EXIT_BROKEN", "register", "trail_directories"]

EXIT_BROKEN = 1
"""A trail read is broken, or does not reach an anchor given."""


def trail_directories(values: list[str] | None) -> list[Path]:
    """``--trail DIR`` values, else ``$GATEWAY_AUDIT_DIR``, else ``./audit`` (shared by report, anchor, export)."""
    return [Path(v) for v in values] if values else [resolve_directory(None)]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "report",
        help="a compliance report (html, json, md, csv) from the audit trail",
        description="Build a report only from the audit trail: verification of every trail (and anchor), totals, "
        "principals, policies, denial rules, images, outcomes, durations, activity, denied requests, CIS Docker "
        "Benchmark control evidence and a PolicyReport summary. Streams in constant memory. Exit 0, or 1 when a "
        "trail is broken or does not reach an anchor (the report then says BROKEN on its first line).",
    )
    p.add_argument("--format", required=True, choices=sorted(FORMATS), help="output format")
    p.add_argument("-o", "--output", metavar="FILE", default="-", help="where to write it (default: stdout)")
    p.add_argument(
        "--trail",
        action="append",
        metavar="DIR",
        help="trail directory, repeatable: each is verified and they are merged by time "
        "(default: $GATEWAY_AUDIT_DIR, then ./audit)",
    )
    p.add_argument("--since", type=time_argument, metavar="TIME", help="RFC 3339 time, inclusive")
    p.add_argument("--until", type=time_argument, metavar="TIME", help="RFC 3339 time, exclusive")
    p.add_argument("--principal", help="only this principal's records")
    p.add_argument("--policy", metavar="NAME", help="only records made under the policy named NAME")
    p.add_argument(
        "--anchor",
        action="extend",
        nargs="+",
        metavar="FILE",
        help="anchor file(s) from `gateway audit anchor`: the trail they name must still reach them",
    )
    p.add_argument("--key-file", metavar="F", help="HMAC key file (default: $GATEWAY_AUDIT_KEY_FILE)")
    p.add_argument(
        "--max-denied",
        type=int,
        default=DENIED_CAP,
        metavar="N",
        help=f"denied requests listed one by one (default {DENIED_CAP}; the total is always given)",
    )
    p.set_defaults(func=_report)


def _report(args: argparse.Namespace) -> int:
    if args.max_denied < 0:
        print("gateway report: error: --max-denied must be >= 0", file=sys.stderr)
        return 2
    key = load_key(args.key_file) if args.key_file else key_from_env()
    filters = ReportFilters(
        since=args.since,
        until=args.until,
        principal=args.principal,
        policy=args.policy,
    )
    anchors = [load_anchor(a) for a in args.anchor or ()]
    report = build_report(
        trail_directories(args.trail),
        filters=filters,
        key=key,
        anchors=anchors,
        progress=Progress(),
        denied_cap=args.max_denied,
    )
    broken = report.broken_lines()
    for line in broken:
        print(line, file=sys.stderr)
    with output_file(args.output) as out:  # a report is for filing: readable by all, as any document
        out.write(render(report, args.format).encode("utf-8"))
    return EXIT_BROKEN if broken else 0

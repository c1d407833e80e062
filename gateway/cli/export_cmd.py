"""``gateway audit export --format ocsf``: the trail as OCSF events (JSON lines) for a SIEM.

Trails: ``--trail DIR`` (repeatable; several are merged by time), else ``$GATEWAY_AUDIT_DIR``, else ``./audit``.
Each trail is verified first and only its verified records are exported: over a broken chain the intact
prefix is written, then ``BROKEN: <trail>: first break at seq N (<why>)`` goes to stderr and the exit status
is 1. The export is :mod:`gateway.audit.ocsf_export`, the mapping :mod:`gateway.audit.ocsf` (``docs/ocsf.md``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from gateway._files import output_file
from gateway.audit.ocsf_export import ExportReport, export_ocsf
from gateway.audit.segments import key_from_env, load_key, resolve_directory
from gateway.cli.arguments import time_argument

__all__ = ["add_export"]

EXIT_BROKEN = 1


def add_export(commands: argparse._SubParsersAction[Any]) -> None:
    """Add ``export`` to the ``gateway audit`` sub-commands."""
    p = commands.add_parser(
        "export",
        help="export the trail as OCSF events (JSON lines) for a SIEM",
        description="Write every verified record of the trail(s) as one OCSF 1.5.0 event per line (mapping: "
        "docs/ocsf.md). Each trail is verified first; over a broken chain the intact prefix is written, the break "
        "is named on stderr and the exit status is 1.",
    )
    p.add_argument("--format", choices=("ocsf",), default="ocsf", help="output format (only ocsf)")
    p.add_argument(
        "--trail",
        action="append",
        metavar="DIR",
        help="trail directory, repeatable: several are merged by time (default: $GATEWAY_AUDIT_DIR, then ./audit)",
    )
    p.add_argument("--since", type=time_argument, metavar="TIME", help="RFC 3339 time, inclusive")
    p.add_argument("--until", type=time_argument, metavar="TIME", help="RFC 3339 time, exclusive")
    p.add_argument("--key-file", metavar="F", help="HMAC key file (default: $GATEWAY_AUDIT_KEY_FILE)")
    p.add_argument("-o", "--output", metavar="FILE", default="-", help="output file, or - for stdout (default)")
    p.set_defaults(func=_export)


def _progress() -> Any:
    """A progress printer for stderr when a person is watching it; ``None`` when stderr is not a terminal."""
    if not sys.stderr.isatty():
        return None
    start = time.monotonic()

    def show(count: int) -> None:
        rate = count / max(time.monotonic() - start, 1e-9)
        print(f"\rexported {count:,} events ({rate:,.0f}/s)", end="", file=sys.stderr, flush=True)

    return show


def broken_line(report: ExportReport) -> str | None:
    """``BROKEN: <trail>: first break at seq N (<why>)`` for a trail whose chain broke, else ``None``."""
    brk = report.verification.first_break
    if brk is None:
        return None
    return f"BROKEN: {report.trail}: first break at seq {brk.seq} ({brk.reason}: {brk.detail})"


def _export(args: argparse.Namespace) -> int:
    trails = [Path(t) for t in args.trail] if args.trail else [resolve_directory(None)]
    key = load_key(args.key_file) if args.key_file else key_from_env()
    since = args.since
    until = args.until
    progress = _progress()
    try:
        with output_file(args.output, mode=0o600) as out:  # the trail's own records: not for every reader
            reports = export_ocsf(trails, out, since=since, until=until, key=key, on_progress=progress)
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        return 0
    if progress is not None:
        print(file=sys.stderr)
    broken = [line for line in map(broken_line, reports) if line is not None]
    for line in broken:
        print(line, file=sys.stderr)
    for report in reports:
        if report.verification.hmac_status == "not_checked":
            print(
                f"warning: {report.trail}: HMACs were NOT checked (the records carry HMACs but no key was given); "
                "pass --key-file or set GATEWAY_AUDIT_KEY_FILE",
                file=sys.stderr,
            )
        if progress is not None:
            print(
                f"{report.trail}: {report.exported} event(s) exported, verified up to seq "
                f"{report.verification.last_seq}",
                file=sys.stderr,
            )
    return EXIT_BROKEN if broken else 0

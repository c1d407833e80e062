"""``gateway audit verify | query | repair | anchor | export``: work on a trail directory (``export``:
cli/export_cmd.py).

Trail directory precedence: ``--audit-dir DIR`` (as for ``run``, ``check`` and ``doctor``) or the positional
``DIR`` (the same thing; giving both with different values is a usage error), then ``GATEWAY_AUDIT_DIR``, then
``./audit``. The HMAC key comes from ``--key-file`` or, as for the writer, ``GATEWAY_AUDIT_KEY_FILE`` /
``GATEWAY_AUDIT_KEY``. ``anchor`` reads ``--trail DIR`` (repeatable) like ``gateway report``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from gateway.audit.anchor import anchor_from_report, check_anchor, load_anchor, trail_id, write_anchor
from gateway.audit.query import QueryFilters, query_trail
from gateway.audit.repair import repair_trail
from gateway.audit.segments import key_from_env, load_key, resolve_directory
from gateway.audit.verify import VerifyReport, verify_trail
from gateway.cli.arguments import time_argument
from gateway.cli.export_cmd import add_export
from gateway.errors import EXIT_USAGE

__all__ = ["register"]

EXIT_BROKEN = 1
"""``verify`` found a break."""


_DIR_DEFAULT = "(default: $GATEWAY_AUDIT_DIR, then ./audit)"


def _directory_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "directory", nargs="?", metavar="DIR", help=f"trail directory, the same as --audit-dir {_DIR_DEFAULT}"
    )
    p.add_argument("--audit-dir", metavar="DIR", help=f"trail directory {_DIR_DEFAULT}")
    p.add_argument(
        "--trail",
        action="append",
        metavar="DIR",
        help="the same as --audit-dir, as `report`, `audit export` and `audit anchor` spell it (one trail here)",
    )


class UsageError(Exception):
    """A command line that contradicts itself (exit 2)."""


def _directory(args: argparse.Namespace) -> Path:
    """The trail directory the command line names (DIR, --audit-dir or --trail); raises :class:`UsageError` when
    it names two."""
    spelled = [("DIR", args.directory), ("--audit-dir", args.audit_dir)]
    spelled += [("--trail", value) for value in args.trail or ()]
    named = [(spelling, value) for spelling, value in spelled if value is not None]
    if len({Path(value) for _spelling, value in named}) > 1:
        given = " and ".join(f"{spelling} {value!r}" for spelling, value in named)
        raise UsageError(
            f"give the trail directory once: {given} differ (`audit {args.audit_command}` works on one trail; "
            "run it once per trail)"
        )
    return resolve_directory(named[0][1] if named else None)


def _usage_errors(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``func`` with a contradictory command line reported as a usage error (exit 2)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except UsageError as exc:
            print(f"gateway audit: error: {exc}", file=sys.stderr)
            return EXIT_USAGE

    return run


def register(sub: argparse._SubParsersAction[Any]) -> None:
    audit = sub.add_parser(
        "audit",
        help="verify, query and repair the audit trail",
        description=f"Work on an audit trail directory: --audit-dir DIR or DIR {_DIR_DEFAULT}.",
    )
    commands = audit.add_subparsers(dest="audit_command", metavar="AUDIT_COMMAND")
    commands.required = True

    verify = commands.add_parser(
        "verify",
        help="recompute the hash chain; exit 0 intact, 1 broken",
        description=f"Recompute the hash chain (and the HMACs with a key) of the trail in DIR {_DIR_DEFAULT}. "
        "Exit 0 intact, 1 broken.",
    )
    _directory_arguments(verify)
    verify.add_argument("--key-file", metavar="F", help="HMAC key file (default: $GATEWAY_AUDIT_KEY_FILE)")
    verify.add_argument("--json", action="store_true", help="print the report as one JSON object")
    verify.add_argument(
        "--anchor",
        action="extend",
        nargs="+",
        metavar="FILE",
        help="anchor file(s) from `gateway audit anchor`: fail (exit 1) when the trail no longer reaches one "
        "(records deleted from the end, truncation, an older copy put back)",
    )
    verify.set_defaults(func=_usage_errors(_verify))

    anchor = commands.add_parser(
        "anchor",
        help="print (or write) the trail's verified head, to store elsewhere",
        description="Verify the trail and emit its head as an anchor: trail id (the event_id of the first "
        "record), last seq, last hash, time; HMAC'd with the trail key when one is set. Store it where whoever can "
        "edit the trail cannot (a WORM bucket, a ticket, a second host); `gateway audit verify --anchor FILE` and "
        "`gateway report --anchor FILE` then fail when the trail no longer reaches it.",
    )
    anchor.add_argument("--trail", action="append", metavar="DIR", help=f"trail directory, repeatable {_DIR_DEFAULT}")
    anchor.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the anchor there (a directory: one file per trail); default stdout",
    )
    anchor.add_argument("--key-file", metavar="F", help="HMAC key file (default: $GATEWAY_AUDIT_KEY_FILE)")
    anchor.set_defaults(func=_usage_errors(_anchor))

    query = commands.add_parser(
        "query",
        help="print matching records (streaming)",
        description=f"Print the records of the trail in DIR {_DIR_DEFAULT} that match every filter given, in "
        "trail order, as a table (a decision's summary: allow/deny, the denying rules, warn:RULES for warnings, "
        "dry-run for `gateway check`) or as JSON lines.",
    )
    _directory_arguments(query)
    query.add_argument("--since", type=time_argument, metavar="TIME", help="RFC 3339 time, inclusive")
    query.add_argument("--until", type=time_argument, metavar="TIME", help="RFC 3339 time, exclusive")
    query.add_argument("--principal")
    query.add_argument("--decision", choices=("allow", "deny"))
    query.add_argument("--rule", metavar="ID", help="decisions in which this rule did not pass")
    query.add_argument("--image")
    query.add_argument("--event-type", action="append", metavar="TYPE", help="repeatable")
    query.add_argument("--request-id")
    query.add_argument("--policy", metavar="NAME", help="records made under the policy named NAME (metadata.name)")
    query.add_argument(
        "--dry-run",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only the decisions of dry runs (`gateway check`); --no-dry-run: only those of real runs",
    )
    query.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    query.set_defaults(func=_usage_errors(_query))

    repair = commands.add_parser(
        "repair",
        help="seal a torn or broken tail with a recorded recovery event",
        description=f"Seal a torn or broken tail of the trail in DIR {_DIR_DEFAULT}: without --yes, only say "
        "what would be done.",
    )
    _directory_arguments(repair)
    repair.add_argument("--key-file", metavar="F", help="HMAC key file (default: $GATEWAY_AUDIT_KEY_FILE)")
    repair.add_argument("--yes", action="store_true", help="really do it (moves the broken tail to quarantine/)")
    repair.add_argument("--json", action="store_true", help="print the report as one JSON object")
    repair.set_defaults(func=_usage_errors(_repair))

    add_export(commands)


def _key(args: argparse.Namespace) -> bytes | None:
    return load_key(args.key_file) if args.key_file else key_from_env()


def _verify(args: argparse.Namespace) -> int:
    directory = _directory(args)
    key = _key(args)
    anchors = [load_anchor(a) for a in args.anchor or ()]
    report = verify_trail(directory, key=key)
    ident = trail_id(directory) if anchors else None
    checks = [check_anchor(directory, a, report, key=key, ident=ident) for a in anchors]
    anchored = all(c.ok for c in checks)
    if args.json:
        out = report.to_dict()
        if anchors:
            out["anchors"] = [c.to_dict() for c in checks]
        print(json.dumps(out, sort_keys=True))
        return 0 if report.ok and anchored else EXIT_BROKEN
    for check in checks:
        if not check.ok:
            print(f"BROKEN: {directory}: anchor {check.anchor.source} not reached: {check.reason}: {check.detail}")
    if not anchored and report.ok:
        _print_verify(report)
        return EXIT_BROKEN
    for check in checks:
        if check.ok:
            hmac = "" if check.hmac_checked else " (anchor HMAC not checked: no key)"
            print(f"anchor {check.anchor.source}: {check.detail}{hmac}")
    return _print_verify(report)


def _print_verify(report: VerifyReport) -> int:
    hmac = "hashes and HMACs" if report.hmac_checked else "hashes only"
    print(f"records checked: {report.records_checked} in {report.segments} segment(s) ({hmac})")
    if report.hmac_status == "not_checked":
        print(
            "WARNING: HMACs were NOT checked: the records carry HMACs but no key was given, so anyone who can "
            "write the trail could have re-forged it; pass --key-file (or set GATEWAY_AUDIT_KEY_FILE)"
        )
    elif report.hmac_status == "absent":
        print(
            "WARNING: HMACs were NOT checked: no record carries one (an unkeyed trail, or every HMAC was "
            "stripped); the hash chain alone does not prove who wrote it. If this trail was written with a key, "
            "verify with --key-file: it will fail"
        )
    brk = report.first_break
    if brk is None:
        print(f"OK: chain intact up to seq {report.last_seq}")
        return 0
    print(f"BROKEN at seq {brk.seq} ({brk.segment} line {brk.line}): {brk.reason}: {brk.detail}")
    return EXIT_BROKEN


def _anchor(args: argparse.Namespace) -> int:
    directories = [Path(v) for v in args.trail] if args.trail else [resolve_directory(None)]
    output = None if args.output in (None, "-") else Path(args.output)
    if len(directories) > 1 and output is not None and not output.is_dir():
        raise UsageError(f"{len(directories)} trails give {len(directories)} anchors: -o must be a directory")
    key = _key(args)
    # Every trail verified and anchored before anything is written: one that cannot be leaves no partial set.
    anchors = [(d, anchor_from_report(d, verify_trail(d, key=key), key=key)) for d in directories]
    for directory, anchor in anchors:
        if output is None:
            sys.stdout.write(anchor.to_bytes().decode("ascii"))
            continue
        target = output / f"anchor-{anchor.trail or 'empty'}-{anchor.seq:012d}.json" if output.is_dir() else output
        write_anchor(anchor, target)
        print(f"anchored {directory} at seq {anchor.seq} in {target}", file=sys.stderr)
    return 0


def _summary(record: dict[str, Any]) -> str:
    data = record.get("data") or {}
    kind = record.get("event_type")
    if kind == "policy.decision":
        decision = data.get("decision") or {}
        parts = ["dry-run"] if data.get("dry_run") is True else []
        parts.append("allow" if decision.get("allowed") else "deny")
        for group, prefix in (("violations", ""), ("warnings", "warn:")):
            rules = sorted({str(v.get("rule")) for v in decision.get(group) or () if isinstance(v, dict)})
            if rules:
                parts.append(prefix + ",".join(rules))
        return " ".join(parts)
    if kind == "policy.rejected":
        return f"{data.get('source')}: {len(data.get('problems') or ())} problem(s)"
    if kind == "execution.outcome":
        parts = [f"exit={data.get('exit_code')}"]
        parts.extend(flag for flag in ("timed_out", "oom_killed") if data.get(flag))
        parts.append(f"{data.get('duration_ms')}ms")
        return " ".join(parts)
    if kind == "request.received":
        request = data.get("request") or {}
        return f"image={request.get('image', '-')} code={request.get('code_bytes', '-')}B"
    if kind in ("policy.loaded", "policy.reloaded"):
        return f"{data.get('name')} {str(data.get('sha256'))[:12]}"
    if kind == "recovery":
        return f"last_good_seq={data.get('last_good_seq')} dropped={data.get('dropped_bytes')}B"
    if kind == "containers.reaped":
        return f"{len(data.get('container_ids') or ())} container(s)"
    return ""


_COLUMNS = (("seq", 7), ("timestamp", 27), ("event_type", 18), ("request_id", 36), ("principal", 16))


def _print_row(out: TextIO, values: list[str], last: str) -> None:
    cells = [value[:width].ljust(width) for value, (_name, width) in zip(values, _COLUMNS, strict=True)]
    out.write(" ".join([*cells, last]).rstrip() + "\n")


def _query(args: argparse.Namespace) -> int:
    filters = QueryFilters(
        since=args.since,
        until=args.until,
        principal=args.principal,
        decision=args.decision,
        rule=args.rule,
        image=args.image,
        event_types=None if not args.event_type else frozenset(args.event_type),
        request_id=args.request_id,
        policy=args.policy,
        dry_run=args.dry_run,
    )

    def skipped(segment: str, line: int) -> None:
        print(f"warning: {segment} line {line} is not a complete record; skipped", file=sys.stderr)

    records = query_trail(_directory(args), filters, on_skip=skipped)
    out = sys.stdout
    try:
        if not args.json:
            _print_row(out, [name for name, _w in _COLUMNS], "summary")
        for record in records:
            if args.json:
                out.write(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")
            else:
                values = [str(record.get(name) if record.get(name) is not None else "-") for name, _w in _COLUMNS]
                _print_row(out, values, _summary(record))
        out.flush()
    except BrokenPipeError:  # `| head`: the reader has what it wanted
        return 0
    return 0


def _repair(args: argparse.Namespace) -> int:
    directory = _directory(args)
    key = _key(args)
    if not args.yes:
        report = verify_trail(directory, key=key)
        brk = report.first_break
        if brk is None:
            print(f"trail intact ({report.records_checked} records); nothing to repair")
            return 0
        print(f"BROKEN at seq {brk.seq} ({brk.segment} line {brk.line}): {brk.reason}: {brk.detail}")
        print(
            f"repair would move everything from {brk.segment} byte {brk.offset} on to quarantine/ and append a "
            f"recovery record at seq {brk.seq}; re-run with --yes",
            file=sys.stderr,
        )
        return EXIT_USAGE
    result = repair_trail(directory, key=key)
    if args.json:
        print(json.dumps(result.to_dict(), sort_keys=True))
    elif result.repaired:
        print(
            f"sealed: recovery record at seq {result.recovery_seq} after seq {result.last_good_seq}; "
            f"{result.dropped_bytes} bytes moved to quarantine/ ({', '.join(result.quarantined)})"
        )
        print(f"reason: {result.reason}")
    else:
        print(f"trail intact up to seq {result.last_good_seq}; nothing to repair")
    return 0

"""``gateway policy show | diff | impact`` and the expiry warnings of ``gateway policy validate``.

What a reviewer needs before a policy change lands: the effective policy (after ``extends``), what changes
between two policies, and whom a candidate policy would deny, replayed from the requests on the trail.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

import yaml

from gateway.audit import resolve_directory
from gateway.audit.query import query_trail
from gateway.cli.arguments import time_argument
from gateway.decision import evaluate
from gateway.errors import AuditIntegrityError, RequestError
from gateway.policy import Policy, compile_policy, load_policy
from gateway.policy.compose import load_document
from gateway.request import parse_request
from gateway.runner.docker.options import DockerAssembler

__all__ = ["diff_egress", "expiry_warnings", "parse_duration", "register", "replay_request"]

_ABSENT = "(absent)"
_DURATION = re.compile(r"([0-9]{1,6})([smhdw]?)")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks", "": "days"}


def parse_duration(text: str) -> timedelta:
    """``14d``, ``36h``, ``2w`` (a bare number is days)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; write e.g. 14d, 36h or 2w")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def expiry_warnings(policy: Policy, *, now: datetime, ahead: timedelta | None) -> Iterator[str]:
    """One line per exception of ``policy`` (and of its shadow policy) that has expired, or expires within
    ``ahead`` of ``now``."""
    for owner in (policy, policy.audit_policy):
        if owner is None:
            continue
        for exc in owner.exceptions:
            where = f"{exc.source}:{exc.line}" if exc.line is not None else exc.source
            stamp = exc.expires.astimezone(UTC).isoformat().replace("+00:00", "Z")
            if exc.expires <= now:
                yield f"{where}: warning: exception {exc.id} expired at {stamp}; it is ignored, remove or renew it"
            elif ahead is not None and exc.expires <= now + ahead:
                left = exc.expires - now
                days = left.days
                when = f"in {days} day(s)" if days else f"in {int(left.total_seconds() // 3600)} hour(s)"
                yield f"{where}: warning: exception {exc.id} expires {when} ({stamp}; approved by {exc.approved_by})"


# --- show -----------------------------------------------------------------------------------------------


def _show(args: argparse.Namespace) -> int:
    policy = load_policy(args.file)  # refuses an invalid policy with every problem (file:line: $.path)
    doc = load_document(args.file).data
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print(f"# effective policy of {args.file}: {policy.name}@sha256:{policy.sha256}")
    sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100))
    return 0


# --- diff -----------------------------------------------------------------------------------------------


def _flatten(value: Any, path: str, out: dict[str, Any]) -> None:
    """Leaves of the document by JSON path; a mapping is walked, everything else (lists too) is one value."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            _flatten(item, f"{path}.{key}", out)
    else:
        out[path] = value


def diff_documents(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every JSON path whose effective value differs: ``{"path", "old", "new"}``, absent sides omitted."""
    a: dict[str, Any] = {}
    b: dict[str, Any] = {}
    _flatten(dict(old), "$", a)
    _flatten(dict(new), "$", b)
    changes = []
    for path in sorted(set(a) | set(b)):
        if path in a and path in b and a[path] == b[path]:
            continue
        change: dict[str, Any] = {"path": path}
        if path in a:
            change["old"] = a[path]
        if path in b:
            change["new"] = b[path]
        changes.append(change)
    return changes


def _compact(change: Mapping[str, Any], key: str) -> str:
    if key not in change:
        return _ABSENT
    value = change[key]
    return value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))


def _egress_entries(policy: Policy) -> dict[str, dict[str, Any]]:
    rule = policy.network.egress
    return {
        d.host if d.kind == "network" else ("*." if d.kind == "wildcard" else "") + d.key: {
            "ports": list(d.ports),
            "cidrs": [str(c) for c in d.cidrs],
        }
        for d in (rule.allow if rule is not None else ())
    }


def diff_egress(old: Policy, new: Policy) -> list[dict[str, Any]]:
    """The egress destinations a policy change adds, removes or changes (ports, CIDRs), compared by normalised
    host: ``{"host", "change", "old", "new"}``, absent sides omitted. What a reviewer must see of an egress change:
    a host the sandbox may newly reach."""
    a, b = _egress_entries(old), _egress_entries(new)
    out: list[dict[str, Any]] = []
    for host in sorted(set(a) | set(b)):
        if host in a and host in b and a[host] == b[host]:
            continue
        change: dict[str, Any] = {"host": host, "change": "changed" if host in a and host in b else "added"}
        if host in a:
            change["old"] = a[host]
            change["change"] = "changed" if host in b else "removed"
        if host in b:
            change["new"] = b[host]
        out.append(change)
    return out


def _show_entry(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return _ABSENT
    cidrs = f" cidrs {', '.join(entry['cidrs'])}" if entry["cidrs"] else ""
    return f"ports {', '.join(map(str, entry['ports']))}{cidrs}"


def _diff(args: argparse.Namespace) -> int:
    old_policy, new_policy = load_policy(args.old), load_policy(args.new)
    changes = diff_documents(load_document(args.old).data, load_document(args.new).data)
    egress = diff_egress(old_policy, new_policy)
    if args.json:
        refs = {"old": _ref(old_policy, args.old), "new": _ref(new_policy, args.new)}
        extra = {"egress": egress} if egress else {}
        print(json.dumps({**refs, "changes": changes, **extra}, indent=2, sort_keys=True))
    else:
        print(f"--- {args.old} ({old_policy.name}@sha256:{old_policy.sha256[:12]})")
        print(f"+++ {args.new} ({new_policy.name}@sha256:{new_policy.sha256[:12]})")
        for change in changes:
            print(f"{change['path']}: {_compact(change, 'old')} -> {_compact(change, 'new')}")
        for item in egress:
            mark = {"added": "+", "removed": "-", "changed": "~"}[item["change"]]
            shown = _show_entry(item.get("new") or item.get("old"))
            if item["change"] == "changed":
                shown = f"{_show_entry(item['old'])} -> {_show_entry(item['new'])}"
            print(f"egress {mark} {item['host']}: {shown} ({item['change']})")
        if not changes:
            print("no differences in the effective policies")
    return 1 if changes else 0


def _ref(policy: Policy, source: str) -> dict[str, str]:
    return {"name": policy.name, "sha256": policy.sha256, "source": source}


# --- impact ---------------------------------------------------------------------------------------------


def replay_request(record: Mapping[str, Any]) -> dict[str, Any]:
    """The request of a ``request.received`` record, rebuilt as far as the trail keeps it.

    The trail keeps the code only up to its cap (and its full size), file names and sizes but no contents,
    variable names but no values. Code and files are rebuilt as filler of the recorded sizes (no rule reads
    their contents), variables with empty values: a rule about variable *values* (``env.limits`` sizes) sees
    less than the original request had."""
    stored = record["data"]["request"]
    out: dict[str, Any] = {
        k: stored[k]
        for k in ("language", "image", "network", "runtime", "limits", "mounts", "egress", "packages")
        if k in stored
    }
    code = stored.get("code", "")
    size = stored.get("code_bytes")
    raw = code.encode("utf-8", "surrogatepass")
    out["code"] = code + "#" * (size - len(raw)) if isinstance(size, int) and size > len(raw) else code or "#"
    files = stored.get("files")
    if isinstance(files, list):
        out["files"] = {f["name"]: "x" * int(f["bytes"]) for f in files}
    if stored.get("env_names"):
        out["env"] = dict.fromkeys(stored["env_names"], "")
    principal = record.get("principal") or stored.get("principal")
    if principal:
        out["principal"] = principal
    return out


@dataclass
class _Who:
    requests: int = 0
    denied: int = 0
    rules: dict[str, int] = field(default_factory=dict)


def _impact(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy_file)
    compiled = compile_policy(policy)
    directory = resolve_directory(args.audit_dir)
    since = args.since
    records = query_trail(directory, since=since, event_types={"request.received", "policy.decision"})
    received: list[Mapping[str, Any]] = []
    recorded: dict[str, bool] = {}
    for record in records:
        if record.get("event_type") == "policy.decision":
            decision = record.get("data", {}).get("decision", {})
            if isinstance(decision, dict) and isinstance(decision.get("allowed"), bool):
                recorded[str(record.get("request_id"))] = decision["allowed"]
        else:
            received.append(record)
    assembler = DockerAssembler()
    denied_paths = (str(Path(directory).resolve()),)
    who: dict[str, _Who] = {}
    denied: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for item in received:
        request_id = str(item.get("request_id"))
        try:
            request = parse_request(replay_request(item))
        except (KeyError, TypeError, ValueError, RequestError, AuditIntegrityError) as exc:
            skipped.append({"request_id": request_id, "seq": item.get("seq"), "reason": str(exc)})
            continue
        decision = evaluate(compiled, request, assembler=assembler, denied_paths=denied_paths)
        name = request.principal or "-"
        entry = who.setdefault(name, _Who())
        entry.requests += 1
        if decision.allowed:
            continue
        entry.denied += 1
        rules = sorted({v.rule for v in decision.violations})
        for rule in rules:
            entry.rules[rule] = entry.rules.get(rule, 0) + 1
        denied.append(
            {
                "request_id": request_id,
                "timestamp": item.get("timestamp"),
                "principal": request.principal,
                "rules": rules,
                "was_allowed": recorded.get(request_id),
            }
        )
    report = {
        "policy": _ref(policy, args.policy_file),
        "audit_dir": str(directory),
        "since": since,
        "replayed": sum(w.requests for w in who.values()),
        "principals": [
            {"principal": n, "requests": w.requests, "denied": w.denied, "rules": dict(sorted(w.rules.items()))}
            for n, w in sorted(who.items())
        ],
        "denied": denied,
        "skipped": skipped,
    }
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        _print_impact(sys.stdout, report)
    return 0


def _print_impact(out: TextIO, report: Mapping[str, Any]) -> None:
    ref = report["policy"]
    since = f" since {report['since']}" if report["since"] else ""
    out.write(
        f"{report['replayed']} recorded request(s){since} replayed under {ref['source']} "
        f"({ref['name']}@sha256:{ref['sha256'][:12]})\n"
    )
    rows = [(p["principal"], str(p["requests"]), str(p["denied"]), _rules(p["rules"])) for p in report["principals"]]
    width = max([len(r[0]) for r in rows] + [9])
    out.write(f"{'principal':<{width}}  {'requests':>8}  {'denied':>6}  rules\n")
    for name, requests, count, rules in rows:
        out.write(f"{name:<{width}}  {requests:>8}  {count:>6}  {rules}\n")
    if report["denied"]:
        out.write("would be denied:\n")
        for item in report["denied"]:
            then = {True: "allowed then", False: "denied then", None: "no decision on record"}[item["was_allowed"]]
            who = item["principal"] or "-"
            out.write(f"  {item['timestamp']}  {item['request_id']}  {who}  {','.join(item['rules'])}  ({then})\n")
    for item in report["skipped"]:
        out.write(f"skipped: record seq {item['seq']} ({item['request_id']}): {item['reason']}\n")


def _rules(rules: Mapping[str, int]) -> str:
    return ", ".join(f"{rule} ({count})" for rule, count in rules.items()) or "-"


def register(policy_sub: argparse._SubParsersAction[Any]) -> None:
    show = policy_sub.add_parser("show", help="print the effective policy (after extends) as YAML")
    show.add_argument("file", metavar="FILE")
    show.add_argument("--json", action="store_true", help="print it as JSON instead")
    show.set_defaults(func=_show)

    diff = policy_sub.add_parser(
        "diff", help="what changes between the effective values of two policies (exit 1 when they differ)"
    )
    diff.add_argument("old", metavar="A")
    diff.add_argument("new", metavar="B")
    diff.add_argument("--json", action="store_true", help="print the changes as JSON")
    diff.set_defaults(func=_diff)

    impact = policy_sub.add_parser(
        "impact", help="replay the requests on the audit trail under a candidate policy: who would be denied, why"
    )
    impact.add_argument("policy_file", metavar="NEW.yaml")
    impact.add_argument(
        "--since", type=time_argument, metavar="T", help="only requests recorded at or after T (RFC 3339 or a date)"
    )
    impact.add_argument("--audit-dir", help="audit trail directory (default: $GATEWAY_AUDIT_DIR, then ./audit)")
    impact.add_argument("--json", action="store_true", help="print the report as JSON")
    impact.set_defaults(func=_impact)

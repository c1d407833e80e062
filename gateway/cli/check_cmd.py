"""``gateway check``: decide one request and print the decision with the assembled options. Nothing runs.

The decision goes through the same :class:`~gateway.Gateway` as ``run`` (the same policy choice, the same
assembler) and is audited as a dry run: every decision the gateway makes is on the trail.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gateway._gateway import Gateway
from gateway.cli.backend import add_backend_args, make_runner
from gateway.cli.policy_cmd import policy_path_for
from gateway.decision import Decision
from gateway.errors import EXIT_DENIED, RequestError, exit_code_for
from gateway.request import MAX_REQUEST_BYTES

__all__ = ["check_main", "register", "render_decision"]


def _read_request(name: str) -> tuple[bytes, str]:
    if name == "-":
        data = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
        return data, "<stdin>"
    try:
        with Path(name).open("rb") as fh:
            return fh.read(MAX_REQUEST_BYTES + 1), name
    except OSError as exc:
        raise RequestError(f"cannot read request file {name}: {exc.strerror or exc}") from exc


def render_decision(decision: Decision) -> str:
    """The human-readable view of a decision: verdict, every non-pass result, then the options."""
    verdict = "ALLOW" if decision.allowed else "DENY"
    lines = [
        f"decision: {verdict}",
        f"  policy:   {decision.policy.name}@sha256:{decision.policy.sha256} ({decision.policy.source})",
        f"  decision: {decision.decision_id}   request: {decision.request_id}",
    ]
    if decision.violations:
        lines.append("violations:")
        lines.extend(f"  {v.rule:<22} {v.path:<24} {v.message}" for v in decision.violations)
    if decision.warnings:
        lines.append("warnings:")
        lines.extend(f"  {w.rule:<22} {w.path:<24} {w.message}" for w in decision.warnings)
    passed = [r for r in decision.results if r.status == "pass"]
    lines.append(f"rules: {len(passed)} passed, {len(decision.results) - len(passed)} other")
    if decision.settings is not None and decision.run is not None:
        lines.append("plan:")
        lines.extend(f"  {k}: {_shown(v)}" for k, v in decision.settings.plan().items())
    options = decision.recorded_options
    if options is not None and decision.run is not None:
        lines.append(f"options ({decision.run.backend} backend):")
        shown = json.dumps(dict(options), indent=2, sort_keys=True)
        lines.extend("  " + line for line in shown.splitlines())
    return "\n".join(lines)


def _shown(value: Any) -> Any:
    """A plan value as the output shows it: a list or mapping (mounts, egress) as compact JSON, else as it is."""
    return json.dumps(value, sort_keys=True) if isinstance(value, list | tuple | dict) else value


def check_main(args: argparse.Namespace) -> int:
    """Decide one request; exit 0 allow, 77 deny, 2 invalid, 125 if the gateway cannot decide. Nothing runs.

    The decision goes through the same :class:`Gateway` as ``run`` and is audited as a dry run: every decision
    the gateway makes is on the trail.
    """
    data, _source = _read_request(args.request)
    runner = make_runner(args)  # never contacts a cluster or an engine: check only decides
    try:
        with Gateway.from_env(policy_path_for(args), args.audit_dir, runner=runner) as gw:
            result = gw.decide(data)
    finally:
        if runner is not None:
            runner.close()
    if result.error is not None:
        if args.json:
            print(json.dumps({"allowed": False, "request_id": result.request_id, "error": result.error.to_dict()}))
        else:
            print(result.error.diagnostics(), file=sys.stderr)
        return exit_code_for(result.error)
    decision = result.decision
    assert decision is not None  # noqa: S101 - decide() returns a decision whenever it reports no error
    if args.json:
        out = decision.to_dict()
        options = out.get("options")
        if decision.run is not None and decision.run.backend == "kubernetes" and isinstance(options, dict):
            out["pod"] = options["pod"]  # the full manifest the runner would submit (also in options.pod)
            out["pod_sha256"] = options["pod_sha256"]
        print(json.dumps(out, indent=2, sort_keys=True))
    else:
        print(render_decision(decision))
    return 0 if decision.allowed else EXIT_DENIED


def register(sub: argparse._SubParsersAction[Any]) -> None:
    check = sub.add_parser("check", help="decide a request (JSON file or - for stdin) without running it")
    check.add_argument("request", metavar="REQUEST.json|-")
    check.add_argument("--policy", metavar="FILE", help="policy file (default: $GATEWAY_POLICY, then the default)")
    check.add_argument("--audit-dir", help="audit trail directory (default: $GATEWAY_AUDIT_DIR, then ./audit)")
    check.add_argument("--json", action="store_true", help="print the decision as JSON")
    add_backend_args(check)
    check.set_defaults(func=check_main)

"""``gateway policy validate``, ``gateway policy test`` and ``gateway check``.

``check`` only decides: it parses the request, evaluates it and prints the decision with the assembled
options. Nothing runs. ``load_policy_for(args)`` is the one place that picks the policy file, so other
commands (``run``) choose it the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from gateway.decision import Decision
from gateway.errors import EXIT_DENIED, EXIT_USAGE, PolicyError, RequestError, exit_code_for
from gateway.policy import Policy, load_policy
from gateway.policy.testing import run_suites
from gateway.request import MAX_REQUEST_BYTES
from gateway.resources import policy_path_from_env

__all__ = ["check_main", "load_policy_for", "policy_path_for", "register", "render_decision"]


def policy_path_for(args: argparse.Namespace) -> Path:
    """``--policy``, else ``GATEWAY_POLICY``, else the shipped default policy."""
    return policy_path_from_env(getattr(args, "policy", None))


def load_policy_for(args: argparse.Namespace) -> Policy:
    """Load the policy the command line selects (see :func:`policy_path_for`); raises ``PolicyError``."""
    return load_policy(policy_path_for(args))


# --- validate -------------------------------------------------------------------------------------------


def _validate(args: argparse.Namespace) -> int:
    out: TextIO = sys.stdout
    failed = 0
    for name in args.files:
        try:
            policy = load_policy(name)
        except PolicyError as exc:
            failed += 1
            if exc.problems:
                for problem in exc.problems:
                    print(str(problem), file=out)
            else:
                print(f"{name}: {exc.message}", file=out)
            continue
        print(f"{name}: ok ({policy.name}@sha256:{policy.sha256[:12]})", file=out)
    return 1 if failed else 0


# --- test -----------------------------------------------------------------------------------------------


def _test(args: argparse.Namespace) -> int:
    directory = Path(args.directory)
    if not directory.is_dir():
        print(f"{directory}: not a directory", file=sys.stderr)
        return EXIT_USAGE
    results = run_suites(directory)
    if args.json:
        print(json.dumps([_case(r) for r in results], indent=2))
    else:
        width = max([len(r.name) for r in results] + [4])
        print(f"{'':4} {'case':<{width}}  {'expected':<40} got")
        for r in results:
            mark = "ok" if r.ok else "FAIL"
            print(f"{mark:4} {r.name:<{width}}  {r.expected:<40} {r.got}")
            if not r.ok and r.detail:
                print(f"     {r.suite}: {r.detail}")
    passed = sum(r.ok for r in results)
    print(f"{passed} passed, {len(results) - passed} failed, {len(results)} total")
    if not results:
        print(f"no suites (kind: PolicyTest) under {directory}", file=sys.stderr)
        return 1
    return 0 if passed == len(results) else 1


def _case(r: Any) -> dict[str, Any]:
    return {
        "suite": r.suite,
        "name": r.name,
        "ok": r.ok,
        "expected": r.expected,
        "got": r.got,
        "detail": r.detail,
    }


# --- check ----------------------------------------------------------------------------------------------


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
    if decision.plan is not None:
        lines.append("plan:")
        lines.extend(f"  {k}: {v}" for k, v in decision.plan.to_dict().items())
    options = decision.options
    if options is not None:
        lines.append("options (docker-py containers.create):")
        lines.extend("  " + line for line in json.dumps(options, indent=2, sort_keys=True).splitlines())
    return "\n".join(lines)


def check_main(args: argparse.Namespace) -> int:
    """Decide one request; exit 0 allow, 77 deny, 2 invalid, 125 if the gateway cannot decide. Nothing runs.

    The decision goes through the same :class:`Gateway` as ``run`` and is audited as a dry run: every decision
    the gateway makes is on the trail.
    """
    from gateway.service import Gateway  # noqa: PLC0415 - the policy commands must not need the runner stack

    data, _source = _read_request(args.request)
    with Gateway.from_env(policy_path_for(args), args.audit_dir) as gw:
        result = gw.decide(data)
    if result.error is not None:
        if args.json:
            print(json.dumps({"allowed": False, "request_id": result.request_id, "error": result.error.to_dict()}))
        else:
            print(result.error.diagnostics(), file=sys.stderr)
        return exit_code_for(result.error)
    decision = result.decision
    assert decision is not None  # noqa: S101 - decide() returns a decision whenever it reports no error
    if args.json:
        print(json.dumps(decision.to_dict(), indent=2, sort_keys=True))
    else:
        print(render_decision(decision))
    return 0 if decision.allowed else EXIT_DENIED


def register(sub: argparse._SubParsersAction[Any]) -> None:
    policy = sub.add_parser("policy", help="validate and test policies")
    policy_sub = policy.add_subparsers(dest="policy_command", metavar="SUBCOMMAND")
    policy_sub.required = True

    validate = policy_sub.add_parser("validate", help="check policy files; every problem as file:line: $.path: msg")
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.set_defaults(func=_validate)

    test = policy_sub.add_parser("test", help="run the policy test suites (kind: PolicyTest) under DIR")
    test.add_argument("directory", metavar="DIR")
    test.add_argument("--json", action="store_true", help="print the case results as JSON")
    test.set_defaults(func=_test)

    check = sub.add_parser("check", help="decide a request (JSON file or - for stdin) without running it")
    check.add_argument("request", metavar="REQUEST.json|-")
    check.add_argument("--policy", metavar="FILE", help="policy file (default: $GATEWAY_POLICY, then the default)")
    check.add_argument("--audit-dir", help="audit trail directory (default: $GATEWAY_AUDIT_DIR, then ./audit)")
    check.add_argument("--json", action="store_true", help="print the decision as JSON")
    check.set_defaults(func=check_main)

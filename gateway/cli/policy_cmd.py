"""``gateway policy validate`` and ``gateway policy test`` (``show``, ``diff``, ``impact``: :mod:`policy_review`).

``load_policy_for(args)`` is the one place that picks the policy file, so other commands choose it the same
way.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from gateway.cli import policy_review, rules_cmd
from gateway.errors import EXIT_USAGE, PolicyError
from gateway.policy import Policy, load_policy
from gateway.resources import policy_path_from_env
from gateway.testing import run_suites

__all__ = ["load_policy_for", "policy_path_for", "register"]


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
        for warning in policy_review.expiry_warnings(policy, now=datetime.now(UTC), ahead=args.warn_expiring):
            print(warning, file=out)
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
            if not r.ok and r.detail:  # a broken suite's problems already start with file:line
                print(f"     {r.detail}" if r.detail.startswith(r.suite) else f"     {r.suite}: {r.detail}")
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


def register(sub: argparse._SubParsersAction[Any]) -> None:
    policy = sub.add_parser("policy", help="validate and test policies")
    policy_sub = policy.add_subparsers(dest="policy_command", metavar="SUBCOMMAND")
    policy_sub.required = True

    validate = policy_sub.add_parser("validate", help="check policy files; every problem as file:line: $.path: msg")
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.add_argument(
        "--warn-expiring",
        metavar="DURATION",
        type=policy_review.parse_duration,
        help="also warn about exceptions that expire within DURATION (14d, 36h, 2w); expired ones always warn",
    )
    validate.set_defaults(func=_validate)

    test = policy_sub.add_parser(
        "test",
        help="run the policy test suites (kind: PolicyTest) under DIR",
        description="Run every suite (a *.yaml with kind: PolicyTest) under DIR. Suites are validated strictly "
        "against schemas/policy-test.schema.json: an unknown key or a decision case without `allowed` is an "
        "error (file:line: $.path), and a suite with any problem runs no case. Exit 0 when every case passes.",
    )
    test.add_argument("directory", metavar="DIR")
    test.add_argument("--json", action="store_true", help="print the case results as JSON")
    test.set_defaults(func=_test)

    rules_cmd.register(policy_sub)
    policy_review.register(policy_sub)

"""The ``gateway`` command: a thin shell over the library.

Each sub-command lives in its own module with a ``register(subparsers)`` function that adds its parser and
sets ``func`` (``args -> int``). ``main(argv)`` is what tests call; it never calls ``sys.exit``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gateway.cli import (
    audit_cmd,
    check_cmd,
    doctor_cmd,
    kubernetes_cmd,
    mcp_cmd,
    policy_cmd,
    principals_cmd,
    report_cmd,
    run_cmd,
    sbom_cmd,
    serve_cmd,
)
from gateway.errors import EXIT_USAGE, GatewayError, exit_code_for

__all__ = ["console_main", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway",
        description="Policy-driven security gateway for AI-agent code execution.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    policy_cmd.register(sub)
    check_cmd.register(sub)
    run_cmd.register(sub)
    audit_cmd.register(sub)
    report_cmd.register(sub)
    doctor_cmd.register(sub)
    principals_cmd.register(sub)
    mcp_cmd.register(sub)
    serve_cmd.register(sub)
    sbom_cmd.register(sub)
    kubernetes_cmd.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # argparse exits on usage errors and --help
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    try:
        rc: int = args.func(args)
    except GatewayError as exc:
        print(exc.diagnostics(), file=sys.stderr)
        return exit_code_for(exc)
    except KeyboardInterrupt:
        return 130
    return rc


def console_main() -> None:
    sys.exit(main())

"""The ``gateway`` command: a thin shell over the library.

Each sub-command lives in its own module with a ``register(subparsers)`` function that adds its parser and
sets ``func`` (``args -> int``). ``main(argv)`` is what tests call; it never calls ``sys.exit``. A command line
naming a sub-command imports only that sub-command's module (each one imports what it runs: Docker, the policy
loader, the report, the service ...: about 0.4 s of CPU for all of them, on every call); anything else (no
command, ``--help``, a misspelt one) builds the whole parser.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib import import_module

from gateway.errors import EXIT_USAGE, GatewayError, exit_code_for

__all__ = ["COMMANDS", "build_parser", "console_main", "main"]

COMMANDS: dict[str, str] = {
    "policy": "policy_cmd",
    "check": "check_cmd",
    "run": "run_cmd",
    "reap": "run_cmd",
    "audit": "audit_cmd",
    "report": "report_cmd",
    "doctor": "doctor_cmd",
    "principals": "principals_cmd",
    "mcp": "mcp_cmd",
    "serve": "serve_cmd",
    "sbom": "sbom_cmd",
    "kubernetes": "kubernetes_cmd",
    "session": "session_cmd",
    "approvals": "approvals_cmd",
}
"""Each sub-command, in the order ``--help`` lists them, and the module (in this package) that registers it."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every sub-command, or only of ``command`` (one of :data:`COMMANDS`)."""
    parser = argparse.ArgumentParser(
        prog="gateway",
        description="Policy-driven security gateway for AI-agent code execution.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    wanted = [COMMANDS[command]] if command is not None else COMMANDS.values()
    for module in dict.fromkeys(wanted):
        import_module(f"gateway.cli.{module}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(argv) if argv is not None else sys.argv[1:]
    first = arguments[0] if arguments else None
    parser = build_parser(first if first in COMMANDS else None)
    try:
        args = parser.parse_args(arguments)
    except SystemExit as exc:  # argparse exits on usage errors and --help
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    try:
        rc: int = args.func(args)
    except GatewayError as exc:
        print(exc.diagnostics(), file=sys.stderr)
        return exit_code_for(exc)
    except OSError as exc:  # what the machine refused (an output file that cannot be written, a full disk)
        where = f": {exc.filename}" if exc.filename else ""
        error = GatewayError(f"{exc.strerror or exc}{where}")
        print(error.diagnostics(), file=sys.stderr)
        return exit_code_for(error)
    except KeyboardInterrupt:
        return 130
    return rc


def console_main() -> None:
    sys.exit(main())

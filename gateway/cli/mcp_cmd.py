"""``gateway mcp``: serve the LLM tools (one per language the policy allows) over MCP stdio (see
:mod:`gateway.service.mcp`).

Stdout carries only the protocol: the wire is claimed before the principal, the policy or the trail are even
read, so every message of this command (errors included) goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from gateway import Gateway
from gateway.errors import EXIT_USAGE, GatewayError, PrincipalIdentityError, exit_code_for

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    mcp = sub.add_parser(
        "mcp",
        help="serve the execute_<language> tools to an MCP client over stdio",
        description="Serve the tools of the policy (execute_python, and execute_shell / execute_javascript where "
        "it allows those languages) over MCP stdio as one principal: --principal NAME from the "
        "principals file (its policy and max_concurrent quota), or, without one, an explicit --policy FILE with "
        "calls audited as local:<process owner>. Every call is decided by that policy and audited. Stdout "
        "carries only the protocol; logs go to stderr. Stops when the client closes stdin, or on SIGTERM/SIGINT "
        "(running sandboxes are removed first). With --session, the execute_python calls of the connection share one "
        "gateway session (a live interpreter, or a persistent workspace), created at start if the policy allows it "
        "(else exit status 77) and closed when the connection ends.",
    )
    mcp.add_argument("--principal", help="act as this principal of the principals file")
    mcp.add_argument("--principals", help="principals file (default: $GATEWAY_PRINCIPALS, then ./principals.yaml)")
    mcp.add_argument("--policy", help="policy file, when serving without --principal (required then)")
    mcp.add_argument("--audit-dir", help="audit trail directory (default: $GATEWAY_AUDIT_DIR, then ./audit)")
    mcp.add_argument(
        "--session",
        choices=("kernel", "workspace"),
        help="keep state between the calls of the connection in one session of this mode: kernel (variables, "
        "imports and files persist) or workspace (files persist); off by default (each call starts from nothing)",
    )
    mcp.set_defaults(func=_mcp)


def _mcp(args: argparse.Namespace) -> int:
    try:
        from gateway.service import mcp  # noqa: PLC0415 - the mcp SDK is an optional extra
    except ImportError as exc:
        print(
            f"gateway mcp: the MCP SDK is not installed ({exc}): pip install 'agent-exec-gateway[mcp]'", file=sys.stderr
        )
        return EXIT_USAGE

    with mcp.claim_stdio() as wire:
        try:
            identity = mcp.resolve_identity(
                principal=args.principal, principals_file=args.principals, policy=args.policy
            )
        except PrincipalIdentityError as exc:
            print(exc.diagnostics(), file=sys.stderr)
            return EXIT_USAGE
        try:
            with Gateway.from_env(identity.policy, args.audit_dir) as gateway:
                _sweep(gateway)
                return mcp.serve(gateway, identity, wire, session=args.session)
        except GatewayError as exc:
            print(exc.diagnostics(), file=sys.stderr)
            return exit_code_for(exc)


def _sweep(gateway: Gateway) -> None:
    """Remove sandboxes past their deadline before serving (best effort, audited), like ``gateway run``."""
    with contextlib.suppress(GatewayError):
        gateway.reap(expired_only=True)

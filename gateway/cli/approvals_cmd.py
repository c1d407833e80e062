"""``gateway approvals list|show|approve|deny``: an operator decides the requests approve-mode rules held.

It works on the local trail (``--audit-dir``, else ``GATEWAY_AUDIT_DIR``, else ``./audit``): the approvals are
rebuilt from its last segments, and ``approve`` / ``deny`` append ``approval.granted`` / ``approval.denied`` with
the OS user as the approver (``os:<user>``) and the reason given. A gateway that starts afterwards on that trail
(``gateway run``, ``gateway serve``) sees the verdict; the agent then submits the identical request again.
Exit status: **0** done; **2** usage, an unknown id or an approval that cannot be decided (already decided,
expired, ``--digest`` not the request's); **125** the trail cannot be read or written.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from datetime import UTC, datetime
from typing import Any

from gateway.audit import JsonlAuditTrail
from gateway.audit.approvals import Approval, ApprovalStore

__all__ = ["register"]

_STATES = ("pending", "granted", "denied", "used", "expired")


def _approver() -> str:
    return f"os:{getpass.getuser()}"


def _with_store(args: argparse.Namespace, act: Any) -> int:
    with JsonlAuditTrail.from_env(args.audit_dir) as trail:
        store = ApprovalStore(trail)
        store.load_trail(trail.directory)
        rc: int = act(store)
        return rc


def _line(approval: Approval, now: datetime) -> str:
    who = approval.principal or "-"
    state = approval.state(now)
    verdict = f" by {approval.approver}: {approval.reason}" if approval.approver else ""
    return (
        f"{approval.approval_id}  {state:<8} principal={who}  rules={','.join(approval.rules)}  "
        f"expires={approval.expires_at.isoformat()}{verdict}"
    )


def _list(args: argparse.Namespace) -> int:
    def act(store: ApprovalStore) -> int:
        now = datetime.now(UTC)
        found = store.list(state=None if args.all else (args.state or "pending"), principal=args.principal)
        if args.json:
            print(json.dumps([a.to_dict(now) for a in found], indent=2, ensure_ascii=False))
        elif not found:
            print("no approvals in that state in the trail's recent segments", file=sys.stderr)
        for approval in [] if args.json else found:
            print(_line(approval, now))
        return 0

    return _with_store(args, act)


def _show(args: argparse.Namespace) -> int:
    def act(store: ApprovalStore) -> int:
        print(json.dumps(store.get(args.approval_id).to_dict(datetime.now(UTC)), indent=2, ensure_ascii=False))
        return 0

    return _with_store(args, act)


def _approve(args: argparse.Namespace) -> int:
    def act(store: ApprovalStore) -> int:
        approval = store.grant(
            args.approval_id, approver=_approver(), reason=args.reason, uses=args.uses, digest=args.digest
        )
        print(f"approved {approval.approval_id} for {approval.uses_allowed} run(s) of exactly that request, until "
              f"{approval.expires_at.isoformat()}", file=sys.stderr)  # fmt: skip
        return 0

    return _with_store(args, act)


def _deny(args: argparse.Namespace) -> int:
    def act(store: ApprovalStore) -> int:
        approval = store.deny(args.approval_id, approver=_approver(), reason=args.reason, digest=args.digest)
        print(f"denied {approval.approval_id}: the identical request is refused until it expires", file=sys.stderr)
        return 0

    return _with_store(args, act)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    parser = sub.add_parser(
        "approvals",
        help="list, show, approve or deny requests waiting for an operator",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    commands = parser.add_subparsers(dest="approvals_command", metavar="ACTION")
    commands.required = True

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--audit-dir", metavar="DIR", help="trail directory (default: $GATEWAY_AUDIT_DIR or ./audit)")

    p = commands.add_parser("list", help="the pending approvals (or those in --state, or --all)")
    common(p)
    p.add_argument("--state", choices=_STATES, help="only approvals in this state (default: pending)")
    p.add_argument("--all", action="store_true", help="every approval in the trail's recent segments")
    p.add_argument("--principal", help="only this principal's approvals")
    p.add_argument("--json", action="store_true", help="one JSON array, each approval with its request")
    p.set_defaults(func=_list)

    p = commands.add_parser("show", help="one approval, with the request it holds and the rules that asked")
    common(p)
    p.add_argument("approval_id")
    p.set_defaults(func=_show)

    for name, func, verb in (("approve", _approve, "approve"), ("deny", _deny, "deny")):
        p = commands.add_parser(name, help=f"{verb} a pending approval (the approver is the OS user)")
        common(p)
        p.add_argument("approval_id")
        p.add_argument("--reason", required=True, help="why (recorded in the trail)")
        p.add_argument(
            "--digest", metavar="SHA256", help="the request digest you checked (`show`); another one is refused"
        )
        if name == "approve":
            p.add_argument("--uses", type=int, default=1, help="how many runs of the request it allows (default 1)")
        p.set_defaults(func=func)

"""``gateway principals add|list|rotate|revoke``: who may call the service (see :mod:`gateway.service.principals`).

``add`` and ``rotate`` print only the new token on stdout, so a script can capture it
(``TOKEN=$(gateway principals add me --policy policies/default.yaml)``); what they tell people goes to stderr.
``list`` never prints a token or a digest. Changes take effect in a running service on SIGHUP.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gateway.service.principals import (
    DEFAULT_QUOTAS,
    QUOTA_FIELDS,
    PrincipalsStore,
    Quotas,
    name_problem,
    principals_path_from_env,
)

__all__ = ["register"]


def _store(args: argparse.Namespace) -> PrincipalsStore:
    return PrincipalsStore(principals_path_from_env(args.principals))


def _add(args: argparse.Namespace) -> int:
    store = _store(args)
    flags = {"max_concurrent": args.max_concurrent, "rpm": args.rpm, "queue": args.queue}
    given = {key: value for key, value in flags.items() if value is not None}
    quotas = Quotas(**{**DEFAULT_QUOTAS.to_dict(), **given})
    token = store.add(args.name, policy=args.policy, role=args.role, quotas=quotas, quotas_set=frozenset(given))
    print(token)
    print(
        f"added {args.role} {args.name!r} to {store.path}; this token is shown once and not stored: keep it now",
        file=sys.stderr,
    )
    return 0


def _list(args: argparse.Namespace) -> int:
    principals = _store(args).load()
    if args.json:
        doc = {"source": principals.source, "principals": [p.public_dict() for p in principals]}
        print(json.dumps(doc, indent=2))
        return 0
    if not len(principals):
        print(f"{principals.source}: no principals", file=sys.stderr)
    for p in principals:
        set_ = {k: f"{k}={v}" for k, v in p.quotas.to_dict().items() if k in p.quotas_set}
        print(f"{p.name}  role={p.role}  policy={p.policy}")
        rest = "" if len(set_) == len(QUOTA_FIELDS) else " (the rest: the server's defaults)"
        print(f"  quotas: {' '.join(set_.values()) or 'the server defaults'}{rest if set_ else ''}")
        tokens = ", ".join(f"{t['id']} (created {t['created']})" for t in (t.public_dict() for t in p.tokens))
        print(f"  tokens: {tokens or 'none (revoked; `gateway principals rotate` issues one)'}")
    return 0


def _rotate(args: argparse.Namespace) -> int:
    store = _store(args)
    token = store.rotate(args.name)
    print(token)
    print(
        f"new token for {args.name!r} in {store.path}; its other tokens are revoked (a running service drops "
        "them on SIGHUP); this token is shown once",
        file=sys.stderr,
    )
    return 0


def _revoke(args: argparse.Namespace) -> int:
    store = _store(args)
    before = store.revoke(args.name, remove=args.remove)
    ids = ", ".join(t.id for t in before.tokens) or "none"
    done = "removed principal" if args.remove else "revoked every token of"
    print(
        f"{done} {args.name!r} in {store.path} (tokens: {ids}); a running service applies it on SIGHUP", file=sys.stderr
    )
    return 0


def _name(text: str) -> str:
    why = name_problem(text)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    return text


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not zero or a positive integer")
    return value


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("principals", help="manage who may call the gateway service: tokens, policies, quotas")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    file_help = "principals file (default: $GATEWAY_PRINCIPALS, then ./principals.yaml)"

    add = actions.add_parser("add", help="add a principal; print only its new token on stdout")
    add.add_argument("name", metavar="NAME", type=_name)
    add.add_argument("--policy", required=True, help="policy file its requests are decided under (stored absolute)")
    add.add_argument("--role", choices=("agent", "operator"), default="agent", help="operator may read metrics, audit")
    unset = "(default: the server config's quotas)"
    add.add_argument("--max-concurrent", type=_positive, metavar="N", help=f"executions at once {unset}")
    add.add_argument("--rpm", type=_positive, metavar="N", help=f"requests per minute {unset}")
    add.add_argument("--queue", type=_non_negative, metavar="N", help=f"executions that may wait {unset}")
    add.add_argument("--principals", help=file_help)
    add.set_defaults(func=_add)

    lst = actions.add_parser("list", help="list principals: role, policy, quotas, token ids (never a token or digest)")
    lst.add_argument("--json", action="store_true", help="print one JSON object")
    lst.add_argument("--principals", help=file_help)
    lst.set_defaults(func=_list)

    rot = actions.add_parser("rotate", help="issue a new token, revoke the others; print only the new token")
    rot.add_argument("name", metavar="NAME")
    rot.add_argument("--principals", help=file_help)
    rot.set_defaults(func=_rotate)

    rev = actions.add_parser("revoke", help="revoke every token of a principal (or --remove it)")
    rev.add_argument("name", metavar="NAME")
    rev.add_argument("--remove", action="store_true", help="delete the principal itself, not only its tokens")
    rev.add_argument("--principals", help=file_help)
    rev.set_defaults(func=_revoke)

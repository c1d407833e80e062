"""``gateway principals add|list|rotate|revoke``: who may call the service (see :mod:`gateway.service.principals`).

``add`` and ``rotate`` print only the new token on stdout, so a script can capture it
(``TOKEN=$(gateway principals add me --policy policies/default.yaml)``); what they tell people goes to stderr.
``list`` never prints a token or a digest. Changes take effect in a running service on SIGHUP.

``revoke`` is an incident response, so it says whether it is in force: with ``--service URL`` (and an
operator's token in ``$GATEWAY_OPERATOR_TOKEN``, never on the command line) it asks that service to reload
(``POST /v1/reload``) and confirms from its answer that no revoked token is still accepted. Exit status:
**0** applied (confirmed by the service), **3** written but no service was told, **4** written but not applied
(the reload was rejected, the service still accepts a revoked token, or it could not be reached), **2** usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from gateway.errors import EXIT_USAGE
from gateway.service.principals import (
    DEFAULT_QUOTAS,
    QUOTA_FIELDS,
    PrincipalsStore,
    Quotas,
    name_problem,
    principals_path_from_env,
)

__all__ = ["REVOKE_APPLIED", "REVOKE_NOT_APPLIED", "REVOKE_NOT_TOLD", "TOKEN_ENV", "register"]

TOKEN_ENV = "GATEWAY_OPERATOR_TOKEN"  # noqa: S105 - the name of a variable, not a token
"""Where ``revoke --service`` takes the operator's token from (a command line is visible to every user)."""
REVOKE_APPLIED = 0
"""``revoke``: the service confirmed that it no longer accepts any revoked token."""
REVOKE_NOT_TOLD = 3
"""``revoke``: written to the principals file; no running service was told (no ``--service``)."""
REVOKE_NOT_APPLIED = 4
"""``revoke``: written, but the service did not apply it (rejected reload, token still accepted, unreachable)."""


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
    token = os.environ.get(TOKEN_ENV, "")
    if args.service is not None and not token:  # checked before the file changes
        print(
            f"gateway principals revoke: --service needs an operator's token in ${TOKEN_ENV} (`gateway principals "
            "add NAME --role operator` issues one); nothing was changed",
            file=sys.stderr,
        )
        return EXIT_USAGE
    store = _store(args)
    before = store.revoke(args.name, remove=args.remove)
    ids = [t.id for t in before.tokens]
    report: dict[str, Any] = {
        "principal": args.name, "removed": args.remove, "file": str(store.path), "revoked_token_ids": ids,
        "service": args.service, "applied": False, "reloaded_at": None, "reason": None,
    }  # fmt: skip
    if args.service is None:
        status = REVOKE_NOT_TOLD
        report["reason"] = (
            f"no running service was told: send it SIGHUP (it reloads {store.path}), or pass --service URL"
        )
    else:
        status, found = _applied_by(args.service.rstrip("/"), token, ids, str(store.path))
        report.update(found)
    if args.json:
        print(json.dumps(report, indent=2))
    done = "removed principal" if args.remove else "revoked every token of"
    what = f"{done} {args.name!r} in {store.path} (tokens: {', '.join(ids) or 'none'})"
    if status == REVOKE_APPLIED:
        print(f"{what}: applied by the service at {args.service} (reload {report['reloaded_at']})", file=sys.stderr)
    else:
        print(f"{what}; NOT yet applied: {report['reason']}", file=sys.stderr)
    return status


def _applied_by(url: str, token: str, revoked: list[str], file: str) -> tuple[int, dict[str, Any]]:
    """Ask the service at ``url`` to reload (``POST /v1/reload``) and check its answer: the status of
    ``revoke`` and the report's ``applied``, ``reloaded_at`` and ``reason``."""
    import httpx  # noqa: PLC0415 - the client extra; only --service needs it

    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
            response = client.post("/v1/reload")
    except httpx.HTTPError as exc:
        why = f"could not reach the service at {url} ({type(exc).__name__}: {exc}); send it SIGHUP, or retry"
        return REVOKE_NOT_APPLIED, {"reason": why}
    try:
        answer = response.json()
    except ValueError:
        answer = {}
    if response.status_code != 200 or not isinstance(answer, dict):
        said = f"{answer.get('code')}: {answer.get('message')}" if isinstance(answer, dict) else response.text[:200]
        why = f"the service at {url} refused the reload (HTTP {response.status_code}, {said})"
        return REVOKE_NOT_APPLIED, {"reason": why}
    found: dict[str, Any] = {"reloaded_at": answer.get("reloaded_at")}
    if not answer.get("applied"):
        problems = "; ".join(answer.get("problems") or []) or "no reason given"
        why = f"the service at {url} rejected the reload and keeps its last good principals: {problems}"
        return REVOKE_NOT_APPLIED, {**found, "reason": why}
    still = sorted(set(revoked) & set(answer.get("token_ids") or []))
    if still:
        why = (
            f"the service at {url} reloaded {answer.get('source')} and still accepts token(s) {', '.join(still)}: "
            f"does it serve another principals file than {file}?"
        )
        return REVOKE_NOT_APPLIED, {**found, "reason": why}
    return REVOKE_APPLIED, {**found, "applied": True}


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

    rev = actions.add_parser(
        "revoke",
        help="revoke every token of a principal (or --remove it); with --service, apply it there and confirm",
        description="Exit status: 0 applied (the service confirmed it), 3 written but no service was told, "
        "4 written but not applied (reload rejected, token still accepted, or unreachable), 2 usage.",
    )
    rev.add_argument("name", metavar="NAME")
    rev.add_argument("--remove", action="store_true", help="delete the principal itself, not only its tokens")
    rev.add_argument("--principals", help=file_help)
    rev.add_argument(
        "--service",
        metavar="URL",
        help=f"the running service to reload and confirm with (POST URL/v1/reload as ${TOKEN_ENV}, an operator)",
    )
    rev.add_argument("--json", action="store_true", help="print the outcome as one JSON object")
    rev.set_defaults(func=_revoke)

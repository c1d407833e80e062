"""``gateway policy rules``: the rule catalogue (every rule id, what it checks, what audit mode can relax).

Built by :mod:`gateway.decision.catalogue` from the rules themselves; ``--markdown`` prints docs/rules.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gateway.decision.catalogue import AUDIT_EFFECTS, catalogue, render_markdown

__all__ = ["register"]


def _rules(args: argparse.Namespace) -> int:
    entries = catalogue()
    if args.json:
        print(json.dumps([e.to_dict() for e in entries], indent=2))
        return 0
    if args.markdown:
        sys.stdout.write(render_markdown())
        return 0
    for e in entries:
        print(f"{e.id}  [{e.path}{'  ' + e.setting if e.setting else ''}]")
        print(f"  checks:        {e.checks}")
        print(f"  audit mode:    {e.audit}: {AUDIT_EFFECTS[e.audit]}")
        if e.never_relaxed:
            print(f"  never relaxed: {e.never_relaxed}")
        print(f"  example:       {e.example}")
    return 0


def register(policy_sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``rules`` to the ``gateway policy`` sub-commands."""
    rules = policy_sub.add_parser(
        "rules", help="list every rule id: what it checks, its path, what audit mode can relax, an example"
    )
    form = rules.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print the catalogue as a JSON list")
    form.add_argument("--markdown", action="store_true", help="print the catalogue as Markdown (docs/rules.md)")
    rules.set_defaults(func=_rules)

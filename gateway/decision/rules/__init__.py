"""The rule registry: every rule the engine runs, in the order its results appear in a decision.

A new rule goes in the module of its family (or a new module) as a small generator of findings, and is
listed here. Its id is the id every one of its results carries, errors included.
"""

from __future__ import annotations

from gateway.decision.rules import basics, env, limits, mounts, packages
from gateway.decision.rules.base import Context, Finding, Rule

__all__ = ["RULES", "RULE_IDS", "Context", "Finding", "Rule"]

RULES: tuple[Rule, ...] = (
    *basics.RULES,
    *limits.RULES,
    *basics.LATER_RULES,
    *mounts.RULES,
    *env.RULES,
    *packages.RULES,
)
RULE_IDS: frozenset[str] = frozenset(rule.id for rule in RULES)

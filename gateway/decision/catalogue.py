"""The rule catalogue: every id a decision result can carry, what it checks and what audit mode can relax.

Built from the metadata on the registered :class:`~gateway.decision.rules.base.Rule` objects (plus the
engine's own result ids), so ``gateway policy rules`` and ``docs/rules.md`` (written by
``gateway policy rules --markdown`` / ``scripts/gen-rules-doc.py``, checked by a unit test) cannot drift from
the code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gateway.decision.rules import RULES
from gateway.decision.rules.base import AuditEffect, Rule
from gateway.decision.rules.sessions import SESSION_RULES, SessionRule
from gateway.decision.sessions import SESSION_PROFILE_RULE

__all__ = ["AUDIT_EFFECTS", "RuleEntry", "catalogue", "render_markdown"]


@dataclass(frozen=True, slots=True)
class RuleEntry:
    """One line of the catalogue."""

    id: str
    checks: str
    path: str
    """Where the rule's results are reported in the request (``$...``)."""
    setting: str
    """The policy field that configures it (``$.spec...``), empty when the rule is fixed."""
    audit: AuditEffect
    never_relaxed: str
    example: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


AUDIT_EFFECTS: dict[AuditEffect, str] = {
    "clamp": "a warning; the value is clamped to max (hard_max, if set, still denies)",
    "warn": "a warning; the request proceeds",
    "never": "always enforced; audit mode does not apply",
    "advisory": "always a warning, never a denial",
}
"""What ``mode: audit`` does to a failure of a rule, by the rule's ``audit`` effect."""

_ENGINE: tuple[RuleEntry, ...] = (
    RuleEntry(
        "engine.resolve", "the policy object resolves into settings for the request (never fails for a loaded policy)",
        "$", "", "never", "always a denial", "ValueError: ...",
    ),
    RuleEntry(
        "assembly.build", "the backend builds its options from the resolved settings", "$", "", "never",
        "always a denial", "ValueError: mount source /srv/x was allowed without being opened below a root",
    ),
    RuleEntry(
        "assembly.guard", "the backend's guard re-checks every assembled option against the invariants (network, "
        "read-only root, capabilities, non-root, limits, tmpfs, mounts, no forbidden key)", "$", "", "never",
        "always a denial", "unsafe options refused: ...",
    ),
)  # fmt: skip


_SESSION_PROFILE = RuleEntry(
    SESSION_PROFILE_RULE, "an execution in a session asks for no more than the session's profile: the same "
    "language, image, runtime and network, only the session's mounts, and limits at most the session's", "$", "",
    "never", "always enforced: the session's sandbox exists with that profile", "memory 1g is above the session's "
    "256m; an execution asks for no more",
)  # fmt: skip


def catalogue() -> tuple[RuleEntry, ...]:
    """Every rule, in the order its results appear in a decision, then the engine's own result ids, then the
    session rules (a session decision's results come first) and the rule of an execution in a session."""

    def entry(r: Rule | SessionRule) -> RuleEntry:
        return RuleEntry(r.id, r.checks, r.path, r.setting, r.audit, r.never_relaxed, r.example)

    return (*map(entry, RULES), *_ENGINE, *map(entry, SESSION_RULES), _SESSION_PROFILE)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or "-"


def render_markdown() -> str:
    """``docs/rules.md``: the catalogue as a Markdown page (generated; do not edit by hand)."""
    lines = [
        "# Rule catalogue",
        "",
        "<!-- Generated from the rules' metadata (gateway/decision/rules/) by `gateway policy rules --markdown`",
        "     (or scripts/gen-rules-doc.py); tests/unit/decision/test_catalogue.py fails when this file is stale. -->",
        "",
        "Every id a decision result can carry. *Audit* says what `mode: audit` on the rule's policy section does",
        "to a failure:",
        "",
    ]
    lines.extend(f"- **{effect}**: {text}." for effect, text in AUDIT_EFFECTS.items())
    lines += [
        "",
        "Whatever the mode, some failures always deny (*never relaxed*): host networking, denied mount paths,",
        "dangerous environment variables, values no sandbox can be given, and every invariant of the guard.",
        "",
        "| rule | checks | result path | policy setting | audit | never relaxed | example message |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in catalogue():
        cells = [f"`{e.id}`", e.checks, f"`{e.path}`", f"`{e.setting}`" if e.setting else "", e.audit]
        cells += [e.never_relaxed, e.example]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"

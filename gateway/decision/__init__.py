"""Decisions: every rule judges the request, every result is kept, and the decision explains itself.

``evaluate(policy, request, assembler=...)`` is the one entry point for an execution; a session's creation
(``decide_session``) and an execution in a session (``decide_in_session``) are built on it. The package knows no
backend: the backend's assembler comes in as an argument, so the decision records (and the trail stores, before
anything runs) exactly the options that backend will use.
"""

from __future__ import annotations

from gateway.decision.engine import Assembler, evaluate
from gateway.decision.model import Decision, PolicyRef, RuleResult, Status
from gateway.decision.rules import RULE_IDS, RULES
from gateway.decision.rules.env import DANGEROUS_ENV
from gateway.decision.rules.sessions import SESSION_RULES
from gateway.decision.sessions import (
    SESSION_PROFILE_RULE,
    SessionDecision,
    SessionSettings,
    bind_to_session,
    decide_in_session,
    decide_session,
    within_session,
)
from gateway.decision.settings import ResolvedMount, SandboxProfile, SandboxSettings, resolve

__all__ = [
    "DANGEROUS_ENV",
    "RULES",
    "RULE_IDS",
    "SESSION_PROFILE_RULE",
    "SESSION_RULES",
    "Assembler",
    "Decision",
    "PolicyRef",
    "ResolvedMount",
    "RuleResult",
    "SandboxProfile",
    "SandboxSettings",
    "SessionDecision",
    "SessionSettings",
    "Status",
    "bind_to_session",
    "decide_in_session",
    "decide_session",
    "evaluate",
    "resolve",
    "within_session",
]

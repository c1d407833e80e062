"""What a rule is: an id, the mode it runs in, and a small generator of findings (jsonschema's keyword style).

A rule's check takes the :class:`Context` and yields :class:`Finding` objects (ok or not, got, expected,
message, path). It never builds a result itself: the engine stamps each finding with the rule's id, mode and
status, so a rule cannot mislabel what it found. A check that raises becomes an ``error`` result under the
rule's own id, and an error always denies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar

from gateway.decision.settings import BackendLimits, SandboxSettings
from gateway.policy.compiled import CompiledPolicy
from gateway.policy.model import Mode, Policy
from gateway.request import ExecutionRequest

__all__ = ["AuditEffect", "Check", "Context", "Finding", "Rule", "RuleOf", "fail", "ok", "skip"]


@dataclass(frozen=True, slots=True)
class Context:
    """Everything a rule may look at: the request, the settings resolved from it, and the compiled policy."""

    compiled: CompiledPolicy
    request: ExecutionRequest
    settings: SandboxSettings
    denied_paths: tuple[str, ...]
    """Host paths no mount may reach besides the built-in list (the audit sink's own, for one)."""
    backend: BackendLimits = field(default_factory=BackendLimits)
    """What the backend can give one sandbox (from its assembler)."""
    now: datetime = field(default_factory=lambda: datetime.now(UTC))
    """The decision time (UTC): what a time-bound rule (an exception's expiry) judges against."""

    @property
    def policy(self) -> Policy:
        return self.compiled.policy


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a rule found. ``ok=None`` is a skip (the rule had nothing to judge)."""

    ok: bool | None
    path: str
    got: Any
    expected: Any
    message: str
    never_relaxed: bool = False
    """A failure that denies even when the rule runs in audit mode (host network, dangerous variables)."""


def ok(path: str, got: Any, expected: Any, message: str) -> Finding:
    return Finding(True, path, got, expected, message)


def fail(path: str, got: Any, expected: Any, message: str, *, never_relaxed: bool = False) -> Finding:
    return Finding(False, path, got, expected, message, never_relaxed)


def skip(path: str, message: str) -> Finding:
    return Finding(None, path, None, None, message)


Check = Callable[[Context], Iterable[Finding]]

AuditEffect = Literal["clamp", "warn", "never", "advisory"]
"""What ``mode: audit`` does to a rule's failures: ``clamp`` (a warning, and the value bounded by the ceiling),
``warn`` (a warning, and the request proceeds), ``never`` (the rule always enforces), ``advisory`` (the rule
only ever warns, whatever the mode)."""


C = TypeVar("C")
"""What a rule's check looks at: a :class:`Context` for an execution's rules, a session's context for the
session rules (:mod:`gateway.decision.rules.sessions`)."""


@dataclass(frozen=True, slots=True)
class RuleOf(Generic[C]):
    """A registered rule judging a ``C``: every result it yields carries this id."""

    id: str
    check: Callable[[C], Iterable[Finding]]
    mode: Callable[[Policy], Mode]
    """The rule's mode under a policy (``enforce`` or ``audit``)."""
    path: str = "$"
    """Where an error of this rule is reported."""
    checks: str = ""
    """What the rule checks, in one sentence (the rule catalogue: ``gateway policy rules``, docs/rules.md)."""
    setting: str = ""
    """The policy field that configures the rule (``$.spec...``), or empty when the rule is fixed."""
    audit: AuditEffect = "never"
    """What ``mode: audit`` can relax; ``never`` rules have no mode of their own and always enforce."""
    never_relaxed: str = ""
    """What stays denied even in audit mode (the rule's ``never_relaxed`` findings)."""
    example: str = ""
    """A message the rule yields on a failure."""


@dataclass(frozen=True, slots=True)
class Rule(RuleOf[Context]):
    """A rule of an execution request (the rules of :data:`gateway.decision.rules.RULES`)."""

"""What the session manager hands out: a session's public view (:class:`SessionInfo`) and the result of asking
for one (:class:`SessionResult`). Frozen; every interface serialises these and none rebuilds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from gateway.decision import Decision
from gateway.decision.sessions import SessionSettings
from gateway.errors import EXIT_DENIED, GatewayError, exit_code_for

__all__ = ["END_EVENTS", "SessionInfo", "SessionResult", "SessionState", "utc"]

SessionState = Literal["ready", "busy", "closed", "expired", "killed"]
"""``ready`` (waiting for an execution), ``busy`` (one runs), or how it ended."""

END_EVENTS = {"closed": "session.closed", "expired": "session.expired", "killed": "session.killed"}
"""The record that ends a session, by its final state; exactly one is written per session."""


def utc(ts: float) -> str:
    """Unix time as RFC 3339 UTC with seconds and Z (what responses and records carry)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One session as its owner (or an operator) sees it."""

    session_id: str
    """Unguessable (192 random bits); the only handle on the session."""
    principal: str | None
    """Who owns it: only this principal (and an operator) can see, use or close it."""
    mode: str
    """``kernel`` or ``workspace``."""
    state: SessionState
    ready_at: float
    """Unix time it became ready (its lifetime counts from here)."""
    last_used_at: float
    """Unix time its last execution ended (``ready_at`` before any): its idle time counts from here."""
    expires_at: float
    """Unix time it ends unless used: the earlier of ``last_used_at + idle_s`` and ``ready_at + lifetime_s``."""
    lifetime_ends_at: float
    executions: int
    """Executions decided in it (allowed or not)."""
    settings: SessionSettings
    container_id: str | None = None
    """The kernel's container (kernel mode)."""
    ended: str | None = None
    """Why it ended (the ``reason`` of its end record); None while it lives."""

    def to_dict(self) -> dict[str, Any]:
        """The session as JSON data (``POST /v1/sessions``'s 201 body, ``GET /v1/sessions/{id}``)."""
        return {
            "session_id": self.session_id,
            "principal": self.principal,
            "mode": self.mode,
            "state": self.state,
            "ready_at": utc(self.ready_at),
            "last_used_at": utc(self.last_used_at),
            "expires_at": utc(self.expires_at),
            "lifetime_ends_at": utc(self.lifetime_ends_at),
            "executions": self.executions,
            "idle_s": self.settings.idle_s,
            "lifetime_s": self.settings.lifetime_s,
            "settings": self.settings.to_dict(),
            "ended": self.ended,
        }


@dataclass(frozen=True, slots=True)
class SessionResult:
    """What a request to create a session came to: the session, or why there is none (a denial with its rule
    ids, an invalid request, a failure), like an :class:`~gateway.ExecutionResult`."""

    request_id: str
    """Gateway-assigned id, also in the session's decision and ``session.created`` records."""
    decision: Decision | None
    """The policy decision (session rules first, then the profile's); None when the request was invalid."""
    session: SessionInfo | None = None
    """The new session; None unless it was created."""
    error: GatewayError | None = None
    audit_ok: bool = True

    @property
    def allowed(self) -> bool:
        return self.decision is not None and self.decision.allowed and self.error is None

    @property
    def exit_status(self) -> int:
        """0 created; 77 denied by policy; else the error's exit status (as ``gateway run``)."""
        if self.error is not None:
            return exit_code_for(self.error)
        if self.decision is not None and not self.decision.allowed:
            return EXIT_DENIED
        return 0

    def to_dict(self) -> dict[str, Any]:
        """The session's fields (when created) plus ``request_id``, ``allowed``, ``violations``, ``warnings``,
        ``policy``, ``error``, ``audit_ok``, as an execution's result names them."""
        d = self.decision.to_dict() if self.decision is not None else None
        out: dict[str, Any] = self.session.to_dict() if self.session is not None else {}
        return out | {
            "request_id": self.request_id,
            "allowed": self.allowed,
            "decision_id": d["decision_id"] if d else None,
            "violations": d["violations"] if d else [],
            "warnings": d["warnings"] if d else [],
            "policy": {"name": d["policy"]["name"], "sha256": d["policy"]["sha256"]} if d else None,
            "error": self.error.to_dict() if self.error is not None else None,
            "audit_ok": self.audit_ok,
        }

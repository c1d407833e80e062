"""Approvals as the trail records them: requests held by approve-mode rules, operators' verdicts, the runs.

The state lives in the trail, one record per step; the store keeps it in memory and rebuilds it from the trail
at start, so approvals survive a restart. The Gateway holds and runs requests through it (``Gateway.approvals``).

Records: ``approval.requested`` (the approval id, the request digest, the principal, the rules that asked, the
expiry, the request as ``request.received`` keeps it), ``approval.granted`` / ``approval.denied`` (the approver,
the reason, the runs allowed), ``approval.used`` (a run consumed one use, recorded before it starts) and
``approval.refused`` (an operator's action that could not apply: unknown id, decided twice, expired, a digest
that does not match; nothing changes).

An approval is bound to :func:`~gateway.decision.model.request_digest`, which covers the principal: only the
identical request of the same principal runs, at most ``uses`` times, before ``expires_at``. An identical
request while its approval lives gets that approval (pending: the same id; granted: a run; denied or used up: an
:class:`~gateway.errors.ApprovalClosedError`); once it expired, the request asks anew. Bounds: at most
:data:`MAX_PENDING_PER_PRINCIPAL` pending approvals per principal, each expiring (:data:`DEFAULT_TTL_S`), and the
rebuild reads only the trail's last :data:`~gateway.audit.interrupted.SCAN_SEGMENTS` segments.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal

from gateway.audit.interface import AuditSink
from gateway.audit.interrupted import SCAN_SEGMENTS
from gateway.audit.pipeline import stored_request
from gateway.audit.segments import list_segments
from gateway.errors import (
    ApprovalClosedError,
    ApprovalConflictError,
    ApprovalLimitError,
    ApprovalNotFoundError,
    AuditUnavailableError,
    GatewayError,
)

__all__ = ["DEFAULT_TTL_S", "MAX_PENDING_PER_PRINCIPAL", "Approval", "ApprovalStore", "State"]

DEFAULT_TTL_S: Final = 3600
"""How long an approval lives (pending or granted) when the store is not told otherwise: one hour."""
MAX_PENDING_PER_PRINCIPAL: Final = 16
"""Pending approvals one principal may hold; one more is refused (``approval.too_many``) until some are decided
or expire."""

State = Literal["pending", "granted", "denied", "used", "expired"]

_KINDS: Final = ("approval.requested", "approval.granted", "approval.denied", "approval.used")


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class Approval:
    """One approval as the trail says it stands."""

    approval_id: str
    digest: str
    """The request digest the approval is bound to."""
    principal: str | None
    rules: tuple[str, ...]
    """The approve-mode rules that asked."""
    requested_at: datetime
    expires_at: datetime
    request: Mapping[str, Any]
    """The request as the trail keeps it (``request.received``'s redaction)."""
    request_id: str | None
    verdict: Literal["pending", "granted", "denied"] = "pending"
    approver: str | None = None
    reason: str | None = None
    uses_allowed: int = 0
    uses: int = 0

    def state(self, now: datetime) -> State:
        """Where it stands at ``now``: denied and used up stay so; anything else past its expiry is expired."""
        if self.verdict == "denied":
            return "denied"
        if self.verdict == "granted" and self.uses >= self.uses_allowed:
            return "used"
        return "expired" if now >= self.expires_at else self.verdict

    def to_dict(self, now: datetime) -> dict[str, Any]:
        return {
            "approval_id": self.approval_id,
            "state": self.state(now),
            "request_digest": self.digest,
            "principal": self.principal,
            "rules": list(self.rules),
            "requested_at": _stamp(self.requested_at),
            "expires_at": _stamp(self.expires_at),
            "request_id": self.request_id,
            "request": dict(self.request),
            "approver": self.approver,
            "reason": self.reason,
            "uses_allowed": self.uses_allowed,
            "uses": self.uses,
        }


class ApprovalStore:
    """The approvals of one trail: held requests, operators' verdicts, runs that used them. Thread-safe; every
    change is recorded (durably, fail closed) before it takes effect."""

    def __init__(
        self,
        audit: AuditSink,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        max_pending: int = MAX_PENDING_PER_PRINCIPAL,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.audit = audit
        self.ttl = timedelta(seconds=ttl_s)
        self.max_pending = max_pending
        self.clock = clock
        self._by_id: dict[str, Approval] = {}
        self._lock = threading.Lock()

    # -- rebuilding from the trail --------------------------------------------------------------------------

    def load(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Replay ``records`` (trail order); records of other kinds are skipped."""
        with self._lock:
            for record in records:
                if record.get("event_type") in _KINDS:
                    self._apply(record["event_type"], record.get("data") or {}, record.get("principal"))

    def load_trail(self, directory: Path) -> None:
        """Replay the approvals in the trail's last segments (a bounded read; each line that names an approval
        event is parsed, no other). Raises :class:`AuditUnavailableError` when the trail cannot be read."""
        try:
            self.load(_approval_records(directory))
        except OSError as exc:
            raise AuditUnavailableError(f"cannot read the audit trail in {directory}: {exc.strerror or exc}") from exc

    def _apply(self, kind: str, data: Mapping[str, Any], principal: str | None) -> None:
        approval_id = str(data.get("approval_id", ""))
        if kind == "approval.requested":
            self._by_id[approval_id] = Approval(
                approval_id, str(data["request_digest"]), principal, tuple(data.get("rules") or ()),
                _time(data["requested_at"]), _time(data["expires_at"]), data.get("request") or {},
                data.get("request_id"),
            )  # fmt: skip
            return
        found = self._by_id.get(approval_id)
        if found is None:  # requested before the window that was read: nothing to update
            return
        if kind == "approval.used":
            self._by_id[approval_id] = replace(found, uses=found.uses + 1)
        else:
            verdict: Literal["granted", "denied"] = "granted" if kind == "approval.granted" else "denied"
            uses = int(data.get("uses_allowed", 0)) if verdict == "granted" else 0
            self._by_id[approval_id] = replace(
                found, verdict=verdict, approver=data.get("approver"), reason=data.get("reason"), uses_allowed=uses
            )

    # -- reading -------------------------------------------------------------------------------------------

    def get(self, approval_id: str) -> Approval:
        """The approval; :class:`ApprovalNotFoundError` for an id the store does not know."""
        with self._lock:
            found = self._by_id.get(approval_id)
        if found is None:
            raise _not_found(approval_id)
        return found

    def list(self, *, state: State | None = None, principal: str | None = None) -> list[Approval]:
        """Every known approval (optionally only those in ``state`` or of ``principal``), oldest first."""
        now = self.clock()
        with self._lock:
            found = list(self._by_id.values())
        return [
            a for a in found
            if (state is None or a.state(now) == state) and (principal is None or a.principal == principal)
        ]  # fmt: skip

    def usable(self, principal: str | None) -> frozenset[str]:
        """The digests ``principal`` may run now: granted, not expired, uses left (for :func:`evaluate`)."""
        now = self.clock()
        with self._lock:
            return frozenset(
                a.digest for a in self._by_id.values() if a.principal == principal and a.state(now) == "granted"
            )

    def _live(self, principal: str | None, digest: str, now: datetime) -> Approval | None:
        """The newest approval of this request that has not expired (denied and used up ones included)."""
        live = [
            a for a in self._by_id.values()
            if a.principal == principal and a.digest == digest and now < a.expires_at
        ]  # fmt: skip
        return max(live, key=lambda a: a.requested_at, default=None)

    # -- the request side ----------------------------------------------------------------------------------

    def hold(
        self, digest: str, *, principal: str | None, rules: Iterable[str], request: Mapping[str, Any],
        request_id: str, decision_id: str, policy: Mapping[str, str] | None = None,
    ) -> Approval:  # fmt: skip
        """The approval a request with this digest waits for (its decision is ``approval_required``; ``rules``:
        the approve-mode rules that asked, ``request``: its ``to_dict()``): the live one of the same request, else
        a new one (``approval.requested``). Raises :class:`ApprovalClosedError` when this request's live approval
        was denied or used up, :class:`ApprovalLimitError` when the principal holds too many pending ones, and the
        sink's error when the record cannot be written (nothing is held then)."""
        now = self.clock()
        with self._lock:
            live = self._live(principal, digest, now)
            if live is not None and live.state(now) == "pending":
                return live
            if live is not None and live.state(now) in ("denied", "used"):
                raise _closed(live, now)
            pending = sum(1 for a in self._by_id.values() if a.principal == principal and a.state(now) == "pending")
            if pending >= self.max_pending:
                raise ApprovalLimitError(
                    f"principal {principal!r} already has {pending} pending approvals (at most "
                    f"{self.max_pending}); this request was not held",
                    hint="wait until an operator decides some, or they expire",
                )
            shown = stored_request(request)  # as the record keeps it: no file content, no environment value
            approval = Approval(
                uuid.uuid4().hex, digest, principal, tuple(rules), now, now + self.ttl, shown, request_id
            )
            data = {
                "approval_id": approval.approval_id, "request_digest": digest, "rules": list(approval.rules),
                "requested_at": _stamp(now), "expires_at": _stamp(approval.expires_at),
                "request_id": request_id, "decision_id": decision_id, "request": request,
            }  # fmt: skip
            self.audit.append("approval.requested", data, request_id=request_id, principal=principal, policy=policy)
            self._by_id[approval.approval_id] = approval
            return approval

    def use(self, digest: str, principal: str | None, records: Mapping[str, Any]) -> Approval:
        """Consume one use of the granted approval of this request (``approval.used``, durable before the run).
        Raises :class:`ApprovalClosedError` when none is usable any more (another run took the last use)."""
        now = self.clock()
        with self._lock:
            live = self._live(principal, digest, now)
            if live is None or live.state(now) != "granted":
                raise ApprovalClosedError(
                    "the approval of this request is no longer usable (used up, denied or expired); nothing ran",
                    hint="submit the request again to ask for a new approval once the old one expired",
                )
            data = {"approval_id": live.approval_id, "request_digest": digest, "use": live.uses + 1,
                    "uses_allowed": live.uses_allowed}  # fmt: skip
            self.audit.append("approval.used", data, **records)
            used = replace(live, uses=live.uses + 1)
            self._by_id[live.approval_id] = used
            return used

    # -- the operator side ---------------------------------------------------------------------------------

    def grant(
        self, approval_id: str, *, approver: str, reason: str, uses: int = 1, digest: str | None = None
    ) -> Approval:
        """Approve a pending approval for ``uses`` runs (``approval.granted``). ``digest``: the request digest
        the operator saw; a different one is refused. Every refusal is recorded (``approval.refused``)."""
        if uses < 1:
            raise ApprovalConflictError(f"uses must be at least 1, got {uses}; nothing was approved")
        return self._decide(
            approval_id, "approval.granted", approver, reason, digest=digest, extra={"uses_allowed": uses}
        )

    def deny(self, approval_id: str, *, approver: str, reason: str, digest: str | None = None) -> Approval:
        """Refuse a pending approval (``approval.denied``); the identical request stays refused until it expires."""
        return self._decide(approval_id, "approval.denied", approver, reason, digest=digest, extra={})

    def _decide(
        self, approval_id: str, kind: str, approver: str, reason: str, *, digest: str | None, extra: Mapping[str, Any]
    ) -> Approval:
        action = "approve" if kind == "approval.granted" else "deny"
        now = self.clock()
        with self._lock:
            try:
                found = self._by_id.get(approval_id)
                if found is None:
                    raise _not_found(approval_id)
                if not approver:
                    raise ApprovalConflictError(f"{action} needs the approver's identity; nothing was changed")
                if digest is not None and digest != found.digest:
                    raise ApprovalConflictError(
                        f"approval {approval_id} is for request digest {found.digest}, not {digest}; nothing was "
                        "changed",
                        hint="show the approval (`gateway approvals show ID`) and check the request it holds",
                    )
                state = found.state(now)
                if state != "pending":
                    raise ApprovalConflictError(
                        f"approval {approval_id} is {state}, not pending; it cannot be decided again",
                        hint="a pending approval is decided once; the agent submits its request again for a new one "
                        "after this one expired",
                    )
            except GatewayError as exc:
                refused = {"approval_id": approval_id, "action": action, "approver": approver, "code": exc.code,
                           "message": exc.message}  # fmt: skip
                self.audit.append("approval.refused", refused)
                raise
            data = {"approval_id": approval_id, "request_digest": found.digest, "approver": approver,
                    "reason": reason, **extra}  # fmt: skip
            self.audit.append(kind, data, request_id=found.request_id, principal=found.principal)
            self._apply(kind, data, found.principal)
            return self._by_id[approval_id]


def _not_found(approval_id: str) -> ApprovalNotFoundError:
    return ApprovalNotFoundError(
        f"no approval {approval_id!r} in the trail's recent segments",
        hint="list the approvals with `gateway approvals list`; an id older than the trail's last segments is no "
        "longer known",
    )


def _closed(approval: Approval, now: datetime) -> ApprovalClosedError:
    state = approval.state(now)
    if state == "denied":
        message = (
            f"approval {approval.approval_id} of this request was denied by {approval.approver}: {approval.reason}"
        )
    else:
        message = f"approval {approval.approval_id} of this request allowed {approval.uses_allowed} run(s), all used"
    return ApprovalClosedError(
        f"{message}; nothing ran",
        hint=f"change the request, or submit it again after {_stamp(approval.expires_at)} to ask anew",
    )


def _approval_records(directory: Path) -> Iterable[dict[str, Any]]:
    """The approval records of the trail's last segments, in order (only their lines are parsed)."""
    for _index, path in list_segments(directory)[-SCAN_SEGMENTS:]:
        with path.open("rb", buffering=1 << 20) as fh:
            for line in fh:
                if b'"event_type":"approval.' in line:
                    record = json.loads(line)
                    if isinstance(record, dict):
                        yield record

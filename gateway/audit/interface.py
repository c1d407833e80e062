"""The audit sink interface: what the gateway calls to leave evidence of every event.

A sink stamps (ids, time, trace, gateway identity), redacts (secrets and bulky payloads), chains
(``seq``, ``prev_hash``, ``hash``, ``hmac``) and writes each record, and returns only once the record is
durable (unless the caller asks for ``durable=False``, see :meth:`AuditSink.append`). Any failure to make a
record durable raises :class:`gateway.errors.AuditUnavailableError`: the caller must then deny the request
(fail closed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

__all__ = ["EVENT_TYPES", "SCHEMA_VERSION", "AuditReceipt", "AuditSink"]

SCHEMA_VERSION: Final = "gateway.audit/v1"
"""Value of the ``schema`` field of every record written by this version."""

EVENT_TYPES: Final = frozenset(
    {
        "gateway.start",
        "gateway.stop",
        "policy.loaded",
        "policy.reloaded",
        "policy.rejected",
        "request.received",
        "request.invalid",
        "request.refused",
        "policy.decision",
        "image.pulled",
        "network.connection",
        "execution.outcome",
        "containers.reaped",
        "container.left",
        "recovery",
        "auth.failed",
        "auth.forbidden",
        "session.created",
        "session.expired",
        "session.closed",
        "session.killed",
        "session.file.put",
        "session.file.get",
        "approval.requested",
        "approval.granted",
        "approval.denied",
        "approval.used",
        "approval.refused",
    }
)
"""Every ``event_type`` a record may carry; ``schemas/audit-record.schema.json`` describes each ``data``."""


@dataclass(frozen=True, slots=True)
class AuditReceipt:
    """Proof that one record is durable in the trail."""

    event_id: str
    """The record's ``event_id`` (a UUID)."""
    seq: int
    """Its position in the trail (contiguous from 1, across segments and processes)."""
    hash: str
    """Its ``hash`` (hex sha256 of the canonical record without ``hash``/``hmac``)."""
    segment: str | None
    """File name of the segment that holds it, or ``None`` for sinks without files."""


@runtime_checkable
class AuditSink(Protocol):
    """Where audit records go. Implementations: :class:`JsonlAuditTrail`, :class:`MemoryAuditSink`."""

    def append(
        self,
        event_type: str,
        data: Mapping[str, Any],
        *,
        request_id: str | None = None,
        principal: str | None = None,
        policy: Mapping[str, str] | None = None,
        durable: bool = True,
    ) -> AuditReceipt | None:
        """Stamp, redact, chain and durably write one record; the receipt says where it went.

        ``data`` is read, never changed: a sink copies what it keeps before it redacts or bounds anything (the
        record pipeline's ``normalise``), so a caller may hand it values it shares with others (the Gateway
        does: a decision's own options and rule results, see ``Decision.to_dict(shared=True)``).

        ``durable=False``: written in order but not waited for; it becomes durable with the next durable append
        (which covers every record before it) or at close. For a record that a durable one always follows
        before anything acts on it: a request's ``request.received``, followed by its ``policy.decision``
        before anything runs (one flush per dry run instead of two). A sink may also write such a record later,
        with others, and return ``None``: a decision worker's (``gateway.audit.batched``), which builds each
        record when it is appended (a record that cannot be built raises here) and writes and flushes its
        batch's records together before it answers any of its dry runs.

        Raises :class:`gateway.errors.AuditUnavailableError` on any failure to make it durable.
        """
        ...

    def close(self) -> None:
        """Release files and locks; further appends fail closed."""
        ...

    @property
    def protected_paths(self) -> tuple[str, ...]:
        """The host paths a sandbox must never be able to mount, because they hold this sink's evidence.

        Absolute and resolved (symlinks followed), so a mount check compares like with like. The sink owns
        this list: whoever guards mounts asks the sink, never the environment (one source, no drift).
        """
        ...

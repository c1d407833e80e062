"""A sink that writes its records in batches: each record built when it is appended, the batch written to a
:class:`~gateway.audit.JsonlAuditTrail` in one turn and made durable with one fsync when its writer says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.audit.jsonl import JsonlAuditTrail
    from gateway.audit.pipeline import Record

__all__ = ["BatchedAuditSink"]


class BatchedAuditSink:
    """A trail as a writer that decides many requests sees it (a decision worker's Gateway).

    Each record is built when it is appended (:meth:`JsonlAuditTrail.build`: a record that cannot be built fails
    its request at once) and written with the rest of its batch by :meth:`flush`: in order, under one hold of
    the trail's lock (the trail's other writers, other processes, wait for it once per batch, not once per
    record), then made durable with one fsync. The writer calls :meth:`flush` before it acts on, or answers for,
    any request of the batch: :meth:`append` returns before its record is written (``None``, no receipt)."""

    def __init__(self, trail: JsonlAuditTrail) -> None:
        self.trail = trail
        self._records: list[Record] = []

    def append(
        self,
        event_type: str,
        data: Mapping[str, Any],
        *,
        request_id: str | None = None,
        principal: str | None = None,
        policy: Mapping[str, str] | None = None,
        durable: bool = True,
    ) -> None:
        """Build the record (raises :class:`~gateway.errors.AuditUnavailableError` when it cannot be built); it
        is written by the next :meth:`flush`, whatever ``durable`` says."""
        self._records.append(
            self.trail.build(event_type, data, request_id=request_id, principal=principal, policy=policy)
        )

    def flush(self) -> None:
        """Write the records appended since the last flush and make them durable; raises
        :class:`~gateway.errors.AuditUnavailableError` when they cannot all be (none of them is then durable)."""
        records, self._records = self._records, []
        self.trail.append_built(records, durable=False)
        self.trail.sync()

    def close(self) -> None:
        self.trail.close()

    @property
    def protected_paths(self) -> tuple[str, ...]:
        return self.trail.protected_paths

"""An in-memory audit sink for unit tests: the same stamping, redaction and chaining as the trail."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from gateway.audit.canonical import GENESIS_HASH, CanonicalError
from gateway.audit.interface import AuditReceipt
from gateway.audit.pipeline import RecordPipeline, chain
from gateway.errors import AuditUnavailableError

__all__ = ["MemoryAuditSink"]


class MemoryAuditSink:
    """Keeps sealed records in a list. Set ``available = False`` to make every append fail closed."""

    def __init__(self, *, key: bytes | None = None, code_max_bytes: int = 65536, host: str | None = None) -> None:
        self.key = key
        self.records: list[dict[str, Any]] = []
        """Every record appended, as a verifier would parse it (``hash`` and ``hmac`` included)."""
        self.lines: list[bytes] = []
        """The exact lines a :class:`JsonlAuditTrail` would have written."""
        self.available = True
        """When ``False``, ``append`` raises :class:`AuditUnavailableError` (to test fail-closed callers)."""
        self.closed = False
        self._pipeline = RecordPipeline(code_max_bytes=code_max_bytes, host=host)
        self._lock = threading.Lock()

    def append(
        self,
        event_type: str,
        data: Mapping[str, Any],
        *,
        request_id: str | None = None,
        principal: str | None = None,
        policy: Mapping[str, str] | None = None,
        durable: bool = True,  # memory: nothing to wait for
    ) -> AuditReceipt:
        if not self.available or self.closed:
            raise AuditUnavailableError("the in-memory audit sink is unavailable")
        try:
            record = self._pipeline.build(event_type, data, request_id=request_id, principal=principal, policy=policy)
            with self._lock:
                prev = self.records[-1]["hash"] if self.records else GENESIS_HASH
                sealed = chain(record, seq=len(self.records) + 1, prev_hash=prev, key=self.key)
                self.records.append(sealed.record)
                self.lines.append(sealed.line)
        except (CanonicalError, KeyError, TypeError) as exc:
            raise AuditUnavailableError(f"cannot build the {event_type!r} audit record: {exc}") from exc
        return AuditReceipt(sealed.record["event_id"], sealed.record["seq"], sealed.hash, None)

    def close(self) -> None:
        self.closed = True

    @property
    def protected_paths(self) -> tuple[str, ...]:
        """None: records live in this process's memory, out of any sandbox's reach."""
        return ()

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        """The records of one event type, in order."""
        return [r for r in self.records if r["event_type"] == event_type]

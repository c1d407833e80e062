"""The tamper-evident audit trail: one canonical, hash-chained record per event.

The gateway writes through an :class:`AuditSink` passed to it (never a global): :class:`JsonlAuditTrail` on
disk, :class:`MemoryAuditSink` in unit tests; each record goes through the pipeline of
:mod:`gateway.audit.pipeline` (normalise, redact, stamp, chain). :func:`verify_trail`, :func:`query_trail`
and :func:`repair_trail` work on a trail directory; :func:`view_record` reads one record into a typed,
read-only view for queries and reports. ``audit/README.md`` documents the format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway._lazy import lazy_names

if TYPE_CHECKING:
    from gateway.audit.canonical import GENESIS_HASH, CanonicalError, canonical_bytes
    from gateway.audit.interface import EVENT_TYPES, SCHEMA_VERSION, AuditReceipt, AuditSink
    from gateway.audit.jsonl import JsonlAuditTrail
    from gateway.audit.memory import MemoryAuditSink
    from gateway.audit.query import QueryFilters, query_trail
    from gateway.audit.records import (
        NOT_PASSED,
        AuditRecordView,
        ExecutionOutcomeView,
        FileDigestView,
        GatewayIdentityView,
        GenericRecordView,
        ImagePulledView,
        NetworkConnectionView,
        PolicyDecisionView,
        PolicyRefView,
        ProblemView,
        RequestInvalidView,
        RequestReceivedView,
        RuleResultView,
        view_record,
    )
    from gateway.audit.repair import RepairReport, repair_trail
    from gateway.audit.segments import AuditIO, key_from_env, load_key, resolve_directory
    from gateway.audit.verify import REASONS, BreakInfo, VerifyReport, verify_trail

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "gateway.audit.canonical": ("GENESIS_HASH", "CanonicalError", "canonical_bytes"),
        "gateway.audit.interface": ("EVENT_TYPES", "SCHEMA_VERSION", "AuditReceipt", "AuditSink"),
        "gateway.audit.jsonl": ("JsonlAuditTrail",),
        "gateway.audit.memory": ("MemoryAuditSink",),
        "gateway.audit.query": ("QueryFilters", "query_trail"),
        "gateway.audit.records": (
            "NOT_PASSED",
            "AuditRecordView",
            "ExecutionOutcomeView",
            "FileDigestView",
            "GatewayIdentityView",
            "GenericRecordView",
            "ImagePulledView",
            "NetworkConnectionView",
            "PolicyDecisionView",
            "PolicyRefView",
            "ProblemView",
            "RequestInvalidView",
            "RequestReceivedView",
            "RuleResultView",
            "view_record",
        ),
        "gateway.audit.repair": ("RepairReport", "repair_trail"),
        "gateway.audit.segments": ("AuditIO", "key_from_env", "load_key", "resolve_directory"),
        "gateway.audit.verify": ("REASONS", "BreakInfo", "VerifyReport", "verify_trail"),
    },
    globals(),
)  # imported on first use (gateway/_lazy.py): a worker that needs one submodule does not import the writer's
# dependencies (the policy package, OpenTelemetry) in every interpreter it starts

__all__ = [
    "EVENT_TYPES",
    "GENESIS_HASH",
    "NOT_PASSED",
    "REASONS",
    "SCHEMA_VERSION",
    "AuditIO",
    "AuditReceipt",
    "AuditRecordView",
    "AuditSink",
    "BreakInfo",
    "CanonicalError",
    "ExecutionOutcomeView",
    "FileDigestView",
    "GatewayIdentityView",
    "GenericRecordView",
    "ImagePulledView",
    "JsonlAuditTrail",
    "MemoryAuditSink",
    "NetworkConnectionView",
    "PolicyDecisionView",
    "PolicyRefView",
    "ProblemView",
    "QueryFilters",
    "RepairReport",
    "RequestInvalidView",
    "RequestReceivedView",
    "RuleResultView",
    "VerifyReport",
    "canonical_bytes",
    "key_from_env",
    "load_key",
    "query_trail",
    "repair_trail",
    "resolve_directory",
    "verify_trail",
    "view_record",
]

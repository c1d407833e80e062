"""What one request came to: :class:`ExecutionResult`, and the audit data of an outcome.

Every interface (CLI, Python API, LLM tool, HTTP) serialises the same result; none rebuilds it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.audit.pipeline import bounded
from gateway.decision import Decision
from gateway.errors import (
    EXIT_DENIED,
    EXIT_GATEWAY_FAILURE,
    EXIT_MEMORY,
    EXIT_PENDING,
    EXIT_TIMEOUT,
    GatewayError,
    exit_code_for,
)
from gateway.runner.interface import NOTHING_RAN, Outcome

if TYPE_CHECKING:
    from gateway.egress.proxy import ConnectionRecord, EgressReport

__all__ = ["ExecutionResult", "connection_data", "outcome_data", "raw_bytes"]


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _file_entry(name: str, content: bytes) -> dict[str, Any]:
    try:
        return {"path": name, "bytes": len(content), "encoding": "utf-8", "content": content.decode("utf-8")}
    except UnicodeDecodeError:
        return {
            "path": name,
            "bytes": len(content),
            "encoding": "base64",
            "content": base64.b64encode(content).decode("ascii"),
        }


def _digest(data: bytes, size: int | None = None) -> dict[str, Any]:
    """sha256 of ``data``; ``size`` when more bytes were produced than kept (a capped stream)."""
    return {"bytes": len(data) if size is None else size, "sha256": hashlib.sha256(data).hexdigest()}


@dataclass(frozen=True)
class ExecutionResult:
    """What one request came to. Serialised by every interface; none rebuilds it."""

    request_id: str
    """Gateway-assigned id, also in every audit record of this request."""
    decision: Decision | None
    """The policy decision; None when the request was invalid or the gateway failed before deciding."""
    outcome: Outcome | None = None
    """What the sandbox reported; None when nothing ran."""
    error: GatewayError | None = None
    """A gateway-side failure (invalid request, audit unavailable, engine down); the program's own failure is not
    an error."""
    audit_ok: bool = True
    """False when a record of this request could not be made durable (the run, if any, already happened)."""
    session_id: str | None = None
    """The session this execution ran in (``gateway.sessions``); None for a single run."""
    value: str | None = None
    """A kernel cell's last expression's ``repr`` (bounded; see ``CellResult.value``); None otherwise."""
    value_truncated: bool = False
    interrupted: bool = False
    """A kernel cell was interrupted (its deadline, an output flood) and the kernel lives on."""
    session_ended: str | None = None
    """Why the session ended during this execution (a kernel kill reason: ``session.killed``); None while it lives."""
    approval_id: str | None = None
    """The approval this request waits for (:attr:`pending`), or the one its run used (``gateway.audit.approvals``)."""

    @property
    def pending(self) -> bool:
        """Waiting for an operator's approval: neither allowed nor denied, nothing ran (exit status 75)."""
        return self.approval_id is not None and self.decision is not None and self.decision.approval_required

    @property
    def allowed(self) -> bool:
        return self.decision is not None and self.decision.allowed and self.error is None

    @property
    def ran(self) -> bool:
        """True when a sandbox ran (``outcome`` is set), whatever the program did."""
        return self.outcome is not None

    @property
    def exit_status(self) -> int:
        """CLI exit status following ``docker run`` / ``timeout(1)`` (see DESIGN.md)."""
        if self.error is not None and self.outcome is None:
            return exit_code_for(self.error)
        if self.pending:
            return EXIT_PENDING
        if self.decision is not None and not self.decision.allowed:
            return EXIT_DENIED
        if self.outcome is None:
            return EXIT_GATEWAY_FAILURE
        if self.outcome.timed_out:
            return EXIT_TIMEOUT
        if self.outcome.oom_killed or self.outcome.resource_killed or self.outcome.output_limit_killed:
            return EXIT_MEMORY  # 128 + SIGKILL: killed for memory or another resource limit (output, pids)
        if not self.audit_ok:
            return EXIT_GATEWAY_FAILURE
        if self.error is not None:  # the run ended in a gateway failure, even if the program reported
            return exit_code_for(self.error)
        if self.outcome.exit_code is None:
            return EXIT_GATEWAY_FAILURE
        return self.outcome.exit_code

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` result object (keys are a contract: add, never rename)."""
        d = self.decision.to_dict() if self.decision is not None else None
        o = self.outcome or NOTHING_RAN
        out: dict[str, Any] = {
            "request_id": self.request_id,
            "allowed": self.allowed,
            "decision_id": d["decision_id"] if d else None,
            "violations": d["violations"] if d else [],
            "warnings": d["warnings"] if d else [],
            "policy": {"name": d["policy"]["name"], "sha256": d["policy"]["sha256"]} if d else None,
            "exit_code": o.exit_code,
            "stdout": _text(o.stdout),
            "stderr": _text(o.stderr),
            "stdout_truncated": o.stdout_truncated,
            "stderr_truncated": o.stderr_truncated,
            "timed_out": o.timed_out,
            "oom_killed": o.oom_killed,
            "output_limit_killed": o.output_limit_killed,
            "resource_killed": o.resource_killed,
            "duration_ms": o.duration_ms if self.outcome is not None else None,
            "files": [_file_entry(k, v) for k, v in sorted(o.files.items())],
            "files_truncated": o.files_truncated,
            "pool": o.pool if self.outcome is not None else None,
            "error": self.error.to_dict() if self.error is not None else None,
            "audit_ok": self.audit_ok,
            "exit_status": self.exit_status,
        }
        if self.outcome is not None and self.outcome.egress is not None:
            out["egress"] = _egress_totals(self.outcome.egress)  # only a run with egress: other results unchanged
        if self.session_id is not None:
            out |= {
                "session_id": self.session_id,
                "value": self.value,
                "value_truncated": self.value_truncated,
                "interrupted": self.interrupted,
                "session_ended": self.session_ended,
            }
        if self.approval_id is not None:  # only approve-mode requests: other results unchanged
            out |= {"approval_id": self.approval_id, "pending": self.pending}
        return out


def raw_bytes(raw: object) -> bytes:
    if isinstance(raw, bytes):
        return raw
    if isinstance(raw, str):
        return raw.encode("utf-8", errors="surrogatepass")
    try:
        return json.dumps(raw, sort_keys=True, default=repr).encode()
    except (TypeError, ValueError, RecursionError):
        return repr(raw).encode("utf-8", errors="replace")


def outcome_data(image: str, outcome: Outcome | None, error: GatewayError | None) -> dict[str, Any]:
    o = outcome or NOTHING_RAN
    data = {
        "exit_code": o.exit_code,
        "timed_out": o.timed_out,
        "oom_killed": o.oom_killed,
        "output_limit_killed": o.output_limit_killed,
        "resource_killed": o.resource_killed,
        "duration_ms": int(o.duration_ms),
        "container_id": o.container_id,
        "pool": o.pool if outcome is not None else None,
        "image": image,
        "image_id": o.image_id,
        "stdout": {**_digest(o.stdout, o.stdout_bytes), "truncated": o.stdout_truncated},
        "stderr": {**_digest(o.stderr, o.stderr_bytes), "truncated": o.stderr_truncated},
        **_files_data(o),
        "error": {"code": error.code, "message": error.message} if error else None,
        **({"sandbox": dict(o.sandbox)} if o.sandbox else {}),
    }
    if o.egress is not None:  # each connection is a network.connection record of its own, written just before
        data["egress"] = {**_egress_totals(o.egress), "records_dropped": o.egress.dropped}
        if o.egress.redactions:  # an upstream echoed a secret: erased from the output, recorded here (names only)
            data["egress"]["redactions"] = [r.to_dict() for r in o.egress.redactions]
    return data


def _egress_totals(egress: EgressReport) -> dict[str, int]:
    """A run's egress totals, as its result and its ``execution.outcome`` record state them."""
    return {
        "connections": egress.connections,
        "denied": egress.denied,
        "bytes_out": egress.bytes_out,
        "bytes_in": egress.bytes_in,
    }


def connection_data(record: ConnectionRecord) -> dict[str, Any]:
    """The ``data`` of one ``network.connection`` record (the request's ids come with the envelope)."""
    data: dict[str, Any] = {
        "host": record.host,
        "port": record.port,
        "address": record.address,
        "method": record.method,
        "decision": "allowed" if record.allowed else "denied",
        "rule": record.rule,
        "bytes_out": record.bytes_out,
        "bytes_in": record.bytes_in,
        "duration_ms": max(0, round(record.duration * 1000)),  # the trail's canonical JSON has no floats
        "ended": record.ended,
    }
    if record.message:  # why it was denied or ended early
        data["message"] = record.message
    if record.secret is not None:  # the proxy set this secret's header (its name; the value is never recorded)
        data["secret"] = record.secret
    return data


def _files_data(o: Outcome) -> dict[str, Any]:
    """The returned files in the outcome record: a bounded listing whatever the program wrote.

    ``files`` names the first few (name, bytes, sha256), ``files_omitted`` counts the rest with a digest of
    their entries, ``files_count`` / ``files_bytes`` cover all of them. The result returned to the caller holds
    every file (bounded by the policy's ``limits.output_files`` and ``limits.output_files_bytes``).
    """
    entries = [{"name": k, **_digest(v)} for k, v in sorted(o.files.items())]
    listed, omitted = bounded(entries)
    out: dict[str, Any] = {
        "files": listed,
        "files_count": len(entries),
        "files_bytes": sum(len(v) for v in o.files.values()),
        "files_truncated": o.files_truncated,
    }
    if omitted is not None:
        out["files_omitted"] = omitted
    return out

"""The decision model: one frozen :class:`Decision` per request, the single source of truth for what was decided.

CLI, server, audit and reports serialise it; none rebuilds it. Each rule's verdict is a :class:`RuleResult`;
an allowed decision also carries the :class:`~gateway.runspec.RunSpec` the runner will receive,
with the backend's options exactly as they were guarded, and their recorded form (``recorded_options``: the
same options with the Docker seccomp profile named by digest), which records and responses show.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from gateway.canonical import options_bytes
from gateway.decision.settings import SandboxSettings
from gateway.policy.model import Mode
from gateway.request import ExecutionRequest
from gateway.runspec import RunSpec

__all__ = [
    "DENYING", "Decision", "PolicyRef", "RuleResult", "ShadowVerdict", "Status", "copy_json", "request_digest",
]  # fmt: skip

Status = Literal["pass", "fail", "warn", "error", "skip"]


def copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data (tuples become lists), so nothing handed out aliases a decision."""
    if isinstance(value, dict):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [copy_json(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class RuleResult:
    """One rule's verdict on one part of the request."""

    rule: str
    """Stable rule id, e.g. ``limits.memory``: the id in the rule registry."""
    status: Status
    mode: Mode
    """The mode the result was judged in; ``enforce`` for findings that audit mode never relaxes."""
    path: str
    """JSON path into the request (``$.limits.memory``)."""
    got: Any
    """What the request asked for (or was defaulted to), as JSON data."""
    expected: Any
    """What the policy allows, as JSON data."""
    message: str

    @property
    def denies(self) -> bool:
        """An error in any mode, or a failure in enforce mode."""
        return self.status == "error" or (self.status == "fail" and self.mode == "enforce")

    @property
    def holds(self) -> bool:
        """A failure in approve mode: the request waits for an operator's approval (it does not deny)."""
        return self.status == "fail" and self.mode == "approve"

    def to_dict(self, *, shared: bool = False) -> dict[str, Any]:
        """This result as JSON data: ``got`` and ``expected`` copied, or as they are with ``shared`` (see
        :meth:`Decision.to_dict`)."""
        return {
            "rule": self.rule,
            "status": self.status,
            "mode": self.mode,
            "path": self.path,
            "got": self.got if shared else copy_json(self.got),
            "expected": self.expected if shared else copy_json(self.expected),
            "message": self.message,
        }


DENYING: frozenset[Status] = frozenset({"fail", "error"})


@dataclass(frozen=True, slots=True)
class PolicyRef:
    name: str
    sha256: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "sha256": self.sha256, "source": self.source}


@dataclass(frozen=True, slots=True)
class ShadowVerdict:
    """What the shadow policy (``spec.audit_policy``) made of the same request; it never decides."""

    name: str
    sha256: str
    allowed: bool

    def to_dict(self) -> dict[str, Any]:
        return {"policy": {"name": self.name, "sha256": self.sha256}, "allowed": self.allowed}


@dataclass(frozen=True, slots=True)
class Decision:
    """What the policy made of one request."""

    decision_id: str
    request_id: str
    allowed: bool
    policy: PolicyRef
    results: tuple[RuleResult, ...]
    settings: SandboxSettings | None = None
    """Every resolved setting (None when they could not be resolved)."""
    run: RunSpec | None = None
    """What the runner receives: the guarded backend options and the runner's own limits. None when denied."""
    exceptions: tuple[str, ...] = ()
    """Ids of the policy exceptions that applied to this request (matching principal, not expired)."""
    shadow: ShadowVerdict | None = None
    """The shadow policy's verdict (its failures are among the warnings as ``shadow:<rule id>``)."""
    recorded_options: Mapping[str, Any] | None = None
    """``run.options`` as the record and the responses show them (the assembler's ``recorded`` form: the
    Docker seccomp profile named by its digest); present exactly when ``run`` is."""
    request_digest: str | None = None
    """:func:`request_digest` of the request, present when approve-mode rules asked for an approval (the request
    waits for one, or runs because an operator approved exactly this digest)."""

    def __post_init__(self) -> None:
        if (self.run is None) != (self.recorded_options is None):
            raise ValueError("a decision has recorded options exactly when it has a run specification")
        if self.recorded_options is not None:
            object.__setattr__(self, "recorded_options", MappingProxyType(copy_json(dict(self.recorded_options))))

    @property
    def options(self) -> dict[str, Any] | None:
        """A fresh plain-JSON copy of the backend's run options, or None when denied."""
        return None if self.run is None else copy_json(dict(self.run.options))

    @property
    def options_sha256(self) -> str | None:
        """sha256 of the exact options (``options``, not the recorded form) in the canonical options format."""
        if self.run is None:
            return None
        return hashlib.sha256(options_bytes(dict(self.run.options))).hexdigest()  # read only: no copy needed

    @property
    def violations(self) -> tuple[RuleResult, ...]:
        """Every result that denies: an enforce-mode failure, or an error in any mode."""
        return tuple(r for r in self.results if r.denies)

    @property
    def approvals(self) -> tuple[RuleResult, ...]:
        """The approve-mode failures: the rules that ask an operator to approve this request."""
        return tuple(r for r in self.results if r.holds)

    @property
    def approval_required(self) -> bool:
        """Neither allowed nor denied: only approve-mode rules failed, and no approval of this digest was given."""
        return not self.allowed and not self.violations and bool(self.approvals)

    @property
    def warnings(self) -> tuple[RuleResult, ...]:
        """Audit-mode failures (``warn``) and the shadow policy's failures (``fail`` in mode ``audit``)."""
        return tuple(r for r in self.results if r.status == "warn" or (r.status == "fail" and r.mode == "audit"))

    def to_dict(self, *, shared: bool = False) -> dict[str, Any]:
        """The decision record (``schemas/decision.schema.json``): a fresh copy the caller may change.

        ``shared``: the same record holding the decision's own values (the recorded options, each result's
        ``got`` and ``expected``, which may be the compiled policy's) instead of copies of them, for a reader
        that changes nothing and copies what it keeps: an audit sink (``AuditSink.append``)."""
        options = self.recorded_options
        out: dict[str, Any] = {
            "decision_id": self.decision_id,
            "request_id": self.request_id,
            "allowed": self.allowed,
            "policy": self.policy.to_dict(),
            "results": [r.to_dict(shared=shared) for r in self.results],
            "violations": [r.to_dict(shared=shared) for r in self.violations],
            "warnings": [r.to_dict(shared=shared) for r in self.warnings],
            "options": None if options is None else (options if shared else copy_json(dict(options))),
            "plan": self.settings.plan() if self.settings is not None and self.run is not None else None,
            "exceptions": list(self.exceptions),
            "shadow": None if self.shadow is None else self.shadow.to_dict(),
        }
        if self.request_digest is not None:  # only approve-mode rules add these (older records stay as they were)
            out["approvals"] = [r.to_dict(shared=shared) for r in self.approvals]
            out["approval_required"] = self.approval_required
            out["request_digest"] = self.request_digest
        return out


def request_digest(request: ExecutionRequest, settings: SandboxSettings) -> str:
    """sha256 of what an approval is bound to: the request's content (code, files, every setting it asked for,
    its principal; not its free-form ``metadata``) and the settings the decision resolved (``plan``), in the
    canonical options format. The one definition: the engine stamps it, the approval store matches it."""
    content = request.to_dict()
    content.pop("metadata", None)
    body = {"request": content, "principal": request.principal, "plan": settings.plan()}
    return hashlib.sha256(options_bytes(body)).hexdigest()

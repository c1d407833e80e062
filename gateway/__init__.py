"""Policy-driven security gateway for AI-agent code execution.

The public API. Everything else is reachable through its module but may change; what is listed here is
pinned by ``tests/unit/test_public_api.py``.
"""

from __future__ import annotations

__version__ = "0.1.0"

from importlib import import_module
from typing import TYPE_CHECKING, Any

from gateway.errors import (
    AuditError,
    AuditIntegrityError,
    AuditUnavailableError,
    ContractError,
    EngineUnavailableError,
    GatewayError,
    ImageMissingError,
    PolicyError,
    PolicyNotFoundError,
    Problem,
    RequestError,
    RunnerError,
    SandboxError,
    UnsafeOptionsError,
    exit_code_for,
    http_status_for,
)

if TYPE_CHECKING:
    from gateway._gateway import Admission, Caller, Gateway
    from gateway.decision import Decision, RuleResult, evaluate
    from gateway.policy import Policy, PolicySet, load_policy, load_policy_text
    from gateway.policy.model import PoolConfig
    from gateway.request import ExecutionRequest, parse_request
    from gateway.result import ExecutionResult

_LAZY: dict[str, str] = {
    **dict.fromkeys(("Admission", "Caller", "Gateway"), "gateway._gateway"),
    **dict.fromkeys(("Decision", "RuleResult", "evaluate"), "gateway.decision"),
    **dict.fromkeys(("Policy", "PolicySet", "load_policy", "load_policy_text"), "gateway.policy"),
    "PoolConfig": "gateway.policy.model",
    **dict.fromkeys(("ExecutionRequest", "parse_request"), "gateway.request"),
    "ExecutionResult": "gateway.result",
}
"""The public names whose modules are imported on first use (PEP 562), not with the package: a process that
needs one submodule (an audit worker imports only ``gateway.audit._scan`` or ``gateway.audit.ocsf``) does not
pay for importing the whole gateway (policy loader, jsonschema, decision engine: about 0.3 s of CPU per
interpreter, which a verify or export starts one per CPU)."""


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gateway' has no attribute {name!r}")
    return getattr(import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "Admission",
    "AuditError",
    "AuditIntegrityError",
    "AuditUnavailableError",
    "Caller",
    "ContractError",
    "Decision",
    "EngineUnavailableError",
    "ExecutionRequest",
    "ExecutionResult",
    "Gateway",
    "GatewayError",
    "ImageMissingError",
    "Policy",
    "PolicyError",
    "PolicyNotFoundError",
    "PolicySet",
    "PoolConfig",
    "Problem",
    "RequestError",
    "RuleResult",
    "RunnerError",
    "SandboxError",
    "UnsafeOptionsError",
    "__version__",
    "evaluate",
    "exit_code_for",
    "http_status_for",
    "load_policy",
    "load_policy_text",
    "parse_request",
]

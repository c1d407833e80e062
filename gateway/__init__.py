"""Policy-driven security gateway for AI-agent code execution.

The public API. Everything else is reachable through its module but may change; what is listed here is
pinned by ``tests/unit/core/test_public_api.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway._lazy import lazy_names
from gateway._version import __version__
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

__getattr__, __dir__ = lazy_names(
    __name__,
    {
        "gateway._gateway": ("Admission", "Caller", "Gateway"),
        "gateway.decision": ("Decision", "RuleResult", "evaluate"),
        "gateway.policy": ("Policy", "PolicySet", "load_policy", "load_policy_text"),
        "gateway.policy.model": ("PoolConfig",),
        "gateway.request": ("ExecutionRequest", "parse_request"),
        "gateway.result": ("ExecutionResult",),
    },
    globals(),
)  # the public names of the Gateway, the policy and the request: imported on first use (gateway/_lazy.py)

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

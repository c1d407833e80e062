"""Policies: strict loading, JSON Schema validation, a semantic pass, and the frozen model.

Use :func:`load_policy` (a file) or :func:`load_policy_text`; both raise only
:class:`gateway.errors.PolicyError` (or its subclass ``PolicyNotFoundError``).
"""

from __future__ import annotations

from gateway.policy.compiled import CompiledPolicy, compile_policy
from gateway.policy.loader import canonical_sha256, load_policy, load_policy_text
from gateway.policy.model import Policy
from gateway.policy.policyset import PolicySet
from gateway.sizes import SizeError, format_size, parse_size

__all__ = [
    "CompiledPolicy",
    "Policy",
    "PolicySet",
    "SizeError",
    "canonical_sha256",
    "compile_policy",
    "format_size",
    "load_policy",
    "load_policy_text",
    "parse_size",
]

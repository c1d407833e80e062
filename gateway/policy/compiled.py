"""The compiled policy: what every decision needs from a policy, derived once when the policy is loaded.

OPA's prepared query in miniature: glob patterns become one regex, allowed lists become the JSON the decision
records as ``expected``. Immutable, built by :func:`compile_policy` (a :class:`~gateway.policy.PolicySet` does
it once per policy); a rule reads it and never derives anything of its own per request.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from gateway.policy.model import MountRoot, Policy, PolicyException
from gateway.policy.paths import is_within

__all__ = ["CompiledPolicy", "compile_globs", "compile_policy", "relax"]


def compile_globs(patterns: tuple[str, ...] | frozenset[str]) -> re.Pattern[str]:
    """One regex that matches exactly the names some shell glob in ``patterns`` matches (none when empty)."""
    if not patterns:
        return re.compile(r"(?!)")
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in sorted(patterns)))


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """A :class:`Policy` with the data its rules derive from it, computed once."""

    policy: Policy
    env_allowed: re.Pattern[str]
    """Matches the variable names ``env.allowed`` lists (exact names and globs)."""
    images_expected: tuple[dict[str, Any], ...]
    """The image allowlist as the decision records it."""
    mount_roots: tuple[str, ...]
    """Every allowlisted mount root, in policy order."""
    mount_targets: tuple[str, ...]
    """Every allowed mount target of any root, sorted."""
    exception_principals: tuple[re.Pattern[str], ...] = ()
    """For each of ``policy.exceptions``, in order: the principals it matches."""
    shadow: CompiledPolicy | None = None
    """The compiled shadow policy (``policy.audit_policy``), if any."""

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def sha256(self) -> str:
        return self.policy.sha256

    def matching_root(self, canonical: str) -> MountRoot | None:
        """The first allowlisted root that contains ``canonical`` (component by component), if any."""
        for root in self.policy.mounts.allow:
            if is_within(canonical, root.root):
                return root
        return None

    def exceptions_for(self, principal: str | None, now: datetime) -> tuple[PolicyException, ...]:
        """The exceptions that apply to a request of ``principal`` at ``now`` (aware): matching and unexpired."""
        if not principal:
            return ()
        pairs = zip(self.policy.exceptions, self.exception_principals, strict=True)
        return tuple(exc for exc, names in pairs if now < exc.expires and names.match(principal))

    def relaxed(self, exceptions: Sequence[PolicyException]) -> CompiledPolicy:
        """This policy widened by ``exceptions`` (see :func:`relax`), compiled; itself when there are none."""
        return compile_policy(relax(self.policy, exceptions)) if exceptions else self


def relax(policy: Policy, exceptions: Sequence[PolicyException]) -> Policy:
    """``policy`` with each exception's raised ceilings and added image entries; name and sha256 stay (the
    decision names the policy as written, and the exceptions by id). The result has no exceptions and no
    shadow policy of its own: it judges one request."""
    limits = policy.limits
    for exc in exceptions:
        for name, ceiling in exc.limits:
            current = getattr(limits, name)
            if ceiling > current.max:
                limits = replace(limits, **{name: replace(current, max=ceiling)})
    added = tuple(entry for exc in exceptions for entry in exc.images)
    images = replace(policy.images, allow=policy.images.allow + added)
    return replace(policy, limits=limits, images=images, exceptions=(), audit_policy=None)


def compile_policy(policy: Policy) -> CompiledPolicy:
    """Derive everything the rules need from ``policy``; raises only on a policy the loader could not produce."""
    allow = policy.mounts.allow
    return CompiledPolicy(
        policy=policy,
        env_allowed=compile_globs(policy.env.allowed),
        images_expected=tuple(
            {"repository": e.repository, "tags": list(e.tags), "digests": list(e.digests)} for e in policy.images.allow
        ),
        mount_roots=tuple(r.root for r in allow),
        mount_targets=tuple(sorted({t for r in allow for t in r.targets})),
        exception_principals=tuple(compile_globs(e.principals) for e in policy.exceptions),
        shadow=None if policy.audit_policy is None else compile_policy(policy.audit_policy),
    )

"""The policies a Gateway decides under: one per principal, plus the default for everyone else.

Each policy is compiled once, when the set is built; every decision reads the compiled form. A single policy
is the simple case (``PolicySet.single(policy)``). A *strict* set (the HTTP service's) has no "everyone else":
a principal it does not list is refused, never decided under the default.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.errors import AuthenticationError, PolicyError, Problem
from gateway.policy.compiled import CompiledPolicy, compile_policy
from gateway.policy.model import Policy
from gateway.policy.paths import rw_overlaps

__all__ = ["PolicySet", "code_size_ceiling"]


def _refuse_shared_rw_roots(default: Policy, principals: Mapping[str, Policy]) -> None:
    """Across different policies too, an ``rw`` root may not overlap another's root (see ``rw_overlaps``):
    one principal's sandbox could otherwise rearrange the tree another principal's mounts are judged in."""
    roots: list[tuple[str, tuple[str, ...]]] = []
    owners: list[tuple[str, str]] = []
    for who, policy in (("the default", default), *((f"principal {n!r}", p) for n, p in principals.items())):
        for r in policy.mounts.allow:
            roots.append((r.root, r.modes))
            owners.append((who, policy.sha256))
    problems = [
        Problem(
            f"mount root {roots[i][0]} of {owners[i][0]} policy and {roots[j][0]} of {owners[j][0]} policy "
            "overlap and one allows rw; give each principal sibling directories"
        )
        for i, j in rw_overlaps(roots)
        if owners[i][1] != owners[j][1]  # one policy's own roots were checked when it was loaded
    ]
    if problems:
        raise PolicyError("policies of the set share a writable mount tree", problems=problems)


def code_size_ceiling(policy: Policy) -> int | None:
    """The most UTF-8 bytes of code ``policy`` lets any request send (rule ``limits.code_size``): its ``max``
    raised by any of its exceptions (expired ones too: a bound, not a decision), or in audit or approve mode its
    ``hard_max`` (the loader requires one in audit mode: what was sent cannot be clamped); None without one."""
    limit = policy.limits.code_size
    if limit.hard_max is not None or limit.mode == "audit":
        return None if limit.hard_max is None else int(limit.hard_max)
    raised = (ceiling for exc in policy.exceptions for name, ceiling in exc.limits if name == "code_size")
    return int(max((limit.max, *raised)))


@dataclass(frozen=True)
class PolicySet:
    """An immutable mapping of principal name to compiled policy, with a default."""

    default: CompiledPolicy
    """The policy of any principal not listed (and of requests that name none)."""
    by_principal: Mapping[str, CompiledPolicy] = field(default_factory=lambda: MappingProxyType({}))
    """Principal name → its own policy."""
    strict: bool = False
    """Refuse a principal not in :attr:`by_principal` (and a request that names none) instead of deciding it
    under :attr:`default`: the service's set, whose principals are exactly its principals file's, so that a
    request of a principal a reload removed is refused rather than decided under another policy."""

    @classmethod
    def single(cls, policy: Policy) -> PolicySet:
        return cls(compile_policy(policy))

    @classmethod
    def of(
        cls, default: Policy, by_principal: Mapping[str, Policy] | None = None, *, strict: bool = False
    ) -> PolicySet:
        """Compile ``default`` and each principal's policy once."""
        principals = dict(by_principal or {})
        for name in principals:
            if not name:
                raise PolicyError("a principal in a policy set needs a non-empty name")
        _refuse_shared_rw_roots(default, principals)
        compiled = {name: compile_policy(p) for name, p in principals.items()}
        return cls(compile_policy(default), MappingProxyType(compiled), strict=strict)

    def for_principal(self, name: str | None) -> CompiledPolicy:
        """The policy that applies to ``name`` (the default when it has none of its own); in a :attr:`strict`
        set, :class:`AuthenticationError` (401) when it has none."""
        if name is not None and name in self.by_principal:
            return self.by_principal[name]
        if self.strict:
            raise AuthenticationError(
                f"principal {name!r} is not served (none of the service's principals has that name: removed by a "
                "reload?); its request is refused, never decided under another policy; nothing ran",
                hint="ask the operator for a token of a current principal (`gateway principals add|rotate`)",
            )
        return self.default

    @property
    def code_size_ceiling(self) -> int | None:
        """The most UTF-8 bytes of code that any policy of the set (the default too, even in a strict set: a
        bound, the same in a decision worker's set) lets a request send (:func:`code_size_ceiling` of each);
        None when one of them sets no bound. Code above it is denied whoever sends it, so the service
        refuses it at intake, before it waits for a slot (:meth:`gateway.Gateway.intake`)."""
        ceilings = [code_size_ceiling(compiled.policy) for compiled in self]
        return None if None in ceilings else max(c for c in ceilings if c is not None)

    def __iter__(self) -> Iterator[CompiledPolicy]:
        """Every distinct policy of the set, the default first."""
        seen: set[str] = set()
        for compiled in (self.default, *self.by_principal.values()):
            key = f"{compiled.policy.source}\0{compiled.sha256}"
            if key not in seen:
                seen.add(key)
                yield compiled

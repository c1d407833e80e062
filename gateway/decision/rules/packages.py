"""Rules for a request's Python packages (``spec.packages``): whether installs are allowed at all, and which.

The install phase checks every distribution it resolved (dependencies too) against the same ``allow`` list
and the policy's hashes again; these rules refuse what can be refused before anything runs.
"""

from __future__ import annotations

from collections.abc import Iterator

from gateway.decision.rules.base import Context, Finding, Rule, fail, ok, skip

__all__ = ["RULES"]


def _enabled(ctx: Context) -> Iterator[Finding]:
    asked = ctx.request.packages
    rule = ctx.policy.packages
    if not asked:
        yield skip("$.packages", "no packages asked")
    elif rule is None:
        message = f"{len(asked)} package(s) asked, but the policy allows no package installs (spec.packages)"
        yield fail("$.packages", len(asked), {"spec.packages": None}, message, never_relaxed=True)
    elif ctx.settings.language != "python":
        message = f"packages are Python packages; the request's language is {ctx.settings.language!r}"
        yield fail("$.language", ctx.settings.language, "python", message, never_relaxed=True)
    else:
        yield ok("$.packages", len(asked), {"index": rule.index}, f"packages may be installed from {rule.index}")


def _allowed(ctx: Context) -> Iterator[Finding]:
    resolved = ctx.settings.packages
    if resolved is None:
        yield skip("$.packages", "no packages to install (rule packages.enabled)")
        return
    rule = resolved.rule
    count = len(ctx.request.packages)
    if count > rule.max:
        message = f"{count} requirements asked; at most {rule.max} are allowed (spec.packages.max)"
        yield fail("$.packages", count, rule.max, message, never_relaxed=True)
    for index, why in resolved.refused:
        got = ctx.request.packages[index]
        yield fail(f"$.packages[{index}]", got, list(rule.allow), why, never_relaxed=True)
    if count <= rule.max and not resolved.refused:
        listed = ", ".join(str(r) for r in resolved.requirements)
        yield ok("$.packages", [str(r) for r in resolved.requirements], list(rule.allow), f"allowed: {listed}")


RULES: tuple[Rule, ...] = (
    Rule(
        "packages.enabled", _enabled, lambda _p: "enforce", "$.packages",
        checks="a request lists packages only when the policy allows installs (spec.packages), and only for "
        "the python language",
        setting="$.spec.packages",
        never_relaxed="always enforced",
        example="1 package(s) asked, but the policy allows no package installs (spec.packages)",
    ),
    Rule(
        "packages.allowed", _allowed, lambda _p: "enforce", "$.packages",
        checks="each requirement is a name (extras, version specifiers) within spec.packages.allow, and no more "
        "than spec.packages.max; a URL, path, VCS link, marker or pip option is refused. The install phase "
        "checks every resolved distribution (dependencies too) against allow and hashes again",
        setting="$.spec.packages.allow",
        never_relaxed="always enforced",
        example="project 'numpy' is not allowed (allowed: ['requests', 'urllib3', 'idna', 'certifi', "
        "'charset-normalizer'])",
    ),
)  # fmt: skip

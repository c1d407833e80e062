"""Rules for a request's packages (``spec.packages``): whether installs are allowed at all, and which.

Python packages for language ``python`` (``spec.packages``), npm packages for ``javascript``
(``spec.packages.npm``). The install phase checks everything it resolved (dependencies too) against the same
``allow`` list and the policy's hashes again; these rules refuse what can be refused before anything runs.
"""

from __future__ import annotations

from collections.abc import Iterator

from gateway.decision.rules.base import Context, Finding, Rule, fail, ok, skip
from gateway.decision.settings import ResolvedNpm

__all__ = ["RULES"]


def _enabled(ctx: Context) -> Iterator[Finding]:
    asked = ctx.request.packages
    rule = ctx.policy.packages
    npm = ctx.policy.npm
    if not asked:
        yield skip("$.packages", "no packages asked")
    elif ctx.settings.language == "javascript" and npm is not None:
        yield ok(
            "$.packages", len(asked), {"registry": npm.registry}, f"npm packages may be installed from {npm.registry}"
        )
    elif ctx.settings.language == "javascript" and rule is not None:
        message = "npm packages asked, but the policy names no npm registry (spec.packages.npm)"
        yield fail("$.packages", len(asked), {"spec.packages.npm": None}, message, never_relaxed=True)
    elif rule is None and npm is not None:
        message = f"packages are npm packages here; the request's language is {ctx.settings.language!r}"
        yield fail("$.language", ctx.settings.language, "javascript", message, never_relaxed=True)
    elif rule is None:
        message = f"{len(asked)} package(s) asked, but the policy allows no package installs (spec.packages)"
        yield fail("$.packages", len(asked), {"spec.packages": None}, message, never_relaxed=True)
    elif ctx.settings.language != "python":
        message = f"packages are Python packages; the request's language is {ctx.settings.language!r}"
        yield fail("$.language", ctx.settings.language, "python", message, never_relaxed=True)
    else:
        yield ok("$.packages", len(asked), {"index": rule.index}, f"packages may be installed from {rule.index}")


def _allowed_npm(ctx: Context, resolved: ResolvedNpm) -> Iterator[Finding]:
    rule = resolved.rule
    count = len(ctx.request.packages)
    if count > rule.max:
        message = f"{count} npm specs asked; at most {rule.max} are allowed (spec.packages.npm.max)"
        yield fail("$.packages", count, rule.max, message, never_relaxed=True)
    for index, why in resolved.refused:
        got = ctx.request.packages[index]
        yield fail(f"$.packages[{index}]", got, list(rule.allow), why, never_relaxed=True)
    if count <= rule.max and not resolved.refused:
        listed = ", ".join(str(s) for s in resolved.specs)
        yield ok("$.packages", [str(s) for s in resolved.specs], list(rule.allow), f"allowed: {listed}")


def _allowed(ctx: Context) -> Iterator[Finding]:
    if ctx.settings.npm is not None:
        yield from _allowed_npm(ctx, ctx.settings.npm)
        return
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
        checks="a request lists packages only when the policy allows installs for its language: spec.packages "
        "(index) for python, spec.packages.npm (registry) for javascript",
        setting="$.spec.packages",
        never_relaxed="always enforced",
        example="1 package(s) asked, but the policy allows no package installs (spec.packages)",
    ),
    Rule(
        "packages.allowed", _allowed, lambda _p: "enforce", "$.packages",
        checks="each requirement is a name (extras, version specifiers) within spec.packages.allow, and no more "
        "than spec.packages.max; a URL, path, VCS link, marker or pip option is refused. For javascript, each "
        "is an npm name or name@range within spec.packages.npm.allow (no URL, git, file:, path or npm: alias). "
        "The install phase checks everything resolved (dependencies too) against allow and hashes again",
        setting="$.spec.packages.allow",
        never_relaxed="always enforced",
        example="project 'numpy' is not allowed (allowed: ['requests', 'urllib3', 'idna', 'certifi', "
        "'charset-normalizer'])",
    ),
)  # fmt: skip

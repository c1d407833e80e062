"""Rules for a request's packages (``spec.packages``): whether installs are allowed at all, and which.

Python packages for language ``python`` (``spec.packages``), npm packages for ``javascript``
(``spec.packages.npm``). The install phase checks everything it resolved (dependencies too) against the same
``allow`` list and the policy's hashes again; these rules refuse what can be refused before anything runs.
"""

from __future__ import annotations

from collections.abc import Iterator

from gateway.decision.rules.base import Context, Finding, Rule, fail, ok, skip
from gateway.policy.model import NpmRule, PackagesRule
from gateway.policy.npm import NpmSpec
from gateway.policy.packages import Requirement

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


def _allowed(ctx: Context) -> Iterator[Finding]:
    npm, python = ctx.settings.npm, ctx.settings.packages
    rule: NpmRule | PackagesRule
    accepted: tuple[NpmSpec, ...] | tuple[Requirement, ...]
    if npm is not None:
        rule, accepted, refused = npm.rule, npm.specs, npm.refused
        what, ceiling = "npm specs", "spec.packages.npm.max"
    elif python is not None:
        rule, accepted, refused = python.rule, python.requirements, python.refused
        what, ceiling = "requirements", "spec.packages.max"
    else:
        yield skip("$.packages", "no packages to install (rule packages.enabled)")
        return
    count = len(ctx.request.packages)
    if count > rule.max:
        message = f"{count} {what} asked; at most {rule.max} are allowed ({ceiling})"
        yield fail("$.packages", count, rule.max, message, never_relaxed=True)
    for index, why in refused:
        got = ctx.request.packages[index]
        yield fail(f"$.packages[{index}]", got, list(rule.allow), why, never_relaxed=True)
    if count <= rule.max and not refused:
        listed = [str(a) for a in accepted]
        yield ok("$.packages", listed, list(rule.allow), f"allowed: {', '.join(listed)}")


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

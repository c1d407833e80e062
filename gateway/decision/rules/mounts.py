"""Mounts: only allowlisted host roots, never a denied path (the engine socket, system paths, the audit trail),
only allowed targets, each target once, and nothing below a source that a bind would expose dangerously.

Sources are judged by their canonical path (``realpath``), so ``..`` and symlinks cannot leave a root; then
the directory itself is opened below its root with no symlink followed (``gateway.hostfs``) and its device
and inode become part of the decision: a backend binds that directory and no other.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterator

from gateway.decision.rules.base import Context, Finding, Rule, fail, ok, skip
from gateway.policy.paths import denied_host_reason, is_within, target_problem

__all__ = ["RULES"]


def _denied_path(ctx: Context) -> Iterator[Finding]:
    mounts = ctx.settings.mounts
    if not mounts:
        yield skip("$.mounts", "no mounts requested")
        return
    extra = ctx.denied_paths
    expected = "not a system path, engine socket or the audit directory"
    for index, m in enumerate(mounts):
        # On the canonical path first: a symlink inside an allowed root cannot smuggle the socket in.
        reason = denied_host_reason(m.canonical, extra=extra)
        if reason is None and m.canonical != m.source:
            reason = denied_host_reason(posixpath.normpath(m.source), extra=extra)
        path = f"$.mounts[{index}].source"
        if reason is None:
            yield ok(path, m.canonical, expected, f"{m.canonical} is not a denied path")
        else:
            yield fail(path, m.canonical, expected, reason)


def _allowlist(ctx: Context) -> Iterator[Finding]:
    mounts = ctx.settings.mounts
    if not mounts:
        yield skip("$.mounts", "no mounts requested")
        return
    rule = ctx.policy.mounts
    roots = list(ctx.compiled.mount_roots)
    if not rule.allow:
        yield fail("$.mounts", len(mounts), [], "this policy allows no mounts")
        return
    if len(mounts) > rule.max_count:
        message = f"{len(mounts)} mounts requested; at most {rule.max_count} allowed"
        yield fail("$.mounts", len(mounts), {"max_count": rule.max_count}, message)
    for index, m in enumerate(mounts):
        path = f"$.mounts[{index}]"
        root = ctx.compiled.matching_root(m.canonical)
        if not os.path.exists(m.canonical):
            yield fail(f"{path}.source", m.source, roots, f"mount source {m.source!r} does not exist")
        elif m.problem is not None:
            yield fail(f"{path}.source", m.canonical, roots, m.problem, never_relaxed=True)
        elif root is None:
            shown = m.source if m.canonical == m.source else f"{m.source} (resolves to {m.canonical})"
            yield fail(f"{path}.source", m.canonical, roots, f"mount source {shown} is not inside an allowlisted root")
        elif m.mode not in root.modes:
            modes = list(root.modes)
            message = f"mode {m.mode!r} is not allowed under {root.root} (allowed: {modes})"
            yield fail(f"{path}.mode", m.mode, modes, message)
        else:
            yield ok(f"{path}.source", m.canonical, roots, f"{m.canonical} lies inside {root.root} ({m.mode})")


def _contents(ctx: Context) -> Iterator[Finding]:
    mounts = ctx.settings.mounts
    if not mounts:
        yield skip("$.mounts", "no mounts requested")
        return
    expected = "only directories, regular files and symlinks below the source; no mount points"
    for index, m in enumerate(mounts):
        path = f"$.mounts[{index}].source"
        if m.identity is None:
            yield skip(path, f"{m.canonical} was not opened (see mounts.allowlist)")
        elif m.contents is not None:
            yield fail(path, m.canonical, expected, m.contents)
        else:
            yield ok(path, m.canonical, expected, f"nothing below {m.canonical} is a socket, device or mount point")


def _target(ctx: Context) -> Iterator[Finding]:
    mounts = ctx.settings.mounts
    if not mounts:
        yield skip("$.mounts", "no mounts requested")
        return
    seen: set[str] = set()
    for index, m in enumerate(mounts):
        root = ctx.compiled.matching_root(m.canonical)
        targets = list(root.targets) if root is not None else list(ctx.compiled.mount_targets)
        problem = target_problem(m.target)
        if problem is None and not any(is_within(m.target, t) for t in targets):
            problem = f"target {m.target} is not one of the allowed targets {targets}"
        if problem is None and m.target in seen:
            problem = f"target {m.target} is used by more than one mount"
        seen.add(m.target)
        path = f"$.mounts[{index}].target"
        if problem is None:
            yield ok(path, m.target, targets, f"target {m.target} is allowed")
        else:
            yield fail(path, m.target, targets, problem)


RULES: tuple[Rule, ...] = (
    Rule("mounts.denied_path", _denied_path, lambda _p: "enforce", "$.mounts"),
    Rule("mounts.allowlist", _allowlist, lambda p: p.mounts.mode, "$.mounts"),
    Rule("mounts.contents", _contents, lambda _p: "enforce", "$.mounts"),
    Rule("mounts.target", _target, lambda p: p.mounts.mode, "$.mounts"),
)

"""Mounts: only allowlisted host roots, never a denied path (the engine socket, system paths, the audit trail),
only allowed targets, each target once, and nothing below a source that a bind would expose dangerously.

Sources are judged by their canonical path (``realpath``), so ``..`` and symlinks cannot leave a root; then
the directory itself is opened below its root with no symlink followed (``gateway.hostfs``) and its device
and inode become part of the decision: a backend binds that directory and no other.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterator

from gateway.decision.rules.base import Context, Finding, Rule, fail, ok, skip
from gateway.policy.paths import denied_host_reason, is_within, target_problem

__all__ = ["RULES", "writable_by"]


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
        # Only a directory judged below an allowlisted root can be bound, and rw only where the policy (whose
        # rw roots never overlap another root) allows it: these deny even in audit mode.
        if not os.path.exists(m.canonical):
            message = f"mount source {m.source!r} does not exist"
            yield fail(f"{path}.source", m.source, roots, message, never_relaxed=True)
        elif m.problem is not None:
            yield fail(f"{path}.source", m.canonical, roots, m.problem, never_relaxed=True)
        elif root is None:
            shown = m.source if m.canonical == m.source else f"{m.source} (resolves to {m.canonical})"
            message = f"mount source {shown} is not inside an allowlisted root"
            yield fail(f"{path}.source", m.canonical, roots, message, never_relaxed=True)
        elif m.mode not in root.modes:
            modes = list(root.modes)
            message = f"mode {m.mode!r} is not allowed under {root.root} (allowed: {modes})"
            yield fail(f"{path}.mode", m.mode, modes, message, never_relaxed=True)
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
        # A system target or a target used twice denies even in audit mode (the guard refuses both).
        problem = target_problem(m.target)
        if problem is None and m.target in seen:
            problem = f"target {m.target} is used by more than one mount"
        never = problem is not None
        if problem is None and not any(is_within(m.target, t) for t in targets):
            problem = f"target {m.target} is not one of the allowed targets {targets}"
        seen.add(m.target)
        path = f"$.mounts[{index}].target"
        if problem is None:
            yield ok(path, m.target, targets, f"target {m.target} is allowed")
        else:
            yield fail(path, m.target, targets, problem, never_relaxed=never)


def writable_by(owner: tuple[int, int, int], uid: int, gid: int) -> bool:
    """Whether a directory with ``(st_uid, st_gid, st_mode)`` lets ``uid:gid`` (no supplementary groups, as a
    sandbox's user has none) create files in it: write and search permission of the one class that applies
    (owner, else group, else others). ACLs and user-namespace id mapping are not considered."""
    st_uid, st_gid, mode = owner
    need = stat.S_IWUSR | stat.S_IXUSR
    if st_uid == uid:
        return mode & need == need
    if st_gid == gid:
        return mode & (need >> 3) == need >> 3
    return mode & (need >> 6) == need >> 6


def _writable(ctx: Context) -> Iterator[Finding]:
    mounts = [(i, m) for i, m in enumerate(ctx.settings.mounts) if m.mode == "rw"]
    if not mounts:
        yield skip("$.mounts", "no rw mounts requested")
        return
    user = ctx.policy.user
    expected = f"writable by the policy's user {user.uid}:{user.gid}"
    for index, m in mounts:
        path = f"$.mounts[{index}].source"
        if m.owner is None:
            yield skip(path, f"{m.canonical} was not opened (see mounts.allowlist)")
        elif writable_by(m.owner, user.uid, user.gid):
            yield ok(path, m.canonical, expected, f"{m.canonical} is writable by {user.uid}:{user.gid}")
        else:
            st_uid, st_gid, mode = m.owner
            message = (
                f"rw mount source {m.canonical} (owner {st_uid}:{st_gid}, mode {stat.S_IMODE(mode):04o}) is not "
                f"writable by the policy's user {user.uid}:{user.gid}: the program will get 'Permission denied'; "
                f"chown it to {user.uid}:{user.gid} or make it group-writable for gid {user.gid}"
            )
            yield fail(path, m.canonical, expected, message)


RULES: tuple[Rule, ...] = (
    Rule(
        "mounts.denied_path", _denied_path, lambda _p: "enforce", "$.mounts",
        checks="no mount source is (or resolves to) a system path, an engine socket or the audit directory",
        never_relaxed="always enforced",
        example="/var/run/docker.sock is the Docker engine socket",
    ),
    Rule(
        "mounts.allowlist", _allowlist, lambda p: p.mounts.mode, "$.mounts",
        checks="each source exists, lies inside an allowlisted root (canonical path), opens below it with no "
        "symlink or mount point on the way, in a mode the root allows; at most max_count mounts",
        setting="$.spec.mounts", audit="warn",
        never_relaxed="a source that does not exist, lies outside every root or cannot be opened below it, and a "
        "mode the root does not allow (rw); only max_count is relaxed",
        example="mount source /srv/other is not inside an allowlisted root",
    ),
    Rule(
        "mounts.contents", _contents, lambda _p: "enforce", "$.mounts",
        checks="nothing below a source is a socket, device node, FIFO or mount point (bounded scan)",
        never_relaxed="always enforced",
        example="/srv/data/sock is a socket; a mount may not expose it",
    ),
    Rule(
        "mounts.target", _target, lambda p: p.mounts.mode, "$.mounts",
        checks="each target is normalised, not a system directory, one of the root's targets, and used once",
        setting="$.spec.mounts.allow[].targets", audit="warn",
        never_relaxed="a system or unnormalised target, and a target used twice; only the allowed-targets list "
        "is relaxed",
        example="target /data/x is not one of the allowed targets ['/data']",
    ),
    Rule(
        "mounts.writable", _writable, lambda _p: "audit", "$.mounts",
        checks="an rw mount's source is writable by the policy's uid:gid (owner and mode bits; ACLs and id mapping "
        "are not considered), else the program only sees 'Permission denied'",
        setting="$.spec.user", audit="advisory",
        never_relaxed="never denies: always a warning",
        example="rw mount source /srv/work (owner 0:0, mode 0755) is not writable by the policy's user "
        "65534:65534: the program will get 'Permission denied'; chown it to 65534:65534 or make it group-writable "
        "for gid 65534",
    ),
)  # fmt: skip

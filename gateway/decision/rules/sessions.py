"""Session rules: what a policy says about sessions themselves (modes, how many, how long, how large).

A session's profile (image, runtime, network, limits, mounts) is not judged here: it is decided by the execution
rules, exactly as an execution's would be (:func:`gateway.decision.decide_session` composes the two). These rules
judge a :class:`SessionContext` and yield findings like every other rule; the engine's stamping applies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gateway.decision.rules.base import Finding, RuleOf, fail, ok, skip
from gateway.policy.compiled import CompiledPolicy
from gateway.policy.model import MIN_WORKSPACE, Limit, Policy, SessionsRule
from gateway.request import SessionRequest
from gateway.sizes import format_size

__all__ = ["KERNEL_LANGUAGES", "SESSION_RULES", "SessionContext", "SessionRule"]


@dataclass(frozen=True, slots=True)
class SessionContext:
    """What a session rule may look at: the session request, the principal's live sessions, the policy."""

    compiled: CompiledPolicy
    request: SessionRequest
    live_sessions: int
    """How many live sessions the request's principal holds now (the session manager counts them)."""

    @property
    def policy(self) -> Policy:
        return self.compiled.policy


@dataclass(frozen=True, slots=True)
class SessionRule(RuleOf[SessionContext]):
    """A registered session rule: the metadata of any rule, judging a :class:`SessionContext`."""


def _section(ctx: SessionContext) -> SessionsRule | None:
    return ctx.policy.sessions


def _enabled(ctx: SessionContext) -> Iterator[Finding]:
    expected = "a policy with spec.sessions"
    if _section(ctx) is None:
        message = (
            f"policy {ctx.policy.name!r} allows no sessions (it has no spec.sessions); run single executions, or "
            "ask the operator for a policy that allows sessions"
        )
        yield fail("$", ctx.request.mode, expected, message, never_relaxed=True)
    else:
        yield ok("$", ctx.request.mode, expected, f"policy {ctx.policy.name!r} allows sessions")


def _mode(ctx: SessionContext) -> Iterator[Finding]:
    section = _section(ctx)
    if section is None:
        yield skip("$.mode", "the policy allows no sessions")
        return
    got, allowed = ctx.request.mode, list(section.modes)
    if got in allowed:
        yield ok("$.mode", got, allowed, f"session mode {got!r} is allowed")
    else:
        yield fail("$.mode", got, allowed, f"session mode {got!r} is not allowed (allowed: {allowed})")


KERNEL_LANGUAGES = ("python",)
"""The languages a kernel-mode session can run: the supervisor's persistent interpreter is Python's."""


def _language(ctx: SessionContext) -> Iterator[Finding]:
    language = ctx.request.language or ctx.policy.languages.default
    if ctx.request.mode != "kernel":
        yield skip("$.language", f"a {ctx.request.mode} session runs every language the policy allows")
    elif language in KERNEL_LANGUAGES:
        yield ok("$.language", language, list(KERNEL_LANGUAGES), f"a kernel session can run {language}")
    else:
        message = (
            f"a kernel session cannot run {language} (kernel mode runs {', '.join(KERNEL_LANGUAGES)} only); use "
            f"mode workspace, whose executions each run {language} in a fresh sandbox"
        )
        yield fail("$.language", language, list(KERNEL_LANGUAGES), message, never_relaxed=True)


def _count(ctx: SessionContext) -> Iterator[Finding]:
    section = _section(ctx)
    if section is None:
        yield skip("$", "the policy allows no sessions")
        return
    most = section.max_per_principal
    expected = {"max_per_principal": most}
    who = repr(ctx.request.principal) if ctx.request.principal else "a caller without a principal"
    if ctx.live_sessions >= most:
        message = f"{who} holds {ctx.live_sessions} live session(s); at most {most} allowed: close one first"
        yield fail("$", ctx.live_sessions, expected, message, never_relaxed=True)
    else:
        yield ok("$", ctx.live_sessions, expected, f"{who} holds {ctx.live_sessions} of {most} live session(s)")


def _bound_rule(
    rule_id: str,
    field: str,
    limit: Callable[[SessionsRule], Limit],
    *,
    size: bool,
    checks: str,
    example: str,
    floor: float | None = None,
) -> SessionRule:
    """A rule that bounds one session value by the policy's ceiling, like the ``limits.*`` rules: in audit mode a
    value above ``max`` is a warning and clamped (:func:`~gateway.decision.settings.pick`), and ``hard_max`` and
    the floor still deny."""
    path = f"$.{field}"

    def show(value: float) -> str:
        return format_size(int(value)) if size else f"{value:g}"

    def check(ctx: SessionContext) -> Iterator[Finding]:
        section = _section(ctx)
        if section is None:
            yield skip(path, "the policy allows no sessions")
            return
        rule = limit(section)
        expected: dict[str, float] = {"max": rule.max}
        if floor is not None:
            expected["min"] = floor
        if rule.hard_max is not None:
            expected["hard_max"] = rule.hard_max
        asked = getattr(ctx.request, field)
        got = rule.default if asked is None else asked
        if rule.hard_max is not None and got > rule.hard_max:
            message = f"{field} {show(got)} is above the hard ceiling {show(rule.hard_max)} (hard_max: denied even "
            yield fail(path, got, expected, message + "in audit mode)", never_relaxed=True)
        elif got > rule.max:
            message = f"{field} {show(got)} is above the ceiling {show(rule.max)}"
            if rule.mode == "audit":
                message += f"; clamped to {show(rule.max)} (audit mode)"
            yield fail(path, got, expected, message)
        elif floor is not None and got < floor:
            yield fail(
                path, got, expected, f"{field} {show(got)} is below the minimum {show(floor)}", never_relaxed=True
            )
        else:
            what = "requested value" if asked is not None else "policy default"
            yield ok(path, got, expected, f"{what} within the ceiling")

    never = "a value above hard_max" + ("; below the minimum a session can be given" if floor is not None else "")
    return SessionRule(
        rule_id, check, lambda p: "enforce" if p.sessions is None else limit(p.sessions).mode, path,
        checks=checks, setting=f"$.spec.sessions.{field}", audit="clamp", never_relaxed=never, example=example,
    )  # fmt: skip


SESSION_RULES: tuple[SessionRule, ...] = (
    SessionRule(
        "sessions.enabled", _enabled, lambda _p: "enforce", "$",
        checks="the policy allows sessions at all (it has a spec.sessions section)",
        setting="$.spec.sessions", never_relaxed="always enforced: a policy without spec.sessions allows none",
        example="policy 'strict' allows no sessions (it has no spec.sessions); run single executions, or ask the "
        "operator for a policy that allows sessions",
    ),
    SessionRule(
        "sessions.mode", _mode, lambda p: "enforce" if p.sessions is None else p.sessions.mode, "$.mode",
        checks="the session mode (workspace, kernel) is one the policy allows",
        setting="$.spec.sessions.modes", audit="warn",
        example="session mode 'kernel' is not allowed (allowed: ['workspace'])",
    ),
    SessionRule(
        "sessions.language", _language, lambda _p: "enforce", "$.language",
        checks="a kernel session's language has a persistent interpreter (python); workspace sessions run any "
        "language the policy allows",
        never_relaxed="always enforced: no kernel of another language exists",
        example="a kernel session cannot run shell (kernel mode runs python only); use mode workspace, whose "
        "executions each run shell in a fresh sandbox",
    ),
    SessionRule(
        "sessions.count", _count, lambda _p: "enforce", "$",
        checks="the principal holds fewer live sessions than max_per_principal (requests without a principal "
        "share one count)",
        setting="$.spec.sessions.max_per_principal",
        never_relaxed="always enforced: live sessions hold containers and disk",
        example="'agent-1' holds 2 live session(s); at most 2 allowed: close one first",
    ),
    _bound_rule(
        "sessions.idle", "idle_s", lambda s: s.idle_s, size=False,
        checks="the idle timeout in seconds (a session unused this long is removed) is at most the ceiling",
        example="idle_s 7200 is above the ceiling 1800",
    ),
    _bound_rule(
        "sessions.lifetime", "lifetime_s", lambda s: s.lifetime_s, size=False,
        checks="the lifetime in seconds, counted from when the session became ready, is at most the ceiling",
        example="lifetime_s 86400 is above the ceiling 14400",
    ),
    _bound_rule(
        "sessions.workspace_size", "workspace_size", lambda s: s.workspace_size, size=True, floor=MIN_WORKSPACE,
        checks="the hard size bound of the session's /workspace is at most the ceiling and at least 1m",
        example="workspace_size 1g is above the ceiling 256m",
    ),
)  # fmt: skip
"""Every session rule, in the order its results appear in a session decision (before the profile's)."""

"""Resource limits: a request may ask for less than a ceiling, never more; the code and files it sends are capped."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from gateway.decision.rules.base import Context, Finding, Rule, fail, ok
from gateway.policy.model import MIN_CPUS, MIN_MEMORY, RUNSC_MIN_PIDS, Limit, Policy
from gateway.policy.sizes import format_size

__all__ = ["RULES"]

_MIN_TMPFS = 1024 * 1024


def _show(value: float, size: bool) -> str:
    return format_size(int(value)) if size else f"{value:g}"


def _pids_floor(ctx: Context) -> int | None:
    maximum = ctx.policy.limits.pids.max
    return RUNSC_MIN_PIDS if ctx.settings.profile.runtime == "runsc" and maximum >= RUNSC_MIN_PIDS else None


def _ceiling_rule(
    rule_id: str,
    field: str,
    limit: Callable[[Policy], Limit],
    value: Callable[[Context], float],
    *,
    size: bool,
    floor: Callable[[Context], float | None] = lambda _ctx: None,
    capacity: Callable[[Context], float | None] = lambda _ctx: None,
) -> Rule:
    """A rule that bounds one resolved value by the policy's ceiling (and a floor the engine needs, and what the
    backend says it can give)."""
    path = f"$.limits.{field}"

    def check(ctx: Context) -> Iterator[Finding]:
        maximum = limit(ctx.policy).max
        low = floor(ctx)
        most = capacity(ctx)
        expected = {"max": maximum} if low is None else {"max": maximum, "min": low}
        if most is not None and most < maximum:
            expected["backend_max"] = most
        got = value(ctx)
        if most is not None and got > most:
            message = f"{field} {_show(got, size)} is above what the backend can give ({_show(most, size)})"
            yield fail(path, got, expected, message, never_relaxed=True)
        elif got > maximum:
            yield fail(path, got, expected, f"{field} {_show(got, size)} is above the ceiling {_show(maximum, size)}")
        elif low is not None and got < low:
            # Below what a sandbox can be given: the backend would refuse it after a container was made, so
            # it denies even in audit mode.
            yield fail(
                path, got, expected, f"{field} {_show(got, size)} is below the minimum {_show(low, size)}",
                never_relaxed=True,
            )  # fmt: skip
        else:
            asked = getattr(ctx.request.limits, field) is not None
            yield ok(path, got, expected, f"{'requested value' if asked else 'policy default'} within the ceiling")

    return Rule(rule_id, check, lambda p: limit(p).mode, path)


def _size_cap_rule(
    rule_id: str, path: str, what: str, limit: Callable[[Policy], Limit], size: Callable[[Context], int]
) -> Rule:
    """A rule that caps how many bytes of code or files a request sends."""

    def check(ctx: Context) -> Iterator[Finding]:
        maximum = int(limit(ctx.policy).max)
        got = size(ctx)
        if got <= maximum:
            yield ok(path, got, {"max": maximum}, f"{what} within ceiling")
        else:
            total = "is" if what == "code" else "total"
            yield fail(
                path, got, {"max": maximum}, f"{what} {total} {got} bytes; the ceiling is {format_size(maximum)}"
            )

    return Rule(rule_id, check, lambda p: limit(p).mode, path)


RULES: tuple[Rule, ...] = (
    _ceiling_rule(
        "limits.memory", "memory", lambda p: p.limits.memory, lambda c: c.settings.profile.memory,
        size=True, floor=lambda _c: MIN_MEMORY,
    ),
    _ceiling_rule(
        "limits.cpus", "cpus", lambda p: p.limits.cpus, lambda c: c.settings.profile.cpus,
        size=False, floor=lambda _c: MIN_CPUS, capacity=lambda c: c.backend.max_cpus,
    ),
    _ceiling_rule(
        "limits.pids", "pids", lambda p: p.limits.pids, lambda c: c.settings.profile.pids,
        size=False, floor=_pids_floor,
    ),
    _ceiling_rule(
        "limits.timeout", "timeout_s", lambda p: p.limits.timeout_s, lambda c: c.settings.timeout_s, size=False
    ),
    _ceiling_rule(
        "limits.output_bytes", "output_bytes", lambda p: p.limits.output_bytes, lambda c: c.settings.output_bytes,
        size=True,
    ),
    _ceiling_rule(
        "limits.output_files_bytes", "output_files_bytes", lambda p: p.limits.output_files_bytes,
        lambda c: c.settings.output_files_bytes, size=True,
    ),
    _ceiling_rule(
        "limits.output_files", "output_files", lambda p: p.limits.output_files, lambda c: c.settings.output_files,
        size=False,
    ),
    _ceiling_rule(
        "limits.tmpfs", "tmpfs", lambda p: p.limits.tmpfs, lambda c: c.settings.profile.tmpfs,
        size=True, floor=lambda _c: _MIN_TMPFS,
    ),
    _size_cap_rule("limits.code_size", "$.code", "code", lambda p: p.limits.code_size, lambda c: c.settings.code_bytes),
    _size_cap_rule(
        "limits.files_size", "$.files", "files", lambda p: p.limits.files_size, lambda c: c.settings.files_bytes
    ),
)  # fmt: skip

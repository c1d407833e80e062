"""Resource limits: a request may ask for less than a ceiling, never more; the code and files it sends are capped."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from gateway.decision.rules.base import Context, Finding, Rule, fail, ok, skip
from gateway.policy.model import MIN_CPUS, MIN_MEMORY, RUNSC_MIN_PIDS, Limit, Policy
from gateway.sizes import format_size

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
    checks: str,
    example: str,
    floor: Callable[[Context], float | None] | None = None,
    capacity: Callable[[Context], float | None] | None = None,
    egress: bool = False,
) -> Rule:
    """A rule that bounds one value by the policy's ceiling (and a floor the engine needs, and what the backend
    says it can give).

    It judges what the request asked for; the resolved value (``value``) is what will run: the same, except
    in audit mode, where :func:`~gateway.decision.settings.resolve` clamps it to ``max``. So an audit-mode
    failure is a warning that says the value was clamped, and only ``hard_max`` (and what no sandbox can be
    given) still denies.
    """
    path = f"$.limits.{field}"

    def check(ctx: Context) -> Iterator[Finding]:
        if egress and ctx.settings.egress is None:
            # Only a run with network egress under a policy that lists destinations has this limit.
            if getattr(ctx.request.limits, field) is None:
                yield skip(path, "no egress: the limit does not apply")
            else:
                message = f"{field} was given but the run has no egress; ask for network egress with it"
                yield fail(path, getattr(ctx.request.limits, field), {"network": "egress"}, message, never_relaxed=True)
            return
        rule = limit(ctx.policy)
        maximum = rule.max
        low = None if floor is None else floor(ctx)
        most = None if capacity is None else capacity(ctx)
        expected = {"max": maximum} if low is None else {"max": maximum, "min": low}
        if rule.hard_max is not None:
            expected["hard_max"] = rule.hard_max
        if most is not None and most < maximum:
            expected["backend_max"] = most
        effective = value(ctx)
        asked = getattr(ctx.request.limits, field)
        got = effective if asked is None else asked
        if most is not None and effective > most:
            message = f"{field} {_show(effective, size)} is above what the backend can give ({_show(most, size)})"
            yield fail(path, got, expected, message, never_relaxed=True)
        elif rule.hard_max is not None and got > rule.hard_max:
            message = (
                f"{field} {_show(got, size)} is above the hard ceiling {_show(rule.hard_max, size)} "
                f"(hard_max: denied even in {rule.mode} mode)"
            )
            yield fail(path, got, expected, message, never_relaxed=True)
        elif got > maximum:
            message = f"{field} {_show(got, size)} is above the ceiling {_show(maximum, size)}"
            if rule.mode == "audit":
                message += f"; clamped to {_show(effective, size)} (audit mode)"
            elif rule.mode == "approve":
                message += "; it runs only once an operator approves this request (approve mode)"
            yield fail(path, got, expected, message)
        elif low is not None and got < low:
            # Below what a sandbox can be given: the backend would refuse it after a container was made, so
            # it denies even in audit mode.
            yield fail(
                path, got, expected, f"{field} {_show(got, size)} is below the minimum {_show(low, size)}",
                never_relaxed=True,
            )  # fmt: skip
        else:
            what = "requested value" if asked is not None else "policy default"
            yield ok(path, got, expected, f"{what} within the ceiling")

    never = ["a value above hard_max"]
    if floor is not None:
        never.append("below the minimum a sandbox can be given")
    if capacity is not None:
        never.append("above what the backend can give (for Docker: the host's CPUs)")
    if egress:
        never.append("a value given without network egress")
        name = field.removeprefix("egress_")
        setting = f"$.spec.network.egress.limits.{name}"
    else:
        setting = f"$.spec.limits.{field}"
    return Rule(
        rule_id, check, lambda p: limit(p).mode, path,
        checks=checks, setting=setting, audit="clamp", never_relaxed="; ".join(never), example=example,
    )  # fmt: skip


def _egress_limit(name: str) -> Callable[[Policy], Limit]:
    """The policy's limit of egress ``name``; without an egress section, one in the network section's mode (the
    rule then only skips, or denies a value given without egress)."""

    def limit(policy: Policy) -> Limit:
        rule = policy.network.egress
        if rule is None:
            return Limit(default=0, max=0, mode=policy.network.mode)
        found: Limit = getattr(rule, name)
        return found

    return limit


def _size_cap_rule(
    rule_id: str,
    path: str,
    what: str,
    limit: Callable[[Policy], Limit],
    size: Callable[[Context], int],
    *,
    measured: str,
    example: str,
) -> Rule:
    """A rule that caps how many bytes of code or files a request sends (``measured`` says how they are
    counted). What was sent cannot be clamped, so
    in audit mode (where the loader requires ``hard_max``) a request above ``max`` is a warning and one above
    ``hard_max`` is denied."""

    def check(ctx: Context) -> Iterator[Finding]:
        rule = limit(ctx.policy)
        maximum = int(rule.max)
        expected: dict[str, int] = {"max": maximum}
        if rule.hard_max is not None:
            expected["hard_max"] = int(rule.hard_max)
        got = size(ctx)
        total = "is" if what == "code" else "total"
        if rule.hard_max is not None and got > rule.hard_max:
            message = (
                f"{what} {total} {got} bytes; the hard ceiling is {format_size(int(rule.hard_max))} "
                f"(hard_max: denied even in {rule.mode} mode)"
            )
            yield fail(path, got, expected, message, never_relaxed=True)
        elif got > maximum:
            yield fail(path, got, expected, f"{what} {total} {got} bytes; the ceiling is {format_size(maximum)}")
        else:
            yield ok(path, got, expected, f"{what} within ceiling")

    return Rule(
        rule_id, check, lambda p: limit(p).mode, path,
        checks=f"the bytes of {what} a request sends are at most the ceiling ({measured})",
        setting=f"$.spec.limits.{rule_id.removeprefix('limits.')}", audit="warn",
        never_relaxed="a request above hard_max (required in audit mode: what was sent cannot be clamped)",
        example=example,
    )  # fmt: skip


RULES: tuple[Rule, ...] = (
    _ceiling_rule(
        "limits.memory", "memory", lambda p: p.limits.memory, lambda c: c.settings.profile.memory,
        size=True, floor=lambda _c: MIN_MEMORY,
        checks="the memory limit (memory + swap alike) is at most the ceiling and at least 6m",
        example="memory 1g is above the ceiling 512m",
    ),
    _ceiling_rule(
        "limits.cpus", "cpus", lambda p: p.limits.cpus, lambda c: c.settings.profile.cpus,
        size=False, floor=lambda _c: MIN_CPUS, capacity=lambda c: c.backend.max_cpus,
        checks="the CPU quota is at most the ceiling, at least 0.01 and no more than the backend's CPUs",
        example="cpus 4 is above the ceiling 2",
    ),
    _ceiling_rule(
        "limits.pids", "pids", lambda p: p.limits.pids, lambda c: c.settings.profile.pids,
        size=False, floor=_pids_floor,
        checks="the process/thread limit is at most the ceiling (and at least 256 under runsc)",
        example="pids 1000 is above the ceiling 128",
    ),
    _ceiling_rule(
        "limits.timeout", "timeout_s", lambda p: p.limits.timeout_s, lambda c: c.settings.timeout_s, size=False,
        checks="the wall-clock deadline in seconds is at most the ceiling",
        example="timeout_s 600 is above the ceiling 60",
    ),
    _ceiling_rule(
        "limits.output_bytes", "output_bytes", lambda p: p.limits.output_bytes, lambda c: c.settings.output_bytes,
        size=True,
        checks="the bytes of stdout and of stderr kept (each) are at most the ceiling",
        example="output_bytes 16m is above the ceiling 4m",
    ),
    _ceiling_rule(
        "limits.output_files_bytes", "output_files_bytes", lambda p: p.limits.output_files_bytes,
        lambda c: c.settings.output_files_bytes, size=True,
        checks="the total bytes of files returned from /workspace/out are at most the ceiling",
        example="output_files_bytes 16m is above the ceiling 4m",
    ),
    _ceiling_rule(
        "limits.output_files", "output_files", lambda p: p.limits.output_files, lambda c: c.settings.output_files,
        size=False,
        checks="how many files are returned from /workspace/out is at most the ceiling",
        example="output_files 5000 is above the ceiling 1024",
    ),
    _ceiling_rule(
        "limits.tmpfs", "tmpfs", lambda p: p.limits.tmpfs, lambda c: c.settings.profile.tmpfs,
        size=True, floor=lambda _c: _MIN_TMPFS,
        checks="the size of each tmpfs (/tmp, /workspace; also the file-size ulimit) is at most the ceiling and at "
        "least 1m",
        example="tmpfs 1g is above the ceiling 128m",
    ),
    _ceiling_rule(
        "limits.egress_connections", "egress_connections", _egress_limit("connections"),
        lambda c: c.settings.egress.connections if c.settings.egress else 0, size=False, egress=True,
        checks="with network egress, the connections a run may open in all are at most the ceiling",
        example="egress_connections 1000 is above the ceiling 256",
    ),
    _ceiling_rule(
        "limits.egress_bytes_out", "egress_bytes_out", _egress_limit("bytes_out"),
        lambda c: c.settings.egress.bytes_out if c.settings.egress else 0, size=True, egress=True,
        checks="with network egress, the bytes a run may send upstream in all are at most the ceiling",
        example="egress_bytes_out 1g is above the ceiling 256m",
    ),
    _ceiling_rule(
        "limits.egress_bytes_in", "egress_bytes_in", _egress_limit("bytes_in"),
        lambda c: c.settings.egress.bytes_in if c.settings.egress else 0, size=True, egress=True,
        checks="with network egress, the bytes a run may receive in all are at most the ceiling",
        example="egress_bytes_in 2g is above the ceiling 1g",
    ),
    _ceiling_rule(
        "limits.egress_rate", "egress_rate", _egress_limit("rate"),
        lambda c: c.settings.egress.rate if c.settings.egress else 0, size=False, egress=True,
        checks="with network egress, the connection attempts a run may make within any second are at most the "
        "ceiling",
        example="egress_rate 100 is above the ceiling 32",
    ),
    _size_cap_rule(
        "limits.code_size", "$.code", "code", lambda p: p.limits.code_size, lambda c: c.settings.code_bytes,
        measured="UTF-8", example="code is 300000 bytes; the ceiling is 256k",
    ),
    _size_cap_rule(
        "limits.files_size", "$.files", "files", lambda p: p.limits.files_size, lambda c: c.settings.files_bytes,
        measured="text as UTF-8, a base64 file as its decoded bytes",
        example="files total 2000000 bytes; the ceiling is 1m",
    ),
)  # fmt: skip

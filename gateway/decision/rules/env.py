"""Environment variables: only names the policy allows, never one that changes how the interpreter or the
loader behaves unless listed by exact name, and bounded in count and size."""

from __future__ import annotations

from collections.abc import Iterator

from gateway.decision.rules.base import Check, Context, Finding, Rule, fail, ok, skip
from gateway.policy.compiled import compile_globs
from gateway.policy.model import MAX_ENV_TOTAL_BYTES, MAX_ENV_VALUE_BYTES

__all__ = ["DANGEROUS_ENV", "RULES"]

DANGEROUS_ENV: tuple[str, ...] = (
    "LD_*",
    "DYLD_*",
    "PYTHONSTARTUP",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONINSPECT",
    "PYTHONBREAKPOINT",
    "PYTHONUSERBASE",
    "PYTHONEXECUTABLE",
    "PYTHONWARNINGS",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PERL5OPT",
    "PERL5LIB",
    "NODE_OPTIONS",
    "NODE_PATH",
    "NODE_REPL_EXTERNAL_MODULE",
    "NODE_ICU_DATA",
    "OPENSSL_CONF",
    "OPENSSL_ENGINES",
    "OPENSSL_MODULES",
    "RUBYOPT",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "GCONV_PATH",
    "MALLOC_*",
    "HOSTALIASES",
    "PATH",
    "HOME",
    "IFS",
)
"""Variables that change how the interpreter or the loader behaves. Denied unless the policy lists the
exact name under ``env.allow_dangerous``; a glob in ``env.allowed`` never allows them. Each language's own
are here: bash sources ``BASH_ENV`` before the script and runs ``PS4``'s command substitutions under
``SHELLOPTS=xtrace``; node loads ``NODE_OPTIONS``' ``--require`` and ``--import`` modules and searches
``NODE_PATH``; OpenSSL (Python's and Node's) loads the engines and providers ``OPENSSL_CONF`` names. So a
request cannot run code that is not its program; the supervisor does not filter what the policy allowed."""

_DANGEROUS = compile_globs(DANGEROUS_ENV)


def _allowed(ctx: Context) -> Iterator[Finding]:
    env = ctx.request.env
    rule = ctx.policy.env
    allowed = list(rule.allowed)
    matches = ctx.compiled.env_allowed.match
    refused = [n for n in env if matches(n) is None and n not in rule.allow_dangerous]
    for name in refused:
        message = f"variable {name!r} is not allowed" + ("" if allowed else " (this policy allows none)")
        yield fail(f"$.env.{name}", name, allowed, message)
    if not refused:
        yield ok("$.env", sorted(env), allowed, "every variable name is allowed")


def _dangerous(ctx: Context) -> Iterator[Finding]:
    env = ctx.request.env
    listed = ctx.policy.env.allow_dangerous
    expected = sorted(listed)
    found = [n for n in env if _DANGEROUS.match(n) is not None and n not in listed]
    for name in found:
        message = (
            f"variable {name!r} changes how the interpreter or loader behaves; it must be listed in env.allow_dangerous"
        )
        yield fail(f"$.env.{name}", name, expected, message, never_relaxed=True)
    if not found:
        yield ok("$.env", sorted(env), expected, "no dangerous variables")


def _limits(ctx: Context) -> Iterator[Finding]:
    env = ctx.request.env
    rule = ctx.policy.env
    total = 0
    bad = False
    for name, value in env.items():
        size = len(value.encode("utf-8", "surrogatepass"))
        total += size + len(name)
        if "\x00" in value:
            bad = True
            # No program can be started with it: denied even in audit mode.
            message = f"value of {name!r} contains NUL"
            yield fail(f"$.env.{name}", name, "no NUL characters", message, never_relaxed=True)
        if size > rule.max_value_bytes:
            bad = True
            message = f"value of {name!r} is {size} bytes; at most {rule.max_value_bytes} allowed"
            # Above what a sandbox can be started with: denied even in audit mode (the exec would fail).
            yield fail(
                f"$.env.{name}", size, {"max_value_bytes": rule.max_value_bytes}, message,
                never_relaxed=size > MAX_ENV_VALUE_BYTES,
            )  # fmt: skip
    count = len(env)
    if count > rule.max_count:
        bad = True
        message = f"{count} variables; at most {rule.max_count} allowed"
        yield fail("$.env", count, {"max_count": rule.max_count}, message)
    if total > rule.max_total_bytes:
        bad = True
        message = f"environment totals {total} bytes; at most {rule.max_total_bytes} allowed"
        yield fail(
            "$.env",
            total,
            {"max_total_bytes": rule.max_total_bytes},
            message,
            never_relaxed=total > MAX_ENV_TOTAL_BYTES,
        )
    if not bad:
        yield ok("$.env", count, {"max_count": rule.max_count}, f"{count} variable(s), {total} bytes")


def _unless_empty(check: Check) -> Check:
    """Skip the rule when the request sets no variables."""

    def run(ctx: Context) -> Iterator[Finding]:
        if not ctx.request.env:
            yield skip("$.env", "no environment variables requested")
        else:
            yield from check(ctx)

    return run


RULES: tuple[Rule, ...] = (
    Rule(
        "env.allowed", _unless_empty(_allowed), lambda p: p.env.mode, "$.env",
        checks="every variable name matches env.allowed (exact names or globs)",
        setting="$.spec.env.allowed", audit="warn",
        example="variable 'SECRET' is not allowed",
    ),
    Rule(
        "env.dangerous", _unless_empty(_dangerous), lambda _p: "enforce", "$.env",
        checks="no variable that changes how the interpreter or loader behaves (LD_*, PYTHONPATH, PATH, ...) "
        "unless env.allow_dangerous lists its exact name",
        setting="$.spec.env.allow_dangerous",
        never_relaxed="always enforced (only env.allow_dangerous admits such a name)",
        example="variable 'LD_PRELOAD' changes how the interpreter or loader behaves; it must be listed in "
        "env.allow_dangerous",
    ),
    Rule(
        "env.limits", _unless_empty(_limits), lambda p: p.env.mode, "$.env",
        checks="the number of variables and the bytes of each value and of all of them are within env.max_*",
        setting="$.spec.env", audit="warn",
        never_relaxed=f"a NUL in a value, a value above {MAX_ENV_VALUE_BYTES} bytes or an environment above "
        f"{MAX_ENV_TOTAL_BYTES} bytes (no program can be started with them)",
        example="17 variables; at most 16 allowed",
    ),
)  # fmt: skip

"""spec.sessions: loaded strictly into SessionsRule, every bound checked; no section means no sessions."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.errors import PolicyError
from gateway.policy import Policy, load_policy
from gateway.policy.model import Limit, SessionsRule
from gateway.resources import policies_dir

SESSIONS = """
sessions:
  modes: [workspace, kernel]
  max_per_principal: 3
  idle_s: {default: 60, max: 600}
  lifetime_s: {default: 600, max: 3600, mode: audit, hard_max: 7200}
  workspace_size: {default: 64m, max: 1g}
"""


def _problems(make_policy: Callable[[str], Policy], extra: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        make_policy(extra)
    return [f"{p.path}: {p.message}" for p in info.value.problems]


def test_the_section_becomes_a_frozen_rule(make_policy: Callable[[str], Policy]) -> None:
    assert make_policy(SESSIONS).sessions == SessionsRule(
        modes=("workspace", "kernel"),
        max_per_principal=3,
        idle_s=Limit(60, 600),
        lifetime_s=Limit(600, 3600, "audit", 7200),
        workspace_size=Limit(64 * 1024**2, 1024**3),
    )
    assert make_policy(SESSIONS).sessions.pool_size == 0  # type: ignore[union-attr]  # no ready kernels unless asked


def test_ready_kernels_are_sized_by_the_policy_and_need_kernel_mode(make_policy: Callable[[str], Policy]) -> None:
    pooled = make_policy(SESSIONS + "  pool: {size: 2}\n").sessions
    assert pooled is not None
    assert pooled.pool_size == 2
    assert _problems(make_policy, SESSIONS.replace("[workspace, kernel]", "[workspace]") + "  pool: {size: 1}\n") == [
        "$.spec.sessions.pool.size: 1 ready kernels, but kernel is not in modes ['workspace']: no session could use "
        "them; add kernel to modes or set pool.size to 0"
    ]


def test_no_section_means_no_sessions(default_policy: Policy, strict_policy: Policy) -> None:
    assert default_policy.sessions is None
    assert strict_policy.sessions is None


def test_the_shipped_sessions_example_is_the_default_policy_plus_both_modes(default_policy: Policy) -> None:
    example = load_policy(policies_dir() / "examples" / "sessions.yaml")
    assert example.sessions is not None
    assert example.sessions.modes == ("workspace", "kernel")
    assert example.sessions.pool_size == 2  # ready kernels, for a gateway that keeps a pool
    assert (example.limits, example.images, example.network) == (
        default_policy.limits, default_policy.images, default_policy.network,
    )  # fmt: skip


def test_every_bound_is_checked_and_every_problem_reported(make_policy: Callable[[str], Policy]) -> None:
    bad = (
        SESSIONS.replace("default: 60, max: 600", "default: 900, max: 600")
        .replace("default: 64m, max: 1g", "default: 512k, max: 1g")
        .replace("mode: audit, hard_max: 7200", "hard_max: 7200")
    )
    assert _problems(make_policy, bad) == [
        "$.spec.sessions.idle_s.default: default 900 is above the ceiling max 600",
        "$.spec.sessions.lifetime_s.hard_max: hard_max is only valid with mode: audit or approve (in enforce mode "
        "max already denies); set mode: audit or approve, or remove hard_max",
        "$.spec.sessions.workspace_size.default: 512k is below the smallest workspace (1m); no session could be "
        "created",
    ]


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (("  max_per_principal: 3\n", ""), "$.spec.sessions"),
        (("max_per_principal: 3", "max_per_principal: 0"), "$.spec.sessions.max_per_principal"),
        (("[workspace, kernel]", "[]"), "$.spec.sessions.modes"),
        (("[workspace, kernel]", "[workspace, workspace]"), "$.spec.sessions.modes"),
        (("[workspace, kernel]", "[notebook]"), "$.spec.sessions.modes[0]"),
        (("idle_s: {default: 60, max: 600}", "idle_s: {default: 0, max: 600}"), "$.spec.sessions.idle_s.default"),
        (("  modes:", "  lifespan: 5\n  modes:"), "$.spec.sessions.lifespan"),
        (("  modes:", "  pool: {size: -1}\n  modes:"), "$.spec.sessions.pool.size"),
        (("  modes:", "  pool: {size: 17}\n  modes:"), "$.spec.sessions.pool.size"),
        (("  modes:", "  pool: {}\n  modes:"), "$.spec.sessions.pool"),
        (("  modes:", "  pool: {size: 1, min: 1}\n  modes:"), "$.spec.sessions.pool.min"),
    ],
)
def test_the_schema_is_strict(make_policy: Callable[[str], Policy], change: tuple[str, str], path: str) -> None:
    problems = _problems(make_policy, SESSIONS.replace(*change))
    assert any(p.startswith(f"{path}: ") for p in problems), problems

"""Issue 13, defect 1: audit mode observes a limit, it never removes it.

Before the fix, ``limits.memory: {mode: audit, max: 2g}`` let a request for ``100t`` through with the
requested value in the container's options. Now a request above ``max`` is a warning and gets ``max``;
``hard_max`` (audit mode only, at least ``max``) denies above it even in audit mode; the bytes a request
sends cannot be clamped, so audit mode there needs ``hard_max``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from gateway.errors import PolicyError
from gateway.policy import Policy, load_policy_text
from gateway.request import parse_request
from gateway.testing import decide

MiB = 1024**2
GiB = 1024**3


def _audit(base: str, field: str, extra: str = "") -> Policy:
    """``base`` with ``limits.<field>`` switched to audit mode (plus ``extra`` keys in the same mapping)."""
    pattern = re.compile(rf"^(    {field}: \{{[^}}]*)\}}$", re.MULTILINE)
    text, count = pattern.subn(rf"\1, mode: audit{extra}}}", base)
    assert count == 1, field
    return load_policy_text(text, source="audit.yaml")


# (policy field, request value far above the ceiling, the option/setting it lands in, the ceiling)
CLAMPED = [
    ("memory", "100t", lambda d: d.options["mem_limit"], 512 * MiB),
    ("cpus", 64, lambda d: d.options["nano_cpus"], 2 * 10**9),
    ("pids", 100000, lambda d: d.options["pids_limit"], 128),
    ("timeout_s", 86400, lambda d: d.run.timeout_s, 60),
    ("output_bytes", "1g", lambda d: d.run.output_bytes, 4 * MiB),
    ("output_files_bytes", "1g", lambda d: d.run.output_files_bytes, 4 * MiB),
    ("output_files", 60000, lambda d: d.run.output_files, 256),
    ("tmpfs", "100g", lambda d: d.settings.profile.tmpfs, 128 * MiB),
]


@pytest.mark.parametrize(("field", "asked", "applied", "ceiling"), CLAMPED, ids=[c[0] for c in CLAMPED])
def test_audit_mode_clamps_every_limit_to_its_ceiling(
    base_policy_text: str, field: str, asked: Any, applied: Any, ceiling: float
) -> None:
    base = base_policy_text
    if field == "output_files":
        base = base.replace("  user:", "    output_files: {default: 16, max: 256}\n  user:")
    policy = _audit(base, field)
    d = decide(policy, parse_request({"code": "x", "limits": {field: asked}}))
    assert d.allowed, d.violations
    [warning] = d.warnings
    assert (warning.status, warning.mode, warning.path) == ("warn", "audit", f"$.limits.{field}")
    assert "clamped to" in warning.message
    assert applied(d) == ceiling  # the value that runs is the ceiling, never what was asked


def test_the_issue_example_100t_under_a_2g_audit_ceiling(base_policy_text: str) -> None:
    text = base_policy_text.replace("max: 512m}", "max: 2g, mode: audit}")
    d = decide(load_policy_text(text), parse_request({"code": "x", "limits": {"memory": "100t"}}))
    assert d.allowed
    assert d.options is not None
    assert d.options["mem_limit"] == d.options["memswap_limit"] == 2 * GiB
    assert [w.message for w in d.warnings] == ["memory 100t is above the ceiling 2g; clamped to 2g (audit mode)"]


def test_hard_max_denies_even_in_audit_mode(base_policy_text: str) -> None:
    policy = _audit(base_policy_text, "memory", ", hard_max: 1g")
    assert policy.limits.memory.hard_max == GiB
    between = decide(policy, parse_request({"code": "x", "limits": {"memory": "768m"}}))
    assert between.allowed
    assert between.options is not None
    assert between.options["mem_limit"] == 512 * MiB
    above = decide(policy, parse_request({"code": "x", "limits": {"memory": "2g"}}))
    assert not above.allowed
    [violation] = above.violations
    assert (violation.rule, violation.mode, violation.status) == ("limits.memory", "enforce", "fail")
    assert violation.expected == {"max": 512 * MiB, "min": 6 * MiB, "hard_max": GiB}
    assert "hard ceiling 1g" in violation.message


def test_what_a_request_sends_cannot_be_clamped_so_audit_mode_needs_hard_max(base_policy_text: str) -> None:
    with pytest.raises(PolicyError) as caught:
        _audit(base_policy_text, "code_size")
    [problem] = caught.value.problems
    assert problem.path == "$.spec.limits.code_size.mode"
    assert "add hard_max" in problem.message
    policy = _audit(base_policy_text, "code_size", ", hard_max: 2k")
    warned = decide(policy, parse_request({"code": "x" * 1500}))
    assert warned.allowed
    assert [w.rule for w in warned.warnings] == ["limits.code_size"]
    denied = decide(policy, parse_request({"code": "x" * 3000}))
    assert [(v.rule, v.mode) for v in denied.violations] == [("limits.code_size", "enforce")]


@pytest.mark.parametrize(
    ("extra", "path", "says"),
    [
        (", hard_max: 1g", "$.spec.limits.memory.hard_max", "only valid with mode: audit"),
        (", mode: audit, hard_max: 256m", "$.spec.limits.memory.hard_max", "below max 512m"),
    ],
)
def test_hard_max_is_checked_when_the_policy_loads(base_policy_text: str, extra: str, path: str, says: str) -> None:
    text = base_policy_text.replace("{default: 256m, max: 512m}", f"{{default: 256m, max: 512m{extra}}}")
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text, source="p.yaml")
    [problem] = caught.value.problems
    assert (problem.path, problem.source, problem.line) == (path, "p.yaml", 13)
    assert says in problem.message


def test_never_relaxed_failures_deny_in_audit_mode_everywhere(data_root: Any, base_policy_text: str) -> None:
    """Audit mode on every section still denies what can never be allowed: an unsafe file name (the payload
    refuses it too), a mount outside every root or in a mode the root does not allow, a system target, a NUL
    in a variable, a dangerous variable, host networking."""
    audit = "\n".join(
        [
            "  files: {mode: audit}",
            "  network: {mode: audit, default: none, allowed: [none]}",
            "  env: {mode: audit, allowed: ['APP_*']}",
            "  mounts:",
            "    mode: audit",
            f"    allow: [{{root: {data_root}, modes: [ro], targets: [/data]}}]",
        ]
    )
    policy = load_policy_text(base_policy_text + audit + "\n")
    cases = [
        ({"files": {"../x": "1"}}, "files.path"),
        ({"mounts": [{"source": str(data_root.parent / "data2"), "target": "/data"}]}, "mounts.allowlist"),
        ({"mounts": [{"source": str(data_root), "target": "/data", "mode": "rw"}]}, "mounts.allowlist"),
        ({"mounts": [{"source": str(data_root), "target": "/usr/x"}]}, "mounts.target"),
        ({"env": {"APP_X": "a\x00b"}}, "env.limits"),
        ({"env": {"LD_PRELOAD": "/x.so"}}, "env.dangerous"),
        ({"network": "host"}, "network.mode"),
    ]
    for fields, rule in cases:
        d = decide(policy, parse_request({"code": "x", **fields}))
        assert not d.allowed, fields
        assert [(v.rule, v.mode) for v in d.violations] == [(rule, "enforce")], fields

"""Strict loading: every bad input gives precise problems (file:line: $.path: message), never a traceback."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import PolicyError, PolicyNotFoundError
from gateway.policy import Policy, canonical_sha256, load_policy, load_policy_text
from gateway.policy.loader import MAX_POLICY_BYTES
from gateway.yamlstrict import load_yaml


def _problems(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy_text(text, source="p.yaml")
    return [str(p) for p in info.value.problems]


def test_shipped_default_policy_has_safe_defaults(default_policy: Policy) -> None:
    p = default_policy
    assert p.name == "default"
    assert p.network.allowed == ("none",)
    assert p.runtime.allowed == ("runc",)
    assert p.mounts.allow == ()
    assert p.user.uid != 0
    assert p.pull == "never"
    assert p.limits.memory.default == 256 * 1024**2


def test_strict_requires_runsc_with_enough_pids(strict_policy: Policy) -> None:
    assert strict_policy.runtime.required == "runsc"
    assert strict_policy.runtime.allowed == ("runsc",)
    assert strict_policy.limits.pids.max >= 256
    assert strict_policy.mounts.allow == ()


def test_sha256_is_over_canonical_content_not_formatting(base_policy_text: str) -> None:
    a = load_policy_text(base_policy_text)
    reformatted = "# a comment\n" + base_policy_text.replace(
        'tags: ["3.11-bookworm"]', "tags:\n          - 3.11-bookworm"
    )
    b = load_policy_text(reformatted)
    assert a.sha256 == b.sha256
    c = load_policy_text(base_policy_text.replace("max: 60", "max: 61"))
    assert c.sha256 != a.sha256
    assert len(a.sha256) == 64
    assert canonical_sha256({"b": 1, "a": [1, 2]}) == canonical_sha256({"a": [1, 2], "b": 1})


def test_duplicate_keys_are_rejected_with_both_lines(base_policy_text: str) -> None:
    text = base_policy_text.replace("  user:", "  user: {uid: 1, gid: 1}\n  user:")
    [problem] = _problems(text)
    assert "$.spec.user: duplicate key 'user' (first defined on line" in problem
    assert problem.startswith("p.yaml:")


def test_every_problem_is_reported_sorted_by_line(base_policy_text: str) -> None:
    text = (
        base_policy_text.replace("max: 60", "max: sixty")
        .replace("cpus: {default: 1, max: 2}", "cpus: {default: 1, max: 2, burst: 3}")
        .replace("uid: 65534", "uid: 0")
    )
    problems = _problems(text)
    assert len(problems) == 3
    lines = [int(p.split(":")[1]) for p in problems]
    assert lines == sorted(lines)
    assert any("$.spec.limits.cpus.burst: unknown field 'burst'" in p for p in problems)
    assert any("$.spec.limits.timeout_s.max" in p for p in problems)
    assert any("$.spec.user.uid" in p for p in problems)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "empty"),
        ("a: [1, 2", "malformed YAML"),
        ("a: &x 1\nb: *x\n", "aliases are not allowed"),
        ("? [a, b]\n: 1\n", "plain strings"),
        ("1: a\n", "must be a string"),
        ("a: .nan\n", "not a finite number"),
        ("base: &b {x: 1}\nother:\n  <<: *b\n", "merge keys"),
        ("- just\n- a list\n", "is not of type 'object'"),
        ("a: !!python/object:os.system x\n", "malformed YAML"),
        ("a: \x07\n", "malformed YAML"),
    ],
)
def test_hostile_or_broken_yaml(text: str, expected: str) -> None:
    assert any(expected in p for p in _problems(text))


def test_deep_nesting_is_refused_without_recursion_error() -> None:
    deep = "a: " + "[" * 5000 + "]" * 5000 + "\n"
    problems = _problems(deep)
    assert problems


def test_timestamps_stay_strings() -> None:
    assert load_yaml("d: 2024-01-01\n", source="x").data == {"d": "2024-01-01"}


def test_non_utf8_and_oversize(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(PolicyError) as info:
        load_policy(bad)
    assert "not valid UTF-8 at byte 9" in str(info.value.problems[0])
    huge = tmp_path / "huge.yaml"
    huge.write_bytes(b"#" * (MAX_POLICY_BYTES + 10))
    with pytest.raises(PolicyError, match="too large"):
        load_policy(huge)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(PolicyNotFoundError):
        load_policy(tmp_path / "nope.yaml")
    with pytest.raises(PolicyError, match="cannot be read"):
        load_policy(tmp_path)


def test_sizes_in_policy_are_checked_with_their_path(base_policy_text: str) -> None:
    [problem] = _problems(
        base_policy_text.replace("tmpfs: {default: 64m, max: 128m}", "tmpfs: {default: 64m, max: 1.5g}")
    )
    assert "$.spec.limits.tmpfs.max" in problem
    assert "is not a size" in problem
    [problem] = _problems(
        base_policy_text.replace("memory: {default: 256m, max: 512m}", "memory: {default: 1m, max: 512m}")
    )
    assert "below Docker's minimum of 6m" in problem


def test_empty_allowlists_are_rejected(base_policy_text: str) -> None:
    text = base_policy_text.replace('tags: ["3.11-bookworm"]', "tags: []")
    assert any("$.spec.images.allow[0].tags" in p and "non-empty" in p for p in _problems(text))
    text = base_policy_text + "  mounts:\n    allow: []\n"
    assert any("$.spec.mounts.allow" in p for p in _problems(text))


def test_required_runtime_must_be_the_only_allowed(make_policy: Callable[[str], Policy]) -> None:
    with pytest.raises(PolicyError) as info:
        make_policy("runtime: {required: runsc, allowed: [runc, runsc]}\n")
    paths = {p.path for p in info.value.problems}
    assert "$.spec.runtime.allowed" in paths


@pytest.mark.parametrize(
    ("root", "reason"),
    [
        ("/", "root filesystem"),
        ("/etc", "inside /etc"),
        ("/var", "contains"),
        ("/lib64/x", "never be mounted"),
        ("/usr/share", "inside /usr"),
    ],
)
def test_mount_roots_may_not_touch_denied_paths(make_policy: Callable[[str], Policy], root: str, reason: str) -> None:
    with pytest.raises(PolicyError) as info:
        make_policy(f"mounts:\n  allow:\n    - root: {root}\n      targets: [/data]\n")
    assert any(reason in p.message and p.path == "$.spec.mounts.allow[0].root" for p in info.value.problems)


_yaml_text = st.one_of(
    st.text(max_size=300),
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=10)),
        lambda children: st.one_of(
            st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
        ),
        max_leaves=20,
    ).map(repr),
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(_yaml_text)
def test_loader_raises_only_gateway_errors_on_arbitrary_input(text: str) -> None:
    # Anything other than a GatewayError propagates and fails the test; the one raised is a PolicyError.
    with contextlib.suppress(PolicyError):
        load_policy_text(text, source="fuzz.yaml")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_loader_raises_only_gateway_errors_on_arbitrary_bytes(data: bytes) -> None:
    with pytest.raises(PolicyError):
        load_policy_text(data, source="fuzz.yaml")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    line=st.integers(min_value=0, max_value=24), junk=st.sampled_from(["  ", "x", ": :", "- [", "{", "max: -1", "\t"])
)
def test_mutated_valid_policy_never_escapes(base_policy_text: str, line: int, junk: str) -> None:
    lines = base_policy_text.splitlines()
    lines.insert(min(line, len(lines)), junk)
    try:
        load_policy_text("\n".join(lines))
    except PolicyError as exc:
        problems = exc.problems
    else:
        problems = (None,)
    assert problems


def test_env_caps_above_what_a_sandbox_can_be_started_with_are_refused(base_policy_text: str) -> None:
    """Item 11: a 140 KB variable passes a policy allowing 1m values, then the sandbox's exec fails (E2BIG)."""
    from gateway.errors import PolicyError
    from gateway.policy import load_policy_text
    from gateway.policy.model import MAX_ENV_VALUE_BYTES

    text = base_policy_text + "  env: {allowed: [X], max_value_bytes: 1m, max_total_bytes: 8m}\n"
    with pytest.raises(PolicyError) as info:
        load_policy_text(text)
    paths = sorted(p.path for p in info.value.problems)
    assert paths == ["$.spec.env.max_total_bytes", "$.spec.env.max_value_bytes"]
    ok = base_policy_text + f"  env: {{allowed: [X], max_value_bytes: {MAX_ENV_VALUE_BYTES}}}\n"
    assert load_policy_text(ok).env.max_value_bytes == MAX_ENV_VALUE_BYTES

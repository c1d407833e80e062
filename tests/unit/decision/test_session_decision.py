"""Session decisions: the profile decided as an execution's, the session rules, and executions within a session."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gateway.decision import (
    SESSION_PROFILE_RULE,
    SESSION_RULES,
    SessionDecision,
    SessionSettings,
    bind_to_session,
    decide_in_session,
    decide_session,
    within_session,
)
from gateway.decision.sessions import KERNEL_MARGIN_S
from gateway.policy import Policy, compile_policy, load_policy
from gateway.request import parse_request, parse_session_request
from gateway.resources import load_schema, policies_dir
from gateway.runner.docker.options import DockerAssembler
from gateway.runner.kubernetes.pod import KubernetesAssembler
from gateway.testing import decide

SESSIONS = """
sessions:
  modes: [workspace]
  max_per_principal: 2
  idle_s: {default: 600, max: 1800}
  lifetime_s: {default: 3600, max: 14400}
  workspace_size: {default: 64m, max: 256m}
"""


@pytest.fixture(scope="module")
def sessions_policy() -> Policy:
    return load_policy(policies_dir() / "examples" / "sessions.yaml")


def _decide(policy: Policy, live: int = 0, **fields: Any) -> SessionDecision:
    return decide_session(
        policy, parse_session_request({"mode": "workspace", **fields}), live_sessions=live, assembler=DockerAssembler()
    )


def _session(policy: Policy, **fields: Any) -> SessionSettings:
    decision = _decide(policy, **fields)
    assert decision.allowed, decision.violations
    assert decision.settings is not None
    return decision.settings


def test_an_allowed_session_resolves_its_bounds_and_fixes_the_profile_an_execution_would_get(
    sessions_policy: Policy,
) -> None:
    d = _decide(sessions_policy, idle_s=120, limits={"memory": "128m", "timeout_s": 5}, principal="agent-1")
    assert d.allowed
    assert d.settings is not None
    assert (d.settings.mode, d.settings.idle_s, d.settings.lifetime_s) == ("workspace", 120.0, 3600.0)
    assert d.settings.workspace_size == 64 * 1024**2
    same = decide(sessions_policy, parse_request({"code": "x", "limits": {"memory": "128m", "timeout_s": 5}}))
    assert same.settings is not None
    assert d.settings.sandbox.profile == same.settings.profile
    assert d.decision.options is not None
    assert d.decision.options["mem_limit"] == 128 * 1024**2
    assert [r.rule for r in d.decision.results[: len(SESSION_RULES)]] == [r.id for r in SESSION_RULES]
    record = d.to_dict()
    assert record["allowed"] is True
    assert record["session"]["workspace_size"] == 64 * 1024**2
    assert record["session"]["profile"]["memory"] == 128 * 1024**2


def test_a_policy_without_sessions_denies_every_session_with_a_rule_id(default_policy: Policy) -> None:
    d = _decide(default_policy)
    assert not d.allowed
    assert [(v.rule, v.path) for v in d.violations] == [("sessions.enabled", "$")]
    assert d.settings is None
    assert d.decision.run is None
    assert d.decision.options is None
    skipped = {r.rule for r in d.decision.results if r.status == "skip"}
    assert skipped >= {"sessions.mode", "sessions.count", "sessions.idle", "sessions.workspace_size"}


def test_the_session_rules_and_the_profile_rules_are_all_reported(sessions_policy: Policy) -> None:
    d = _decide(sessions_policy, live=2, lifetime_s=20000, workspace_size="512m", limits={"memory": "1g"})
    assert not d.allowed
    assert [v.rule for v in d.violations] == ["sessions.count", "sessions.lifetime", "sessions.workspace_size",
                                              "limits.memory"]  # fmt: skip
    assert d.decision.run is None


def test_the_live_session_count_is_the_caller_s(sessions_policy: Policy) -> None:
    assert _decide(sessions_policy, live=1).allowed
    denied = _decide(sessions_policy, live=2, principal="agent-1")
    assert [v.rule for v in denied.violations] == ["sessions.count"]
    assert denied.violations[0].message == "'agent-1' holds 2 live session(s); at most 2 allowed: close one first"


def test_a_mode_the_policy_does_not_list_is_denied(make_policy: Callable[[str], Policy]) -> None:
    d = decide_session(
        make_policy(SESSIONS), parse_session_request({"mode": "kernel"}), live_sessions=0, assembler=DockerAssembler()
    )
    assert [(v.rule, v.path, v.got) for v in d.violations] == [("sessions.mode", "$.mode", "kernel")]


def test_audit_mode_clamps_the_bounds_and_warns(make_policy: Callable[[str], Policy]) -> None:
    policy = make_policy(
        SESSIONS.replace("max: 1800}", "max: 1800, mode: audit}").replace(
            "modes: [workspace]", "mode: audit\n  modes: [workspace]"
        )
    )
    d = decide_session(
        policy, parse_session_request({"mode": "kernel", "idle_s": 5000}), live_sessions=0, assembler=DockerAssembler()
    )
    assert d.allowed
    assert [w.rule for w in d.warnings] == ["sessions.mode", "sessions.idle"]
    assert d.settings is not None
    assert d.settings.idle_s == 1800.0
    assert d.warnings[1].message == "idle_s 5000 is above the ceiling 1800; clamped to 1800 (audit mode)"


def test_exceptions_widen_the_profile_as_for_an_execution(tmp_path: Path, sessions_policy: Policy) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        f"apiVersion: gateway.agent-exec/v1\nkind: Policy\nextends: {policies_dir() / 'examples' / 'sessions.yaml'}\n"
        "metadata: {name: p}\nspec:\n  exceptions:\n    - id: EXC-1\n      match: {principals: [ml-*]}\n"
        "      limits: {memory: {max: 1g}}\n      reason: r\n      approved_by: a\n"
        "      expires: '2999-01-01T00:00:00Z'\n"
    )
    loaded = load_policy(policy)
    assert _decide(loaded, limits={"memory": "1g"}, principal="ml-1").allowed
    assert [v.rule for v in _decide(loaded, limits={"memory": "1g"}, principal="x").violations] == ["limits.memory"]


def test_a_shadow_policy_warns_about_sessions_it_would_deny(tmp_path: Path) -> None:
    base = policies_dir() / "examples" / "sessions.yaml"
    (tmp_path / "shadow.yaml").write_text(
        f"apiVersion: gateway.agent-exec/v1\nkind: Policy\nextends: {policies_dir() / 'default.yaml'}\n"
        "metadata: {name: shadow}\nspec: {}\n"
    )
    (tmp_path / "p.yaml").write_text(
        f"apiVersion: gateway.agent-exec/v1\nkind: Policy\nextends: {base}\nmetadata: {{name: p}}\n"
        "spec:\n  audit_policy: shadow.yaml\n"
    )
    d = _decide(load_policy(tmp_path / "p.yaml"))
    assert d.allowed
    assert [w.rule for w in d.warnings] == ["shadow:sessions.enabled"]


def test_a_compiled_policy_decides_the_same(sessions_policy: Policy) -> None:
    request = parse_session_request({"mode": "kernel", "workspace_size": "128m"})
    plain = decide_session(sessions_policy, request, live_sessions=0, assembler=DockerAssembler(), decision_id="d",
                           request_id="r")  # fmt: skip
    compiled = decide_session(compile_policy(sessions_policy), request, live_sessions=0, assembler=DockerAssembler(),
                              decision_id="d", request_id="r")  # fmt: skip
    assert plain == compiled


# --- executions within a session ------------------------------------------------------------------------


def test_an_execution_may_ask_for_less_or_the_same_never_more(sessions_policy: Policy) -> None:
    session = _session(sessions_policy, limits={"memory": "256m", "timeout_s": 10})
    same = parse_request({"code": "x", "image": "gateway/sandbox-python:3.11-bookworm", "runtime": "runc",
                          "limits": {"memory": "256m", "timeout_s": 5}})  # fmt: skip
    assert within_session(session, same) == ()
    more = parse_request({"code": "x", "runtime": "runsc", "network": "bridge", "limits": {"memory": "1g",
                          "timeout_s": 11, "output_files": 5000}})  # fmt: skip
    violations = within_session(session, more)
    assert {v.rule for v in violations} == {SESSION_PROFILE_RULE}
    assert all(v.denies for v in violations)
    assert [v.path for v in violations] == ["$.runtime", "$.network", "$.limits.memory", "$.limits.timeout_s",
                                            "$.limits.output_files"]  # fmt: skip
    assert violations[2].message == "memory 1g is above the session's 256m; an execution asks for no more"


def test_an_execution_names_only_the_session_s_mounts(make_policy: Callable[[str], Policy], data_root: Path) -> None:
    policy = make_policy(
        SESSIONS
        + f"mounts:\n  allow:\n    - root: {data_root}\n      modes: [ro, rw]\n      targets: [/data, /other]\n"
    )
    session = _session(policy, mounts=[{"source": str(data_root), "target": "/data", "mode": "ro"}])
    ok = parse_request({"code": "x", "mounts": [{"source": str(data_root), "target": "/data"}]})
    assert within_session(session, ok) == ()
    for mount in ({"source": str(data_root), "target": "/data", "mode": "rw"},
                  {"source": str(data_root), "target": "/other"}):  # fmt: skip
        [violation] = within_session(session, parse_request({"code": "x", "mounts": [mount]}))
        assert (violation.rule, violation.path) == (SESSION_PROFILE_RULE, "$.mounts[0]")


def test_an_execution_in_a_session_lists_no_packages(sessions_policy: Policy) -> None:
    session = _session(sessions_policy)
    [violation] = within_session(session, parse_request({"code": "x", "packages": ["idna"]}))
    assert (violation.rule, violation.path) == (SESSION_PROFILE_RULE, "$.packages")
    assert "installed before a run's sandbox is made" in violation.message


def test_binding_fills_what_the_execution_omits_from_the_session(sessions_policy: Policy) -> None:
    session = _session(sessions_policy, limits={"memory": "128m", "timeout_s": 20})
    bound = bind_to_session(session, parse_request({"code": "print(1)", "limits": {"timeout_s": 3}}))
    assert bound.code == "print(1)"
    assert (bound.image, bound.runtime, bound.network) == ("gateway/sandbox-python:3.11-bookworm", "runc", "none")
    assert (bound.limits.memory, bound.limits.timeout_s) == (128 * 1024**2, 3)


def test_an_execution_in_a_session_is_decided_again_under_the_policy(sessions_policy: Policy) -> None:
    session = _session(sessions_policy, limits={"memory": "128m"})
    allowed = decide_in_session(sessions_policy, session, parse_request({"code": "x"}), assembler=DockerAssembler())
    assert allowed.allowed
    assert (allowed.results[0].rule, allowed.results[0].status) == (SESSION_PROFILE_RULE, "pass")
    assert allowed.options is not None
    assert allowed.options["mem_limit"] == 128 * 1024**2
    denied = decide_in_session(
        sessions_policy, session, parse_request({"code": "x", "limits": {"memory": "256m"}, "env": {"SECRET": "1"}}),
        assembler=DockerAssembler(),
    )  # fmt: skip
    assert [v.rule for v in denied.violations] == [SESSION_PROFILE_RULE, "env.allowed"]


# --- the catalogue's examples are what the rules say -----------------------------------------------------

_EXAMPLES: list[tuple[str, str, int, dict[str, Any]]] = [
    ("sessions.enabled", "strict", 0, {"mode": "workspace"}),
    ("sessions.count", "examples/sessions", 2, {"mode": "workspace", "principal": "agent-1"}),
    ("sessions.idle", "examples/sessions", 0, {"mode": "workspace", "idle_s": 7200}),
    ("sessions.lifetime", "examples/sessions", 0, {"mode": "workspace", "lifetime_s": 86400}),
    ("sessions.workspace_size", "examples/sessions", 0, {"mode": "workspace", "workspace_size": "1g"}),
]


@pytest.mark.parametrize(("rule_id", "policy", "live", "fields"), _EXAMPLES, ids=[e[0] for e in _EXAMPLES])
def test_the_example_message_is_what_the_session_rule_says(
    rule_id: str, policy: str, live: int, fields: dict[str, Any]
) -> None:
    d = decide_session(
        load_policy(policies_dir() / f"{policy}.yaml"), parse_session_request(fields), live_sessions=live,
        assembler=DockerAssembler(),
    )  # fmt: skip
    [rule] = [r for r in SESSION_RULES if r.id == rule_id]
    assert rule.example in [v.message for v in d.violations if v.rule == rule_id]


def test_the_mode_rule_s_example(make_policy: Callable[[str], Policy]) -> None:
    d = decide_session(
        make_policy(SESSIONS), parse_session_request({"mode": "kernel"}), live_sessions=0, assembler=DockerAssembler()
    )
    [rule] = [r for r in SESSION_RULES if r.id == "sessions.mode"]
    assert [v.message for v in d.violations] == [rule.example]


def test_session_decisions_validate_against_the_decision_schema(
    sessions_policy: Policy, default_policy: Policy
) -> None:
    validator = Draft202012Validator(load_schema("decision"), format_checker=Draft202012Validator.FORMAT_CHECKER)
    for decision in (_decide(sessions_policy, mounts=[]), _decide(sessions_policy, live=2), _decide(default_policy)):
        assert list(validator.iter_errors(decision.to_dict())) == []


def test_a_policy_object_that_cannot_be_resolved_denies_and_never_raises(sessions_policy: Policy) -> None:
    broken = dataclasses.replace(sessions_policy, mounts=None)  # type: ignore[arg-type]  # compiling it raises
    d = _decide(broken)
    assert not d.allowed
    assert [v.rule for v in d.violations] == ["engine.resolve"]
    assert d.settings is None


@pytest.mark.parametrize(
    "assembler", [DockerAssembler(), KubernetesAssembler(instance="unit")], ids=lambda a: a.backend
)
def test_a_kernel_sessions_sandbox_is_assembled_for_its_lifetime_not_one_executions_timeout(
    sessions_policy: Policy, assembler: Any
) -> None:
    kernel = decide_session(
        sessions_policy, parse_session_request({"mode": "kernel", "lifetime_s": 7200}), live_sessions=0,
        assembler=assembler,
    )  # fmt: skip
    assert kernel.allowed, kernel.violations
    assert kernel.decision.run is not None
    assert kernel.decision.run.timeout_s == 7200 + KERNEL_MARGIN_S
    workspace = decide_session(
        sessions_policy, parse_session_request({"mode": "workspace"}), live_sessions=0, assembler=assembler
    )
    assert workspace.decision.run is not None
    assert workspace.decision.run.timeout_s < 7200  # a workspace runs fresh containers, each with its timeout
    if assembler.backend == "kubernetes":  # the deadline is fixed in the Pod the decision records
        pod = kernel.decision.run.options["pod"]
        assert pod["spec"]["activeDeadlineSeconds"] >= 7200 + KERNEL_MARGIN_S
        assert kernel.decision.recorded_options is not None
        assert kernel.decision.recorded_options["pod"] == pod

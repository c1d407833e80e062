"""Every rule at its boundaries, all violations reported, audit mode, and crashing rules deny."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from gateway.decision import RULE_IDS, Decision
from gateway.policy import Policy, compile_policy
from gateway.request import parse_request
from gateway.testing import decide as judge

MiB = 1024**2


def decide(policy: Policy, **fields: Any) -> Decision:
    return judge(policy, parse_request({"code": "print(1)", **fields}))


def failing(decision: Decision) -> list[str]:
    return sorted(v.rule for v in decision.violations)


@pytest.mark.parametrize(
    ("field", "at_ceiling", "above", "rule"),
    [
        ("memory", "512m", 512 * MiB + 1, "limits.memory"),
        ("cpus", 2, 2.000001, "limits.cpus"),
        ("pids", 128, 129, "limits.pids"),
        ("timeout_s", 60, 60.001, "limits.timeout"),
        ("output_bytes", "4m", 4 * MiB + 1, "limits.output_bytes"),
        ("output_files_bytes", "4m", 4 * MiB + 1, "limits.output_files_bytes"),
        ("tmpfs", "128m", 128 * MiB + 1, "limits.tmpfs"),
    ],
)
def test_limit_at_ceiling_passes_one_above_fails(
    default_policy: Policy, field: str, at_ceiling: Any, above: Any, rule: str
) -> None:
    ok = decide(default_policy, limits={field: at_ceiling})
    assert ok.allowed, failing(ok)
    bad = decide(default_policy, limits={field: above})
    assert not bad.allowed
    assert failing(bad) == [rule]
    [violation] = bad.violations
    assert violation.path == f"$.limits.{field}"
    assert violation.got == above
    assert violation.expected["max"] == getattr(default_policy.limits, field).max
    assert "above the ceiling" in violation.message
    assert bad.options is None
    assert bad.run is None


def test_omitted_limits_get_defaults(default_policy: Policy) -> None:
    d = decide(default_policy)
    assert d.allowed
    opts = d.options
    assert opts is not None
    assert opts["mem_limit"] == 256 * MiB
    assert opts["pids_limit"] == 64
    assert opts["nano_cpus"] == 1_000_000_000
    assert d.run is not None
    assert d.run.timeout_s == 10
    assert d.run.output_bytes == MiB


def test_memory_below_docker_minimum(default_policy: Policy) -> None:
    assert failing(decide(default_policy, limits={"memory": "5m"})) == ["limits.memory"]
    assert decide(default_policy, limits={"memory": "6m"}).allowed


def test_code_and_files_size_boundaries(make_policy: Callable[[str], Policy]) -> None:
    policy = make_policy()  # code_size 1k, files_size 2k
    assert judge(policy, parse_request({"code": "x" * 1024})).allowed
    d = judge(policy, parse_request({"code": "x" * 1025}))
    assert failing(d) == ["limits.code_size"]
    assert judge(policy, parse_request({"code": "é" * 512})).allowed  # 1024 UTF-8 bytes
    assert failing(judge(policy, parse_request({"code": "é" * 512 + "x"}))) == ["limits.code_size"]
    files = {"a.txt": "x" * 1024, "b.txt": "y" * 1024}
    assert judge(policy, parse_request({"code": "x", "files": files})).allowed
    files["c.txt"] = "z"
    assert failing(judge(policy, parse_request({"code": "x", "files": files}))) == ["limits.files_size"]


@pytest.mark.parametrize(
    "name",
    ["../x", "a/../../x", "/etc/passwd", "a\x00b", "a\\b", "a//b", "./a", "a/", "a\nb"],
)
def test_file_names_must_be_safe(default_policy: Policy, name: str) -> None:
    d = decide(default_policy, files={name: "x"})
    assert failing(d) == ["files.path"]


def test_file_names_that_are_fine(default_policy: Policy) -> None:
    assert decide(default_policy, files={"a.txt": "", "dir/sub/b.py": "x", "..hidden": "x", "out/x": "y"}).allowed


def test_file_count_cap(make_policy: Callable[[str], Policy]) -> None:
    policy = make_policy("files: {max_count: 2}\n")
    assert judge(policy, parse_request({"code": "x", "files": {"a": "", "b": ""}})).allowed
    d = judge(policy, parse_request({"code": "x", "files": {"a": "", "b": "", "c": ""}}))
    assert failing(d) == ["files.path"]


def test_images(make_policy: Callable[[str], Policy]) -> None:
    policy = make_policy()
    digest = "sha256:" + "a" * 64
    assert judge(policy, parse_request({"code": "x", "image": f"gateway/sandbox-python@{digest}"})).allowed
    assert judge(
        policy, parse_request({"code": "x", "image": f"gateway/sandbox-python:3.11-bookworm@{digest}"})
    ).allowed
    for image in (
        "gateway/sandbox-python",
        "gateway/sandbox-python:latest",
        "gateway/sandbox-python@sha256:" + "b" * 64,
        "gateway/sandbox-python-evil:3.11-bookworm",
        "docker.io/gateway/sandbox-python:3.11-bookworm",
        "localhost:5000/gateway/sandbox-python:3.11-bookworm",
    ):
        d = judge(policy, parse_request({"code": "x", "image": image}))
        assert failing(d) == ["images.allowlist"], image


def test_network(make_policy: Callable[[str], Policy]) -> None:
    policy = make_policy("network: {default: none, allowed: [none, sandbox-net]}\n")
    d = judge(policy, parse_request({"code": "x", "network": "sandbox-net"}))
    assert d.allowed
    assert d.options is not None
    assert d.options["network_mode"] == "sandbox-net"
    for net in ("host", "bridge", "container:abc"):
        assert failing(judge(policy, parse_request({"code": "x", "network": net}))) == ["network.mode"]


def test_network_host_is_denied_even_in_audit_mode(make_policy: Callable[[str], Policy]) -> None:
    policy = make_policy("network: {mode: audit, default: none, allowed: [none]}\n")
    assert judge(policy, parse_request({"code": "x", "network": "bridge"})).allowed  # audit: a warning
    assert failing(judge(policy, parse_request({"code": "x", "network": "host"}))) == ["network.mode"]


def test_runtime_and_runsc_pids(strict_policy: Policy, default_policy: Policy) -> None:
    d = decide(strict_policy)
    assert d.allowed
    assert d.options is not None
    assert d.options["runtime"] == "runsc"
    assert d.options["pids_limit"] == 256
    assert failing(decide(strict_policy, runtime="runc")) == ["runtime.allowed", "runtime.required"]
    assert failing(decide(strict_policy, limits={"pids": 255})) == ["limits.pids"]
    assert failing(decide(default_policy, runtime="kata")) == ["runtime.allowed"]


def test_env_rules(make_policy: Callable[[str], Policy]) -> None:
    policy = make_policy(
        """
        env:
          allowed: ["APP_*", "LANG", "*_TOKEN"]
          allow_dangerous: [PYTHONPATH]
          max_count: 3
          max_value_bytes: 8
          max_total_bytes: 40
        """
    )

    def env(values: dict[str, str]) -> list[str]:
        return failing(judge(policy, parse_request({"code": "x", "env": values})))

    assert env({"APP_X": "1", "LANG": "C", "PYTHONPATH": "/w"}) == []
    assert env({"OTHER": "1"}) == ["env.allowed"]
    assert env({"LD_PRELOAD": "x"}) == ["env.allowed", "env.dangerous"]
    assert env({"LD_TOKEN": "x"}) == ["env.dangerous"]  # a glob never allows a dangerous name
    assert env({"APP_A": "12345678"}) == []
    assert env({"APP_A": "123456789"}) == ["env.limits"]
    assert env({"APP_A": "a\x00b"}) == ["env.limits"]
    assert env({"APP_A": "1", "APP_B": "2", "APP_C": "3", "APP_D": "4"}) == ["env.limits"]
    assert env({"APP_AAAAAAAAAAAA": "12345678", "APP_BBBBBBBBBBBB": "12345678"}) == ["env.limits"]


def test_env_denied_entirely_without_section(strict_policy: Policy) -> None:
    assert failing(decide(strict_policy, env={"LANG": "C"})) == ["env.allowed"]


def test_all_violations_reported_not_just_first(default_policy: Policy) -> None:
    d = decide(
        default_policy,
        image="evil:1",
        network="host",
        runtime="runsc",
        language="ruby",
        limits={"memory": "1g", "pids": 1000},
        env={"LD_PRELOAD": "/x.so"},
        files={"../x": ""},
    )
    assert failing(d) == [
        "env.allowed",
        "env.dangerous",
        "files.path",
        "images.allowlist",
        "language.supported",
        "limits.memory",
        "limits.pids",
        "network.mode",
        "runtime.allowed",
    ]


def test_audit_mode_warns_and_proceeds_within_the_ceiling(base_policy_text: str) -> None:
    from gateway.policy import load_policy_text

    text = base_policy_text.replace(
        "memory: {default: 256m, max: 512m}", "memory: {default: 256m, max: 512m, mode: audit}"
    )
    policy = load_policy_text(text)
    d = judge(policy, parse_request({"code": "x", "limits": {"memory": "1g"}}))
    assert d.allowed
    [warning] = d.warnings
    assert warning.rule == "limits.memory"
    assert warning.status == "warn"
    assert warning.mode == "audit"
    assert warning.got == 1024**3  # what was asked is what the warning reports
    assert warning.message == "memory 1g is above the ceiling 512m; clamped to 512m (audit mode)"
    assert d.violations == ()
    assert d.options is not None
    assert d.options["mem_limit"] == 512 * MiB  # audit mode never removes the limit: clamped to max
    out = d.to_dict()
    assert out["warnings"][0]["rule"] == "limits.memory"


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [("cpus", 0.004, "limits.cpus"), ("cpus", 0.0099, "limits.cpus"), ("memory", "5m", "limits.memory")],
)
def test_below_what_a_sandbox_can_be_given_denies_even_in_audit_mode(
    base_policy_text: str, field: str, value: Any, rule: str
) -> None:
    """The engine refuses these after a container is made (item 11); audit mode must not let them through."""
    from gateway.policy import load_policy_text

    text = base_policy_text.replace("cpus: {default: 1, max: 2}", "cpus: {default: 1, max: 2, mode: audit}")
    text = text.replace("memory: {default: 256m, max: 512m}", "memory: {default: 256m, max: 512m, mode: audit}")
    assert "mode: audit}" in text.split("cpus:")[1].split("\n")[0]
    d = judge(load_policy_text(text), parse_request({"code": "x", "limits": {field: value}}))
    assert not d.allowed
    [violation] = d.violations
    assert (violation.rule, violation.mode, violation.path) == (rule, "enforce", f"$.limits.{field}")
    assert "below the minimum" in violation.message
    assert judge(load_policy_text(text), parse_request({"code": "x", "limits": {"cpus": 0.01}})).allowed


def test_a_backend_that_declares_its_cpus_gets_no_more_even_in_audit_mode(base_policy_text: str) -> None:
    from gateway.decision import evaluate
    from gateway.decision.settings import BackendLimits
    from gateway.policy import load_policy_text
    from gateway.runner.docker.options import DockerAssembler

    policy = load_policy_text(
        base_policy_text.replace("cpus: {default: 1, max: 2}", "cpus: {default: 1, max: 2, mode: audit}")
    )
    small = DockerAssembler(capacity=lambda: BackendLimits(max_cpus=1.5))
    d = evaluate(policy, parse_request({"code": "x", "limits": {"cpus": 2}}), assembler=small)
    assert not d.allowed
    [violation] = d.violations
    assert (violation.rule, violation.mode) == ("limits.cpus", "enforce")
    assert violation.expected == {"max": 2, "min": 0.01, "backend_max": 1.5}
    assert evaluate(policy, parse_request({"code": "x", "limits": {"cpus": 1.5}}), assembler=small).allowed
    unknown = DockerAssembler(capacity=BackendLimits)  # no engine: judged on the policy alone
    assert evaluate(policy, parse_request({"code": "x", "limits": {"cpus": 2}}), assembler=unknown).allowed


def test_an_engine_that_does_not_answer_is_asked_again_only_after_the_retry_interval() -> None:
    from gateway.decision.settings import BackendLimits
    from gateway.runner.docker.options import DockerAssembler

    answers: list[BackendLimits] = [BackendLimits(), BackendLimits(), BackendLimits(max_cpus=2.0)]
    asked: list[float] = []
    now = [100.0]

    def capacity() -> BackendLimits:
        asked.append(now[0])
        return answers[len(asked) - 1]

    assembler = DockerAssembler(capacity=capacity, clock=lambda: now[0])
    assert assembler.limits.max_cpus is None  # engine down: judged on the policy alone
    now[0] += DockerAssembler.RETRY_S - 0.1
    assert assembler.limits.max_cpus is None
    assert asked == [100.0]  # every dry run in between was decided without a failed connection
    now[0] += 0.1
    assert assembler.limits.max_cpus is None
    now[0] += DockerAssembler.RETRY_S
    assert assembler.limits.max_cpus == 2.0  # the engine is back: its answer is kept
    now[0] += 1000
    assert assembler.limits.max_cpus == 2.0
    assert len(asked) == 3


def test_a_crashing_rule_is_an_error_and_a_deny_under_its_own_id(default_policy: Policy) -> None:
    # A policy object the loader could never produce (no env section) behind a valid compiled policy: each
    # env rule crashes, and each error carries the id of the rule that crashed (one a golden case can name).
    compiled = compile_policy(default_policy)
    broken = dataclasses.replace(compiled, policy=dataclasses.replace(default_policy, env=None))
    d = judge(broken, parse_request({"code": "x", "env": {"APP_X": "1"}}))  # type: ignore[arg-type]
    assert not d.allowed
    errors = d.violations
    assert [e.rule for e in errors] == ["env.allowed", "env.dangerous", "env.limits"]
    assert all(e.status == "error" and "rule crashed" in e.message for e in errors)
    assert {e.rule for e in errors} <= RULE_IDS
    assert d.options is None


def test_resolve_crash_is_a_deny(default_policy: Policy) -> None:
    broken = dataclasses.replace(default_policy, limits=None)  # type: ignore[arg-type]
    d = judge(broken, parse_request({"code": "x"}))
    assert not d.allowed
    assert d.violations[0].status == "error"


def test_guard_refusal_is_a_deny(default_policy: Policy) -> None:
    rooted = dataclasses.replace(default_policy, user=dataclasses.replace(default_policy.user, uid=0))
    d = judge(rooted, parse_request({"code": "x"}))
    assert not d.allowed
    assert {v.rule for v in d.violations} >= {"user.non_root"}


def test_decision_to_dict_contract(default_policy: Policy) -> None:
    d = judge(parse_request_policy := default_policy, parse_request({"code": "x"}), request_id="req-1")
    out = json.loads(json.dumps(d.to_dict()))
    assert set(out) == {
        "decision_id",
        "request_id",
        "allowed",
        "policy",
        "results",
        "violations",
        "warnings",
        "options",
        "plan",
        "exceptions",
        "shadow",
    }
    assert out["exceptions"] == []
    assert out["shadow"] is None
    assert out["request_id"] == "req-1"
    assert out["policy"] == {
        "name": "default",
        "sha256": parse_request_policy.sha256,
        "source": parse_request_policy.source,
    }
    assert set(out["results"][0]) == {"rule", "status", "mode", "path", "got", "expected", "message"}
    assert set(out["plan"]) == {
        "image", "runtime", "network", "timeout_s", "output_bytes", "output_files_bytes", "output_files",
        "pull", "language", "code_bytes", "files_bytes", "mounts",
    }  # fmt: skip
    assert out["plan"]["pull"] == "never"
    labels = out["options"]["labels"]
    assert labels["io.agent-gateway.decision"] == d.decision_id
    assert labels["io.agent-gateway.request"] == "req-1"
    assert labels["io.agent-gateway.policy"] == f"default@sha256:{default_policy.sha256}"


def test_options_cannot_be_changed_through_the_decision(default_policy: Policy) -> None:
    d = decide(default_policy)
    opts = d.options
    assert opts is not None
    opts["privileged"] = True
    assert "privileged" not in (d.options or {})
    assert d.options_sha256 is not None
    assert len(d.options_sha256) == 64


def test_the_record_is_a_copy_unless_shared(default_policy: Policy) -> None:
    # to_dict() hands out a copy: changing it changes neither the decision nor the compiled policy behind its
    # results' expected values. shared=True (what the Gateway hands its audit sink, which copies) is the same
    # record holding the decision's own values.
    decision = decide(default_policy)
    before = json.dumps(decision.to_dict(), sort_keys=True)
    record = decision.to_dict()
    images = next(r for r in record["results"] if r["rule"] == "images.allowlist")
    images["expected"][0]["tags"].append("latest")
    record["options"]["security_opt"].append("seccomp=unconfined")
    assert json.dumps(decision.to_dict(), sort_keys=True) == before
    assert decision.to_dict(shared=True) == decision.to_dict()
    shared = decision.to_dict(shared=True)
    assert shared["options"] is decision.recorded_options

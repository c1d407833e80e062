"""Egress where the sandbox can give it, fail closed where it cannot.

The Docker runner gives a run (and a kernel) with network egress its own proxy (the run-time guard passes its
options); a ready kernel with egress, the Kubernetes backend, and any run whose options and egress plan disagree are
refused before any sandbox is made.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gateway.decision import evaluate
from gateway.egress import EgressPlan
from gateway.errors import UnsafeOptionsError
from gateway.policy import Policy, load_policy
from gateway.request import parse_request
from gateway.resources import policies_dir
from gateway.runner.docker.options import EGRESS_LABEL, DockerAssembler, guard, profile_part
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import RunSpec
from gateway.runner.kubernetes.pod import KubernetesAssembler
from gateway.runner.supervisor import EGRESS_TARGET
from gateway.testing import decide


class NoEngine:
    """A client no test may reach: every refusal here happens before the engine is asked anything."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the engine was asked for {name!r}")


@pytest.fixture(scope="module")
def mirror() -> Policy:
    return load_policy(policies_dir() / "examples" / "egress-mirror.yaml")


@pytest.fixture(scope="module")
def egress_run(mirror: Policy) -> RunSpec:
    decision = decide(mirror, parse_request({"code": "x", "network": "egress"}))
    assert decision.allowed
    assert decision.run is not None
    return decision.run


def test_docker_options_have_no_network_and_the_run_time_guard_passes_them(egress_run: RunSpec) -> None:
    options = egress_run.options
    assert (options["network_mode"], options["network_disabled"], options["labels"][EGRESS_LABEL]) == (
        "none",
        True,
        "proxy",
    )
    DockerAssembler().guard(options)
    guard(options)  # what the runner calls before it creates a container: egress is the run's proxy now


def test_the_run_carries_the_egress_plan_of_the_decision(egress_run: RunSpec) -> None:
    plan = egress_run.egress
    assert isinstance(plan, EgressPlan)
    assert [(d.host, d.ports, [str(c) for c in d.cidrs]) for d in plan.destinations] == [
        ("mirror.internal", (18089, 18443), ["127.0.0.0/8"])
    ]
    assert (plan.limits.connections, plan.limits.bytes_out, plan.limits.bytes_in, plan.limits.rate) == (
        64,
        64 << 20,
        512 << 20,
        16,
    )


def test_a_run_without_egress_has_no_plan_and_passes_the_guard(mirror: Policy) -> None:
    decision = decide(mirror, parse_request({"code": "x"}))
    assert decision.run is not None
    assert decision.run.egress is None
    assert EGRESS_LABEL not in decision.run.options["labels"]
    guard(decision.run.options)


def test_the_guard_refuses_an_assembled_mount_where_the_runner_binds_the_proxy(egress_run: RunSpec) -> None:
    for target in (EGRESS_TARGET, EGRESS_TARGET + "/proxy.sock"):
        mount = {
            "Type": "bind",
            "Source": "/run/agent-gateway/staging/d1/0",
            "Target": target,
            "ReadOnly": True,
            "BindOptions": {"NonRecursive": True, "Propagation": "rprivate"},
        }
        options = {**egress_run.options, "labels": {**egress_run.options["labels"], "io.agent-gateway.decision": "d1"}}
        with pytest.raises(UnsafeOptionsError) as info:
            guard({**options, "mounts": [mount]})
        assert any("inside /run, which a mount may not shadow" in p.message for p in info.value.problems)


def test_the_guard_refuses_the_egress_label_on_a_sandbox_with_a_network(egress_run: RunSpec) -> None:
    options = {**egress_run.options, "network_mode": "bridge", "network_disabled": False}
    with pytest.raises(UnsafeOptionsError) as info:
        guard(options)
    assert any(EGRESS_LABEL in p.message for p in info.value.problems)


def test_options_and_plan_that_disagree_are_refused_before_the_engine(egress_run: RunSpec) -> None:
    runner = DockerRunner(NoEngine())
    with pytest.raises(UnsafeOptionsError, match="the run has no egress plan"):
        runner.prepare(replace(egress_run, egress=None))
    plain = dict(egress_run.options)
    plain["labels"] = {k: v for k, v in plain["labels"].items() if k != EGRESS_LABEL}
    with pytest.raises(UnsafeOptionsError, match="have no egress"):
        runner.prepare(RunSpec(plain, timeout_s=5, output_bytes=10, egress=egress_run.egress))
    # A pooled container is made before any request: it never has a proxy, so egress options are refused.
    with pytest.raises(UnsafeOptionsError, match="the run has no egress plan"):
        runner.prepare_pooled(profile_part(egress_run.options), ttl_s=5)


def test_a_kernel_with_egress_is_never_made_ready_ahead(egress_run: RunSpec) -> None:
    """Its proxy is bound when its container is made for the session: the warm pool has no key for it, and a
    ready kernel is never made for it."""
    runner = DockerRunner(NoEngine())
    assert runner.kernel_key(egress_run, None) is None
    slot = Released()
    with pytest.raises(UnsafeOptionsError, match="cannot hold mounts or egress"):
        runner.prepare_kernel(egress_run, workspace=None, slot=slot, wait_s=1)
    assert slot.released == 1  # the host slot a ready kernel would have held is given back


class Released:
    """A slot that records its release."""

    released = 0

    def release(self) -> None:
        self.released += 1


def test_kubernetes_refuses_egress_when_it_assembles_the_pod(mirror: Policy) -> None:
    decision = evaluate(mirror, parse_request({"code": "x", "network": "egress"}), assembler=KubernetesAssembler())
    assert not decision.allowed
    errors = [(r.rule, r.message) for r in decision.results if r.status == "error"]
    assert len(errors) == 1
    assert errors[0][0] == "assembly.build"
    assert "EgressUnavailableError" in errors[0][1]
    assert "cannot provide it yet" in errors[0][1]

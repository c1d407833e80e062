"""Fail closed: a run the decision allowed network egress is refused before any sandbox is made, on every backend."""

from __future__ import annotations

import pytest

from gateway.decision import evaluate
from gateway.errors import EXIT_GATEWAY_FAILURE, EgressUnavailableError, RunnerError, exit_code_for, http_status_for
from gateway.policy import Policy, load_policy
from gateway.request import parse_request
from gateway.resources import policies_dir
from gateway.runner.docker.options import EGRESS_LABEL, DockerAssembler, guard
from gateway.runner.kubernetes.pod import KubernetesAssembler
from gateway.testing import decide


@pytest.fixture(scope="module")
def mirror() -> Policy:
    return load_policy(policies_dir() / "examples" / "egress-mirror.yaml")


def test_docker_options_have_no_network_and_the_run_time_guard_refuses_them(mirror: Policy) -> None:
    decision = decide(mirror, parse_request({"code": "x", "network": "egress"}))
    assert decision.allowed  # the decision judges the policy; the sandbox is what cannot give it yet
    options = decision.options
    assert options is not None
    assert (options["network_mode"], options["network_disabled"], options["labels"][EGRESS_LABEL]) == (
        "none",
        True,
        "proxy",
    )
    DockerAssembler().guard(options)  # the decision's own check passes
    with pytest.raises(EgressUnavailableError) as info:
        guard(options)  # what the runner calls before it creates or claims a container
    assert isinstance(info.value, RunnerError)
    assert info.value.code == "runner.egress_unavailable"
    assert "cannot provide it yet" in info.value.message
    assert "nothing ran" in info.value.message
    # Not implemented in this version (like a backend without sessions), not a failing sandbox (502).
    assert (http_status_for(info.value), exit_code_for(info.value)) == (501, EXIT_GATEWAY_FAILURE)


def test_a_run_without_egress_still_passes_the_run_time_guard(mirror: Policy) -> None:
    options = decide(mirror, parse_request({"code": "x"})).options
    assert options is not None
    assert EGRESS_LABEL not in options["labels"]
    guard(options)


def test_kubernetes_refuses_egress_when_it_assembles_the_pod(mirror: Policy) -> None:
    decision = evaluate(mirror, parse_request({"code": "x", "network": "egress"}), assembler=KubernetesAssembler())
    assert not decision.allowed
    errors = [(r.rule, r.message) for r in decision.results if r.status == "error"]
    assert len(errors) == 1
    assert errors[0][0] == "assembly.build"
    assert "EgressUnavailableError" in errors[0][1]
    assert "cannot provide it yet" in errors[0][1]

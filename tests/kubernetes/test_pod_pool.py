"""The Kubernetes runner's warm-pool interface (``PoolingRunner``: ``prepare_idle`` / ``claim`` / ``discard`` /
``pool_key``, and ``run(..., on_gone=)``) against the fake API server: a pooled Pod holds nothing of a request,
validates and is restricted like any other, serves exactly one request of its own profile, and is deleted."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import kubernetes_validate
import pytest

from gateway.decision import evaluate
from gateway.decision.settings import SandboxProfile
from gateway.errors import GatewayError, SandboxError, UnsafeOptionsError
from gateway.policy import Policy
from gateway.request import parse_request
from gateway.runner.interface import Payload, RunSpec
from gateway.runner.kubernetes.pod import DECISION_LABEL, POD_COMMAND, POOL_LABEL, REQUEST_LABEL, guard, profile_part
from gateway.runner.kubernetes.runner import KubernetesRunner, KubernetesSandbox
from tests.kubernetes.fakeapi import FakeApiServer
from tests.kubernetes.test_pod_manifests import VERSION, restricted_violations

PAYLOAD = Payload(code="print(2+2)", language="python", files={})


def _decide(runner: KubernetesRunner, policy: Policy, **request: Any) -> tuple[SandboxProfile, RunSpec]:
    decision = evaluate(policy, parse_request({"code": "print(2+2)", **request}), assembler=runner.assembler)
    assert decision.allowed
    assert decision.run is not None
    assert decision.settings is not None
    return decision.settings.profile, decision.run


def test_a_pooled_pod_holds_nothing_of_a_request(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    profile, _ = _decide(kube_runner, default_policy)
    idle = kube_runner.prepare_idle(profile, ttl_s=600)
    assert idle.created_with is not None
    pod = idle.created_with["pod"]
    labels = pod["metadata"]["labels"]
    assert labels[POOL_LABEL] == kube_runner.pool_key(profile)[:32]
    assert DECISION_LABEL not in labels
    assert REQUEST_LABEL not in labels
    assert pod["spec"]["activeDeadlineSeconds"] == 600
    assert idle.created_with["environment"] == {}
    kubernetes_validate.validate(pod, VERSION, strict=True)
    assert restricted_violations(pod["spec"]) == []
    guard(idle.created_with)
    assert fake_api.cluster.submitted == [pod]
    assert fake_api.cluster.payloads == []  # waiting for its one payload
    kube_runner.discard(idle)
    assert fake_api.cluster.live() == []


def test_a_pooled_pod_of_another_language_keeps_the_supervisors_command(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    # The profile names the language its sandbox is made for; a Pod keeps the fixed command (the supervisor
    # pre-forks Python; a shell or JavaScript program gets its interpreter fresh).
    profile, _ = _decide(kube_runner, default_policy)
    idle = kube_runner.prepare_idle(dataclasses.replace(profile, interpreter="javascript"), ttl_s=600)
    assert idle.created_with is not None
    assert idle.created_with["pod"]["spec"]["containers"][0]["command"] == list(POD_COMMAND)
    guard(idle.created_with)
    kube_runner.discard(idle)
    assert fake_api.cluster.live() == []


def test_a_claimed_pod_serves_one_request_and_is_deleted(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    profile, _ = _decide(kube_runner, default_policy)
    idle = kube_runner.prepare_idle(profile, ttl_s=600)
    _, spec = _decide(kube_runner, default_policy, env={"APP_X": "1"})
    assert profile_part(spec.options["pod"]) == profile_part(idle.spec.options["pod"])
    claimed = kube_runner.claim(idle, spec)
    assert isinstance(claimed, KubernetesSandbox)
    gone: list[GatewayError | None] = []
    outcome = kube_runner.run(claimed, PAYLOAD, on_gone=gone.append)
    assert outcome.exit_code == 0
    assert outcome.stdout == b"4\n"
    assert gone == [None]
    assert outcome.sandbox["pod"].startswith("gateway-pool-")
    assert outcome.sandbox["pod_sha256"] == idle.digest  # the Pod that ran, by its own digest
    assert fake_api.cluster.payloads[0]["env"] == {"APP_X": "1"}  # the request's, in the payload only
    assert fake_api.cluster.live() == []
    with pytest.raises(SandboxError, match="used once"):
        kube_runner.claim(idle, spec)


def test_another_profile_is_refused_at_claim(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    profile, _ = _decide(kube_runner, default_policy)
    idle = kube_runner.prepare_idle(profile, ttl_s=600)
    _, bigger = _decide(kube_runner, default_policy, limits={"memory": "512m"})
    with pytest.raises(UnsafeOptionsError, match="another profile"):
        kube_runner.claim(idle, bigger)
    kube_runner.discard(idle)
    assert fake_api.cluster.live() == []


def test_a_pod_that_died_while_idle_is_not_claimed(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    profile, spec = _decide(kube_runner, default_policy)
    idle = kube_runner.prepare_idle(profile, ttl_s=600)
    kube_runner.client.delete_pod("gateway-sandboxes", idle.name)  # a reaper, a node drain
    until = time.monotonic() + 5
    while idle.attach is not None and idle.attach.idle() and time.monotonic() < until:
        time.sleep(0.05)
    assert kube_runner.claim(idle, spec) is None
    kube_runner.discard(idle)


def test_on_gone_reports_a_pod_left_instead_of_raising(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    _, spec = _decide(kube_runner, default_policy)
    fake_api.cluster.fail("DELETE", "pod", 500, times=99)
    gone: list[GatewayError | None] = []
    outcome = kube_runner.execute(spec, PAYLOAD, on_gone=gone.append)
    assert outcome.exit_code == 0
    assert len(gone) == 1
    assert isinstance(gone[0], GatewayError)
    fake_api.cluster.failures.clear()
    fake_api.cluster.images = set()
    gone.clear()
    _, spec = _decide(kube_runner, default_policy)
    with pytest.raises(GatewayError):
        kube_runner.execute(spec, PAYLOAD, on_gone=gone.append)
    assert gone == [None]


def test_a_pooled_pod_naming_a_request_is_refused(kube_runner: KubernetesRunner, default_policy: Policy) -> None:
    from gateway.runner.kubernetes.pod import pod_digest, pooled_pod

    profile, _ = _decide(kube_runner, default_policy)
    pod = pooled_pod(profile, ttl_s=60, instance="x")
    pod["metadata"]["labels"][DECISION_LABEL] = "d"
    options = {"image": profile.image, "namespace": "gateway-sandboxes", "environment": {}, "pod": pod,
               "pod_sha256": pod_digest(pod)}  # fmt: skip
    with pytest.raises(UnsafeOptionsError) as info:
        guard(options)
    assert [p.message for p in info.value.problems] == ["a pooled Pod is made before any request: it names none"]

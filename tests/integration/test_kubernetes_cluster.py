"""Layer 5: the containment suite against a real cluster, when ``GATEWAY_TEST_KUBECONFIG`` names a kubeconfig.

This is the suite's one allowed skip: no API server can run on the CI machines, so without the variable these
tests skip with that reason, in CI too. (The integration conftest turns a *missing prerequisite* into a failure
when ``CI`` is set; a cluster is opt-in, so this module skips with ``pytest.skip`` itself and never calls it.)

Set-up (README, "Kubernetes backend"): a kind or k3s cluster with ``gateway kubernetes manifests`` applied and
the sandbox image loaded into its nodes (no registry, never a pull). Optional: ``GATEWAY_TEST_NAMESPACE`` (default
``gateway-sandboxes``), ``GATEWAY_TEST_GVISOR=1`` (the nodes have runsc and the RuntimeClass), and
``GATEWAY_TEST_PIDS_LIMIT=N`` (the kubelet's ``podPidsLimit``, to check it from inside).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.decision import evaluate
from gateway.policy import load_policy
from gateway.request import parse_request
from gateway.resources import policies_dir
from gateway.runner.interface import Payload, RunSpec
from gateway.runner.kubernetes.client import KubeClient, KubeConfig
from gateway.runner.kubernetes.pod import MANAGED_LABEL
from gateway.runner.kubernetes.runner import KubernetesRunner
from tests.kubernetes.probe import PROBE

KUBECONFIG = os.environ.get("GATEWAY_TEST_KUBECONFIG")

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not KUBECONFIG, reason="GATEWAY_TEST_KUBECONFIG is not set: no cluster to run against"),
]

POLICIES = ["default.yaml", *(["strict.yaml"] if os.environ.get("GATEWAY_TEST_GVISOR") == "1" else [])]


@pytest.fixture(scope="module")
def cluster() -> Iterator[KubernetesRunner]:
    config = KubeConfig(namespace=os.environ.get("GATEWAY_TEST_NAMESPACE", "gateway-sandboxes"), kubeconfig=KUBECONFIG)
    runner = KubernetesRunner(KubeClient(config), instance=os.environ["GATEWAY_INSTANCE"], start_timeout_s=180)
    try:
        yield runner
    finally:
        runner.reap()  # this session's Pods, whatever a failed test left
        left = runner.client.list_pods(runner.namespace, f"{MANAGED_LABEL}=true")["items"]
        mine = [p for p in left if p["metadata"]["labels"].get("agent-gateway.io/instance") == runner.instance]
        runner.close()
        assert not mine, [p["metadata"]["name"] for p in mine]


def _spec(runner: KubernetesRunner, policy_name: str, **request: Any) -> RunSpec:
    policy = load_policy(policies_dir() / policy_name)
    decision = evaluate(policy, parse_request({"code": "pass", **request}), assembler=runner.assembler)
    assert decision.allowed, [v.message for v in decision.violations]
    assert decision.run is not None
    return decision.run


@pytest.mark.parametrize("policy_name", POLICIES)
def test_the_pod_holds_from_inside(cluster: KubernetesRunner, policy_name: str) -> None:
    spec = _spec(cluster, policy_name, env={"APP_PROBE_DNS": "1"} if policy_name == "default.yaml" else {})
    pod = spec.options["pod"]
    outcome = cluster.execute(spec, Payload(code=PROBE, language="python", files={}))
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.sandbox["pod_sha256"] == spec.options["pod_sha256"]
    assert outcome.sandbox["pod_uid"]
    probe = json.loads(outcome.stdout)
    ctx = pod["spec"]["containers"][0]["securityContext"]
    assert (probe["uid"], probe["gid"]) == (ctx["runAsUser"], ctx["runAsGroup"])
    assert probe["cap_eff"] == probe["cap_bnd"] == "0000000000000000"
    assert probe["no_new_privs"] == "1"
    assert probe["seccomp"] == "2"
    assert probe["root_writable"] == 30
    assert probe["tmp_mount"][0] == "tmpfs"  # medium: Memory
    assert probe["tmp_size"] <= int(pod["spec"]["volumes"][0]["emptyDir"]["sizeLimit"])
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert int(probe["memory"]) == int(limits["memory"])
    assert probe["hostname"] == "sandbox"
    assert probe["sa_token"] is False
    assert probe["env_keys"] == []
    if policy_name == "default.yaml":
        assert probe["dns"] != "connected", "the deny-all NetworkPolicy let the sandbox reach its name server"
    if os.environ.get("GATEWAY_TEST_PIDS_LIMIT"):
        assert probe["pids"] == os.environ["GATEWAY_TEST_PIDS_LIMIT"]


def test_oom_deadline_and_output_cap(cluster: KubernetesRunner) -> None:
    spec = _spec(cluster, "default.yaml", limits={"memory": "64m"})
    outcome = cluster.execute(spec, Payload(code="x = bytearray(200 << 20)", language="python", files={}))
    assert outcome.oom_killed
    spec = _spec(cluster, "default.yaml", limits={"timeout_s": 2})
    outcome = cluster.execute(spec, Payload(code="while True: pass", language="python", files={}))
    assert outcome.timed_out
    spec = _spec(cluster, "default.yaml", limits={"output_bytes": 65536})
    code = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
    outcome = cluster.execute(spec, Payload(code=code, language="python", files={}))
    assert outcome.output_limit_killed
    assert len(outcome.stdout) == 65536

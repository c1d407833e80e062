"""Fixtures of the Kubernetes backend's tests: the shipped policies, Pods built from them, the fake API server."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gateway.decision import evaluate
from gateway.decision.settings import resolve
from gateway.policy import Policy, load_policy
from gateway.request import parse_request
from gateway.resources import policies_dir
from gateway.runner.interface import RunSpec
from gateway.runner.kubernetes.client import KubeClient, KubeConfig
from gateway.runner.kubernetes.pod import KubernetesAssembler, build_options
from gateway.runner.kubernetes.runner import KubernetesRunner
from tests.kubernetes.fakeapi import FakeApiServer, FakeCluster

REPO = Path(__file__).resolve().parents[2]


def shipped_policy_files() -> list[Path]:
    """Every policy the project ships: policies/ (with examples/) and the docs' example policies."""
    files = sorted(policies_dir().rglob("*.yaml")) + sorted((REPO / "docs" / "examples").rglob("*.yaml"))
    return [f for f in files if not f.name.endswith(".test.yaml") and "kind: Policy" in f.read_text()]


def pods_of(policy: Policy) -> list[tuple[str, dict[str, Any]]]:
    """(runtime, options) for every runtime the policy allows, from a plain request."""
    runtimes = [policy.runtime.required] if policy.runtime.required else list(policy.runtime.allowed)
    out = []
    for runtime in runtimes:
        request: dict[str, Any] = {"code": "pass", "runtime": runtime}
        if "none" in policy.network.allowed:
            request["network"] = "none"
        settings = resolve(policy, parse_request(request))
        out.append((runtime, build_options(settings, decision_id="d" * 32, request_id="r" * 32, instance="it")))
    return out


def all_pods() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in shipped_policy_files():
        policy = load_policy(path)
        out.extend((f"{path.relative_to(REPO)}:{rt}", options) for rt, options in pods_of(policy))
    return out


def kernel_spec(
    assembler: KubernetesAssembler, policy: Policy, *, lifetime_s: float = 300, output_bytes: int = 1 << 16,
    **request: Any,
) -> RunSpec:  # fmt: skip
    """A kernel's run specification as a session would have it: the profile decided like an execution's, its Pod
    assembled with the kernel's lifetime as the timeout (so ``activeDeadlineSeconds`` covers the lifetime)."""
    decision = evaluate(policy, parse_request({"code": "pass", **request}), assembler=assembler)
    assert decision.allowed, [v.message for v in decision.violations]
    assert decision.settings is not None
    assert decision.run is not None
    settings = replace(decision.settings, timeout_s=lifetime_s)
    options = assembler.build(settings, decision_id=decision.decision_id, request_id=decision.request_id)
    assembler.guard(options)
    return replace(decision.run, options=options, timeout_s=lifetime_s, output_bytes=output_bytes)


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    server = FakeApiServer(FakeCluster()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def kube_runner(fake_api: FakeApiServer) -> Iterator[KubernetesRunner]:
    naps: list[float] = []
    client = KubeClient(KubeConfig(host=fake_api.url), sleep=naps.append)
    runner = KubernetesRunner(client, instance="pytest-kube", start_timeout_s=5.0)
    runner.naps = naps  # type: ignore[attr-defined]
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture
def default_policy() -> Policy:
    return load_policy(policies_dir() / "default.yaml")

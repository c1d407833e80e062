"""Choosing the backend: `--backend` / `$GATEWAY_BACKEND` for the CLI, `backend:` + `kubernetes:` for `gateway
serve`; neither contacts a cluster until a run needs it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gateway.cli.backend import make_runner
from gateway.cli.serve_cmd import _kubernetes_runner
from gateway.errors import RequestError, ServerConfigError
from gateway.runner.kubernetes.runner import KubernetesRunner
from gateway.service.config import load_server_config_text
from tests.kubernetes.fakeapi import FakeApiServer

HEAD = "apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\n"


def _args(**kw: object) -> argparse.Namespace:
    base = {"backend": None, "namespace": None, "kubeconfig": None, "context": None, "in_cluster": False}
    return argparse.Namespace(**{**base, **kw})


def test_docker_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATEWAY_BACKEND", raising=False)
    assert make_runner(_args()) is None


def test_the_flag_and_the_environment_choose_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    runner = make_runner(_args(backend="kubernetes", namespace="sandboxes-b", kubeconfig="/nonexistent"))
    assert isinstance(runner, KubernetesRunner)
    assert runner.namespace == "sandboxes-b"
    assert runner.assembler.namespace == "sandboxes-b"
    assert runner.client.config.kubeconfig == "/nonexistent"  # not read yet: nothing is contacted
    monkeypatch.setenv("GATEWAY_BACKEND", "kubernetes")
    assert isinstance(make_runner(_args()), KubernetesRunner)
    monkeypatch.setenv("GATEWAY_BACKEND", "lxc")
    with pytest.raises(RequestError, match="GATEWAY_BACKEND"):
        make_runner(_args())


def test_the_service_configuration(tmp_path: Path) -> None:
    text = f"{HEAD}backend: kubernetes\nkubernetes: {{namespace: team-a, kubeconfig: kube.yaml, context: prod}}\n"
    config = load_server_config_text(text, source="server.yaml", base=tmp_path)
    assert config.backend == "kubernetes"
    assert config.kubernetes.namespace == "team-a"
    assert config.kubernetes.kubeconfig == tmp_path / "kube.yaml"
    runner = _kubernetes_runner(config)()
    assert isinstance(runner, KubernetesRunner)
    assert runner.namespace == "team-a"
    assert runner.client.config.context == "prod"
    assert load_server_config_text(f"{HEAD}port: 1\n").backend == "docker"
    with pytest.raises(ServerConfigError) as info:
        load_server_config_text(f"{HEAD}backend: lxc\nkubernetes: {{namespace: Bad_NS}}\n", source="s.yaml")
    assert sorted(p.path for p in info.value.problems) == ["$.backend", "$.kubernetes.namespace"]


def test_readiness_asks_the_api_server(fake_api: FakeApiServer, kube_runner: KubernetesRunner) -> None:
    assert kube_runner.image_id("gateway/sandbox-python:3.11-bookworm") == "gateway/sandbox-python:3.11-bookworm"
    assert ("GET", "pods") in [(m, w) for m, w, _ in fake_api.cluster.calls]

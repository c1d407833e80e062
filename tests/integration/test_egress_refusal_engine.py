"""Fail closed on a live engine where egress is not given: a kernel session the policy allows network egress is
refused before any container is made. (Runs and workspace sessions get their proxy: test_egress_runs.py; the
Kubernetes backend refuses egress when it assembles the Pod: tests/unit/runner/test_egress_refusal.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit import verify_trail
from gateway.errors import EgressUnavailableError
from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from tests.integration.conftest import gateway_containers
from tests.integration.session_checks import Gateways

pytestmark = pytest.mark.integration

MIRROR = policies_dir() / "examples" / "egress-mirror.yaml"


@pytest.fixture
def gateway(tmp_path: Path, engine: Any) -> Iterator[Gateway]:
    policy = tmp_path / "mirror-sessions.yaml"
    policy.write_text(
        "apiVersion: gateway.agent-exec/v1\nkind: Policy\n"
        f"extends: {MIRROR}\n"
        "metadata:\n  name: mirror-sessions\n"
        "spec:\n  sessions:\n    modes: [workspace, kernel]\n    max_per_principal: 2\n"
        "    idle_s: {default: 600, max: 1800}\n    lifetime_s: {default: 600, max: 3600}\n"
        "    workspace_size: {default: 64m, max: 256m}\n"
    )
    gateways = Gateways(tmp_path)
    gw = gateways.make(policy, DockerRunner(engine))
    gw.__enter__()
    yield gw
    gateways.close()


def test_a_kernel_session_with_egress_is_refused_and_nothing_ran(gateway: Gateway, engine: Any, tmp_path: Path) -> None:
    result = gateway.sessions.create({"mode": "kernel", "principal": "alice", "network": "egress"})
    assert result.session is None
    assert isinstance(result.error, EgressUnavailableError)
    assert result.error.code == "runner.egress_unavailable"
    assert "kernel session" in result.error.message
    assert "nothing ran" in result.error.message
    assert gateway_containers(engine) == []
    # The same policy's kernel session without egress opens as before.
    plain = gateway.sessions.create({"mode": "kernel", "principal": "alice"})
    assert plain.session is not None, plain.to_dict()
    gateway.sessions.close(plain.session.session_id, principal="alice")
    gateway.close()
    assert verify_trail(tmp_path / "audit").ok

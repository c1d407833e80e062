"""A kernel with egress on a live engine is never a ready one: its proxy is bound when its container is made, so a
gateway keeping ready kernels opens a kernel session with egress on request and leaves the ready kernel alone.
(Runs, workspace and kernel sessions through their proxies: test_egress_runs.py; the Kubernetes backend refuses
egress when it assembles the Pod: tests/unit/runner/test_egress_refusal.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway, PoolConfig
from gateway.audit import verify_trail
from gateway.resources import policies_dir
from gateway.runner.docker.options import POOL_LABEL
from gateway.runner.docker.runner import DockerRunner
from tests.integration.conftest import gateway_containers
from tests.integration.session_checks import Gateways, eventually, exists, pooled_ids

pytestmark = pytest.mark.integration

MIRROR = policies_dir() / "examples" / "egress-mirror.yaml"


@pytest.fixture
def egress_root(short_dir: Path) -> Path:
    return short_dir / "egress"


@pytest.fixture
def gateway(tmp_path: Path, engine: Any, workspace_root: str, egress_root: Path) -> Iterator[Gateway]:
    policy = tmp_path / "mirror-sessions.yaml"
    policy.write_text(
        "apiVersion: gateway.agent-exec/v1\nkind: Policy\n"
        f"extends: {MIRROR}\n"
        "metadata:\n  name: mirror-sessions\n"
        "spec:\n  sessions:\n    modes: [workspace, kernel]\n    max_per_principal: 2\n"
        "    idle_s: {default: 600, max: 1800}\n    lifetime_s: {default: 600, max: 3600}\n"
        "    workspace_size: {default: 64m, max: 256m}\n    pool: {size: 1}\n"
    )
    gateways = Gateways(tmp_path)
    runner = DockerRunner(engine, workspace_root=workspace_root, egress_root=str(egress_root))
    gw = gateways.make(policy, runner, pool=PoolConfig())
    gw.__enter__()
    yield gw
    gateways.close()
    runner.close()


def test_a_kernel_session_with_egress_opens_its_own_kernel_never_a_ready_one(
    gateway: Gateway, engine: Any, tmp_path: Path, egress_root: Path
) -> None:
    pool = gateway.pool
    assert pool is not None
    assert pool.wait_ready(timeout_s=60), pool.stats()
    runner = gateway.runner
    assert isinstance(runner, DockerRunner)
    (ready,) = pooled_ids(engine, runner.instance)
    result = gateway.sessions.create({"mode": "kernel", "principal": "alice", "network": "egress"})
    assert result.session is not None, result.to_dict()
    container = result.session.container_id
    assert container is not None
    assert container != ready
    assert POOL_LABEL not in engine.api.inspect_container(container)["Config"]["Labels"]
    stats = pool.stats()
    assert (stats.kernel_hits, stats.kernel_misses, stats.kernels) == (0, 0, 1)  # the ready one is left alone
    assert len(list(egress_root.iterdir())) == 1  # its proxy, for its whole life
    sid = result.session.session_id
    cell = gateway.sessions.execute(sid, {"code": "import os\nprint(os.environ['HTTPS_PROXY'])", "principal": "alice"})
    assert cell.outcome is not None, cell.to_dict()
    assert cell.outcome.stdout == b"http://127.0.0.1:3128\n"
    gateway.sessions.close(sid, principal="alice")
    assert eventually(lambda: not exists(engine, container))
    assert list(egress_root.iterdir()) == []
    gateway.close()
    assert gateway_containers(engine) == []
    assert verify_trail(tmp_path / "audit").ok

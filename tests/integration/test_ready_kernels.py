"""Ready kernels (``spec.sessions.pool``) against the real engine: a kernel session is served by a kernel opened
ahead (the pool's stats say so), keeps its state, is replaced; a policy change, another profile, a waiting run
and the gateway's close each do what the warm pool does for runs, leaving no container, workspace or loop device.
Serving, state and replacement under runc and gVisor (runsc); the rest under runc."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway, PoolConfig
from gateway.audit.memory import MemoryAuditSink
from gateway.policy import PolicySet, load_policy, load_policy_text
from gateway.resources import policies_dir
from gateway.runner.docker.options import POOL_LABEL
from gateway.runner.docker.runner import DockerRunner
from gateway.slots import HostSlots
from tests.integration.conftest import loops_backing
from tests.integration.session_checks import eventually, exists, pooled_ids, sessions_policy_text

pytestmark = pytest.mark.integration

WAIT = 60.0


def _policy_text(runtime: str, *, lifetime: int = 3600) -> str:
    """Kernel sessions with one ready kernel, four per principal."""
    return sessions_policy_text(
        "ready-kernels", runtime, per_principal=4, lifetime=lifetime, workspace_size="{default: 8m, max: 64m}",
        pool="{size: 1}",
    )  # fmt: skip


def _workspaces(root: str) -> list[str]:
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


@pytest.fixture
def make_gateway(engine: Any, workspace_root: str, tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    """Gateways keeping ready kernels only (the warm pool's runs off: ``PoolConfig()``), each with its one ready
    kernel there; closed at the end."""
    made: list[Gateway] = []

    def make(runtime: str = "runc", slots: int = 8) -> Gateway:
        runner = DockerRunner(engine, workspace_root=workspace_root)
        gw = Gateway(
            load_policy_text(_policy_text(runtime)), runner=runner, audit=MemoryAuditSink(), pool=PoolConfig(),
            slots=HostSlots(tmp_path / "slots", slots),
        )  # fmt: skip
        made.append(gw)
        assert gw.pool is not None
        assert gw.pool.wait_ready(timeout_s=WAIT), gw.pool.stats()
        assert gw.pool.stats().kernels == 1
        return gw

    yield make
    for gw in made:
        gw.close()


def _ready(engine: Any, gw: Gateway) -> list[str]:
    """The containers ``gw`` made ahead (its ready kernels), claimed or not."""
    runner = gw.runner
    assert isinstance(runner, DockerRunner)
    return pooled_ids(engine, runner.instance)


def _create(gw: Gateway, **body: Any) -> tuple[str, str]:
    result = gw.sessions.create({"mode": "kernel", "principal": "alice", **body})
    assert result.allowed, result.to_dict()
    assert result.error is None, result.to_dict()
    assert result.session is not None
    assert result.session.container_id is not None
    return result.session.session_id, result.session.container_id


def _cell(gw: Gateway, sid: str, code: str) -> Any:
    return gw.sessions.execute(sid, {"code": code, "principal": "alice"})


def test_a_kernel_session_is_served_by_a_ready_kernel_keeps_its_state_and_it_is_replaced(
    make_gateway: Callable[..., Gateway], engine: Any, runtime: str, workspace_root: str
) -> None:
    gw = make_gateway(runtime)
    assert gw.pool is not None
    (ready,) = _ready(engine, gw)
    sid, container = _create(gw)
    stats = gw.pool.stats()
    assert (stats.kernel_hits, stats.kernel_misses) == (1, 0)
    assert container == ready  # the session's kernel is the one opened ahead
    assert engine.api.inspect_container(container)["HostConfig"]["Runtime"] == runtime
    first = _cell(gw, sid, "state = {'n': 41}\nopen('kept.txt', 'w').write('x')\nprint(2+2)")
    second = _cell(gw, sid, "import os\nstate['n'] += 1\nprint(os.path.exists('kept.txt'))\nstate['n']")
    assert (first.exit_status, first.outcome.stdout) == (0, b"4\n")
    assert (second.exit_status, second.outcome.stdout, second.value) == (0, b"True\n", "42")
    assert [f.path for f in gw.sessions.list_files(sid, principal="alice").files] == ["kept.txt"]
    # Replaced at once: a new kernel with a workspace of its own, never the claimed one.
    assert gw.pool.wait_ready(timeout_s=WAIT)
    assert gw.pool.stats().kernels == 1
    fresh = set(_ready(engine, gw)) - {container}
    assert len(fresh) == 1
    assert len(_workspaces(workspace_root)) == 2  # the session's and the replacement's
    gw.sessions.close(sid, principal="alice")
    assert eventually(lambda: not exists(engine, container))
    # The replacement serves the next session, which sees nothing of the first.
    other, again = _create(gw)
    assert again in fresh
    assert gw.pool.stats().kernel_hits == 2
    assert b"NameError" in _cell(gw, other, "state").outcome.stderr


def test_a_session_asking_for_another_lifetime_opens_its_kernel_on_request(
    make_gateway: Callable[..., Gateway], engine: Any
) -> None:
    gw = make_gateway()
    assert gw.pool is not None
    (ready,) = _ready(engine, gw)
    sid, container = _create(gw, lifetime_s=120)
    assert container != ready
    stats = gw.pool.stats()
    assert (stats.kernel_hits, stats.kernel_misses, stats.kernels) == (0, 0, 1)  # the ready one is left alone
    assert _cell(gw, sid, "x = 6 * 7").exit_status == 0
    assert _cell(gw, sid, "x").value == "42"
    labels = engine.api.inspect_container(container)["Config"]["Labels"]
    assert POOL_LABEL not in labels
    # Another profile (limits) opens cold as well.
    _, limited = _create(gw, limits={"memory": "128m"})
    assert limited != ready
    assert gw.pool.stats().kernel_hits == 0


def test_a_policy_change_discards_the_old_ready_kernels_and_their_workspaces(
    make_gateway: Callable[..., Gateway], engine: Any, workspace_root: str
) -> None:
    gw = make_gateway()
    assert gw.pool is not None
    (old,) = _ready(engine, gw)
    (old_workspace,) = _workspaces(workspace_root)
    gw.policies = PolicySet.single(load_policy_text(_policy_text("runc", lifetime=3000)))
    assert eventually(lambda: not exists(engine, old))
    assert gw.pool.wait_ready(timeout_s=WAIT)
    (new,) = _ready(engine, gw)
    assert old_workspace not in _workspaces(workspace_root)
    sid, container = _create(gw)
    assert container == new
    assert gw.pool.stats().kernel_hits == 1
    assert _cell(gw, sid, "1 + 1").value == "2"


def test_a_waiting_run_takes_the_slot_of_an_idle_ready_kernel(
    make_gateway: Callable[..., Gateway], engine: Any
) -> None:
    gw = make_gateway(slots=1)
    (ready,) = _ready(engine, gw)  # it holds the host's only slot
    result = gw.execute({"code": "print(2+2)"})
    assert result.error is None, result.to_dict()["error"]
    assert result.to_dict()["stdout"] == "4\n"
    assert not exists(engine, ready)  # given up (removed), not just forgotten


def test_close_leaves_no_ready_kernel_workspace_or_loop_device(
    make_gateway: Callable[..., Gateway], engine: Any, workspace_root: str
) -> None:
    gw = make_gateway()
    assert gw.pool is not None
    _create(gw)  # a live session too
    assert gw.pool.wait_ready(timeout_s=WAIT)
    assert len(_ready(engine, gw)) == 2
    gw.close()
    assert eventually(lambda: not _ready(engine, gw))
    assert _workspaces(workspace_root) == []
    assert loops_backing(os.path.dirname(workspace_root)) == []


def test_gateway_reap_removes_its_ready_kernels_and_the_pool_refills(
    make_gateway: Callable[..., Gateway], engine: Any, workspace_root: str
) -> None:
    gw = make_gateway()
    assert gw.pool is not None
    (ready,) = _ready(engine, gw)
    gw.reap()
    assert not exists(engine, ready)
    assert gw.pool.wait_ready(timeout_s=WAIT)
    _, container = _create(gw)
    assert container != ready
    assert gw.pool.stats().kernel_hits == 1
    assert load_policy(policies_dir() / "default.yaml").sessions is None  # the default keeps no ready kernels

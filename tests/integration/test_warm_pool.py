"""The warm pool against the real engine, under runc and runsc: what a pooled container holds before it is
claimed, single use, the records, a reload, the reapers, and a gateway that exits."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway, PoolConfig
from gateway.audit.memory import MemoryAuditSink
from gateway.policy import Policy, PolicySet, load_policy, load_policy_text
from gateway.resources import policies_dir
from gateway.runner.docker.options import DECISION_LABEL, INSTANCE_LABEL, POOL_LABEL, REQUEST_LABEL
from gateway.runner.docker.runner import DockerRunner
from gateway.slots import HostSlots
from tests.integration.session_checks import eventually, exists, pooled_ids

pytestmark = pytest.mark.integration

WAIT = 60.0


def _policy(runtime: str) -> Policy:
    return load_policy(policies_dir() / ("strict.yaml" if runtime == "runsc" else "default.yaml"))


@pytest.fixture
def pooled(engine: Any, runtime: str) -> Iterator[tuple[Gateway, MemoryAuditSink]]:
    sink = MemoryAuditSink()
    gw = Gateway(_policy(runtime), runner=DockerRunner(engine), audit=sink, pool=PoolConfig(size=1))
    with gw:
        assert gw.pool is not None
        assert gw.pool.wait_ready(timeout_s=WAIT), gw.pool.stats()
        yield gw, sink


def test_a_pooled_container_holds_nothing_of_a_request_and_serves_exactly_one(
    pooled: tuple[Gateway, MemoryAuditSink], engine: Any, runtime: str
) -> None:
    gw, sink = pooled
    runner = gw.runner
    assert isinstance(runner, DockerRunner)
    (ready,) = pooled_ids(engine, runner.instance)
    info = engine.api.inspect_container(ready)
    labels = info["Config"]["Labels"]
    assert labels[INSTANCE_LABEL] == runner.instance
    assert len(labels[POOL_LABEL]) == 64
    assert REQUEST_LABEL not in labels
    assert DECISION_LABEL not in labels
    assert info["State"]["Running"]
    assert info["HostConfig"]["ReadonlyRootfs"]
    assert info["HostConfig"]["CapDrop"] == ["ALL"]
    assert info["HostConfig"]["Runtime"] == runtime
    env_before = info["Config"]["Env"]
    env = {"APP_SECRET": "s3cret"} if runtime == "runc" else {}
    code = "import os\nprint(2+2)\nprint(os.environ.get('APP_SECRET'))"
    result = gw.execute({"code": code, "env": env})
    data = result.to_dict()
    assert data["pool"] == "hit", data
    assert data["exit_code"] == 0, data
    assert data["stdout"].splitlines()[0] == "4"
    if env:
        assert data["stdout"].splitlines()[1] == "s3cret"
        assert not any("s3cret" in e for e in env_before)
    assert result.outcome is not None
    assert result.outcome.container_id == ready
    (outcome,) = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    assert outcome["data"]["container_id"] == ready
    assert outcome["data"]["pool"] == "hit"
    assert outcome["request_id"] == result.request_id
    assert eventually(lambda: not exists(engine, ready))  # used once, then destroyed
    assert gw.pool is not None
    assert gw.pool.wait_ready(timeout_s=WAIT)
    (replacement,) = pooled_ids(engine, runner.instance)
    assert replacement != ready
    second = gw.execute({"code": "print(2+2)"})
    assert second.outcome is not None
    assert second.outcome.container_id == replacement


def test_the_deadline_counts_from_the_hand_over_and_the_output_cap_holds(
    pooled: tuple[Gateway, MemoryAuditSink], engine: Any
) -> None:
    gw, _ = pooled
    time.sleep(3)  # idle longer than the run's own deadline below
    slow = gw.execute({"code": "import time\ntime.sleep(1.5)\nprint('done')", "limits": {"timeout_s": 2}})
    assert slow.to_dict()["pool"] == "hit"  # the deadline belongs to the run, not to the profile
    assert slow.to_dict()["stdout"] == "done\n", slow.to_dict()  # not killed: idle time does not count
    gw.pool.wait_ready(timeout_s=WAIT)  # type: ignore[union-attr]
    flood = gw.execute({"code": "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"})
    data = flood.to_dict()
    assert data["pool"] == "hit"
    assert data["stdout_truncated"]
    assert data["output_limit_killed"]
    assert data["exit_status"] == 137
    assert flood.outcome is not None
    assert eventually(lambda: not exists(engine, str(flood.outcome.container_id)))  # type: ignore[union-attr]


def test_a_reload_destroys_the_old_policys_containers(
    pooled: tuple[Gateway, MemoryAuditSink], engine: Any, runtime: str
) -> None:
    gw, _ = pooled
    runner = gw.runner
    assert isinstance(runner, DockerRunner)
    old = pooled_ids(engine, runner.instance)
    name = "strict.yaml" if runtime == "runsc" else "default.yaml"
    text = (policies_dir() / name).read_text().replace("idle_s: 300", "idle_s: 301")
    gw.policies = PolicySet.single(load_policy_text(text))
    assert eventually(lambda: not any(exists(engine, c) for c in old))
    assert gw.pool is not None
    assert gw.pool.wait_ready(timeout_s=WAIT)
    result = gw.execute({"code": "print(2+2)"})
    assert result.to_dict()["pool"] == "hit"
    assert result.outcome is not None
    assert result.outcome.container_id not in old


def test_close_destroys_the_pool(engine: Any, runtime: str) -> None:
    runner = DockerRunner(engine)
    gw = Gateway(_policy(runtime), runner=runner, audit=MemoryAuditSink(), pool=PoolConfig(size=2))
    assert gw.pool is not None
    assert gw.pool.wait_ready(timeout_s=WAIT)
    ids = pooled_ids(engine, runner.instance)
    assert len(ids) == 2
    gw.close()
    assert not any(exists(engine, c) for c in ids)


_CHILD = """
import json, os, sys, time
from gateway import Gateway, PoolConfig
from gateway.audit.memory import MemoryAuditSink
from gateway.policy import load_policy
from gateway.runner.docker.runner import DockerRunner
runner = DockerRunner(instance=sys.argv[2])
gw = Gateway(load_policy(sys.argv[1]), runner=runner, audit=MemoryAuditSink(), pool=PoolConfig(size=2))
assert gw.pool.wait_ready(timeout_s=60)
print("ready", flush=True)
time.sleep(600)
"""


def test_a_gateway_killed_by_sigterm_leaves_no_pooled_container(engine: Any, tmp_path: Path) -> None:
    instance = f"{os.environ['GATEWAY_INSTANCE']}-child"
    policy = str(policies_dir() / "default.yaml")
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, policy, instance], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        ids = pooled_ids(engine, instance)
        assert len(ids) == 2
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        # The supervisors saw their stdin close and ended; the engine removed them (AutoRemove).
        assert eventually(lambda: not pooled_ids(engine, instance)), pooled_ids(engine, instance)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        for cid in pooled_ids(engine, instance):
            engine.api.remove_container(cid, force=True)


def test_the_reapers_treat_pooled_containers_like_any_other(engine: Any) -> None:
    from gateway.service.lifecycle import instance_dead

    owner = DockerRunner(engine, instance="gone-host-1-deadbeef")
    gw = Gateway(_policy("runc"), runner=owner, audit=MemoryAuditSink(), pool=PoolConfig(size=1))
    try:
        assert gw.pool is not None
        assert gw.pool.wait_ready(timeout_s=WAIT)
        (cid,) = pooled_ids(engine, owner.instance)
        other = DockerRunner(engine)
        assert cid not in other.reap(expired_only=True)  # a live pool's container is not expired
        assert exists(engine, cid)
        removed = other.reap(expired_only=True, dead=lambda i: i == owner.instance or instance_dead(i))
        assert cid in removed
        # The pool notices its container is gone and does not hand it out.
        result = gw.execute({"code": "print(2+2)"})
        assert result.to_dict()["pool"] in ("miss", "hit")
        assert result.outcome is not None
        assert result.outcome.container_id != cid
        assert result.to_dict()["stdout"] == "4\n"
    finally:
        gw.close()
    assert not pooled_ids(engine, owner.instance)


def test_gateway_run_reaps_its_own_pool_first(engine: Any) -> None:
    runner = DockerRunner(engine)
    with Gateway(_policy("runc"), runner=runner, audit=MemoryAuditSink(), pool=PoolConfig(size=1)) as gw:
        assert gw.pool is not None
        assert gw.pool.wait_ready(timeout_s=WAIT)
        (cid,) = pooled_ids(engine, runner.instance)
        gw.reap()
        assert not exists(engine, cid)
        assert gw.pool.wait_ready(timeout_s=WAIT)
        assert gw.execute({"code": "print(2+2)"}).to_dict()["pool"] == "hit"


def test_the_service_keeps_a_pool_and_counts_it_in_metrics(serve: Callable[..., Any], engine: Any) -> None:
    server = serve(pool=True)
    pool = server.service.gateway.pool
    assert pool is not None
    assert pool.wait_ready(timeout_s=WAIT)
    runner = server.service.gateway.runner
    with server.client(server.tokens["alice"]) as client:
        response = client.post("/v1/executions", json={"code": "print(2+2)"})
        assert response.status_code == 200, response.text
        assert response.json()["pool"] == "hit"
    metrics = server.service.metrics.render().decode()  # GET /metrics is for operators; the same registry
    assert 'gateway_pool_claims_total{result="hit"} 1.0' in metrics
    assert "gateway_pool_claim_seconds_count 1.0" in metrics
    assert "gateway_pool_ready" in metrics
    (outcome,) = server.records("execution.outcome")
    assert outcome["data"]["pool"] == "hit"
    ids = pooled_ids(engine, runner.instance)
    server.stop()  # the service's shutdown (SIGTERM's path) destroys its pool
    assert not any(exists(engine, c) for c in ids)


def test_a_pool_config_key_is_strict(tmp_path: Path) -> None:
    from gateway.errors import ServerConfigError
    from gateway.service.config import load_server_config_text

    head = "apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\n"
    assert load_server_config_text(head + "pool: true\n").pool is True
    with pytest.raises(ServerConfigError) as bad:
        load_server_config_text(head + "pool: 3\n")
    assert [p.path for p in bad.value.problems] == ["$.pool"]


# -- an idle pool never starves a live run (issue 28, L2) ---------------------------------------------------

_HOLDER = """
import sys, time
from pathlib import Path
from gateway import Gateway, PoolConfig
from gateway.audit.memory import MemoryAuditSink
from gateway.policy import load_policy
from gateway.runner.docker.runner import DockerRunner
from gateway.slots import HostSlots
slots = HostSlots(Path(sys.argv[3]), count=2)
runner = DockerRunner(instance=sys.argv[2])
gw = Gateway(load_policy(sys.argv[1]), runner=runner, audit=MemoryAuditSink(), slots=slots, pool=PoolConfig(size=2))
assert gw.pool.wait_ready(timeout_s=60)
print("ready", flush=True)
sys.stdin.read()  # until the test closes it
gw.close()
"""


def test_a_live_run_in_another_process_takes_a_slot_from_an_idle_pool(
    engine: Any, runtime: str, tmp_path: Path
) -> None:
    """Process A's warm pool holds both host slots; a run in this process (B) must not wait them out: an idle
    pooled container of A gives its slot up (and is removed), and A's pool refills once the run is over."""
    instance = f"{os.environ['GATEWAY_INSTANCE']}-holder"
    slots = tmp_path / "slots"
    path = policies_dir() / ("strict.yaml" if runtime == "runsc" else "default.yaml")
    policy = load_policy(path)
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path), instance, str(slots)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"
        warm = pooled_ids(engine, instance)
        assert len(warm) == 2
        assert HostSlots(slots, 2).try_take() is None  # A's idle pool holds every slot of the host
        live = Gateway(policy, runner=DockerRunner(engine), audit=MemoryAuditSink(), slots=HostSlots(slots, 2, 15.0))
        with live:
            result = live.execute({"code": "print(2+2)"})
        assert result.error is None, result.to_dict()["error"]
        assert result.to_dict()["stdout"] == "4\n"
        assert result.to_dict()["pool"] == "cold"
        gave_up = [c for c in warm if not exists(engine, c)]
        assert gave_up, "no pooled container of process A gave its slot up"  # removed, not just forgotten
        # Once the live run is over, A's pool is whole again (new containers: the old ones never come back).
        assert eventually(lambda: len(pooled_ids(engine, instance)) == 2, WAIT), pooled_ids(engine, instance)
        assert not set(gave_up) & set(pooled_ids(engine, instance))
        proc.stdin.close()
        assert proc.wait(timeout=WAIT) == 0
        assert not pooled_ids(engine, instance)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        for cid in pooled_ids(engine, instance):
            with contextlib.suppress(Exception):  # AutoRemove may be removing it already
                engine.api.remove_container(cid, force=True)


def test_the_busiest_policys_pool_is_not_starved_by_an_idle_one(engine: Any, runtime: str, tmp_path: Path) -> None:
    """Two policies' pools share a host of two slots. The first one served fills both and is never used; the
    other principal's policy is. Its pool must get the host's slots (the idle policy's containers give way,
    removed), instead of every one of its requests running cold."""
    from gateway import Caller
    from gateway.runner.docker.options import pool_key
    from gateway.runner.pool import default_profile

    idle = _policy(runtime)
    busy = load_policy_text(Path(idle.source).read_text().replace("idle_s: 300", "idle_s: 301"))
    busy_key = pool_key(default_profile(busy))
    runner = DockerRunner(engine)
    policies = PolicySet.of(idle, {"busy": busy})
    gw = Gateway(
        policies, runner=runner, audit=MemoryAuditSink(), slots=HostSlots(tmp_path, 2, 30.0), pool=PoolConfig(size=2)
    )
    caller = Caller(principal="busy", token_id="t-busy")

    def busy_ready() -> list[str]:
        found = engine.api.containers(
            all=True, filters={"label": [f"{POOL_LABEL}={busy_key}", f"{INSTANCE_LABEL}={runner.instance}"]}
        )
        return [str(c["Id"]) for c in found]

    with gw:
        pool = gw.pool
        assert pool is not None
        assert eventually(lambda: pool.stats().ready == 2)  # the host is full
        first = gw.execute({"code": "print(2+2)"}, caller=caller)
        assert first.to_dict()["stdout"] == "4\n", first.to_dict()
        # Both slots to the busy policy's pool, both containers ready (the engine lists one while it starts).
        assert eventually(lambda: len(busy_ready()) == 2 and pool.stats().ready == 2), (busy_ready(), pool.stats())
        before = set(pooled_ids(engine, runner.instance))
        second = gw.execute({"code": "print(2+2)"}, caller=caller)
        assert second.to_dict()["pool"] == "hit"
        assert second.outcome is not None
        assert second.outcome.container_id in before
    assert not pooled_ids(engine, runner.instance)

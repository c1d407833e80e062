"""The warm pool's bookkeeping, on the fake runner: fill, claim once, refill, burst, expiry, reload, slots.

What a pooled container holds and how it is hardened is tested against the real engine
(``tests/integration/test_warm_pool.py`` and the containment suite in its pooled mode)."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from gateway import Caller, Gateway, PoolConfig
from gateway.audit.memory import MemoryAuditSink
from gateway.decision import Decision
from gateway.errors import ContractError, SandboxError, UnsafeOptionsError
from gateway.policy import Policy, PolicySet, load_policy, load_policy_text
from gateway.policy.model import Policy as PolicyModel
from gateway.resources import policies_dir
from gateway.runner import FakeRunner
from gateway.runner.docker.options import POOL_LABEL, pool_key, profile_options
from gateway.runner.docker.runner import DockerRunner, DockerSandbox
from gateway.runner.pool import WarmPool, default_profile
from gateway.runspec import RunSpec
from gateway.service.metrics import ServiceMetrics
from gateway.slots import HostSlots

WAIT = 10.0


@pytest.fixture
def policy() -> Policy:
    return load_policy(policies_dir() / "default.yaml")


@pytest.fixture
def slots(tmp_path: Path) -> HostSlots:
    return HostSlots(tmp_path / "slots", count=8, wait_s=1.0)


def _gateway(policy: Policy | PolicySet, runner: FakeRunner, slots: HostSlots, **pool: object) -> Gateway:
    config = PoolConfig(**{"size": 2, **pool})  # type: ignore[arg-type]
    return Gateway(policy, runner=runner, audit=MemoryAuditSink(), slots=slots, pool=config)


def _pool(gw: Gateway) -> WarmPool:
    assert gw.pool is not None
    return gw.pool


def test_the_pool_fills_to_its_size_and_each_container_serves_one_request(policy: Policy, slots: HostSlots) -> None:
    runner = FakeRunner()
    with _gateway(policy, runner, slots) as gw:
        assert _pool(gw).wait_ready(timeout_s=WAIT)
        assert len(runner.pooled) == 2
        first = gw.execute({"code": "print(2+2)"})
        second = gw.execute({"code": "print(2+2)"})
        assert first.to_dict()["pool"] == second.to_dict()["pool"] == "hit"
        assert first.to_dict()["stdout"] == "4\n"
        assert first.outcome is not None
        assert second.outcome is not None
        assert first.outcome.container_id != second.outcome.container_id
        assert set(runner.claimed) == {first.outcome.container_id, second.outcome.container_id}
        assert _pool(gw).wait_ready(timeout_s=WAIT)  # refilled in the background
        assert len(runner.pooled) == 4
    assert runner.live == set()  # close destroyed what was left


def test_the_outcome_record_names_the_claimed_container_and_the_pool_status(policy: Policy, slots: HostSlots) -> None:
    runner = FakeRunner()
    sink = MemoryAuditSink()
    gw = Gateway(policy, runner=runner, audit=sink, slots=slots, pool=PoolConfig(size=1))
    with gw:
        _pool(gw).wait_ready(timeout_s=WAIT)
        result = gw.execute({"code": "print(1)"})
    (outcome,) = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    assert outcome["data"]["pool"] == "hit"
    assert outcome["data"]["container_id"] == result.outcome.container_id if result.outcome else None
    assert outcome["request_id"] == result.request_id


def test_an_empty_pool_is_a_miss_and_grows_towards_max(policy: Policy, slots: HostSlots) -> None:
    runner = FakeRunner()
    with _gateway(policy, runner, slots, size=1, max=3) as gw:
        pool = _pool(gw)
        pool.wait_ready(timeout_s=WAIT)
        assert gw.execute({"code": "1"}).to_dict()["pool"] == "hit"
        with pool.paused():  # no refill under way, none started: once drained, the pool stays empty
            pool.drain()
            assert pool.claim(*_settings_and_spec(gw, policy)).status == "miss"  # type: ignore[arg-type]
            assert pool.stats().target == 2
        assert pool.wait_ready(timeout_s=WAIT)
        assert pool.stats().ready == 2


def _settings_and_spec(gw: Gateway, policy: Policy) -> tuple[object, object]:
    decision = gw.decide({"code": "1"}).decision
    assert decision is not None
    assert decision.settings is not None
    assert decision.run is not None
    return decision.settings, decision.run


def test_requests_with_mounts_or_without_a_pooled_policy_run_cold(
    policy: Policy, slots: HostSlots, mount_policy: Policy, data_root: Path
) -> None:
    runner = FakeRunner()
    with _gateway(mount_policy, runner, slots, size=1) as gw:
        _pool(gw).wait_ready(timeout_s=WAIT)
        mounted = gw.execute({"code": "1", "mounts": [{"source": str(data_root), "target": "/data"}]})
        assert mounted.allowed, mounted.to_dict()
        assert mounted.to_dict()["pool"] == "cold"
    off = dataclasses.replace(policy, pool=PoolConfig(size=0))
    runner = FakeRunner()
    with Gateway(off, runner=runner, audit=MemoryAuditSink(), slots=slots, pool=True) as gw:
        assert gw.execute({"code": "1"}).to_dict()["pool"] == "cold"
        assert runner.pooled == []


def test_a_request_for_another_profile_adds_a_pool_for_it(policy: Policy, slots: HostSlots) -> None:
    runner = FakeRunner()
    with _gateway(policy, runner, slots, size=1) as gw:
        pool = _pool(gw)
        pool.wait_ready(timeout_s=WAIT)
        asked = {"code": "1", "limits": {"memory": "128m"}}
        assert gw.execute(asked).to_dict()["pool"] == "miss"
        assert pool.wait_ready(timeout_s=WAIT)
        assert pool.stats().profiles == 2
        assert gw.execute(asked).to_dict()["pool"] == "hit"


def test_each_language_has_a_pool_of_its_own_and_claims_only_from_it(slots: HostSlots) -> None:
    # A container is made for its language (its supervisor starts that interpreter ahead): a JavaScript request
    # never takes the Python pool's container, nor the reverse.
    polyglot = load_policy(policies_dir() / "examples" / "polyglot.yaml")
    runner = FakeRunner()
    with _gateway(polyglot, runner, slots, size=1) as gw:
        pool = _pool(gw)
        assert pool.wait_ready(timeout_s=WAIT)
        python_made = set(runner.pooled)  # the default language's pool, warm from the start
        js = {"code": "console.log(2+2)", "language": "javascript"}
        first = gw.execute(js)
        assert first.to_dict()["pool"] == "miss"
        assert pool.wait_ready(timeout_s=WAIT)
        assert pool.stats().profiles == 2
        second = gw.execute(js)
        assert second.to_dict()["pool"] == "hit"
        assert second.outcome is not None
        assert second.outcome.container_id not in python_made
        assert second.decision.options["labels"]["io.agent-gateway.interpreter"] == "javascript"
        python = gw.execute({"code": "print(2+2)"})
        assert python.to_dict()["pool"] == "hit"
        assert python.outcome is not None
        assert python.outcome.container_id in python_made
        assert "io.agent-gateway.interpreter" not in python.decision.options["labels"]


def test_the_wait_burst_response_waits_for_a_refill(policy: Policy, slots: HostSlots) -> None:
    runner = FakeRunner()
    with _gateway(policy, runner, slots, size=1, burst="wait", burst_wait_s=5.0) as gw:
        pool = _pool(gw)
        pool.wait_ready(timeout_s=WAIT)
        statuses = [gw.execute({"code": "1"}).to_dict()["pool"] for _ in range(4)]
        assert statuses == ["hit"] * 4  # each waited for the refill instead of running cold


@dataclasses.dataclass
class _Watching(FakeRunner):
    """A fake runner that says when every container in ``watched`` has been discarded."""

    watched: set[str] = dataclasses.field(default_factory=set)
    all_discarded: threading.Event = dataclasses.field(default_factory=threading.Event)

    def discard(self, sandbox: Any) -> None:
        super().discard(sandbox)
        if self.watched and self.watched <= set(self.discarded):
            self.all_discarded.set()


def test_idle_containers_expire_down_to_min(policy: Policy, slots: HostSlots) -> None:
    now = [0.0]
    runner = _Watching()
    pool = WarmPool(runner, slots, override=PoolConfig(size=3, min=1, idle_s=10.0), clock=lambda: now[0])
    try:
        pool.configure([policy])
        assert pool.wait_ready(timeout_s=WAIT)
        runner.watched = set(runner.pooled)
        now[0] = 11.0
        with pool._cond:
            pool._cond.notify_all()
        assert runner.all_discarded.wait(WAIT)  # all three expired together
        assert pool.wait_ready(timeout_s=WAIT)  # and one refilled: the target is down to min
        assert pool.stats().ready == 1
        assert pool.stats().target == 1
    finally:
        pool.close()
    assert runner.live == set()


def test_a_reload_drains_the_old_policys_containers(policy: Policy, slots: HostSlots) -> None:
    runner = FakeRunner()
    with _gateway(policy, runner, slots) as gw:
        pool = _pool(gw)
        pool.wait_ready(timeout_s=WAIT)
        old = set(runner.pooled)
        edited = load_policy_text(
            (policies_dir() / "default.yaml").read_text().replace("timeout_s: {default: 10", "timeout_s: {default: 11")
        )
        assert edited.sha256 != policy.sha256
        gw.policies = PolicySet.single(edited)
        assert old <= set(runner.discarded)  # destroyed, never claimed
        assert not old & set(runner.claimed)
        assert pool.wait_ready(timeout_s=WAIT)
        result = gw.execute({"code": "1"})
        assert result.to_dict()["pool"] == "hit"
        assert result.outcome is not None
        assert result.outcome.container_id not in old
        (profile,) = pool._pools
        assert profile == default_profile(edited)


def test_pooled_containers_hold_host_slots_and_a_cold_run_evicts_one(
    policy: Policy, tmp_path: Path, mount_policy: Policy, data_root: Path
) -> None:
    slots = HostSlots(tmp_path / "few", count=2, wait_s=0.5)
    runner = FakeRunner()
    with _gateway(mount_policy, runner, slots, size=2) as gw:
        pool = _pool(gw)
        assert pool.wait_ready(timeout_s=WAIT)
        assert slots.try_take() is None  # both slots are held by ready containers
        cold = gw.execute({"code": "1", "mounts": [{"source": str(data_root), "target": "/data"}]})
        assert cold.to_dict()["pool"] == "cold"
        assert cold.error is None, cold.to_dict()["error"]
        assert len(runner.discarded) == 1  # one idle container gave its slot to the cold run


def test_an_idle_pool_gives_a_slot_up_to_a_run_of_another_gateway(policy: Policy, tmp_path: Path) -> None:
    shared = HostSlots(tmp_path / "few", count=2, wait_s=10.0)  # another process would use the same directory
    warm_runner, live_runner = FakeRunner(), FakeRunner()
    with _gateway(policy, warm_runner, shared, size=2) as warm:
        assert _pool(warm).wait_ready(timeout_s=WAIT)
        assert shared.try_take() is None  # the idle pool holds every slot of the host
        with _gateway(policy, live_runner, shared, size=1) as live:  # its own pool cannot fill: no slot
            result = live.execute({"code": "1"})
            assert result.error is None, result.to_dict()["error"]
            assert result.to_dict()["pool"] == "miss"
        assert warm_runner.discarded  # gave its slot up: removed, never claimed
        assert not set(warm_runner.discarded) & (warm_runner.live | set(warm_runner.claimed))
    assert warm_runner.live == set()
    assert live_runner.live == set()


def test_the_busiest_profiles_pool_gets_the_slots_of_idle_ones(policy: Policy, tmp_path: Path) -> None:
    slots = HostSlots(tmp_path / "few", count=2, wait_s=10.0)
    busy = load_policy_text((policies_dir() / "default.yaml").read_text().replace("idle_s: 300", "idle_s: 301"))
    runner = _Watching()
    policies = PolicySet.of(policy, {"busy": busy})
    caller = Caller(principal="busy", token_id="t")
    with Gateway(policies, runner=runner, audit=MemoryAuditSink(), slots=slots, pool=PoolConfig(size=2)) as gw:
        pool = _pool(gw)
        assert _eventually(lambda: pool.stats().ready == 2)  # the host is full
        quiet = [p for p in pool._pools.values() if p.profile.policy == policy.ref]
        runner.watched = {r.sandbox.container_id for p in quiet for r in p.ready}
        first = gw.execute({"code": "1"}, caller=caller)
        assert first.error is None, first.to_dict()["error"]
        assert runner.all_discarded.wait(WAIT)  # the idle policy's containers gave way, never claimed
        assert _eventually(lambda: _ready_of(pool, busy) == 2), pool.stats()
        assert _ready_of(pool, policy) == 0
        assert [gw.execute({"code": "1"}, caller=caller).to_dict()["pool"] for _ in range(2)] == ["hit"] * 2
    assert not set(runner.claimed) & runner.watched


def _ready_of(pool: WarmPool, policy: Policy) -> int:
    with pool._cond:
        return sum(len(p.ready) for p in pool._pools.values() if p.profile.policy == policy.ref)


def _eventually(check: Callable[[], bool], tries: int = 400) -> bool:
    for _ in range(tries):
        if check():
            return True
        time.sleep(0.025)
    return False


def test_a_claim_the_guard_refuses_destroys_the_container_and_fails_closed(policy: Policy, slots: HostSlots) -> None:
    runner = FakeRunner()
    with _gateway(policy, runner, slots, size=1) as gw:
        pool = _pool(gw)
        pool.wait_ready(timeout_s=WAIT)
        (ready,) = next(iter(pool._pools.values())).ready
        tampered = dict(ready.sandbox.spec.options, read_only=False)
        ready.sandbox.spec = dataclasses.replace(ready.sandbox.spec, options=tampered)
        result = gw.execute({"code": "1"})
        assert result.error is not None
        assert isinstance(result.error, UnsafeOptionsError)
        assert not result.ran
        assert ready.sandbox.container_id in runner.discarded


def test_a_container_that_died_while_idle_is_skipped(policy: Policy, slots: HostSlots) -> None:
    runner = FakeRunner()
    with _gateway(policy, runner, slots, size=2) as gw:
        pool = _pool(gw)
        pool.wait_ready(timeout_s=WAIT)
        with pool._cond:
            dead = next(iter(pool._pools.values())).ready[0].sandbox
            runner.live.discard(dead.container_id or "")  # reaped behind the pool's back
            lease = pool._claim(*_settings_and_spec(gw, policy))  # type: ignore[arg-type]
        assert lease.status == "hit"
        assert lease.sandbox is not None
        assert lease.sandbox.container_id != dead.container_id
        lease.release()
        runner.discard(lease.sandbox)


def test_close_destroys_the_pool_and_a_pool_needs_a_pooling_runner(policy: Policy, slots: HostSlots) -> None:
    runner = FakeRunner()
    gw = _gateway(policy, runner, slots, size=3)
    assert _pool(gw).wait_ready(timeout_s=WAIT)
    gw.close()
    assert runner.live == set()
    assert len(runner.discarded) == 3

    class Plain:
        assembler = runner.assembler

    with pytest.raises(ContractError, match="pool"):
        Gateway(policy, runner=Plain(), audit=MemoryAuditSink(), slots=slots, pool=True)  # type: ignore[arg-type]


def test_the_service_metrics_count_claims_and_read_the_pool_size(policy: Policy, slots: HostSlots) -> None:
    runner = FakeRunner()
    metrics = ServiceMetrics()
    with _gateway(policy, runner, slots, size=1) as gw:
        pool = _pool(gw)
        metrics.watch_pool(pool)
        pool.wait_ready(timeout_s=WAIT)
        gw.execute({"code": "1"})
        pool.wait_ready(timeout_s=WAIT)
        text = metrics.render().decode()
    assert 'gateway_pool_claims_total{result="hit"} 1.0' in text
    assert "gateway_pool_ready 1.0" in text
    assert "gateway_pool_claim_seconds_count 1.0" in text


def test_the_policy_sizes_its_pool_and_the_semantic_pass_checks_it(make_policy: object) -> None:
    shipped = load_policy(policies_dir() / "default.yaml")
    assert shipped.pool == PoolConfig(size=2, max=4, idle_s=300.0)
    assert PolicyModel.__dataclass_fields__["pool"].default_factory() == PoolConfig()  # type: ignore[misc]
    make = make_policy  # the base test policy plus spec sections
    assert make("pool: {size: 3, min: 1, max: 5, burst: wait}\n").pool == PoolConfig(  # type: ignore[operator]
        size=3, min=1, max=5, burst="wait"
    )
    from gateway.errors import PolicyError

    with pytest.raises(PolicyError) as bad:
        make("pool: {size: 2, min: 3, max: 1}\n")  # type: ignore[operator]
    paths = sorted(p.path for p in bad.value.problems)
    assert paths == ["$.spec.pool.max", "$.spec.pool.min"]


# -- the Docker runner's claim, without an engine: an idle pooled sandbox as prepare_idle makes it ---------


@pytest.fixture
def attach() -> Iterator[socket.socket]:
    """An open, silent attach connection: the idle supervisor waiting for its payload."""
    ours, theirs = socket.socketpair()
    try:
        yield ours
    finally:
        ours.close()
        theirs.close()


def _decisions(policy: Policy, slots: HostSlots, *requests: dict[str, Any]) -> list[Decision]:
    with Gateway(policy, runner=FakeRunner(), audit=MemoryAuditSink(), slots=slots) as gw:  # the Docker assembler
        decisions = [gw.decide(request).decision for request in requests]
    assert all(d is not None and d.run is not None and d.settings is not None for d in decisions)
    return decisions  # type: ignore[return-value]


def _idle(decision: Decision, sock: socket.socket, **extra: Any) -> DockerSandbox:
    assert decision.settings is not None
    options = profile_options(decision.settings.profile)
    options["labels"] = {**options["labels"], POOL_LABEL: pool_key(decision.settings.profile)}
    options.update(extra)
    spec = RunSpec(options=options, timeout_s=60.0, output_bytes=0)
    return DockerSandbox(spec, "c" * 64, None, False, sock, created_with=MappingProxyType(options))


def test_a_docker_claim_serves_its_own_profile_once(policy: Policy, slots: HostSlots, attach: socket.socket) -> None:
    (decision,) = _decisions(policy, slots, {"code": "1"})
    assert decision.run is not None
    idle = _idle(decision, attach)
    runner = DockerRunner(client=object())  # claim never calls the engine
    claimed = runner.claim(idle, decision.run)
    assert claimed is not None
    assert claimed.spec is decision.run
    with pytest.raises(SandboxError, match="already claimed"):
        runner.claim(idle, decision.run)  # the same idle container, claimed twice


def test_a_docker_claim_for_another_profile_is_refused(policy: Policy, slots: HostSlots, attach: socket.socket) -> None:
    mine, other = _decisions(policy, slots, {"code": "1"}, {"code": "1", "limits": {"memory": "128m"}})
    assert other.run is not None
    with pytest.raises(UnsafeOptionsError, match="created with options other than the profile part") as info:
        DockerRunner(client=object()).claim(_idle(mine, attach), other.run)
    assert "(mem_limit" in info.value.message


def test_a_docker_claim_of_a_container_whose_options_fail_the_guard_is_refused(
    policy: Policy, slots: HostSlots, attach: socket.socket
) -> None:
    (decision,) = _decisions(policy, slots, {"code": "1"})
    assert decision.run is not None
    # Created with a host bind the decision's options do not have (the profile part leaves "mounts" out).
    socket_bind = [{"Type": "bind", "Source": "/var/run/docker.sock", "Target": "/s", "ReadOnly": False}]
    idle = _idle(decision, attach, mounts=socket_bind)
    with pytest.raises(UnsafeOptionsError, match="refused unsafe run options") as info:
        DockerRunner(client=object()).claim(idle, decision.run)
    assert any(problem.path.startswith("$.mounts") for problem in info.value.problems)


def test_an_egress_run_never_uses_the_pool(slots: HostSlots) -> None:
    """A run with egress gets its own proxy socket at create (issue 31): it runs cold, and no pool is made for it."""
    egress = dataclasses.replace(
        load_policy(policies_dir() / "examples" / "egress-mirror.yaml"), pool=PoolConfig(size=1)
    )
    runner = FakeRunner()
    with _gateway(egress, runner, slots, size=1) as gw:
        pool = _pool(gw)
        decision = gw.decide({"code": "1", "network": "egress"}).decision
        assert decision is not None, "decided"
        assert decision.allowed, decision.to_dict()
        assert decision.settings is not None
        assert decision.settings.egress is not None
        assert decision.run is not None
        assert pool.claim(decision.settings, decision.run).status == "cold"
        assert pool.stats().cold == 1

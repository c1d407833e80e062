"""A workspace session's next container made ahead (gateway.sessions.ahead), with the fake runner and real host
slots: claimed only for its profile and workspace, holding a slot it gives up to a run that waits, removed before
the workspace at every end. The real engine's side is tests/integration/test_session_ahead.py."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway, PoolConfig
from gateway.audit.memory import MemoryAuditSink
from gateway.decision.settings import SandboxProfile, resolve
from gateway.errors import SandboxError, UnsafeOptionsError
from gateway.payload import Payload
from gateway.policy import load_policy
from gateway.request import ExecutionRequest
from gateway.runner.docker.options import profile_options
from gateway.runner.fake import FakeRunner
from gateway.runner.interface import Outcome, RunSpec
from gateway.runner.pool import default_profile
from gateway.runner.workspace import Workspace
from gateway.sessions import SessionManager
from gateway.sessions.ahead import AheadStats, NextContainers
from gateway.slots import HostSlots, Slot
from tests.unit.sessions_support import SESSIONS_POLICY, Clock, FakeWorkspaces, HeldRun, KernelFakeRunner


@pytest.fixture
def profile() -> SandboxProfile:
    return default_profile(load_policy(SESSIONS_POLICY))


@pytest.fixture
def store() -> FakeWorkspaces:
    return FakeWorkspaces()


def spec_for(profile: SandboxProfile, workspace: Workspace | None) -> RunSpec:
    """A decision's run specification of ``profile`` (its options are the profile's, as the assembler's are)."""
    return RunSpec(options=profile_options(profile), timeout_s=5, output_bytes=1 << 10, workspace=workspace)


def settled(ahead: NextContainers, ready: int = 1) -> AheadStats:
    """The stats once no preparation is under way and ``ready`` containers are ready (bounded wait)."""
    for _ in range(1000):
        stats = ahead.stats()
        if stats.preparing == 0 and stats.ready == ready:
            return stats
        threading.Event().wait(0.01)
    raise AssertionError(f"preparations did not settle: {ahead.stats()}")


def free_slots(slots: HostSlots) -> int:
    taken = []
    while (slot := slots.try_take()) is not None:
        taken.append(slot)
    for slot in taken:
        slot.release()
    return len(taken)


def test_a_claim_takes_the_container_made_ahead_bound_to_the_decisions_spec(
    tmp_path: Path, profile: SandboxProfile, store: FakeWorkspaces
) -> None:
    runner, slots = FakeRunner(), HostSlots(tmp_path / "slots", 2, wait_s=0)
    ahead = NextContainers(runner, slots)
    workspace = store.create(8 << 20, profile.uid, profile.gid)
    assert ahead.prepare("s1", profile, workspace, ttl_s=60)
    assert not ahead.prepare("s1", profile, workspace, ttl_s=60)  # one at a time per session
    settled(ahead)
    assert free_slots(slots) == 1  # the prepared container holds the other
    spec = spec_for(profile, workspace)
    claimed = ahead.claim("s1", profile, spec)
    assert claimed is not None
    sandbox, slot = claimed
    assert (sandbox.spec, sandbox.container_id, slot.held) == (spec, runner.pooled[0], True)
    assert runner.claimed == runner.pooled
    slot.release()
    assert ahead.claim("s1", profile, spec) is None  # used once: the next one must be prepared again
    assert ahead.stats() == AheadStats(ready=0, preparing=0, prepared=1, hits=1, misses=1, yielded=0, failures=0)


def test_an_execution_of_another_profile_runs_cold_and_the_container_is_removed(
    tmp_path: Path, profile: SandboxProfile, store: FakeWorkspaces
) -> None:
    runner, slots = FakeRunner(), HostSlots(tmp_path / "slots", 2, wait_s=0)
    ahead = NextContainers(runner, slots)
    workspace = store.create(8 << 20, profile.uid, profile.gid)
    ahead.prepare("s1", profile, workspace, ttl_s=60)
    settled(ahead)
    smaller = dataclasses.replace(profile, pids=profile.pids // 2)
    assert ahead.claim("s1", smaller, spec_for(smaller, workspace)) is None
    assert (runner.discarded, runner.live, runner.claimed) == (runner.pooled, set(), [])
    assert free_slots(slots) == 2


def test_a_container_made_for_another_workspace_fails_the_claim_closed(
    tmp_path: Path, profile: SandboxProfile, store: FakeWorkspaces
) -> None:
    runner, slots = FakeRunner(), HostSlots(tmp_path / "slots", 2, wait_s=0)
    ahead = NextContainers(runner, slots)
    mine, other = (store.create(8 << 20, profile.uid, profile.gid) for _ in range(2))
    ahead.prepare("s1", profile, mine, ttl_s=60)
    settled(ahead)
    with pytest.raises(UnsafeOptionsError):
        ahead.claim("s1", profile, spec_for(profile, other))
    assert (runner.discarded, runner.claimed) == (runner.pooled, [])
    assert free_slots(slots) == 2


def test_nothing_is_prepared_without_a_free_slot_or_after_close(
    tmp_path: Path, profile: SandboxProfile, store: FakeWorkspaces
) -> None:
    runner, slots = FakeRunner(), HostSlots(tmp_path / "slots", 1, wait_s=0)
    ahead = NextContainers(runner, slots)
    workspace = store.create(8 << 20, profile.uid, profile.gid)
    with slots.take():
        assert not ahead.prepare("s1", profile, workspace, ttl_s=60)  # never waits for one
    ahead.close()
    assert not ahead.prepare("s1", profile, workspace, ttl_s=60)
    assert runner.pooled == []


def test_a_run_waiting_for_a_slot_takes_the_prepared_containers_slot(
    tmp_path: Path, profile: SandboxProfile, store: FakeWorkspaces
) -> None:
    runner, slots = FakeRunner(), HostSlots(tmp_path / "slots", 1, wait_s=30)
    ahead = NextContainers(runner, slots)
    ahead.prepare("s1", profile, store.create(8 << 20, profile.uid, profile.gid), ttl_s=60)
    settled(ahead)
    got: list[Slot] = []
    waiter = threading.Thread(target=lambda: got.append(slots.take()))  # as a run of any process on the host
    waiter.start()
    waiter.join(60)
    assert len(got) == 1
    assert got[0].held
    got[0].release()
    assert (runner.discarded, runner.live) == (runner.pooled, set())
    assert ahead.stats().yielded == 1


class SlowRunner(FakeRunner):
    """Its preparations wait for ``go``; ``events`` says when each ended and each container was removed."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.events: list[str] = []

    def prepare_idle(self, profile: SandboxProfile, *, ttl_s: float, workspace: Workspace | None = None) -> Any:
        self.go.wait(30)
        made = super().prepare_idle(profile, ttl_s=ttl_s, workspace=workspace)
        self.events.append("made")
        return made

    def discard(self, sandbox: Any) -> None:
        super().discard(sandbox)
        self.events.append("removed")


def test_drop_waits_for_a_preparation_under_way_and_removes_the_container(
    tmp_path: Path, profile: SandboxProfile, store: FakeWorkspaces
) -> None:
    runner, slots = SlowRunner(), HostSlots(tmp_path / "slots", 2, wait_s=0)
    ahead = NextContainers(runner, slots)
    ahead.prepare("s1", profile, store.create(8 << 20, profile.uid, profile.gid), ttl_s=60)
    dropper = threading.Thread(target=lambda: (ahead.drop("s1"), runner.events.append("dropped")))
    dropper.start()
    runner.go.set()
    dropper.join(60)
    assert runner.events == ["made", "removed", "dropped"]
    assert (runner.live, free_slots(slots)) == (set(), 2)


def test_a_claim_waits_for_a_preparation_under_way(
    tmp_path: Path, profile: SandboxProfile, store: FakeWorkspaces
) -> None:
    runner, slots = SlowRunner(), HostSlots(tmp_path / "slots", 2, wait_s=0)
    ahead = NextContainers(runner, slots)
    workspace = store.create(8 << 20, profile.uid, profile.gid)
    ahead.prepare("s1", profile, workspace, ttl_s=60)
    claims: list[Any] = []
    claimer = threading.Thread(target=lambda: claims.append(ahead.claim("s1", profile, spec_for(profile, workspace))))
    claimer.start()
    runner.go.set()
    claimer.join(60)
    assert len(claims) == 1
    assert claims[0] is not None
    claims[0][1].release()
    assert ahead.stats().hits == 1


def test_execute_runs_in_the_container_made_ahead_then_cold_when_its_preparation_failed(
    tmp_path: Path, profile: SandboxProfile, store: FakeWorkspaces
) -> None:
    runner, slots = FakeRunner(), HostSlots(tmp_path / "slots", 2, wait_s=0)
    ahead = NextContainers(runner, slots)
    workspace = store.create(8 << 20, profile.uid, profile.gid)
    spec = spec_for(profile, workspace)
    settings = resolve(load_policy(SESSIONS_POLICY), ExecutionRequest(code=""))
    assert settings.profile == profile
    ahead.prepare("s1", profile, workspace, ttl_s=60)
    settled(ahead)
    began: list[str] = []

    def execute() -> Outcome:
        return ahead.execute(
            "s1", settings, spec, Payload("print(2+2)"), cold_slot=slots.take, on_left=lambda error: None,
            then=lambda: began.append("next"),
        )  # fmt: skip

    hit = execute()
    assert (hit.pool, hit.stdout, hit.container_id, began) == ("hit", b"4\n", runner.pooled[0], ["next"])
    runner.error = SandboxError("the engine is gone")
    assert ahead.prepare("s1", profile, workspace, ttl_s=60)
    assert settled(ahead, ready=0).failures == 1
    runner.error = None
    cold = execute()
    assert (cold.pool, cold.stdout, runner.prepared) == ("miss", b"4\n", [spec])
    assert (runner.live, free_slots(slots)) == (set(), 2)  # each container gone, its slot freed


# -- through the session manager ---------------------------------------------------------------------------


class TrackingRunner(KernelFakeRunner):
    """Which workspace each of its containers holds."""

    def __init__(self) -> None:
        super().__init__()
        self.holds: dict[str, Workspace | None] = {}

    def prepare(self, spec: RunSpec) -> Any:
        made = super().prepare(spec)
        self.holds[made.container_id] = spec.workspace
        return made

    def prepare_idle(self, profile: SandboxProfile, *, ttl_s: float, workspace: Workspace | None = None) -> Any:
        made = super().prepare_idle(profile, ttl_s=ttl_s, workspace=workspace)
        self.holds[made.container_id] = workspace
        return made


class CheckedWorkspaces(FakeWorkspaces):
    """A store that refuses to destroy a workspace a container still holds (the session's end records that)."""

    def __init__(self, runner: TrackingRunner) -> None:
        super().__init__()
        self.runner = runner
        self.refused: list[str] = []

    def destroy(self, workspace: Workspace) -> None:
        holders = [c for c in self.runner.live if self.runner.holds.get(c) == workspace]
        if holders:
            self.refused.extend(holders)
            raise SandboxError(f"workspace {workspace.id} is still held by {holders}")
        super().destroy(workspace)


def make_gateway(tmp_path: Path, clock: Clock | None = None) -> tuple[Gateway, TrackingRunner, CheckedWorkspaces]:
    runner = TrackingRunner()
    store = CheckedWorkspaces(runner)
    runner.workspaces = store  # type: ignore[attr-defined]
    slots = HostSlots(tmp_path / "slots", 4, wait_s=0)
    gw = Gateway(load_policy(SESSIONS_POLICY), runner=runner, audit=MemoryAuditSink(), slots=slots, pool=PoolConfig())
    if clock is not None:
        gw.sessions = SessionManager(gw, clock=clock)
    return gw, runner, store


def ready(runner: FakeRunner, count: int) -> None:
    """Wait (bounded) until ``count`` containers were made ahead."""
    for _ in range(1000):
        if len(runner.pooled) >= count:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"no container was made ahead: {runner.pooled}")


def test_each_execution_of_a_workspace_session_is_served_by_a_container_made_ahead(tmp_path: Path) -> None:
    gw, runner, store = make_gateway(tmp_path)
    with gw:
        created = gw.sessions.create({"mode": "workspace", "principal": "alice"})
        assert created.session is not None
        sid = created.session.session_id
        results = []
        for n in range(3):
            ready(runner, n + 1)
            results.append(gw.sessions.execute(sid, {"code": "print(2+2)", "principal": "alice"}))
        assert [(r.outcome.pool, r.outcome.stdout) for r in results if r.outcome] == [("hit", b"4\n")] * 3
        assert len({r.outcome.container_id for r in results if r.outcome}) == 3  # each a fresh container
        assert [spec.workspace for spec, _ in runner.calls] == store.live * 3
        other = gw.sessions.execute(sid, {"code": "print(2+2)", "principal": "alice", "limits": {"pids": 32}})
        assert (other.error, other.outcome and other.outcome.pool) == (None, "miss")  # other limits: cold
        gw.sessions.close(sid, principal="alice")
        assert (store.live, runner.live, store.refused) == ([], set(), [])  # the container went first


def test_expiry_and_the_gateways_stop_remove_the_container_before_the_workspace(tmp_path: Path) -> None:
    clock = Clock()
    gw, runner, store = make_gateway(tmp_path, clock)
    with gw:
        for _ in range(2):
            created = gw.sessions.create({"mode": "workspace", "principal": "alice", "idle_s": 60})
            assert created.session is not None
        ready(runner, 2)
        clock.now += 30
        gw.sessions.execute(created.session.session_id, {"code": "1", "principal": "alice"})
        clock.now += 40
        assert len(gw.sessions.sweep()) == 1  # the one idle for 70 s
        assert len(store.live) == 1
    assert (store.live, runner.live, len(store.destroyed), store.refused) == ([], set(), 2, [])


def test_closing_a_session_while_it_executes_removes_the_next_container_at_once_and_the_workspace_after(
    tmp_path: Path,
) -> None:
    held = HeldRun(30)

    gw, runner, store = make_gateway(tmp_path)
    runner.outcome = held
    with gw:
        created = gw.sessions.create({"mode": "workspace", "principal": "alice"})
        assert created.session is not None
        sid = created.session.session_id
        worker = threading.Thread(target=gw.sessions.execute, args=(sid, {"code": "1", "principal": "alice"}))
        worker.start()
        assert held.entered.wait(30)
        ready(runner, 2)  # the next one, begun as the execution got its container
        closer = threading.Thread(target=gw.sessions.close, args=(sid,), kwargs={"principal": "alice"})
        closer.start()
        closer.join(30)
        assert not closer.is_alive()  # it does not wait for the execution
        assert runner.discarded == runner.pooled[1:]  # the next container is gone already
        assert store.destroyed == []  # the running execution's container still holds the workspace
        held.release.set()
        worker.join(30)
        assert (store.live, runner.live, len(store.destroyed), store.refused) == ([], set(), 1, [])

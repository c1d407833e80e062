"""The session manager with a fake kernel runner and an in-memory trail: ownership, limits, expiry, records.

Containment is the real engine's (tests/integration/test_sessions.py); these tests pin down what the manager does
around the kernel: who may see what, when a session ends and what the trail says.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.errors import (
    SandboxError,
    SessionBusyError,
    SessionGoneError,
    SessionNotFoundError,
    exit_code_for,
    http_status_for,
)
from gateway.policy import load_policy
from gateway.resources import default_policy_path
from gateway.runner.interface import Kernel, KernelRunner, RunSpec
from gateway.sessions import SessionManager
from gateway.sessions.manager import new_session_id
from gateway.slots import HostSlots, Slot
from tests.unit.sessions_support import SESSIONS_POLICY, Clock, FakeKernel, FakeWorkspaces, HeldRun, KernelFakeRunner


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sink() -> MemoryAuditSink:
    return MemoryAuditSink()


@pytest.fixture
def runner() -> KernelFakeRunner:
    return KernelFakeRunner()


@pytest.fixture
def gateway(tmp_path: Path, runner: KernelFakeRunner, sink: MemoryAuditSink, clock: Clock) -> Gateway:
    gw = Gateway(load_policy(SESSIONS_POLICY), runner=runner, audit=sink, slots=HostSlots(tmp_path / "s", 8, wait_s=0))
    gw.sessions = SessionManager(gw, clock=clock)
    return gw


def events(sink: MemoryAuditSink) -> list[str]:
    return [r["event_type"] for r in sink.records]


def create(gateway: Gateway, principal: str = "alice", **body: Any) -> str:
    result = gateway.sessions.create({"mode": "kernel", "principal": principal, **body})
    assert result.allowed, result.to_dict()
    assert result.session is not None
    return result.session.session_id


def test_the_fake_is_a_kernel_runner(runner: KernelFakeRunner, tmp_path: Path) -> None:
    assert isinstance(runner, KernelRunner)
    assert isinstance(runner.open_kernel(RunSpec({"image": "x"}, 1, 1)), Kernel)


def test_state_persists_and_every_cell_is_decided_and_recorded_with_the_session_id(
    gateway: Gateway, sink: MemoryAuditSink, runner: KernelFakeRunner
) -> None:
    created = gateway.sessions.create({"mode": "kernel", "principal": "alice", "lifetime_s": 600})
    assert created.session is not None
    sid = created.session.session_id
    assert len(sid) >= 32
    assert created.to_dict()["expires_at"] == created.session.to_dict()["expires_at"]
    # the kernel's own deadline is the lifetime plus the margin: the manager's sweep comes first
    assert runner.kernels[0].spec.timeout_s == 660
    first = gateway.sessions.execute(sid, {"code": "x = 40", "principal": "alice"})
    second = gateway.sessions.execute(sid, {"code": "x + 2", "principal": "alice"})
    assert (first.allowed, first.value, second.value) == (True, None, "42")
    assert second.to_dict()["session_id"] == sid
    assert events(sink) == [
        "policy.decision", "session.created",
        "request.received", "policy.decision", "execution.outcome",
        "request.received", "policy.decision", "execution.outcome",
    ]  # fmt: skip
    created_record = sink.records[1]
    assert (created_record["request_id"], created_record["principal"]) == (created.request_id, "alice")
    assert created_record["data"]["container_id"] == "fake-kernel-0"
    for record in sink.records[2:]:
        assert record["data"]["session_id"] == sid
    assert sink.records[0]["data"]["session_id"] == sid
    assert sink.records[0]["data"]["session"]["mode"] == "kernel"


def test_another_principals_session_is_exactly_an_unknown_one(gateway: Gateway) -> None:
    sid = create(gateway, "alice")
    foreign = gateway.sessions.execute(sid, {"code": "1", "principal": "bob"})
    unknown = gateway.sessions.execute("no-such-session", {"code": "1", "principal": "bob"})
    assert type(foreign.error) is type(unknown.error) is SessionNotFoundError
    assert http_status_for(foreign.error) == 404  # type: ignore[arg-type]
    assert foreign.to_dict()["error"]["code"] == unknown.to_dict()["error"]["code"] == "session.not_found"
    assert foreign.decision is None  # nothing decided, nothing ran in alice's kernel
    with pytest.raises(SessionNotFoundError):
        gateway.sessions.get(sid, principal="bob")
    with pytest.raises(SessionNotFoundError):
        gateway.sessions.close(sid, principal="bob")
    assert gateway.sessions.list(principal="bob") == []
    assert [s.session_id for s in gateway.sessions.list(principal="alice")] == [sid]
    assert gateway.sessions.get(sid, principal="alice").state == "ready"


def test_two_sessions_of_one_principal_do_not_share_state(gateway: Gateway) -> None:
    a, b = create(gateway), create(gateway)
    gateway.sessions.execute(a, {"code": "x = 1", "principal": "alice"})
    result = gateway.sessions.execute(b, {"code": "x", "principal": "alice"})
    assert result.outcome is not None
    assert (result.error, result.outcome.exit_code) == (None, 1)  # NameError in b: its namespace is its own
    assert b"NameError" in result.outcome.stderr


def test_the_live_session_limit_counts_live_sessions_only(gateway: Gateway) -> None:
    first, _second = create(gateway), create(gateway)  # the example policy: max_per_principal 2
    third = gateway.sessions.create({"mode": "kernel", "principal": "alice"})
    assert not third.allowed
    assert third.session is None
    assert "sessions.count" in {v.rule for v in third.decision.violations}  # type: ignore[union-attr]
    assert third.exit_status == 77
    create(gateway, "bob")  # another principal's count is its own
    gateway.sessions.close(first, principal="alice")
    create(gateway)  # a closed session no longer counts


def test_concurrent_creations_cannot_both_pass_the_limit(gateway: Gateway) -> None:
    create(gateway)
    results: list[Any] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(gateway.sessions.create({"mode": "kernel", "principal": "alice"}))
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.allowed for r in results) == [False, False, False, True]


def test_a_cell_asking_for_more_than_the_profile_is_denied(gateway: Gateway, runner: KernelFakeRunner) -> None:
    sid = create(gateway, limits={"memory": "128m"})
    result = gateway.sessions.execute(sid, {"code": "1", "principal": "alice", "limits": {"memory": "256m"}})
    assert not result.allowed
    assert [v.rule for v in result.decision.violations] == ["sessions.profile"]  # type: ignore[union-attr]
    assert result.exit_status == 77
    assert runner.kernels[0].cells == []


def test_a_cells_deadline_is_its_decided_timeout(gateway: Gateway, runner: KernelFakeRunner) -> None:
    sid = create(gateway, limits={"timeout_s": 20})
    gateway.sessions.execute(sid, {"code": "1", "principal": "alice", "limits": {"timeout_s": 3}})
    gateway.sessions.execute(sid, {"code": "2", "principal": "alice"})
    assert [t for _, t in runner.kernels[0].cells] == [3, 20]


def test_a_second_execution_meanwhile_is_refused_busy(gateway: Gateway, runner: KernelFakeRunner) -> None:
    sid = create(gateway)
    first: list[Any] = []
    worker = threading.Thread(
        target=lambda: first.append(gateway.sessions.execute(sid, {"code": "wait", "principal": "alice"}))
    )
    worker.start()
    assert runner.kernels[0].entered.wait(10)
    busy = gateway.sessions.execute(sid, {"code": "1", "principal": "alice"})
    assert isinstance(busy.error, SessionBusyError)
    assert (busy.error.code, http_status_for(busy.error)) == ("session.busy", 409)
    assert gateway.sessions.get(sid, principal="alice").state == "busy"
    runner.kernels[0].release.set()
    worker.join()
    assert first[0].error is None


def test_idle_and_lifetime_expiry_by_the_sweep(gateway: Gateway, sink: MemoryAuditSink, clock: Clock) -> None:
    idle = create(gateway, idle_s=60, lifetime_s=1000)
    used = create(gateway, idle_s=60, lifetime_s=100)
    clock.now += 50
    gateway.sessions.execute(used, {"code": "1", "principal": "alice"})  # idle counts from here
    assert gateway.sessions.sweep() == []
    clock.now += 15
    assert gateway.sessions.sweep() == [idle]
    clock.now += 40  # 105 s after ready: past used's lifetime, though used 55 s ago
    assert gateway.sessions.sweep() == [used]
    ends = [
        (r["data"]["session_id"], r["data"]["reason"]) for r in sink.records if r["event_type"] == "session.expired"
    ]
    assert ends == [(idle, "idle"), (used, "lifetime")]
    gone = gateway.sessions.execute(idle, {"code": "1", "principal": "alice"})
    assert isinstance(gone.error, SessionGoneError)
    assert "expired (idle)" in gone.error.message
    assert (http_status_for(gone.error), exit_code_for(gone.error)) == (410, 2)


def test_a_due_session_is_expired_when_used_before_the_sweep(gateway: Gateway, clock: Clock) -> None:
    sid = create(gateway, idle_s=10)
    clock.now += 11
    result = gateway.sessions.execute(sid, {"code": "1", "principal": "alice"})
    assert isinstance(result.error, SessionGoneError)


def test_a_kernel_killed_in_a_cell_ends_the_session(gateway: Gateway, sink: MemoryAuditSink) -> None:
    sid = create(gateway)
    result = gateway.sessions.execute(sid, {"code": "kill:memory", "principal": "alice"})
    assert result.session_ended == "memory"
    assert result.to_dict()["session_ended"] == "memory"
    (killed,) = [r for r in sink.records if r["event_type"] == "session.killed"]
    assert (killed["data"]["session_id"], killed["data"]["reason"], killed["principal"]) == (sid, "memory", "alice")
    later = gateway.sessions.execute(sid, {"code": "1", "principal": "alice"})
    assert isinstance(later.error, SessionGoneError)
    assert "killed (memory)" in later.error.message


def test_close_removes_the_kernel_once_and_operators_see_and_close_any(
    gateway: Gateway, sink: MemoryAuditSink, runner: KernelFakeRunner
) -> None:
    mine, theirs = create(gateway, "alice"), create(gateway, "bob")
    assert {s.session_id for s in gateway.sessions.list(principal=None, operator=True)} == {mine, theirs}
    gateway.sessions.close(mine, principal="alice")
    gateway.sessions.close(theirs, principal="ops", operator=True)
    with pytest.raises(SessionGoneError):
        gateway.sessions.close(mine, principal="alice")
    assert [k.killed for k in runner.kernels] == ["closed", "closed"]
    ends = [(r["data"]["session_id"], r["data"]["reason"]) for r in sink.records if r["event_type"] == "session.closed"]
    assert ends == [(mine, "owner"), (theirs, "operator")]


def test_the_gateways_close_closes_every_live_session(gateway: Gateway, sink: MemoryAuditSink) -> None:
    sid = create(gateway)
    gateway.close()
    assert events(sink)[-2:] == ["session.closed", "gateway.stop"]
    assert sink.records[-2]["data"] == {
        "session_id": sid, "mode": "kernel", "reason": "gateway_stop", "container_id": "fake-kernel-0",
        "executions": 0,
    }  # fmt: skip


def test_a_denied_mode_and_a_policy_without_sessions_deny_with_rule_ids(tmp_path: Path, sink: MemoryAuditSink) -> None:
    gw = Gateway(load_policy(default_policy_path()), runner=KernelFakeRunner(), audit=sink,
                 slots=HostSlots(tmp_path / "s", 2, wait_s=0))  # fmt: skip
    result = gw.sessions.create({"mode": "kernel"})
    assert not result.allowed
    assert "sessions.enabled" in {v["rule"] for v in result.to_dict()["violations"]}
    assert events(sink) == ["policy.decision"]
    assert sink.records[0]["data"]["decision"]["allowed"] is False


def test_workspace_mode_without_a_workspace_store_fails_closed(gateway: Gateway, sink: MemoryAuditSink) -> None:
    result = gateway.sessions.create({"mode": "workspace", "principal": "alice"})
    assert result.error is not None
    assert result.error.code == "session.unavailable"
    assert "backend cannot keep workspaces" in result.error.message
    assert events(sink) == ["policy.decision", "execution.outcome"]  # the decision is closed, not left open
    assert gateway.sessions.list(principal="alice") == []


def test_an_invalid_session_request_is_audited(gateway: Gateway, sink: MemoryAuditSink) -> None:
    result = gateway.sessions.create({"mode": "notebook"})
    assert result.error is not None
    assert result.error.code == "request.invalid"
    assert events(sink) == ["request.invalid"]


def test_the_trail_validates_against_the_schema(gateway: Gateway, sink: MemoryAuditSink) -> None:
    import jsonschema

    from gateway.resources import load_schema

    sid = create(gateway)
    gateway.sessions.execute(sid, {"code": "1", "principal": "alice"})
    gateway.sessions.execute(sid, {"code": "kill:exited", "principal": "alice"})
    validator = jsonschema.Draft202012Validator(load_schema("audit-record"))
    for record in sink.records:
        assert not list(validator.iter_errors(record)), record["event_type"]


def test_no_session_is_created_once_the_gateway_closed(gateway: Gateway, sink: MemoryAuditSink) -> None:
    gateway.sessions.close_all()
    result = gateway.sessions.create({"mode": "kernel", "principal": "alice"})
    assert result.error is not None
    assert result.error.code == "session.unavailable"
    assert events(sink)[-2:] == ["policy.decision", "execution.outcome"]


def test_a_kernel_that_cannot_open_closes_its_decision_and_counts_for_nothing(
    tmp_path: Path, sink: MemoryAuditSink
) -> None:
    class Failing(KernelFakeRunner):
        def open_kernel(self, spec: RunSpec, *, slot: Slot | None = None, **kw: Any) -> FakeKernel:
            if slot is not None:
                slot.release()  # the contract: released at once when opening fails
            raise SandboxError("the engine refused the kernel's container")

    gw = Gateway(
        load_policy(SESSIONS_POLICY), runner=Failing(), audit=sink, slots=HostSlots(tmp_path / "s", 2, wait_s=0)
    )
    for _ in range(3):  # max_per_principal 2: a failed opening holds no place
        result = gw.sessions.create({"mode": "kernel", "principal": "alice"})
        assert result.error is not None
        assert result.error.code == "runner.sandbox_failed"
    outcome = sink.records[-1]
    assert (outcome["event_type"], outcome["data"]["error"]["code"]) == ("execution.outcome", "runner.sandbox_failed")
    assert outcome["request_id"] == result.request_id
    assert gw.sessions.list(principal="alice") == []


def test_workspace_mode_runs_each_execution_fresh_over_the_sessions_workspace(
    tmp_path: Path, sink: MemoryAuditSink
) -> None:
    runner = KernelFakeRunner()
    store = FakeWorkspaces()
    runner.workspaces = store  # type: ignore[attr-defined]
    gw = Gateway(load_policy(SESSIONS_POLICY), runner=runner, audit=sink, slots=HostSlots(tmp_path / "s", 2, wait_s=0))
    created = gw.sessions.create({"mode": "workspace", "principal": "alice", "workspace_size": "32m"})
    assert created.session is not None
    sid = created.session.session_id
    (workspace,) = store.live
    assert (workspace.size, workspace.uid, workspace.gid) == (32 << 20, 65534, 65534)
    for code in ("open('a', 'w').write('1')", "print(open('a').read())"):
        result = gw.sessions.execute(sid, {"code": code, "principal": "alice", "files": {"in.txt": "x"}})
        assert (result.allowed, result.session_id, result.error) == (True, sid, None)
    assert [spec.workspace for spec, _ in runner.calls] == [workspace, workspace]
    assert dict(runner.calls[1][1].files) == {"in.txt": b"x"}
    assert runner.kernels == []
    gw.sessions.close(sid, principal="alice")
    assert store.destroyed == [workspace]
    assert [r["event_type"] for r in sink.records][-1] == "session.closed"


def test_a_workspace_in_use_is_destroyed_when_its_execution_ends(tmp_path: Path, sink: MemoryAuditSink) -> None:
    held = HeldRun()

    runner = KernelFakeRunner(outcome=held)
    store = FakeWorkspaces()
    runner.workspaces = store  # type: ignore[attr-defined]
    gw = Gateway(load_policy(SESSIONS_POLICY), runner=runner, audit=sink, slots=HostSlots(tmp_path / "s", 2, wait_s=0))
    created = gw.sessions.create({"mode": "workspace", "principal": "alice"})
    assert created.session is not None
    sid = created.session.session_id
    worker = threading.Thread(target=gw.sessions.execute, args=(sid, {"code": "1", "principal": "alice"}))
    worker.start()
    assert held.entered.wait(10)
    busy = gw.sessions.execute(sid, {"code": "2", "principal": "alice"})
    assert isinstance(busy.error, SessionBusyError)
    gw.sessions.close(sid, principal="alice")
    assert store.destroyed == []  # a container still uses it
    held.release.set()
    worker.join()
    assert len(store.destroyed) == 1
    assert store.live == []


def test_the_sweeper_starts_with_the_first_session_and_ends_idle_ones(gateway: Gateway, clock: Clock) -> None:
    gateway.sessions = SessionManager(gateway, clock=clock, sweep_every_s=0.01)
    sid = create(gateway, idle_s=5)
    clock.now += 6
    swept = threading.Event()
    for _ in range(1000):  # bounded: the sweeper's next tick ends it
        if not gateway.sessions.list(principal="alice"):
            swept.set()
            break
        threading.Event().wait(0.01)
    assert swept.is_set()
    with pytest.raises(SessionGoneError, match=r"expired \(idle\)"):
        gateway.sessions.get(sid, principal="alice")
    gateway.sessions.close_all()


def test_a_session_id_never_starts_with_a_dash_so_no_tool_reads_it_as_an_option() -> None:
    ids = [new_session_id() for _ in range(2000)]  # with one id in 64 starting with "-", 2000 miss it ~1e-14
    assert not [sid for sid in ids if sid.startswith("-")]
    assert {len(sid) for sid in ids} == {32}
    assert len(set(ids)) == len(ids)


def test_a_cells_files_and_env_reach_its_kernel_only_when_the_policy_allows_them(
    gateway: Gateway, runner: KernelFakeRunner
) -> None:
    sid = create(gateway)
    body = {"principal": "alice", "files": {"in.bin": b"\x00\xff", "a.txt": "text"}, "env": {"APP_X": "1"}}
    given = gateway.sessions.execute(sid, {"code": "1", **body})
    assert (given.allowed, given.error) == (True, None)
    denied = gateway.sessions.execute(sid, {"code": "2", "principal": "alice", "env": {"LD_PRELOAD": "/x.so"}})
    assert not denied.allowed  # decided as a run's env: the kernel never sees the cell
    assert runner.kernels[0].given == [({"in.bin": b"\x00\xff", "a.txt": b"text"}, {"APP_X": "1"})]

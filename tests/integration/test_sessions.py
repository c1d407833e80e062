"""Sessions against the real engine, through the Gateway's session manager: a kernel session's state persists
across cells, belongs to its principal alone, stays within its policy's limits, ends (closed, expired, killed,
the gateway's stop, the gateway's death) with its container really gone, and the trail says so and verifies.
State, isolation and close under runc and gVisor (runsc); the rest under runc."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit import verify_trail
from gateway.cli import main
from gateway.errors import SessionGoneError, SessionNotFoundError
from gateway.runner.docker.runner import DockerRunner
from gateway.service.lifecycle import reap_stale
from tests.integration.session_checks import Clock, Gateways, assert_gone, sessions_policy_text

pytestmark = pytest.mark.integration


def sessions_policy(directory: Path, runtime: str) -> Path:
    """Workspace and kernel sessions, two per principal."""
    path = directory / f"sessions-{runtime}.yaml"
    path.write_text(sessions_policy_text("sessions", runtime))
    return path


@pytest.fixture
def make_gateway(tmp_path: Path, engine: Any) -> Iterator[Callable[..., Gateway]]:
    """Gateways over one trail (``tmp_path/audit``), each with its session manager on ``clock``; closed at the
    end (which closes their sessions)."""
    gateways = Gateways(tmp_path)

    def make(runtime: str = "runc", clock: Clock | None = None, workspace_root: str | None = None) -> Gateway:
        runner = DockerRunner(engine, workspace_root=workspace_root)
        gw = gateways.make(sessions_policy(tmp_path, runtime), runner, clock=clock)
        gw.__enter__()
        return gw

    yield make
    gateways.close()


def records(tmp_path: Path, event_type: str) -> list[dict[str, Any]]:
    import json

    return [
        json.loads(line)
        for seg in sorted((tmp_path / "audit").glob("trail-*.jsonl"))
        for line in seg.read_bytes().splitlines()
        if f'"event_type":"{event_type}"'.encode() in line
    ]


def create(gw: Gateway, principal: str = "alice", **body: Any) -> tuple[str, str]:
    result = gw.sessions.create({"mode": "kernel", "principal": principal, **body})
    assert result.allowed, result.to_dict()
    assert result.session is not None
    assert result.session.container_id is not None
    return result.session.session_id, result.session.container_id


def cell(gw: Gateway, sid: str, code: str, principal: str = "alice", **body: Any) -> Any:
    return gw.sessions.execute(sid, {"code": code, "principal": principal, **body})


def test_state_persists_across_cells_and_close_removes_the_container(
    make_gateway: Callable[..., Gateway], runtime: str, engine: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    gw = make_gateway(runtime)
    sid, container = create(gw)
    assert engine.api.inspect_container(container)["HostConfig"]["Runtime"] == runtime
    first = cell(gw, sid, "import json\nstate = {'n': 41}\nprint(2+2)")
    second = cell(gw, sid, "state['n'] += 1\nopen('out/s.json', 'w').write(json.dumps(state))\nstate['n']")
    assert (first.exit_status, first.outcome.stdout, first.value) == (0, b"4\n", None)
    assert (second.exit_status, second.value, dict(second.outcome.files)) == (0, "42", {"s.json": b'{"n": 42}'})
    assert second.to_dict()["session_id"] == sid
    gw.sessions.close(sid, principal="alice")
    assert_gone(engine, container)
    later = cell(gw, sid, "state")
    assert isinstance(later.error, SessionGoneError)
    gw.close()
    kinds = [r["event_type"] for r in records(tmp_path, "session.created") + records(tmp_path, "session.closed")]
    assert kinds == ["session.created", "session.closed"]
    outcomes = records(tmp_path, "execution.outcome")
    assert [o["data"]["session_id"] for o in outcomes] == [sid, sid]
    assert verify_trail(tmp_path / "audit").ok
    assert main(["audit", "verify", str(tmp_path / "audit")]) == 0
    capsys.readouterr()


def test_another_principal_gets_not_found_and_two_sessions_share_nothing(
    make_gateway: Callable[..., Gateway],
) -> None:
    gw = make_gateway()
    a, _ = create(gw, "alice")
    b, _ = create(gw, "alice")
    cell(gw, a, "secret = 'a'\nopen('mine.txt', 'w').write('a')")
    foreign = cell(gw, a, "secret", principal="bob")
    unknown = cell(gw, "x" * 32, "secret", principal="bob")
    assert type(foreign.error) is type(unknown.error) is SessionNotFoundError
    with pytest.raises(SessionNotFoundError):
        gw.sessions.get(a, principal="bob")
    other = cell(gw, b, "import os\nprint(os.path.exists('mine.txt'))\nsecret")
    assert other.outcome.stdout == b"False\n"
    assert other.outcome.exit_code == 1
    assert b"NameError" in other.outcome.stderr
    assert cell(gw, a, "secret").value == "'a'"


def test_limits_the_live_session_count_and_the_profile(make_gateway: Callable[..., Gateway], engine: Any) -> None:
    gw = make_gateway()
    first, container = create(gw, limits={"memory": "128m"})
    create(gw)
    third = gw.sessions.create({"mode": "kernel", "principal": "alice"})
    assert "sessions.count" in {v.rule for v in third.decision.violations}
    more = cell(gw, first, "1", limits={"memory": "256m"})
    assert [v.rule for v in more.decision.violations] == ["sessions.profile"]
    assert more.outcome is None
    assert engine.api.inspect_container(container)["HostConfig"]["Memory"] == 128 << 20


def test_idle_and_lifetime_expiry_remove_the_container(
    make_gateway: Callable[..., Gateway], engine: Any, tmp_path: Path
) -> None:
    clock = Clock()
    gw = make_gateway(clock=clock)
    idle, idle_container = create(gw, idle_s=30)
    old, old_container = create(gw, idle_s=600, lifetime_s=60)
    clock.now += 31
    assert gw.sessions.sweep() == [idle]
    assert_gone(engine, idle_container)
    assert cell(gw, old, "1").value == "1"
    clock.now += 30
    assert gw.sessions.sweep() == [old]
    assert_gone(engine, old_container)
    reasons = [r["data"]["reason"] for r in records(tmp_path, "session.expired")]
    assert reasons == ["idle", "lifetime"]


def test_a_kernel_killed_in_a_cell_ends_the_session(
    make_gateway: Callable[..., Gateway], engine: Any, tmp_path: Path
) -> None:
    gw = make_gateway()
    sid, container = create(gw)
    result = cell(
        gw, sid, "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
        limits={"timeout_s": 1},
    )  # fmt: skip
    assert result.session_ended == "interrupt_ignored"
    assert result.outcome.timed_out
    assert_gone(engine, container)
    (killed,) = records(tmp_path, "session.killed")
    assert (killed["data"]["session_id"], killed["data"]["reason"]) == (sid, "interrupt_ignored")
    later = cell(gw, sid, "1")
    assert isinstance(later.error, SessionGoneError)
    assert "killed (interrupt_ignored)" in later.error.message


def test_the_gateways_stop_closes_its_sessions(
    make_gateway: Callable[..., Gateway], engine: Any, tmp_path: Path
) -> None:
    gw = make_gateway()
    _, container = create(gw)
    gw.close()
    assert_gone(engine, container)
    (closed,) = records(tmp_path, "session.closed")
    assert closed["data"]["reason"] == "gateway_stop"


def test_a_killed_gateways_session_is_gone_after_the_next_start(
    engine: Any, tmp_path: Path, make_gateway: Callable[..., Gateway], workspace_root: str
) -> None:
    opener = (
        "import sys, time\n"
        "from gateway import Gateway\n"
        "gw = Gateway.from_env(sys.argv[1], sys.argv[2]).__enter__()\n"
        "result = gw.sessions.create({'mode': 'kernel', 'principal': 'alice'})\n"
        "print(result.session.container_id, flush=True)\n"
        "time.sleep(300)\n"
    )
    policy = sessions_policy(tmp_path, "runc")
    # an instance of its own (host-pid-random, not this session's GATEWAY_INSTANCE), so that once killed it is a
    # dead instance, and the kernel's workspace under the fixture's root
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_INSTANCE"}
    env["GATEWAY_WORKSPACE_DIR"] = workspace_root
    proc = subprocess.Popen(
        [sys.executable, "-c", opener, str(policy), str(tmp_path / "audit")], stdout=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        container = proc.stdout.readline().strip()
        assert engine.api.inspect_container(container)["State"]["Running"]
    finally:
        proc.kill()  # SIGKILL: no close, no session.closed
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert os.listdir(workspace_root)  # the killed gateway's kernel left its workspace behind
    gw = make_gateway(workspace_root=workspace_root)  # its start marks the session killed (gateway_gone)
    reap_stale(gw)  # the start-up reap: dead instances' containers (this one ended itself) and workspaces
    assert_gone(engine, container)
    assert os.listdir(workspace_root) == []
    (created,) = records(tmp_path, "session.created")
    (killed,) = records(tmp_path, "session.killed")
    assert killed["data"]["session_id"] == created["data"]["session_id"]
    assert killed["data"]["reason"] == "gateway_gone"
    assert records(tmp_path, "session.closed") == []
    assert verify_trail(tmp_path / "audit").ok


def test_a_workspace_session_keeps_its_files_across_fresh_containers_until_closed(
    make_gateway: Callable[..., Gateway], runtime: str, workspace_root: str, engine: Any, tmp_path: Path
) -> None:
    gw = make_gateway(runtime, workspace_root=workspace_root)
    created = gw.sessions.create({"mode": "workspace", "principal": "alice", "workspace_size": "16m"})
    assert created.session is not None, created.to_dict()
    sid = created.session.session_id
    (space,) = os.listdir(workspace_root)
    first = cell(gw, sid, "open('keep.txt', 'w').write('hello')\nopen('out/a.txt', 'w').write('1')")
    second = cell(gw, sid, "print(open('keep.txt').read())", files={"in.txt": "x"})
    assert (first.exit_status, dict(first.outcome.files)) == (0, {"a.txt": b"1"})
    assert (second.exit_status, second.outcome.stdout, second.value) == (0, b"hello\n", None)
    assert first.outcome.container_id != second.outcome.container_id  # each execution a fresh container
    for container in (first.outcome.container_id, second.outcome.container_id):
        assert_gone(engine, container)
    other = gw.sessions.create({"mode": "workspace", "principal": "alice", "workspace_size": "16m"})
    assert other.session is not None
    alone = cell(gw, other.session.session_id, "import os\nprint(os.path.exists('keep.txt'))")
    assert alone.outcome.stdout == b"False\n"
    gw.sessions.close(sid, principal="alice")
    assert space not in os.listdir(workspace_root)
    gone = cell(gw, sid, "1")
    assert isinstance(gone.error, SessionGoneError)
    gw.close()
    assert os.listdir(workspace_root) == []
    assert verify_trail(tmp_path / "audit").ok


def test_a_request_file_is_never_written_through_a_link_an_earlier_execution_planted(
    make_gateway: Callable[..., Gateway], runtime: str, workspace_root: str
) -> None:
    """An execution plants ``data -> /tmp`` in the persistent workspace; the next request's file ``data/x`` is
    refused (the link is not followed), and no file appears where the link points."""
    gw = make_gateway(runtime, workspace_root=workspace_root)
    created = gw.sessions.create({"mode": "workspace", "principal": "alice", "workspace_size": "16m"})
    assert created.session is not None, created.to_dict()
    sid = created.session.session_id
    planted = cell(gw, sid, "import os\nos.symlink('/tmp', 'data')\nos.symlink('/tmp/y', 'y')")
    assert planted.exit_status == 0, planted.to_dict()
    through = cell(gw, sid, "import os\nprint(os.path.exists('/tmp/x'))", files={"data/x": "planted"})
    assert not through.ran or through.outcome.stdout != b"True\n", through.to_dict()
    assert through.error is not None, through.to_dict()
    assert "data/x" in through.error.message, through.to_dict()
    replaced = cell(gw, sid, "import os\nprint(os.path.islink('y'), open('y').read())", files={"y": "mine"})
    assert replaced.outcome.stdout == b"False mine\n", replaced.to_dict()
    after = cell(gw, sid, "import os\nprint(os.path.islink('data'))")
    assert after.outcome.stdout == b"True\n"  # the planted link is the program's own, left as it made it

"""A workspace session's next container made ahead (gateway.sessions.ahead), on the real engine: each execution is
served by a fresh container started before it came, bound to the session's workspace (runc and runsc); other
limits run cold; a run waiting for a slot takes the prepared container's; every end of a session leaves no
container, mount or loop device; hostile code in one execution cannot reach the container prepared beside it.

What the tests observe is the engine's (which containers of this gateway hold the workspace) and each
execution's ``pool`` (``hit``: served by the container made ahead), never timing."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway, PoolConfig
from gateway.audit import verify_trail
from gateway.hostfs import mount_points_below
from gateway.runner.docker.options import INSTANCE_LABEL
from gateway.runner.docker.runner import DockerRunner
from gateway.slots import HostSlots
from tests.integration.conftest import loops_backing
from tests.integration.session_checks import Clock, Gateways, assert_gone, sessions_policy_text

pytestmark = pytest.mark.integration

PROCESSES = "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()) == [1, os.getpid()])\n"
"""Prints whether the program sees no process but its container's supervisor (PID 1) and itself."""


def policy_file(directory: Path, runtime: str) -> Path:
    """Workspace sessions only, four per principal."""
    path = directory / f"ahead-{runtime}.yaml"
    path.write_text(
        sessions_policy_text(
            "ahead", runtime, modes="[workspace]", per_principal=4, workspace_size="{default: 16m, max: 64m}"
        )
    )
    return path


@pytest.fixture
def make_gateway(tmp_path: Path, engine: Any, workspace_root: str) -> Iterator[Callable[..., Gateway]]:
    """Gateways with a warm pool that keeps nothing for plain runs (size 0: only sessions make containers ahead),
    over one trail; closed at the end."""
    gateways = Gateways(tmp_path)

    def make(runtime: str = "runc", *, slots: int = 8, clock: Clock | None = None) -> Gateway:
        runner = DockerRunner(engine, workspace_root=workspace_root)
        return gateways.make(policy_file(tmp_path, runtime), runner, slots=slots, clock=clock, pool=PoolConfig())

    yield make
    gateways.close()


def holders(engine: Any, gw: Gateway, workspace: str) -> list[str]:
    """Ids of this gateway's containers that have ``workspace`` bound (running or not)."""
    instance = gw.runner.instance  # type: ignore[attr-defined]
    found = engine.api.containers(all=True, filters={"label": f"{INSTANCE_LABEL}={instance}"})
    return [str(c["Id"]) for c in found if any(m.get("Source") == workspace for m in c.get("Mounts") or ())]


def wait_for(what: str, check: Callable[[], Any]) -> Any:
    """``check()`` once it is true (bounded: a minute)."""
    for _ in range(600):
        got = check()
        if got:
            return got
        threading.Event().wait(0.1)
    raise AssertionError(f"{what}: not so after a minute")


def one_prepared(engine: Any, gw: Gateway, workspace: str, not_: tuple[str | None, ...] = ()) -> str:
    """The one container made ahead over ``workspace`` (none of ``not_``), once it is there."""
    found = wait_for(
        "a container made ahead", lambda: [c for c in holders(engine, gw, workspace) if c not in not_] or None
    )
    assert len(found) == 1, found
    return str(found[0])


def create(gw: Gateway, **body: Any) -> tuple[str, str]:
    """A workspace session of alice: its id and its workspace's host path."""
    before = set(_workspaces(gw))
    result = gw.sessions.create({"mode": "workspace", "principal": "alice", **body})
    assert result.session is not None, result.to_dict()
    (name,) = set(_workspaces(gw)) - before
    return result.session.session_id, os.path.join(gw.runner.workspaces.root, name, "mnt")  # type: ignore[attr-defined]


def _workspaces(gw: Gateway) -> list[str]:
    root = gw.runner.workspaces.root  # type: ignore[attr-defined]
    return os.listdir(root) if os.path.isdir(root) else []


def execute(gw: Gateway, sid: str, code: str, **body: Any) -> Any:
    result = gw.sessions.execute(sid, {"code": code, "principal": "alice", **body})
    assert result.error is None, result.to_dict()
    assert result.outcome is not None
    return result.outcome


def assert_nothing_left(engine: Any, gw: Gateway, workspace: str, workspace_root: str) -> None:
    """No container holds ``workspace``, which is unmounted and deleted with its loop device."""
    assert holders(engine, gw, workspace) == []
    assert not os.path.exists(os.path.dirname(workspace))
    assert workspace not in mount_points_below(workspace_root)
    assert not [loop for loop in loops_backing(workspace_root) if os.path.dirname(workspace) in loop]


def test_each_execution_is_served_by_a_fresh_container_made_ahead_over_the_workspace(
    make_gateway: Callable[..., Gateway], runtime: str, engine: Any, workspace_root: str, tmp_path: Path
) -> None:
    gw = make_gateway(runtime)
    sid, workspace = create(gw)
    first_made = one_prepared(engine, gw, workspace)
    first = execute(gw, sid, "open('n.txt', 'w').write('1')\nopen('out/a.txt', 'w').write('a')")
    assert (first.pool, first.container_id, first.exit_code, dict(first.files)) == (
        "hit",
        first_made,
        0,
        {"a.txt": b"a"},
    )
    second_made = one_prepared(engine, gw, workspace, not_=(first_made,))  # begun while the first one ran
    second = execute(gw, sid, "import os\nprint(open('n.txt').read(), os.listdir('out'))")
    # the state is the workspace's; out/ is emptied before each execution; each execution a container of its own
    assert (second.pool, second.container_id, second.stdout) == ("hit", second_made, b"1 []\n")
    for container in (first_made, second_made):
        assert_gone(engine, container)
    gw.sessions.close(sid, principal="alice")
    assert_nothing_left(engine, gw, workspace, workspace_root)
    gw.close()
    assert loops_backing(workspace_root) == []
    assert verify_trail(tmp_path / "audit").ok


def test_an_execution_with_other_limits_runs_cold_and_its_own_deadline_holds_in_a_container_made_ahead(
    make_gateway: Callable[..., Gateway], engine: Any, workspace_root: str
) -> None:
    gw = make_gateway()
    sid, workspace = create(gw)
    one_prepared(engine, gw, workspace)
    late = execute(gw, sid, "open('n.txt', 'w').write('1')\nimport time\ntime.sleep(60)", limits={"timeout_s": 1})
    assert (late.pool, late.timed_out, late.exit_code) == ("hit", True, None)  # the timeout is this execution's
    made = one_prepared(engine, gw, workspace, not_=(late.container_id,))
    other = execute(gw, sid, "print(open('n.txt').read())", limits={"pids": 32})
    assert (other.pool, other.exit_code, other.stdout) == ("miss", 0, b"1\n")  # another profile: a cold container
    assert_gone(engine, made)  # the container made for the other profile was removed
    again = execute(gw, sid, "print(2+2)", limits={"pids": 32})
    assert (again.pool, again.stdout) == ("hit", b"4\n")  # the next one was made for the limits last asked for
    gw.sessions.close(sid, principal="alice")
    assert_nothing_left(engine, gw, workspace, workspace_root)


def test_a_run_waiting_for_a_slot_takes_the_slot_of_the_container_made_ahead(
    make_gateway: Callable[..., Gateway], engine: Any, workspace_root: str, tmp_path: Path
) -> None:
    gw = make_gateway(slots=2)
    sid, workspace = create(gw)
    made = one_prepared(engine, gw, workspace)  # it holds one of the host's two slots
    held = HostSlots(tmp_path / "slots", 2).try_take()  # another run holds the other one
    assert held is not None
    with held:
        run = gw.execute({"code": "print(2+2)", "principal": "alice"})  # waits for a slot: given the prepared one's
        assert (run.error, run.outcome and run.outcome.stdout) == (None, b"4\n")
        assert_gone(engine, made)
    after = execute(gw, sid, "print(2+2)")
    assert (after.pool, after.stdout) == ("miss", b"4\n")  # none was made ahead meanwhile: it ran cold
    gw.sessions.close(sid, principal="alice")
    assert_nothing_left(engine, gw, workspace, workspace_root)


def test_close_expiry_and_the_gateways_stop_leave_no_container_mount_or_loop_device(
    make_gateway: Callable[..., Gateway], engine: Any, workspace_root: str, tmp_path: Path
) -> None:
    clock = Clock()
    gw = make_gateway(clock=clock)
    sessions = [create(gw, idle_s=idle) for idle in (600, 60, 600)]
    for sid, workspace in sessions:
        one_prepared(engine, gw, workspace)
        ran = execute(gw, sid, "print(2+2)")
        assert ran.pool == "hit"
        one_prepared(engine, gw, workspace, not_=(ran.container_id,))  # the next one, made while that ran
    (closed, closed_ws), (expired, expired_ws), (_, stopped_ws) = sessions
    gw.sessions.close(closed, principal="alice")
    assert_nothing_left(engine, gw, closed_ws, workspace_root)
    clock.now += 61
    assert gw.sessions.sweep() == [expired]
    assert_nothing_left(engine, gw, expired_ws, workspace_root)
    assert holders(engine, gw, stopped_ws) != []
    gw.close()
    assert_nothing_left(engine, gw, stopped_ws, workspace_root)
    instance = gw.runner.instance  # type: ignore[attr-defined]
    assert engine.api.containers(all=True, filters={"label": f"{INSTANCE_LABEL}={instance}"}) == []
    assert (os.listdir(workspace_root), mount_points_below(workspace_root), loops_backing(workspace_root)) == (
        [], [], []
    )  # fmt: skip
    assert verify_trail(tmp_path / "audit").ok


def test_hostile_code_cannot_reach_the_container_made_ahead_beside_it(
    make_gateway: Callable[..., Gateway], runtime: str, engine: Any, workspace_root: str
) -> None:
    gw = make_gateway(runtime)
    sid, workspace = create(gw)
    made = one_prepared(engine, gw, workspace)
    hostile = (
        "import os, signal, time\n"
        "time.sleep(3)\n"  # the next container is being made meanwhile
        f"{PROCESSES}"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid())]:\n"
        "    try:\n"
        "        os.kill(int(pid), signal.SIGKILL)\n"
        "    except OSError:\n"
        "        pass\n"
        "try:\n"
        "    os.kill(-1, signal.SIGKILL)\n"  # everything it may signal but itself
        "except OSError:\n"
        "    pass\n"
        "import shutil\n"
        "shutil.rmtree('out')\n"
        "os.symlink('/proc/1/fd/1', 'out')\n"  # a trap for whatever empties out/ next
        "os.mkfifo('main.py.trap')\n"
        "print('done')\n"
    )
    first = execute(gw, sid, hostile)
    assert (first.pool, first.container_id, first.stdout) == ("hit", made, b"True\ndone\n")
    following = one_prepared(engine, gw, workspace, not_=(made,))
    second = execute(gw, sid, PROCESSES)
    assert (second.pool, second.container_id, second.exit_code, second.stdout) == ("hit", following, 0, b"True\n")
    gw.sessions.close(sid, principal="alice")
    assert_nothing_left(engine, gw, workspace, workspace_root)

"""Session workspaces on the real engine: a sparse ext4 image per workspace, loop-mounted by the gateway, bound at
``/workspace`` into fresh single-use containers (runc and runsc).

What must hold: a file written by one execution is there for the next; the size bound is the kernel's (the
program gets ENOSPC, the host keeps at most the image's size); two workspaces never see each other; destroy
removes the mount, the loop device and the image; the leftovers of a dead gateway instance are reaped (at start-up
and by ``gateway reap``) and audited; the host's file helpers follow no symlink out and refuse path tricks.
Every test's workspaces live under its own root, torn down (and checked free of loop devices) even on failure.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit.memory import MemoryAuditSink
from gateway.cli import main
from gateway.hostfs import mount_points_below
from gateway.payload import Payload
from gateway.policy import load_policy
from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.docker.workspace import (
    DockerWorkspaces,
    WorkspaceError,
    WorkspaceFileNotFoundError,
    WorkspaceFullError,
    WorkspacePathError,
    list_files,
)
from gateway.runner.interface import Outcome, RunSpec
from gateway.runner.workspace import Workspace
from gateway.service.lifecycle import reap_stale
from tests.integration.conftest import loops_backing

pytestmark = pytest.mark.integration

Options = Callable[..., dict[str, Any]]
MiB = 1 << 20


@pytest.fixture
def runtime_dir(workspace_root: str) -> str:
    """The runtime directory of this test's own (its workspaces' root below it), torn down by ``workspace_root``:
    every workspace reaped, its private mount undone and no loop device left backed by it."""
    return os.path.dirname(workspace_root)


@pytest.fixture
def store(runtime_dir: str, runner: DockerRunner) -> DockerWorkspaces:
    return DockerWorkspaces(runner.instance, root=f"{runtime_dir}/workspaces")


def _owner(options: dict[str, Any]) -> tuple[int, int]:
    uid, gid = str(options["user"]).split(":")
    return int(uid), int(gid)


def _run(runner: DockerRunner, options: dict[str, Any], ws: Workspace, code: str, **files: bytes) -> Outcome:
    spec = RunSpec(options, timeout_s=60, output_bytes=1 << 16, workspace=ws)
    return runner.execute(spec, Payload(code, files=files))


def test_a_file_written_in_one_execution_is_read_in_the_next(
    runner: DockerRunner, store: DockerWorkspaces, options_for: Options
) -> None:
    options = options_for()
    ws = store.create(8 * MiB, *_owner(options))
    try:
        first = _run(runner, options, ws, "open('keep.txt', 'w').write('hello')\nopen('out/a.txt', 'w').write('1')")
        assert (first.exit_code, dict(first.files)) == (0, {"a.txt": b"1"})
        second = _run(runner, options, ws, "import os\nprint(open('keep.txt').read(), sorted(os.listdir('out')))")
        # out/ is emptied before each execution: a run returns the files *it* wrote there
        assert (second.exit_code, second.stdout, dict(second.files)) == (0, b"hello []\n", {})
        third = _run(runner, options, ws, "print(open('keep.txt').read())", **{"keep.txt": b"replaced"})
        assert third.stdout == b"replaced\n"  # a request's file replaces the workspace's
        assert store.get(ws, "keep.txt", 100) == b"replaced"
    finally:
        store.destroy(ws)


def test_a_full_workspace_gives_the_program_enospc_and_the_host_keeps_its_bound(
    runner: DockerRunner, store: DockerWorkspaces, options_for: Options
) -> None:
    # a file-size limit below the workspace's size is raised to it: the file system is the bound (ENOSPC, not EFBIG)
    limits = [{**u, "soft": MiB, "hard": MiB} if u["name"] == "fsize" else u for u in options_for()["ulimits"]]
    options = options_for(ulimits=limits)
    ws = store.create(2 * MiB, *_owner(options))
    image = Path(ws.path).parent / "image"
    try:
        fill = (
            "import errno, os\n"
            "try:\n"
            "    with open('big', 'wb') as f:\n"
            "        for _ in range(64):\n"
            "            f.write(b'x' * 65536)\n"
            "            f.flush()\n"
            "            os.fsync(f.fileno())\n"
            "except OSError as exc:\n"
            "    print(errno.errorcode[exc.errno])\n"
        )
        outcome = _run(runner, options, ws, fill)
        assert (outcome.exit_code, outcome.stdout) == (0, b"ENOSPC\n")
        assert image.stat().st_blocks * 512 <= 2 * MiB  # the host holds no more than the bound
        # the workspace is still usable once the program frees space
        again = _run(runner, options, ws, "import os\nos.unlink('big')\nopen('small', 'w').write('ok')\nprint('ok')")
        assert again.stdout == b"ok\n"
    finally:
        store.destroy(ws)


def test_two_workspaces_cannot_see_each_other(
    runner: DockerRunner, store: DockerWorkspaces, make_options: Options
) -> None:
    options = make_options()
    one, two = store.create(4 * MiB, *_owner(options)), store.create(4 * MiB, *_owner(options))
    try:
        _run(runner, options, one, "open('secret', 'w').write('s1')")
        look = "import os\nprint(sorted(os.listdir('.')), open('/proc/self/mountinfo').read().count(' /workspace '))"
        outcome = _run(runner, options, two, look)
        assert outcome.stdout == b"['main.py', 'out'] 1\n"
        assert [f.path for f in list_files(two).files] == ["main.py"]
    finally:
        store.destroy(one)
        store.destroy(two)


def test_destroy_removes_the_mount_the_loop_device_and_the_image(
    runner: DockerRunner, store: DockerWorkspaces, make_options: Options, runtime_dir: str
) -> None:
    options = make_options()
    ws = store.create(4 * MiB, *_owner(options))
    directory = Path(ws.path).parent
    assert _run(runner, options, ws, "open('f', 'w').write('x')").exit_code == 0
    assert ws.path in mount_points_below(runtime_dir)
    assert len(loops_backing(runtime_dir)) == 1
    store.destroy(ws)
    assert ws.path not in mount_points_below(runtime_dir)
    assert loops_backing(runtime_dir) == []
    assert not directory.exists()
    store.destroy(ws)  # idempotent
    with pytest.raises(WorkspaceError, match="destroyed or reaped"):
        store.get(ws, "f", 10)


def _dead_instance() -> str:
    child = subprocess.Popen(["true"])
    child.wait()
    return f"{socket.gethostname()}-{child.pid}-deadbeef"


def test_the_start_up_reap_removes_a_dead_instances_workspace_and_audits_it(
    engine: Any, runtime_dir: str, make_options: Options
) -> None:
    root = f"{runtime_dir}/workspaces"
    dead = DockerWorkspaces(_dead_instance(), root=root)
    left = dead.create(2 * MiB, *_owner(make_options()))
    alive = DockerWorkspaces(f"{socket.gethostname()}-{os.getpid()}-a11ce000", root=root)
    kept = alive.create(2 * MiB, *_owner(make_options()))
    sink = MemoryAuditSink()
    runner = DockerRunner(engine, workspace_root=root)
    with Gateway(load_policy(policies_dir() / "default.yaml"), runner=runner, audit=sink) as gateway:
        reap_stale(gateway)
    reaped = [r["data"] for r in sink.records if r["event_type"] == "containers.reaped"]
    name = Path(left.path).parent.name
    # (container_ids may name another test session's expired sandboxes on a shared engine: not asserted)
    assert [(r["workspaces"], r["expired_only"], r["instance"]) for r in reaped] == [([name], True, runner.instance)]
    assert not Path(left.path).parent.exists()
    assert list_files(kept).files == ()  # a live instance's workspace is never touched
    alive.destroy(kept)


@pytest.mark.usefixtures("engine")
def test_gateway_reap_removes_a_dead_instances_workspace_and_audits_it(
    runtime_dir: str, make_options: Options, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    root = f"{runtime_dir}/workspaces"
    left = DockerWorkspaces(_dead_instance(), root=root).create(2 * MiB, *_owner(make_options()))
    monkeypatch.setenv("GATEWAY_WORKSPACE_DIR", root)  # where `gateway reap` looks
    audit_dir = tmp_path / "audit"
    assert main(["reap", "--json", "--audit-dir", str(audit_dir)]) == 0
    capsys.readouterr()
    records = [json.loads(line) for seg in audit_dir.glob("*.jsonl") for line in seg.read_text().splitlines()]
    reaped = [r["data"] for r in records if r["event_type"] == "containers.reaped"]
    assert [r.get("workspaces") for r in reaped] == [[Path(left.path).parent.name]]
    assert not Path(left.path).parent.exists()
    assert loops_backing(runtime_dir) == []


def test_the_file_helpers_refuse_path_tricks_and_planted_links(
    runner: DockerRunner, store: DockerWorkspaces, make_options: Options, tmp_path: Path
) -> None:
    options = make_options()
    ws = store.create(2 * MiB, *_owner(options))
    try:
        for bad in ("../x", "/etc/passwd", "a/../../x", "", "a//b", "main.py", "out"):
            with pytest.raises(WorkspacePathError):
                store.put(ws, bad, b"x")
            with pytest.raises(WorkspacePathError):
                store.get(ws, bad, 100)
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "secret").write_text("host secret")
        plant = (
            "import os\n"
            f"os.symlink({str(outside)!r}, 'link')\n"
            f"os.symlink({str(outside / 'secret')!r}, 'pw')\n"
            "os.mkdir('d')\n"
            "os.symlink('/', 'd/up')\n"
            "os.mkfifo('fifo')\n"
        )
        assert _run(runner, options, ws, plant).exit_code == 0
        for path in ("pw", "link/secret", "d/up/etc/passwd"):
            with pytest.raises(WorkspacePathError, match="symlink"):
                store.get(ws, path, 1000)
        with pytest.raises(WorkspacePathError, match="symlink"):
            store.put(ws, "link/planted", b"x")
        with pytest.raises(WorkspacePathError, match="not a regular file"):
            store.get(ws, "fifo", 10)  # refused, not blocked on
        with pytest.raises(WorkspacePathError, match="not a regular file"):
            store.put(ws, "fifo", b"x")
        assert sorted(os.listdir(outside)) == ["secret"]
        assert [f.path for f in store.list(ws).files] == ["main.py"]  # links and the FIFO are not listed
        store.put(ws, "data/in.csv", b"a,b\n1,2\n")
        with pytest.raises(WorkspacePathError, match="larger than"):
            store.get(ws, "data/in.csv", 3)
        with pytest.raises(WorkspaceFileNotFoundError):
            store.get(ws, "data/absent.csv", 10)
        with pytest.raises(WorkspaceFullError, match="full"):
            store.put(ws, "huge", b"x" * (3 * MiB))
        seen = _run(runner, options, ws, "print(open('data/in.csv').read(), end='')\nprint(os.path.exists('huge'))"
                    .replace("print(open", "import os\nprint(open"))  # fmt: skip
        assert seen.stdout == b"a,b\n1,2\nTrue\n"  # the program owns what the host put (a refused put is empty)
        assert store.get(ws, "huge", 10) == b""
    finally:
        store.destroy(ws)


def test_a_deep_tree_in_out_is_cleared_before_the_next_execution(
    runner: DockerRunner, store: DockerWorkspaces, make_options: Options
) -> None:
    options = make_options()
    ws = store.create(8 * MiB, *_owner(options))
    try:
        deep = "import os\np = 'out' + '/d' * 300\nos.makedirs(p)\nopen(p + '/f', 'w').write('x')\n"
        assert _run(runner, options, ws, deep).exit_code == 0
        after = _run(runner, options, ws, "import os\nprint(os.listdir('out'))")
        assert (after.stdout, dict(after.files)) == (b"[]\n", {})
    finally:
        store.destroy(ws)

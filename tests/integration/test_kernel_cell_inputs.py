"""A kernel cell's own ``files`` and ``env`` on the real engine (runc and runsc): the files are written into the
kernel's ``/workspace`` before the cell runs and stay there, the env is the cell's alone, names and links are
refused as for the session file API, the caps hold, and the trail digests the files as for a run."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit import JsonlAuditTrail
from gateway.policy import load_policy
from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.slots import HostSlots

pytestmark = pytest.mark.integration

BLOB = bytes(range(256)) * 4
"""A binary file (every byte value), sent as bytes: base64 on the wire."""


@pytest.fixture
def gw(tmp_path: Path, engine: Any, workspace_root: str) -> Iterator[Gateway]:
    """The default policy with kernel sessions under runc or runsc (``APP_*``, ``LANG``, ``LC_ALL`` and ``TZ``
    allowed in env, files up to 1 MiB), each kernel over a 4 MiB workspace of the fixture's root."""
    policy = tmp_path / "cell-inputs.yaml"
    policy.write_text(
        "apiVersion: gateway.agent-exec/v1\nkind: Policy\n"
        f"extends: {policies_dir() / 'default.yaml'}\n"
        "metadata: {name: cell-inputs}\n"
        "spec:\n  runtime: {allowed: [runc, runsc], default: runc}\n"
        "  limits:\n    pids: {default: 256, max: 256}\n"
        "  sessions:\n    modes: [kernel]\n    max_per_principal: 2\n"
        "    idle_s: {default: 600, max: 1800}\n    lifetime_s: {default: 3600, max: 14400}\n"
        "    workspace_size: {default: 4m, max: 4m}\n"
    )
    trail = JsonlAuditTrail(tmp_path / "audit")
    runner = DockerRunner(engine, workspace_root=workspace_root)
    with Gateway(load_policy(policy), runner=runner, audit=trail, slots=HostSlots(tmp_path / "slots", 4)) as made:
        yield made
    trail.close()


def create(gw: Gateway, runtime: str = "runc") -> str:
    result = gw.sessions.create({"mode": "kernel", "principal": "alice", "runtime": runtime})
    assert result.allowed, result.to_dict()
    assert result.session is not None
    return result.session.session_id


def cell(gw: Gateway, sid: str, code: str, **body: Any) -> Any:
    return gw.sessions.execute(sid, {"code": code, "principal": "alice", **body})


def received(tmp_path: Path) -> list[dict[str, Any]]:
    """The ``request.received`` records' requests, in order."""
    found = []
    for segment in sorted((tmp_path / "audit").glob("trail-*.jsonl")):
        for line in segment.read_bytes().splitlines():
            record = json.loads(line)
            if record["event_type"] == "request.received":
                found.append(record["data"]["request"])
    return found


def test_a_cells_env_is_its_own_and_restored_exactly(gw: Gateway, runtime: str) -> None:
    sid = create(gw, runtime)
    assert cell(gw, sid, "import os, subprocess, sys\nos.environ['APP_KEPT'] = 'mine'").exit_status == 0
    probe = "subprocess.run([sys.executable, '-c', 'import os; print(os.environ[\"APP_NEW\"])'], capture_output=True)"
    inside = cell(
        gw, sid, f"(os.environ['APP_KEPT'], os.environ['APP_NEW'], {probe}.stdout)",
        env={"APP_KEPT": "cell", "APP_NEW": "new"},
    )  # fmt: skip
    assert (inside.exit_status, inside.value) == (0, "('cell', 'new', b'new\\n')")  # a child process sees it too
    after = cell(gw, sid, "(os.environ.get('APP_KEPT'), 'APP_NEW' in os.environ)")
    assert after.value == "('mine', False)"  # added: removed; changed: the value before the cell


def test_a_cell_that_raises_still_gets_its_env_restored(gw: Gateway) -> None:
    sid = create(gw)
    raised = cell(gw, sid, "import os\nassert os.environ['APP_X'] == 'x'\n1 / 0", env={"APP_X": "x"})
    assert (raised.exit_status, b"ZeroDivisionError" in raised.outcome.stderr) == (1, True)
    assert cell(gw, sid, "'APP_X' in os.environ").value == "False"


def test_a_cells_files_are_there_when_it_runs_and_stay_in_the_workspace(
    gw: Gateway, runtime: str, tmp_path: Path
) -> None:
    sid = create(gw, runtime)
    given = cell(
        gw, sid, "(open('data/in.csv').read(), open('blob.bin', 'rb').read() == bytes(range(256)) * 4)",
        files={"data/in.csv": "a,b\n1,2\n", "blob.bin": BLOB},
    )  # fmt: skip
    assert (given.exit_status, given.value) == (0, "('a,b\\n1,2\\n', True)")
    kept = cell(gw, sid, "import os\n(sorted(os.listdir('.')), os.path.getsize('blob.bin'))")
    assert kept.value == "(['blob.bin', 'data', 'out'], 1024)"
    # the same workspace the session file API serves, byte for byte
    assert gw.sessions.get_file(sid, "blob.bin", principal="alice") == BLOB
    replaced = cell(gw, sid, "open('data/in.csv').read()", files={"data/in.csv": "new"})
    assert replaced.value == "'new'"  # a cell's file replaces what is there
    # the trail digests them as for a run: name, sha256 of the decoded bytes, size; never the contents
    files = received(tmp_path)[0]["files"]
    assert sorted(files, key=lambda f: f["name"]) == [
        {"name": "blob.bin", "sha256": hashlib.sha256(BLOB).hexdigest(), "bytes": len(BLOB), "encoding": "base64"},
        {"name": "data/in.csv", "sha256": hashlib.sha256(b"a,b\n1,2\n").hexdigest(), "bytes": 8},
    ]


def test_links_and_non_files_a_cell_planted_are_never_followed_and_the_kernel_lives_on(
    gw: Gateway, runtime: str
) -> None:
    sid = create(gw, runtime)
    plant = "import os\nos.symlink('/tmp', 'dir')\nos.symlink('/tmp/f', 'file')\nos.mkfifo('fifo')\nos.mkdir('sub')"
    assert cell(gw, sid, plant).exit_status == 0
    for name, why in (
        ("dir/x", "passes through a symlink"),
        ("file", "is or passes through a symlink"),
        ("fifo", "is not a regular file"),
        ("sub", "is a directory"),
    ):
        refused = cell(gw, sid, "ran = True", files={name: "x"})
        assert refused.error is not None, name
        assert refused.error.code == "request.workspace_path", (name, refused.error.message)
        assert why in refused.error.message, refused.error.message
        assert "the cell did not run" in refused.error.message
    alive = cell(gw, sid, "(globals().get('ran'), os.path.exists('/tmp/x'), os.path.exists('/tmp/f'))")
    assert (alive.exit_status, alive.value) == (0, "(None, False, False)")


def test_bad_names_and_env_are_refused_before_the_kernel_as_for_a_run(gw: Gateway) -> None:
    sid = create(gw)
    for name in ("../escape", "/etc/passwd", "main.py", "a//b"):
        bad = cell(gw, sid, "ran = True", files={name: "x"})
        assert (bad.allowed, [v["rule"] for v in bad.to_dict()["violations"]]) == (False, ["files.path"]), name
    denied = cell(gw, sid, "ran = True", env={"LD_PRELOAD": "/x.so"})
    assert not denied.allowed  # the policy's env rules decide a cell's env as a run's
    startup = cell(gw, sid, "ran = True", env={"TZ": "UTC"})  # allowed by the policy, read only at start
    assert startup.error is not None
    assert startup.error.code == "request.invalid"
    assert "reads them only when it starts" in startup.error.message
    assert cell(gw, sid, "globals().get('ran')").value is None


def test_the_caps_hold_for_a_cells_files(gw: Gateway) -> None:
    sid = create(gw)
    over = cell(gw, sid, "ran = True", files={"big.bin": b"\0" * ((1 << 20) + 1)})  # limits.files_size: 1m
    assert not over.allowed
    many = cell(gw, sid, "ran = True", files={f"f{i}": "x" for i in range(65)})  # files.max_count: 64
    assert not many.allowed
    # the workspace's own bound (4 MiB): a file that does not fit is ENOSPC, and leaves no half file
    filled = cell(gw, sid, "open('fill', 'wb').write(b'\\1' * (3 << 20))")
    assert filled.exit_status == 0
    full = cell(gw, sid, "ran = True", files={"late.bin": b"\2" * (1 << 20)})
    assert full.error is not None
    assert full.error.code == "request.workspace_full", full.error.message
    assert cell(gw, sid, "import os\n(globals().get('ran'), os.path.getsize('late.bin'))").value == "(None, 0)"

"""The Docker runner's egress bind, and the reaping of run directories a dead gateway left."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from gateway.runner.docker.egress import bind_egress, reap_egress


@pytest.fixture
def root(short_dir: Path) -> Path:
    return short_dir


def test_the_run_directory_is_bound_read_only_at_the_fixed_target() -> None:
    judged = {"Type": "bind", "Source": "/run/agent-gateway/staging/d/0", "Target": "/data"}
    kwargs = {"image": "i", "mounts": [judged]}
    bound = bind_egress(kwargs, Path("/run/agent-gateway/egress/0123abcd"))
    assert bound == {
        "image": "i",
        "mounts": [
            judged,
            {
                "Type": "bind",
                "Source": "/run/agent-gateway/egress/0123abcd",
                "Target": "/run/gateway-egress",
                "ReadOnly": True,
                "BindOptions": {"NonRecursive": True, "Propagation": "rprivate"},
            },
        ],
    }
    assert kwargs == {"image": "i", "mounts": [judged]}  # the caller's options are not changed


def _run_directory(root: Path, name: str, *, listening: bool, age_s: float) -> tuple[Path, socket.socket]:
    directory = root / name
    directory.mkdir()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(directory / "proxy.sock"))
    if listening:
        server.listen(1)
    else:
        server.close()  # the file stays, nobody listens: what a gateway killed mid-run leaves
    then = time.time() - age_s
    os.utime(directory, (then, then))
    return directory, server


def test_only_old_directories_nobody_listens_in_are_reaped(root: Path) -> None:
    stale, _ = _run_directory(root, "stale", listening=False, age_s=600)
    live, server = _run_directory(root, "live", listening=True, age_s=600)
    young, _ = _run_directory(root, "young", listening=False, age_s=0)
    try:
        assert reap_egress(root, grace_s=60) == [str(stale)]
        assert not stale.exists()
        assert live.exists()
        assert young.exists()
    finally:
        server.close()
    assert reap_egress(root / "missing", grace_s=60) == []

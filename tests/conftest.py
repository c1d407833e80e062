"""Suite-wide fixtures."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from gateway.hostfs import mount_points_below
from gateway.policy import Policy, load_policy_text

# Shared 2-core machines stall at random: a per-example deadline would turn a slow moment into a failure.
# Timing is what benchmarks measure, never tests.
settings.register_profile("gateway", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile("gateway")

# One gateway instance per test session (subprocesses inherit it): the session's containers carry it, its
# reaps remove only them (and expired ones), and parallel sessions on one engine never touch each other's.
TEST_INSTANCE = os.environ.setdefault("GATEWAY_INSTANCE", f"pytest-{uuid.uuid4().hex[:12]}")
# Host-wide execution slots of this session alone: another session's runs on the same machine never make a
# test wait for a slot (the slot tests set their own directory and count).
if "GATEWAY_RUNTIME_DIR" not in os.environ:
    _RUNTIME_DIR = tempfile.mkdtemp(prefix="gateway-runtime-")
    os.environ["GATEWAY_RUNTIME_DIR"] = _RUNTIME_DIR

    def _remove_runtime_dir(directory: str = _RUNTIME_DIR) -> None:
        """Removed when the session ends (its slot lock files die with their holders), so runs leave no directory;
        first the mounts below it: the workspace store's private mount of ``workspaces/`` (it lasts, as in a
        service, for the life of the directory) and any workspace a killed test left mounted."""
        for point in reversed(mount_points_below(directory)):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        shutil.rmtree(directory, ignore_errors=True)

    atexit.register(_remove_runtime_dir)
# The session's workspaces there too, not in root's default (/var/lib/agent-gateway/workspaces, the host's).
os.environ.setdefault("GATEWAY_WORKSPACE_DIR", os.path.join(os.environ["GATEWAY_RUNTIME_DIR"], "workspaces"))


@pytest.fixture(autouse=True)
def _isolated_audit_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own trail directory unless it names one: tests never write to the repo's audit/."""
    path = tmp_path_factory.mktemp("audit")
    monkeypatch.setenv("GATEWAY_AUDIT_DIR", str(path))
    return path


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory of the test's own at a short path (a unix socket's path is at most 107 bytes; pytest's
    ``tmp_path`` is long), removed after the test: where proxies' sockets go."""
    path = Path(tempfile.mkdtemp(prefix="gw-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


_MOUNT_POLICY = """\
apiVersion: gateway.agent-exec/v1
kind: Policy
metadata: {{name: {name}}}
spec:
  images:
    default: gateway/sandbox-python:3.11-bookworm
    allow: [{{repository: gateway/sandbox-python, tags: ["3.11-bookworm"]}}]
  limits:
    memory: {{default: 256m, max: 512m}}
    cpus: {{default: 1, max: 2}}
    pids: {{default: 256, max: 512}}
    timeout_s: {{default: 20, max: 60}}
    output_bytes: {{default: 1m, max: 4m}}
    tmpfs: {{default: 64m, max: 128m}}
    code_size: {{max: 256k}}
    files_size: {{max: 1m}}
  runtime: {{allowed: [runc, runsc], default: runc}}
  user: {{uid: 65534, gid: 65534}}
  mounts:
    allow: [{{root: {root}, modes: {modes}, targets: {targets}}}]
"""


def mount_policy(
    root: object, *, modes: tuple[str, ...] = ("ro", "rw"), targets: tuple[str, ...] = ("/data",), name: str = "mounts"
) -> Policy:
    """A policy that allowlists ``root`` with ``modes`` onto ``targets``, for the mount tests."""
    text = _MOUNT_POLICY.format(root=root, modes=json.dumps(list(modes)), targets=json.dumps(list(targets)), name=name)
    return load_policy_text(text, source=f"{name}.yaml")

"""What the engine tests of sessions, ready kernels and the warm pool share: a clock the test moves, a sessions
policy over the shipped one, gateways over one trail, and checks of the engine's containers (gone, there, made
ahead)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from gateway import Gateway
from gateway.audit import JsonlAuditTrail
from gateway.policy import load_policy
from gateway.resources import policies_dir
from gateway.runner.docker.options import INSTANCE_LABEL, POOL_LABEL
from gateway.runner.docker.runner import DockerRunner
from gateway.sessions import SessionManager
from gateway.slots import HostSlots


class Clock:
    """A session manager's clock that stands still from now on until the test moves ``now``."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def sessions_policy_text(
    name: str, runtime: str, *, modes: str = "[workspace, kernel]", per_principal: int = 2, lifetime: int = 3600,
    workspace_size: str = "{default: 64m, max: 256m}", pool: str = "",
) -> str:  # fmt: skip
    """The shipped default (runc) or strict (gVisor) policy, named ``name-runtime``, plus sessions: ``modes``,
    ``per_principal`` at once, ten minutes idle, ``lifetime`` seconds, ``workspace_size``, and ``pool`` (the
    ``spec.sessions.pool`` mapping, none when empty)."""
    base = "strict.yaml" if runtime == "runsc" else "default.yaml"
    return (
        "apiVersion: gateway.agent-exec/v1\nkind: Policy\n"
        f"extends: {policies_dir() / base}\n"
        f"metadata:\n  name: {name}-{runtime}\n"
        f"spec:\n  sessions:\n    modes: {modes}\n    max_per_principal: {per_principal}\n"
        f"    idle_s: {{default: 600, max: 1800}}\n    lifetime_s: {{default: {lifetime}, max: 14400}}\n"
        f"    workspace_size: {workspace_size}\n" + (f"    pool: {pool}\n" if pool else "")
    )


class Gateways:
    """Gateways over one trail (``directory/audit``) and one slots directory, each with its session manager on a
    test's clock when given one; :meth:`close` closes them (and so their sessions), then their trails."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.made: list[Gateway] = []
        self.trails: list[JsonlAuditTrail] = []

    def make(
        self, policy: Path, runner: DockerRunner, *, slots: int = 8, clock: Clock | None = None, **options: Any
    ) -> Gateway:
        """A gateway of ``policy`` on ``runner`` with ``slots`` host slots; ``options`` are Gateway's own."""
        trail = JsonlAuditTrail(self.directory / "audit")
        self.trails.append(trail)
        host = HostSlots(self.directory / "slots", slots)
        gw = Gateway(load_policy(policy), runner=runner, audit=trail, slots=host, **options)
        if clock is not None:
            gw.sessions = SessionManager(gw, clock=clock)
        self.made.append(gw)
        return gw

    def close(self) -> None:
        for gw in self.made:
            gw.close()
        for trail in self.trails:
            trail.close()


def assert_gone(engine: Any, container_id: str | None) -> None:
    """The container is removed (waiting for a removal still under way)."""
    assert container_id is not None
    with contextlib.suppress(docker.errors.NotFound):
        engine.api.wait(container_id, timeout=30, condition="removed")
    with pytest.raises(docker.errors.NotFound):
        engine.api.inspect_container(container_id)


def exists(engine: Any, container_id: str) -> bool:
    return bool(engine.api.containers(all=True, filters={"id": container_id}))


def eventually(check: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Whether ``check()`` becomes true within ``timeout_s``."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if check():
            return True
        time.sleep(0.1)
    return check()


def pooled_ids(engine: Any, instance: str) -> list[str]:
    """This instance's containers made ahead (the pool label: runs' and ready kernels'), claimed or not."""
    found = engine.api.containers(all=True, filters={"label": [POOL_LABEL, f"{INSTANCE_LABEL}={instance}"]})
    return sorted(str(c["Id"]) for c in found)

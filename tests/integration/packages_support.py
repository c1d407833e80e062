"""What the package-install tests on the real engine share, pip's and npm's: gateways whose runner resolves only the
index's name (to loopback), each with a directory of its own that is removed at the end, and a run's outcome."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gateway import Gateway
from gateway.audit.memory import MemoryAuditSink
from gateway.packages import Installer, PackageCache
from gateway.policy.model import Policy
from gateway.result import ExecutionResult
from gateway.runner.docker.runner import DockerRunner
from gateway.slots import HostSlots
from tests.egress_support import loopback_resolver

I = TypeVar("I", bound=Installer)  # noqa: E741 - the installer's type, as the callers name it


class PackageGateways:
    """Gateways with a package installer; :meth:`close` closes them and drops their caches and directories."""

    def __init__(self, engine: Any, host: str, directory: Path) -> None:
        self.engine = engine
        self.host = host
        self.directory = directory
        """Where the gateways' host slots are kept."""
        self.made: list[tuple[Gateway, Path]] = []

    def make(self, policy: Policy, installer: Callable[[DockerRunner, PackageCache], I]) -> tuple[Gateway, I, Path]:
        """A gateway of ``policy`` with the installer made on its runner and cache; the gateway, the installer,
        and the cache's directory."""
        # A short root: a unix socket's path is at most 107 bytes.
        root = Path(tempfile.mkdtemp(prefix="gw-pk-", dir="/tmp"))
        runner = DockerRunner(
            self.engine, egress_resolver=loopback_resolver(self.host), egress_root=str(root / "egress")
        )
        made = installer(runner, PackageCache(root / "cache"))
        gateway = Gateway(
            policy, runner=runner, audit=MemoryAuditSink(), slots=HostSlots(self.directory / "slots", 4), packages=made
        )
        self.made.append((gateway, root))
        return gateway, made, root / "cache"

    def close(self) -> None:
        for gateway, root in self.made:
            gateway.close()
            gateway.runner.close()
            PackageCache(root / "cache").drop()
            shutil.rmtree(root, ignore_errors=True)


def outcome_data(gateway: Gateway, result: ExecutionResult) -> dict[str, Any]:
    """The data of ``result``'s ``execution.outcome`` record in ``gateway``'s (in-memory) trail."""
    sink = gateway.audit
    assert isinstance(sink, MemoryAuditSink)
    [record] = [
        r for r in sink.records if r["event_type"] == "execution.outcome" and r["request_id"] == result.request_id
    ]
    data: dict[str, Any] = record["data"]
    return data

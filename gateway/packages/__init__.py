"""Packages for runs (``spec.packages``: pip for Python, npm for JavaScript): the install phase, and installed
trees cached by resolved set.

`cache` keeps the trees (and which request resolved to which); `docker` installs Python packages on the Docker
engine (pip downloads in a sandbox whose only destination is the policy's index, the gateway checks the archives
itself with `archives`, pip installs them in a sandbox with no network) and binds a tree read-only into a run;
`npm` does the same for JavaScript (npm with install scripts off, the gateway checking the lock file and every
tarball's integrity). The Gateway calls an :class:`Installer` before a run whose decision lists packages; without
one such a run fails closed.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Protocol

from gateway.packages.cache import Distribution, Installed, InstalledFile, PackageCache

if TYPE_CHECKING:
    from gateway.decision.settings import SandboxSettings
    from gateway.runner import Runner
    from gateway.runspec import RunSpec
    from gateway.slots import HostSlots

__all__ = ["Distribution", "Installed", "InstalledFile", "Installer", "PackageCache", "installer_for"]


class Installer(Protocol):
    """Installs a run's packages before it starts, and hands the tree to its run specification."""

    def install(self, settings: SandboxSettings, *, request_id: str, slots: HostSlots) -> Installed:
        """The installed tree of ``settings.packages`` (cached, or installed now holding one of ``slots``); raises
        :class:`~gateway.errors.PackageError` (refused or failed: nothing from it reaches a run)."""
        ...

    def apply(self, spec: RunSpec, installed: Installed) -> RunSpec:
        """``spec`` with ``installed`` bound read-only and ``packages`` set (the sandbox puts it on the program's
        path)."""
        ...


def installer_for(runner: Runner) -> Installer | None:
    """The install phase for ``runner``: a Docker runner's (packages cached in ``GATEWAY_PACKAGES_DIR``), else None
    (a run with packages then fails closed)."""
    docker = sys.modules.get("gateway.runner.docker.runner")  # a DockerRunner's module is loaded already
    if docker is None or not isinstance(runner, docker.DockerRunner):
        return None
    from gateway.packages.docker import DockerInstaller  # noqa: PLC0415 - only with a Docker runner
    from gateway.packages.npm import Installers  # noqa: PLC0415 - only with a Docker runner

    return Installers(DockerInstaller(runner))

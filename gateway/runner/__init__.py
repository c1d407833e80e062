"""Sandbox backends: the runner interface, the Docker (``gateway.runner.docker``) and Kubernetes
(``gateway.runner.kubernetes``) backends, and a fake for unit tests.

``DockerRunner`` is imported lazily (it pulls in docker-py) so that importing the interface stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.runner.interface import NOTHING_RAN, PULL_POLICIES, Outcome, Payload, Runner, RunSpec, Sandbox

if TYPE_CHECKING:
    from gateway.runner.docker.runner import DockerRunner
    from gateway.runner.fake import FakeRunner

__all__ = [
    "NOTHING_RAN",
    "PULL_POLICIES",
    "DockerRunner",
    "FakeRunner",
    "Outcome",
    "Payload",
    "RunSpec",
    "Runner",
    "Sandbox",
]


def __getattr__(name: str) -> Any:
    if name == "DockerRunner":
        from gateway.runner.docker.runner import DockerRunner  # noqa: PLC0415

        return DockerRunner
    if name == "FakeRunner":
        from gateway.runner.fake import FakeRunner  # noqa: PLC0415

        return FakeRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

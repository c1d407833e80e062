"""The Docker backend: every Docker word of the gateway lives here.

``options`` (the assembler that builds docker-py ``containers.create`` arguments from resolved settings, and
the invariant guard), ``runner`` (``DockerRunner``: create → attach → start → payload → wait → remove),
``collect`` (the supervisor's frames read from Docker's multiplexed attach stream; the supervisor itself is every
backend's, ``gateway.runner.supervisor``), ``kernel`` (``DockerKernel``: a session's persistent interpreter) and
``errors`` (docker-py and requests exceptions mapped to the gateway's). ``DockerRunner`` is imported lazily: it
pulls in docker-py, which the assembler and the unit tests of the layers above do not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.runner.docker.options import DockerAssembler, build_options, guard

if TYPE_CHECKING:
    from gateway.runner.docker.runner import DockerRunner

__all__ = ["DockerAssembler", "DockerRunner", "build_options", "guard"]


def __getattr__(name: str) -> Any:
    if name == "DockerRunner":
        from gateway.runner.docker.runner import DockerRunner  # noqa: PLC0415

        return DockerRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

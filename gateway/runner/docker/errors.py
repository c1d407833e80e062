"""The one place where docker-py and requests exceptions become the gateway's errors.

Every class in ``docker.errors`` has an explicit row (a unit test fails when docker-py adds one we have not
mapped); ``requests.exceptions`` and ``OSError`` are mapped by their base classes. The original exception is
always chained (``raise map_engine_error(exc, ...) from exc``).
"""

from __future__ import annotations

import socket

import docker.errors
import requests.exceptions

from gateway.errors import EngineUnavailableError, GatewayError, ImageMissingError, RunnerError, SandboxError

__all__ = ["DOCKER_ERROR_TABLE", "REQUESTS_ERROR_TABLE", "map_engine_error"]

DOCKER_ERROR_TABLE: dict[type[BaseException], type[RunnerError]] = {
    docker.errors.ImageNotFound: ImageMissingError,
    docker.errors.InvalidRepository: ImageMissingError,
    docker.errors.NotFound: SandboxError,
    docker.errors.APIError: SandboxError,
    docker.errors.ContainerError: SandboxError,
    docker.errors.StreamParseError: SandboxError,
    docker.errors.BuildError: SandboxError,
    docker.errors.ImageLoadError: SandboxError,
    docker.errors.InvalidArgument: SandboxError,
    docker.errors.NullResource: SandboxError,
    docker.errors.DeprecatedMethod: SandboxError,
    docker.errors.InvalidVersion: EngineUnavailableError,
    docker.errors.InvalidConfigFile: EngineUnavailableError,
    docker.errors.TLSParameterError: EngineUnavailableError,
    docker.errors.MissingContextParameter: EngineUnavailableError,
    docker.errors.ContextAlreadyExists: EngineUnavailableError,
    docker.errors.ContextException: EngineUnavailableError,
    docker.errors.ContextNotFound: EngineUnavailableError,
    docker.errors.DockerException: RunnerError,
}
"""Exact docker-py exception class → gateway error class."""

REQUESTS_ERROR_TABLE: tuple[tuple[type[BaseException], type[RunnerError]], ...] = (
    # most specific first; ConnectTimeout is both a ConnectionError and a Timeout: the engine did not answer
    (requests.exceptions.ConnectTimeout, EngineUnavailableError),
    (requests.exceptions.Timeout, SandboxError),
    (requests.exceptions.ConnectionError, EngineUnavailableError),
    (requests.exceptions.InvalidURL, EngineUnavailableError),
    (requests.exceptions.InvalidSchema, EngineUnavailableError),
    (requests.exceptions.MissingSchema, EngineUnavailableError),
    (requests.exceptions.URLRequired, EngineUnavailableError),
    (requests.exceptions.RequestException, SandboxError),
    (ConnectionRefusedError, EngineUnavailableError),
    (FileNotFoundError, EngineUnavailableError),
    (PermissionError, EngineUnavailableError),
    (socket.timeout, SandboxError),
    (OSError, SandboxError),
)
"""Base class → gateway error class for everything that is not a docker-py exception (first match wins)."""

_HINTS: dict[type[RunnerError], str] = {
    EngineUnavailableError: "start the Docker engine (scripts/setup.sh does it) or set DOCKER_HOST",
    ImageMissingError: "build the sandbox image with scripts/build-image.sh (no registry is contacted)",
}


def _classify(exc: BaseException) -> type[RunnerError]:
    for klass in type(exc).__mro__:
        if klass in DOCKER_ERROR_TABLE:
            return DOCKER_ERROR_TABLE[klass]
    for klass, target in REQUESTS_ERROR_TABLE:
        if isinstance(exc, klass):
            return target
    return RunnerError


def _explain(exc: BaseException) -> str:
    if isinstance(exc, docker.errors.APIError):
        detail = exc.explanation if exc.explanation else str(exc)
        status = exc.status_code
        return f"{detail} (HTTP {status})" if status else str(detail)
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def map_engine_error(exc: BaseException, action: str) -> GatewayError:
    """The gateway error for a failure while ``action`` (e.g. ``"creating the container"``).

    A ``GatewayError`` is returned unchanged. Raise the result ``from exc``.
    """
    if isinstance(exc, GatewayError):
        return exc
    target = _classify(exc)
    message = f"{action} failed: {_explain(exc)}"
    if target is EngineUnavailableError:
        message = f"the Docker engine is unreachable while {action}: {_explain(exc)}"
    return target(message, hint=_HINTS.get(target, ""))

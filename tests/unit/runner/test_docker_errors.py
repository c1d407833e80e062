"""Every docker-py exception class is mapped explicitly; transport failures map by their base classes."""

from __future__ import annotations

import inspect

import docker.errors
import pytest
import requests.exceptions

from gateway.errors import EngineUnavailableError, ImageMissingError, RunnerError, SandboxError, exit_code_for
from gateway.runner.docker.errors import DOCKER_ERROR_TABLE, map_engine_error


def _exception_classes(module: object) -> list[type[BaseException]]:
    return [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, BaseException) and obj.__module__ == getattr(module, "__name__", "")
    ]


def test_every_docker_error_class_has_an_explicit_row() -> None:
    missing = [cls.__name__ for cls in _exception_classes(docker.errors) if cls not in DOCKER_ERROR_TABLE]
    assert not missing, f"docker.errors classes without a mapping: {missing}"


def test_every_requests_exception_maps_to_a_runner_error() -> None:
    for cls in _exception_classes(requests.exceptions):
        if issubclass(cls, Warning):
            continue
        try:
            exc = cls("boom")
        except TypeError:
            continue
        mapped = map_engine_error(exc, "doing something")
        assert isinstance(mapped, RunnerError), cls


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (docker.errors.ImageNotFound("no such image"), ImageMissingError),
        (docker.errors.NotFound("no such container"), SandboxError),
        (docker.errors.APIError("500 Server Error"), SandboxError),
        (docker.errors.DockerException("Error while fetching server API version"), RunnerError),
        (docker.errors.TLSParameterError("bad tls"), EngineUnavailableError),
        (requests.exceptions.ConnectionError("refused"), EngineUnavailableError),
        (requests.exceptions.ConnectTimeout("slow connect"), EngineUnavailableError),
        (requests.exceptions.ReadTimeout("slow read"), SandboxError),
        (FileNotFoundError(2, "No such file or directory"), EngineUnavailableError),
        (ConnectionRefusedError(111, "refused"), EngineUnavailableError),
        (OSError(5, "I/O error"), SandboxError),
        (ValueError("anything else"), RunnerError),
    ],
)
def test_mapping(exc: BaseException, expected: type[RunnerError]) -> None:
    mapped = map_engine_error(exc, "creating the container")
    assert type(mapped) is expected
    assert exit_code_for(mapped) == 125
    assert "creating the container" in mapped.message


def test_api_error_message_carries_the_engines_explanation() -> None:
    class Response:
        status_code = 400
        reason = "Bad Request"

    exc = docker.errors.APIError("400 Client Error", response=Response(), explanation="unknown runtime: nope")
    mapped = map_engine_error(exc, "creating the container")
    assert "unknown runtime: nope" in mapped.message
    assert "HTTP 400" in mapped.message


def test_gateway_errors_pass_through_unchanged() -> None:
    err = ImageMissingError("x")
    assert map_engine_error(err, "anything") is err


def test_engine_unavailable_has_a_hint() -> None:
    mapped = map_engine_error(requests.exceptions.ConnectionError("refused"), "pinging")
    assert "scripts/setup.sh" in mapped.diagnostics()

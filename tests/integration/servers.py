"""A real ``gateway serve`` application in a uvicorn server on a free loopback port, for the service tests that
need their own start-up arguments (TLS) or a module-scoped server (the fuzz test). The application is built the
way ``gateway serve`` builds it: ``Service.from_config`` with the Docker runner, then ``build_app``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.service.app import build_app
from gateway.service.config import ServerConfig
from gateway.service.deadlines import http_protocol
from gateway.service.principals import PrincipalsStore
from gateway.service.service import Service


def one_principal(directory: Path, name: str = "alice") -> tuple[Path, str]:
    """A principals file with ``name`` under the default policy, and its clear token."""
    path = directory / "principals.yaml"
    token = PrincipalsStore(path).add(name, policy=str(policies_dir() / "default.yaml"), role="agent")
    return path, token


def start(
    config: ServerConfig, runner: Callable[[], DockerRunner] = DockerRunner, **uvicorn_args: Any
) -> tuple[int, Service, Callable[[], None]]:
    """Start the service on 127.0.0.1 (any free port); the port, the service and a stop function."""
    service = Service.from_config(config, runner=runner)
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(service),
            host="127.0.0.1",
            port=0,
            http=http_protocol(
                config.header_read_s,
                max_connections=config.max_connections,
                max_header_bytes=config.max_header_bytes,
                max_headless_connections=config.max_headless_connections,
                on_refused=service.connection_refused,
            ),  # as `gateway serve` runs it
            lifespan="on",
            log_level="warning",
            **uvicorn_args,
        )
    )
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "the server thread died while starting"
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    port: int = server.servers[0].sockets[0].getsockname()[1]

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=60)
        assert not thread.is_alive(), "the server did not stop"

    return port, service, stop

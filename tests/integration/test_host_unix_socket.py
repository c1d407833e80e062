"""A sandbox reaches a host unix socket bound into it, under runc and runsc: what the egress proxy will rely on.

The egress proxy (issue 31) listens on a per-run unix socket on the host, in a directory bound into a sandbox
that has no network. runc lets the program connect to it as to any file; gVisor refuses a host socket unless
runsc runs with ``--host-uds=open`` (or ``all``), which ``scripts/setup-engine.sh`` registers and ``gateway
doctor`` checks (``runsc_host_uds``). Here the host serves an echo socket in a temporary directory, the
directory is bound into a container made with the gateway's hardened options, and the program gets the echo.
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.runner.docker.mounts import engine_mounts
from gateway.runner.docker.options import CONTAINER_CONFIG_KEYS, HOST_CONFIG_KEYS
from tests.integration.conftest import hardened_options, leftover_labels

pytestmark = pytest.mark.integration

TARGET = "/run/gateway-egress"

_CONNECT = f"""
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect({TARGET + "/proxy.sock"!r})
    s.sendall(b"hello from the sandbox")
    print("echo", s.recv(64).decode())
except OSError as e:
    print("refused", e.errno, e.strerror)
"""


@pytest.fixture
def echo_socket() -> Iterator[Path]:
    """A directory holding ``proxy.sock``, a unix socket that echoes what it receives, reachable by uid 65534."""
    directory = Path(tempfile.mkdtemp(prefix="gateway-uds-", dir="/tmp"))
    directory.chmod(0o755)  # the sandbox user must traverse it (as the real wiring will)
    path = directory / "proxy.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    path.chmod(0o666)  # connect() needs write permission on the socket file
    server.listen(4)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(10)
                with contextlib.suppress(OSError):
                    conn.sendall(conn.recv(64))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield directory
    finally:
        stop.set()
        thread.join(2)
        server.close()
        path.unlink(missing_ok=True)
        directory.rmdir()


def _run(engine: Any, runtime: str, directory: Path) -> bytes:
    """Run ``_CONNECT`` in a container with the hardened options for ``runtime`` plus a bind of ``directory``."""
    options = hardened_options(runtime=runtime)
    options.pop("environment", None)  # the runner never puts it in the container's configuration either
    mount = {**engine_mounts([(TARGET, True)], "it-decision")[0], "Source": str(directory)}  # the gateway's bind
    host = {k: v for k, v in options.items() if k in HOST_CONFIG_KEYS}
    config = {k: v for k, v in options.items() if k in CONTAINER_CONFIG_KEYS}
    config["labels"] = {**config.get("labels", {}), **leftover_labels()}
    api = engine.api
    cid = api.create_container(
        **config,
        entrypoint=["python3", "-c", _CONNECT],
        host_config=api.create_host_config(**host, mounts=[mount]),
        use_config_proxy=False,
    )["Id"]
    try:
        api.start(cid)
        assert api.wait(cid, timeout=60)["StatusCode"] == 0
        logs: bytes = api.logs(cid)
        return logs
    finally:
        api.remove_container(cid, force=True)


def test_the_sandbox_reaches_a_host_unix_socket_bound_into_it(engine: Any, runtime: str, echo_socket: Path) -> None:
    assert hardened_options(runtime=runtime)["network_mode"] == "none"
    out = _run(engine, runtime, echo_socket)
    assert out == b"echo hello from the sandbox\n", (
        f"{out!r}: under runsc, register it with --host-uds=open (scripts/setup-engine.sh; `gateway doctor`)"
    )

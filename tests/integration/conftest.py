"""Integration fixtures: a real Docker engine, the sandbox image, and the hardened options of the contract.

Without an engine these tests skip with a reason, except in CI (``CI`` set), where they fail: CI must never
silently skip the containment suite. At the end of the session no container with the gateway's managed label
may remain.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from serve_process import ServeProcess

from gateway.errors import GatewayError
from gateway.hostfs import mount_points_below
from gateway.policy import load_policy
from gateway.request import parse_request
from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.docker.workspace import DockerWorkspaces, missing
from gateway.testing import assemble

if TYPE_CHECKING:
    import httpx

    from gateway.service.config import ServerConfig
    from gateway.service.service import Service

SANDBOX_IMAGE = "gateway/sandbox-python:3.11-bookworm"
MANAGED_LABEL = "io.agent-gateway.managed"
INSTANCE_LABEL = "io.agent-gateway.instance"
DEADLINE_LABEL = "io.agent-gateway.deadline"
RUNTIMES = ("runc", "runsc")
_OURS = [f"{MANAGED_LABEL}=true", f"{INSTANCE_LABEL}={os.environ['GATEWAY_INSTANCE']}"]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI requires the real engine: {reason}")
    pytest.skip(reason)


def hardened_options(**overrides: Any) -> dict[str, Any]:
    """The options the real policy assembly produces for a plain request.

    The ONE place the integration tests get their options from, so the containment suite tests exactly what
    the gateway would run: ``policies/default.yaml`` for runc, ``policies/strict.yaml`` (which requires gVisor)
    when ``runtime="runsc"`` is asked for. ``overrides`` replace top-level keys (``volumes=...``,
    ``mem_limit=...``); the runner re-checks every result with the invariant guard before creating anything.
    """
    name = "strict.yaml" if overrides.get("runtime") == "runsc" else "default.yaml"
    policy = load_policy(policies_dir() / name)
    options = assemble(policy, parse_request({"code": "pass"}), decision_id="it-decision", request_id="it-request")
    options.update(overrides)
    return options


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    """A docker-py client for a live engine with the sandbox image; checks for leftovers at the end."""
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "no engine here"
        _unavailable(f"no Docker engine answers ({type(exc).__name__}: {exc}); run scripts/setup.sh")
    try:
        client.images.get(SANDBOX_IMAGE)
    except docker.errors.ImageNotFound:
        _unavailable(f"the sandbox image {SANDBOX_IMAGE} is missing; run scripts/build-image.sh")
    yield client
    leftovers = gateway_containers(client)
    for cid in leftovers:
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(cid, force=True)
    assert not leftovers, f"containers with the gateway's label left behind: {[c[:12] for c in leftovers]}"
    client.close()


@pytest.fixture(scope="session")
def runtimes(engine: Any) -> tuple[str, ...]:
    return tuple(engine.info().get("Runtimes", {}))


@pytest.fixture
def runner(engine: Any) -> DockerRunner:
    return DockerRunner(engine)


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest, runtimes: tuple[str, ...]) -> str:
    name: str = request.param
    if name not in runtimes:
        _unavailable(f"the {name} runtime is not registered with the engine; run scripts/setup-engine.sh")
    return name


@pytest.fixture
def options_for(runtime: str) -> Callable[..., dict[str, Any]]:
    """``hardened_options`` for the parametrized runtime."""

    def make(**overrides: Any) -> dict[str, Any]:
        return hardened_options(runtime=runtime, **overrides)

    return make


@pytest.fixture
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A host directory the sandbox user (65534) can reach: pytest's own tmp tree is root-only."""
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="gateway-it-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def gateway_containers(engine: Any) -> list[str]:
    """Ids of this session's gateway containers right now (other sessions on the engine are not ours)."""
    # The low-level list: the high-level one inspects each container and fails on one the engine's
    # AutoRemove takes away in between.
    return [str(c["Id"]) for c in engine.api.containers(all=True, filters={"label": _OURS})]


def leftover_labels() -> dict[str, str]:
    """Labels for a hand-made leftover container that this session's reaper must remove."""
    return {MANAGED_LABEL: "true", INSTANCE_LABEL: os.environ["GATEWAY_INSTANCE"]}


@pytest.fixture
def make_options() -> Callable[..., dict[str, Any]]:
    """``hardened_options`` as a fixture (test modules here are not a package and cannot import conftest)."""
    return hardened_options


@pytest.fixture
def managed_containers(engine: Any) -> Callable[[], list[str]]:
    """A function listing the ids of this session's gateway containers right now."""
    return lambda: gateway_containers(engine)


@pytest.fixture
def tiny_fs(tmp_path: Any) -> Iterator[Callable[[str], Any]]:
    """Mount a small tmpfs (as root) with the given options, so a trail really meets a read-only, full or
    nearly full file system; unmounted after the test."""
    import subprocess
    from pathlib import Path

    mounted: list[Path] = []

    def make(options: str) -> Path:
        target = Path(tmp_path) / f"fs{len(mounted)}"
        target.mkdir()
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)], capture_output=True, check=False
        )
        if proc.returncode != 0:
            _unavailable(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
        mounted.append(target)
        return target

    yield make
    for target in mounted:
        subprocess.run(["umount", "-l", str(target)], check=False)


# --- the HTTP service on a loopback port (test_service_http.py, test_client.py) ------------------------------

BODY_LIMIT = 4096


@dataclass
class Server:
    url: str
    service: Service
    audit_dir: Path
    tokens: dict[str, str]
    stop: Callable[[], None]

    def client(self, token: str | None = None) -> httpx.Client:
        import httpx

        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def records(self, event_type: str | None = None) -> list[dict[str, Any]]:
        """The records on the trail now; a line still being written (no newline yet) is not one yet."""
        out = []
        for segment in sorted(self.audit_dir.glob("trail-*.jsonl")):
            for line in segment.read_text().split("\n")[:-1]:  # the part after the last newline is unfinished
                record = json.loads(line)
                if event_type is None or record["event_type"] == event_type:
                    out.append(record)
        return out


def default_policy_variant(directory: Path, name: str, *changes: tuple[str, str]) -> Path:
    """The default policy under another ``name`` (a policy of its own, not the service's default), with each
    ``(old, new)`` text change made once; written to ``directory/<name>.yaml``."""
    text = (policies_dir() / "default.yaml").read_text()
    for old, new in (("name: default", f"name: {name}"), *changes):
        assert old in text, f"the default policy no longer holds {old!r}"
        text = text.replace(old, new, 1)
    path = directory / f"{name}.yaml"
    path.write_text(text)
    return path


def _tight(directory: Path) -> Path:
    """The default policy renamed ``tight``, with a timeout ceiling of 10 s instead of 60 s."""
    return default_policy_variant(
        directory, "tight", ("timeout_s: {default: 10, max: 60}", "timeout_s: {default: 5, max: 10}")
    )


@pytest.fixture
def principals_file(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """alice (default policy), bob (tight policy), carol (revoked: her old token is kept to try)."""
    from gateway.service.principals import PrincipalsStore

    path = tmp_path / "principals.yaml"
    store = PrincipalsStore(path)
    tokens = {
        "alice": store.add("alice", policy=str(policies_dir() / "default.yaml"), role="agent"),
        "bob": store.add("bob", policy=str(_tight(tmp_path)), role="agent"),
        "carol": store.add("carol", policy=str(policies_dir() / "default.yaml"), role="agent"),
    }
    store.revoke("carol")
    return path, tokens


def _start(
    config: ServerConfig, runner: Callable[[], DockerRunner] = DockerRunner
) -> tuple[str, Service, Callable[[], None]]:
    from tests.integration.servers import start

    port, service, stop = start(config, runner)
    return f"http://127.0.0.1:{port}", service, stop


@pytest.fixture
def serve(tmp_path: Path, principals_file: tuple[Path, dict[str, str]]) -> Iterator[Callable[..., Server]]:
    from gateway.service.config import ServerConfig

    started: list[Server] = []

    def make(runner: Callable[[], DockerRunner] = DockerRunner, **config: Any) -> Server:
        settings = {
            "principals": principals_file[0], "audit_dir": tmp_path / "audit", "max_body_bytes": BODY_LIMIT, **config,
        }  # fmt: skip
        url, service, stop = _start(ServerConfig(**settings), runner)
        stopped: list[bool] = []

        def stop_once() -> None:
            if not stopped:
                stopped.append(True)
                stop()

        server = Server(url, service, Path(settings["audit_dir"]), principals_file[1], stop_once)
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def server(serve: Callable[..., Server]) -> Server:
    return serve()


@pytest.fixture
def serve_process(tmp_path: Path, engine: Any) -> Iterator[Callable[..., ServeProcess]]:
    """Starts ``gateway serve`` processes in ``tmp_path``; each is stopped at the end of the test."""
    started: list[ServeProcess] = []

    def run(*args: str, env: dict[str, str] | None = None) -> ServeProcess:
        served = ServeProcess(tmp_path, *args, env=env)
        started.append(served)
        return served

    yield run
    for served in started:
        served.stop()


def loops_backing(root: str) -> list[str]:
    """Loop devices whose backing file is below ``root`` (as the kernel names it, deleted files included)."""
    found = []
    for name in os.listdir("/sys/block"):
        with contextlib.suppress(OSError):
            if Path(f"/sys/block/{name}/loop/backing_file").read_text().strip().startswith(root + "/"):
                found.append(name)
    return found


@pytest.fixture
def workspace_root(tmp_path: Path) -> Iterator[str]:
    """A workspace root of this test's own; at the end whatever a failing test left there is reaped, every
    mount below it (the store's private mount of the root included) undone, and no loop device may be left
    backed by a file below it."""
    if missing():
        pytest.skip(f"workspaces need {', '.join(missing())}")
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    root = str(directory / "workspaces")
    yield root
    try:
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(root):
                with contextlib.suppress(GatewayError):
                    DockerWorkspaces(name.rpartition("--")[0], root=root).reap(everything=True)
    finally:
        for point in [*reversed(mount_points_below(str(directory))), root]:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        left = loops_backing(str(directory))
        for loop in left:
            subprocess.run(["losetup", "-d", f"/dev/{loop}"], capture_output=True, check=False)
        assert not mount_points_below(str(directory))
        assert not left, f"loop devices left behind: {left}"

"""The Docker runner: one hardened, single-use container per execution, driven step by step with docker-py.

Life of a run (``execute`` = ``prepare`` + ``run``):

``prepare``
    guard the assembled options again (``options.guard``); make sure the image is present (a missing
    image is ``ImageMissingError`` naming ``scripts/build-image.sh`` unless the spec says ``pull:
    if-missing``; never a silent pull); ``containers.create`` with the options plus the runner's own
    transport keys only (``entrypoint``: the fixed supervisor of ``gateway.runner.supervisor``, ``command``,
    ``stdin_open``, ``stdin_once``, ``tty=False``, ``detach``); attach to its stdin/stdout/stderr *before*
    starting it; start it. The supervisor then waits for exactly one payload on stdin.
``run``
    send the payload (length-prefixed ``marshal`` data: code, files, the environment, the deadline, a per-run HMAC
    key) and keep the socket open: its close is how the supervisor learns the gateway is gone. Read Docker's
    multiplexed stream and the supervisor's verified frames as they arrive, keeping at most ``output_bytes``
    per stream in memory (past it: truncate, kill the container, stop reading); a monotonic deadline covers
    the whole read (at it: kill, ``timed_out``). After the final frame the supervisor waits for its stdin to
    close: ``inspect`` it, close the attach connection, ``remove(force=True)`` in ``finally``, always (the
    engine's ``AutoRemove`` may get there first). A run that reported but whose container cannot be removed
    raises ``ContainerLeftError`` carrying the program's outcome; any other error that ends a run carries what
    had arrived (``GatewayError.outcome``).
    ``on_output`` (optional) gets each verified chunk's kept bytes as it arrives; ``cancel`` (optional) is
    checked between bounded reads. A callback that raises or a cancel kills the container like a flood, and the
    run ends with ``OutputCallbackError`` / ``CancelledRunError`` carrying the outcome so far.

``open_kernel`` makes a container the same way (``prepare``) for a session's kernel: a persistent interpreter
that takes cells until it is closed (``gateway.runner.docker.kernel``).

No caller content is ever placed on a command line or quoted for a shell: code and files travel inside the
payload and are written by the supervisor into the size-capped ``/workspace`` tmpfs. Every docker-py and
requests exception is mapped by ``gateway.runner.docker.errors.map_engine_error``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import docker
import docker.errors

from gateway.canonical import options_bytes
from gateway.decision.settings import BackendLimits, SandboxProfile
from gateway.errors import (
    CancelledRunError,
    ContainerLeftError,
    EngineUnavailableError,
    GatewayError,
    ImageMissingError,
    OutputCallbackError,
    SandboxError,
    UnsafeOptionsError,
)
from gateway.policy.images import parse_image_ref
from gateway.runner.docker.collect import read_frames
from gateway.runner.docker.egress import (
    OutputRedactor,
    bind_egress,
    bind_secrets,
    reap_egress,
    redact_outcome,
    sandbox_user,
    verify_egress,
    wants_egress,
)
from gateway.runner.docker.errors import map_engine_error
from gateway.runner.docker.kernel import KERNEL_GRACE_S, DockerKernel
from gateway.runner.docker.mounts import Staging, reap_staging
from gateway.runner.docker.options import (
    CONTAINER_CONFIG_KEYS,
    DEADLINE_LABEL,
    DECISION_LABEL,
    HOST_CONFIG_KEYS,
    INSTANCE_LABEL,
    INTERPRETER_LABEL,
    MANAGED_LABEL,
    POOL_LABEL,
    RUN_LABELS,
    RUN_OPTION_KEYS,
    DockerAssembler,
    guard,
    pool_key,
    profile_options,
    profile_part,
)
from gateway.runner.docker.workspace import DockerWorkspaces, bind_workspace, prepare_for_run, verify_workspace
from gateway.runner.frames import Collected, FrameDecoder, ProtocolError, outcome_of
from gateway.runner.interface import OnGone, OnOutput, Outcome, Payload, RunSpec, prepare_and_run
from gateway.runner.supervisor import EGRESS_ENVIRONMENT, encode_payload, new_key, supervisor_command
from gateway.runner.workspace import Workspace
from gateway.slots import Slot, default_runtime_dir, instance_dead

if TYPE_CHECKING:
    from gateway.egress.host import EgressHost, EgressRun
    from gateway.egress.proxy import EgressReport, Resolver
    from gateway.egress.secrets import SecretStore
    from gateway.runner.pool import WorkspaceShape

__all__ = ["BUILD_COMMAND", "EXPIRY_GRACE_S", "DockerRunner", "DockerSandbox", "is_expired", "new_instance_id"]

BUILD_COMMAND = "scripts/build-image.sh"
"""How to build the default sandbox image locally (named in the error for a missing image)."""

_REMOVAL_WAIT_S = 10.0
EXPIRY_GRACE_S = 60
"""Seconds past a container's own deadline after which any reaper treats it as abandoned."""


def new_instance_id() -> str:
    """A fresh gateway instance id: host name, process id and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def build_command(image: str) -> str:
    """How to build ``image`` locally: the one place that says so (the runner's error for a missing image,
    ``gateway doctor``). The script knows each sandbox image by its definition in ``images/``
    (``images/<name>.conf``) and refuses an image it has none for, naming the ones it has."""
    return f"{BUILD_COMMAND} {image}"


@dataclass(eq=False)
class DockerSandbox:
    """A created, started container whose supervisor waits for one payload. Used once, then destroyed."""

    spec: RunSpec
    container_id: str | None
    image_id: str | None
    pulled: bool
    sock: Any = field(repr=False)
    """The attached socket (stdin/stdout/stderr of the container)."""
    sockio: Any = field(repr=False, default=None)
    """docker-py's socket object, kept referenced so the connection stays open."""
    used: bool = False
    runtime: str = "runc"
    staging: Staging | None = None
    """The staged binds of the judged mounts (removed after the container, always)."""
    created_with: Mapping[str, Any] | None = None
    """For a warm pool's container: the exact assembled options it was created with (re-guarded at claim)."""
    egress: EgressRun | None = None
    """A run with egress: its proxy, whose directory is bound at ``EGRESS_TARGET``; closed when the run ends."""

    def close(self) -> None:
        """Drop the attach connection of a sandbox that will never run (its container is reaped)."""
        _close(self.sockio)
        self.sockio = None


class DockerRunner:
    """Runs payloads in hardened single-use containers on a Docker engine.

    ``client`` is injectable (tests, a service sharing one client); otherwise one is created lazily from the
    environment (``DOCKER_HOST`` etc.) or from ``base_url``.

    ``instance`` names this gateway instance on every container it creates (``INSTANCE_LABEL``), so that
    :meth:`reap` removes only its own containers and expired ones, never another instance's live sandboxes.
    Defaults to ``$GATEWAY_INSTANCE`` or a fresh id.

    ``clock`` is the wall clock (seconds since the epoch) of the deadline labels, written at create and read by
    :meth:`reap` (a test passes a fixed one).

    ``workspace_root`` is where :attr:`workspaces` keeps the workspaces of sessions (default
    ``gateway.runner.docker.workspace.default_root``).

    A run with network ``egress`` (``RunSpec.egress``) gets a proxy of its own (``gateway.egress.host``), in a
    directory below ``egress_root`` (default: ``egress`` in the gateway's runtime directory) that the runner binds
    into the sandbox (``gateway.runner.docker.egress``); its proxies resolve names with ``egress_resolver``
    (default: the system resolver; tests pass their own). One event-loop thread hosts them, started by the first
    such run and ended by :meth:`close`. The values of the secrets a run's plan binds come from ``secrets``
    (default: ``GATEWAY_SECRET_*`` variables and ``GATEWAY_SECRETS_FILE``); one missing refuses the run before
    any container.
    """

    def __init__(
        self,
        client: Any | None = None,
        *,
        base_url: str | None = None,
        instance: str | None = None,
        clock: Callable[[], float] = time.time,
        workspace_root: str | None = None,
        egress_root: str | None = None,
        egress_resolver: Resolver | None = None,
        secrets: SecretStore | None = None,
    ) -> None:
        self.assembler = DockerAssembler(capacity=self._engine_limits)
        """Builds and guards this backend's options; the Gateway hands it to the decision."""
        self._client = client
        self._owns_client = client is None
        self._base_url = base_url
        self.instance = instance or os.environ.get("GATEWAY_INSTANCE") or new_instance_id()
        self._clock = clock
        self._removals = _Removals(self._destroy)
        """Removals confirmed in the background (runs given ``on_gone``)."""
        self._workspace_root = workspace_root
        self._workspaces: DockerWorkspaces | None = None
        self._egress_root = egress_root
        self._egress_resolver = egress_resolver
        self._egress: EgressHost | None = None
        self._egress_lock = threading.Lock()
        self._secrets = secrets

    def _engine_limits(self) -> BackendLimits:
        """The engine refuses (at start) a CPU quota above its host's CPUs: say so to the decision."""
        try:
            cpus = int(self.client.info()["NCPU"])
        except Exception:  # noqa: BLE001 - no engine, or an answer without NCPU: unknown, judged on the policy alone
            return BackendLimits()
        return BackendLimits(max_cpus=float(cpus)) if cpus > 0 else BackendLimits()

    def close(self) -> None:
        """Finish the background removals and close the egress proxies still open (their connections end), then
        close the client if this runner created it (an injected client belongs to its owner)."""
        self._removals.close()
        with self._egress_lock:
            egress, self._egress = self._egress, None
        if egress is not None:
            egress.close()
        if self._owns_client and self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    def _open_egress(self, spec: RunSpec) -> EgressRun:
        """The run's proxy, listening in a fresh directory (the proxies' loop thread starts with the first)."""
        assert spec.egress is not None  # noqa: S101 - checked by wants_egress
        with self._egress_lock:
            if self._egress is None:
                # Imported here: gateway.egress loads asyncio and ssl, which only a run with egress needs.
                from gateway.egress.host import EgressHost  # noqa: PLC0415

                self._egress = EgressHost(self._egress_directory(), resolver=self._egress_resolver)
            host = self._egress
        plan = bind_secrets(spec.egress, self._secret_store()) if spec.egress.secrets else spec.egress
        uid, gid = sandbox_user(spec)
        try:
            return host.open(plan, uid=uid, gid=gid)
        except OSError as exc:
            raise SandboxError(f"cannot open the run's egress proxy: {exc}; nothing ran") from exc

    def _secret_store(self) -> SecretStore:
        """The store given, else the gateway's environment and ``GATEWAY_SECRETS_FILE`` (read when a run needs it)."""
        if self._secrets is None:
            from gateway.egress.secrets import SecretStore, SecretStoreError  # noqa: PLC0415 -- see _open_egress

            try:
                self._secrets = SecretStore.load(os.environ, os.environ.get("GATEWAY_SECRETS_FILE"))
            except SecretStoreError as exc:
                raise SandboxError(f"{exc}; nothing ran") from exc
        return self._secrets

    def _egress_directory(self) -> Path:
        return Path(self._egress_root) if self._egress_root else default_runtime_dir() / "egress"

    @property
    def workspaces(self) -> DockerWorkspaces:
        """This instance's workspaces (``gateway.runner.docker.workspace``), for workspace-mode sessions."""
        if self._workspaces is None:
            self._workspaces = DockerWorkspaces(self.instance, root=self._workspace_root)
        return self._workspaces

    # -- client ----------------------------------------------------------------------------------------

    @property
    def client(self) -> Any:
        if self._client is None:
            path = _unix_socket_path(self._base_url)
            if path is not None and not os.path.exists(path):
                # Checked up front: a clearer message, and docker-py leaks the socket of a failed connect.
                raise EngineUnavailableError(
                    f"the Docker engine is unreachable: no engine socket at {path}",
                    hint="start the Docker engine (scripts/setup.sh does it) or set DOCKER_HOST",
                )
            try:
                if self._base_url is not None:
                    self._client = docker.DockerClient(base_url=self._base_url)
                else:
                    self._client = docker.from_env()
            except docker.errors.DockerException as exc:
                raise EngineUnavailableError(
                    f"the Docker engine is unreachable: {exc}",
                    hint="start the Docker engine (scripts/setup.sh does it) or set DOCKER_HOST",
                ) from exc
            except Exception as exc:
                raise map_engine_error(exc, "connecting to the Docker engine") from exc
        return self._client

    @contextlib.contextmanager
    def _step(self, action: str) -> Iterator[None]:
        """Map any engine failure inside the block to the gateway's errors."""
        try:
            yield
        except GatewayError:
            raise
        except Exception as exc:
            raise map_engine_error(exc, action) from exc

    # -- images ----------------------------------------------------------------------------------------

    def _inspect(self, image: str) -> dict[str, Any] | None:
        with self._step(f"inspecting image {image}"):
            try:
                found: dict[str, Any] = self.client.api.inspect_image(image)
            except docker.errors.ImageNotFound:
                return None
        return found

    def _resolve(self, image: str) -> tuple[str, str] | None:
        """``(image id, what to create from)`` of ``image`` on the engine, or None when it is not there.

        A reference found as written (a tag, or ``name@sha256:<registry digest>`` of a pulled image) is created
        from as written. A locally built or imported image has no registry digest, so ``name[:tag]@sha256:<x>``
        is also looked up as the local image id ``sha256:<x>``: an image id names its content, so that image
        is created from the id itself, and only if it carries the repository (and tag) the reference names.
        """
        found = self._inspect(image)
        if found is not None:
            return str(found["Id"]), image
        ref = parse_image_ref(image)
        if ref.digest is None:
            return None
        local = self._inspect(ref.digest)
        if local is None or str(local.get("Id")) != ref.digest:
            return None
        names = [str(t) for t in local.get("RepoTags") or ()]
        wanted = f"{ref.repository}:{ref.tag}" if ref.tag else None
        if (wanted is None and any(parse_image_ref(n).repository == ref.repository for n in names)) or wanted in names:
            return ref.digest, ref.digest
        return None

    def image_id(self, image: str) -> str | None:
        resolved = self._resolve(image)
        return None if resolved is None else resolved[0]

    def _pin_mismatch(self, image: str) -> ImageMissingError | None:
        """When ``image`` pins a digest that no local image has, but the repository (or ``name:tag``) is present
        under another id: the clear refusal (the image was rebuilt or replaced since the policy pinned it)."""
        ref = parse_image_ref(image)
        if ref.digest is None:
            return None
        name = f"{ref.repository}:{ref.tag}" if ref.tag else ref.repository
        with self._step(f"listing images of {name}"):
            present = self.client.api.images(name=name) or []
        ids = sorted({str(i["Id"]) for i in present})
        if not ids:
            return None
        return ImageMissingError(
            f"image {image!r} is pinned to {ref.digest}, but the local {name} is {', '.join(ids)}: neither its "
            "registry digest nor its image id matches the pin, so it is not the pinned image (it was rebuilt, "
            "re-imported or replaced); nothing was created",
            hint=f"review the local image, then pin its id in the policy (docker image inspect --format "
            f"'{{{{.Id}}}}' {name}) under images.allow digests; or load the pinned image. Rebuilding changes the id.",
        )

    def _ensure_image(self, image: str, pull: str) -> tuple[str, bool, str]:
        """``(image id, pulled, what to create from)``; never a silent pull."""
        resolved = self._resolve(image)
        if resolved is not None:
            return resolved[0], False, resolved[1]
        pinned = parse_image_ref(image).digest is not None
        if pull != "if-missing":
            mismatch = self._pin_mismatch(image)
            if mismatch is not None:
                raise mismatch
            if pinned:
                raise ImageMissingError(
                    f"image {image!r} is pinned by digest and no local image has that registry digest or image "
                    "id, and the policy does not allow pulls",
                    hint="load the pinned image (docker load, or pull it by digest where a registry is allowed); a "
                    "locally built image is pinned by its id (docker image inspect --format '{{.Id}}' NAME:TAG), "
                    "which a rebuild changes",
                )
            raise ImageMissingError(
                f"image {image!r} is not present on the engine and the policy does not allow pulls; "
                f"build it locally with {build_command(image)}",
                hint=f"run {build_command(image)} (it builds the sandbox images of images/ without any registry)",
            )
        try:
            self.client.images.pull(image)
        except Exception as exc:
            detail = map_engine_error(exc, f"pulling {image}").message
            raise ImageMissingError(
                f"image {image!r} is missing and pulling it failed (registry unreachable or image unknown): {detail}",
                hint=f"build the image locally ({build_command(image)}) or make its registry reachable",
            ) from exc
        resolved = self._resolve(image)
        if resolved is None:
            raise ImageMissingError(f"image {image!r} is still missing after a pull")
        return resolved[0], True, resolved[1]

    # -- prepare ---------------------------------------------------------------------------------------

    def _create_kwargs(self, options: Mapping[str, Any], *, expires_s: float) -> dict[str, Any]:
        options = dict(options)
        guard(options)  # also refuses the runner-owned keys added below
        # The environment is the program's alone: it travels in the payload to the program's execve, never
        # in the container's configuration (where the supervisor, PID 1, would hold it too).
        options.pop("environment", None)
        deadline = int(self._clock() + expires_s) + 1
        options["labels"] = {
            **dict(options.get("labels") or {}),
            MANAGED_LABEL: "true",
            INSTANCE_LABEL: self.instance,
            DEADLINE_LABEL: str(deadline),
        }
        options.update(
            entrypoint=supervisor_command(interpreter=str(options["labels"].get(INTERPRETER_LABEL, "python"))),
            command=[],
            stdin_open=True,
            stdin_once=True,
            tty=False,
            detach=True,
            log_config={"type": "none", "config": {}},
            auto_remove=True,
        )
        return options

    def prepare(self, spec: RunSpec) -> DockerSandbox:
        return self._prepare(spec, self._create_kwargs(spec.options, expires_s=spec.timeout_s))

    def _prepare(self, spec: RunSpec, kwargs: dict[str, Any], *, pooled: bool = False) -> DockerSandbox:
        with_egress = wants_egress(spec)
        image_id, pulled, kwargs["image"] = self._ensure_image(spec.image, spec.pull)
        api = self.client.api
        container_id: str | None = None
        sockio: Any = None
        staging: Staging | None = None
        egress: EgressRun | None = None
        runtime = str(spec.options.get("runtime") or "runc")
        try:
            staging = _stage(spec, kwargs)
            if spec.workspace is not None:  # after the staging's check: it compares the judged mounts alone
                kwargs = bind_workspace(kwargs, spec.workspace)
            if with_egress:  # the same: the runner's own bind, after the staging's check
                egress = self._open_egress(spec)
                kwargs = bind_egress(kwargs, egress.directory)
            with self._step("creating the container"):
                container_id = str(api.create_container(**_create_args(kwargs, api))["Id"])
            with self._step("attaching to the container"):
                sockio = api.attach_socket(container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
                sock = _raw_socket(sockio)
            with self._step("starting the container"):
                api.start(container_id)
            if staging is not None or spec.workspace is not None or egress is not None:  # before any payload
                with self._step("verifying the container's mounts"):
                    found = api.inspect_container(container_id)
                    if spec.workspace is not None:
                        found = verify_workspace(found, runtime, spec.workspace)
                    if egress is not None:
                        found = verify_egress(found, runtime, egress.directory)
                    if staging is not None:
                        staging.verify(found, runtime)
        except BaseException:
            _close(sockio)
            try:
                if container_id is not None:
                    self._remove(container_id, quiet=True)
            finally:
                if staging is not None:
                    staging.remove()
                if egress is not None:
                    egress.close()
            raise
        return DockerSandbox(
            spec=spec,
            container_id=container_id,
            image_id=image_id,
            pulled=pulled,
            sock=sock,
            sockio=sockio,
            runtime=runtime,
            staging=staging,
            created_with=MappingProxyType(dict(spec.options)) if pooled else None,
            egress=egress,
        )

    # -- the warm pool ---------------------------------------------------------------------------------

    def pool_key(self, profile: SandboxProfile) -> str:
        return pool_key(profile)

    def prepare_idle(
        self, profile: SandboxProfile, *, ttl_s: float, workspace: Workspace | None = None
    ) -> DockerSandbox:
        """A container of ``profile`` alone, for a warm pool: the profile's options (guarded), the pool label,
        no environment, no mounts, no label naming a request; it waits for one payload on stdin. ``workspace``:
        a session's, bound at ``/workspace`` and checked after start as for a run (its next container,
        ``gateway.sessions.ahead``); only a spec with that workspace can claim it."""
        options = profile_options(profile)
        options["labels"] = {**options["labels"], POOL_LABEL: pool_key(profile)}
        return self.prepare_pooled(options, ttl_s=ttl_s, pull=profile.pull, workspace=workspace)

    def prepare_pooled(
        self, options: Mapping[str, Any], *, ttl_s: float, pull: str = "never", workspace: Workspace | None = None
    ) -> DockerSandbox:
        """A pooled container made from ``options`` as they are (guarded; refused when they hold anything of
        one run: an environment, mounts, a label naming a request), with ``workspace`` bound when given.
        :meth:`prepare_idle` gives it a profile's options; the containment suite gives it the profile part of
        the options it tests."""
        run_keys = sorted(k for k in options if k in RUN_OPTION_KEYS) + sorted(
            k for k in dict(options.get("labels") or {}) if k in RUN_LABELS
        )
        if run_keys:
            raise UnsafeOptionsError(f"a pooled container is made before any request; it cannot hold {run_keys}")
        spec = RunSpec(options=options, timeout_s=ttl_s, output_bytes=0, pull=pull, workspace=workspace)
        kwargs = self._create_kwargs(spec.options, expires_s=ttl_s)
        return self._prepare(spec, kwargs, pooled=True)

    def claim(self, sandbox: Any, spec: RunSpec) -> DockerSandbox | None:
        """Bind an idle pooled sandbox to ``spec``; None when its container is no longer alive.

        The guard runs again on the options the container was created with (and on the decision's), and those
        options must be exactly the profile part of the decision's (``profile_part``): same image, runtime,
        limits, user, seccomp profile, every hardening key; and the same workspace as the container's (a
        session's next container, or none). A request with mounts never matches."""
        if not isinstance(sandbox, DockerSandbox) or sandbox.created_with is None:
            raise SandboxError("only an idle pooled sandbox can be claimed")
        if sandbox.used:
            raise SandboxError("a sandbox is used once; this one was already claimed")
        guard(sandbox.created_with)
        guard(spec.options)
        if wants_egress(spec):
            raise UnsafeOptionsError("a run with egress is never pooled: its proxy is bound when its container is made")
        made = profile_part(sandbox.created_with)
        made["labels"] = {k: v for k, v in made["labels"].items() if k != POOL_LABEL}
        other_workspace = spec.workspace != sandbox.spec.workspace
        if spec.mounts or other_workspace or "mounts" in spec.options or made != profile_part(spec.options):
            differ = sorted(
                k for k in set(made) | set(spec.options) if made.get(k) != profile_part(spec.options).get(k)
            ) + (["workspace"] if other_workspace else [])
            raise UnsafeOptionsError(
                "the pooled container was created with options other than the profile part of the decision's "
                f"({', '.join(differ) or 'mounts'}); it was destroyed and nothing ran in it"
            )
        if not _alive(sandbox.sock):
            sandbox.used = True
            return None
        sandbox.used = True
        return replace(sandbox, spec=spec, used=False)

    # -- kernels ---------------------------------------------------------------------------------------

    def open_kernel(
        self, spec: RunSpec, *, files: Mapping[str, bytes] | None = None, slot: Slot | None = None,
        grace_s: float = KERNEL_GRACE_S,
    ) -> DockerKernel:  # fmt: skip
        """A kernel in a container made exactly as a run's (see ``gateway.runner.interface.KernelRunner``); with
        egress, its proxy is opened and bound with the container, for the kernel's whole life
        (``gateway.runner.docker.kernel``)."""
        kwargs = self._create_kwargs(spec.options, expires_s=spec.timeout_s)
        return self._open_kernel(spec, kwargs, files, slot, grace_s)

    def _open_kernel(
        self, spec: RunSpec, kwargs: dict[str, Any], files: Mapping[str, bytes] | None, slot: Slot | None,
        grace_s: float, *, pooled: bool = False,
    ) -> DockerKernel:  # fmt: skip
        try:
            sandbox = self._prepare(spec, kwargs, pooled=pooled)
        except BaseException:
            if slot is not None:
                slot.release()
            raise
        sandbox.used = True  # a kernel's container never takes a run's payload
        kernel = DockerKernel(self, sandbox, slot, grace_s)
        try:
            kernel.start(dict(files or {}))
        except BaseException:
            with contextlib.suppress(Exception):
                kernel.close()
            raise
        return kernel

    # -- ready kernels (the warm pool's kernel profiles) -----------------------------------------------

    def kernel_key(self, spec: RunSpec, workspace: WorkspaceShape | None) -> str | None:
        """The sha256 of everything a kernel is opened with before a session claims it: the profile part of
        ``spec``'s options, its environment (the opening payload's), its deadline and output caps, and the
        workspace's size, uid and gid; None for a spec no ready kernel can serve (mounts are bound at create, and so
        is an egress proxy: a kernel with egress is always opened on request)."""
        if spec.mounts or spec.workspace is not None or "mounts" in spec.options or wants_egress(spec):
            return None
        opened = {
            "options": profile_part(spec.options), "environment": dict(spec.options.get("environment") or {}),
            "timeout_s": spec.timeout_s, "output_bytes": spec.output_bytes,
            "output_files_bytes": spec.output_files_bytes, "output_files": spec.output_files, "pull": spec.pull,
            "workspace": None if workspace is None else list(workspace),
        }  # fmt: skip
        return hashlib.sha256(options_bytes(opened)).hexdigest()

    def prepare_kernel(
        self, spec: RunSpec, *, workspace: WorkspaceShape | None, slot: Slot, wait_s: float
    ) -> DockerKernel:
        """A ready kernel for a session of ``spec`` not yet asked for: its container made from the profile part of
        the options (guarded, the pool label, no label naming a request) over a fresh workspace of ``workspace``
        (size, uid, gid), its interpreter up with ``spec``'s environment, holding ``slot``. Its deadline (the
        label, the supervisor's) is ``spec``'s plus ``wait_s``, the longest it may wait to be claimed, so that it
        still has ``spec``'s whole deadline when a session claims it (:meth:`claim_kernel`)."""
        key = self.kernel_key(spec, workspace)
        if key is None:
            slot.release()
            raise UnsafeOptionsError(
                "a ready kernel is made before any request; its spec cannot hold mounts or egress (both are bound "
                "when its container is made for the session)"
            )
        options = profile_part(spec.options)
        options["labels"] = {**options["labels"], POOL_LABEL: key}
        options["environment"] = dict(spec.options.get("environment") or {})
        made: Workspace | None = None
        try:
            if workspace is not None:
                made = self.workspaces.create(*workspace)
            opened = replace(spec, options=options, timeout_s=spec.timeout_s + wait_s, workspace=made)
            kwargs = self._create_kwargs(opened.options, expires_s=opened.timeout_s)
            kernel = self._open_kernel(opened, kwargs, None, slot, KERNEL_GRACE_S, pooled=True)
        except BaseException:
            slot.release()
            if made is not None:
                with contextlib.suppress(Exception):
                    self.workspaces.destroy(made)
            raise
        return kernel

    def claim_kernel(self, kernel: Any, spec: RunSpec) -> tuple[DockerKernel, Workspace | None] | None:
        """Hand a ready kernel to the session whose kernel spec is ``spec``: the kernel and its workspace; None
        when it no longer lives or waited too long to still have ``spec``'s deadline (discard it).

        As for a pooled run (:meth:`claim`), the guard runs again on the options its container was created with
        and on the decision's, and they must be exactly the profile part of the decision's; its environment, output
        caps and deadline must be the decision's too (they were in its opening payload)."""
        if not isinstance(kernel, DockerKernel) or kernel.sandbox.created_with is None:
            raise SandboxError("only a ready kernel can be claimed")
        sandbox = kernel.sandbox
        made = dict(sandbox.created_with or {})
        guard(made)
        guard(spec.options)
        environment = made.pop("environment", None) or {}
        made = profile_part(made)
        made["labels"] = {k: v for k, v in made["labels"].items() if k != POOL_LABEL}
        wanted = profile_part(spec.options)
        opened = sandbox.spec
        caps = (opened.output_bytes, opened.output_files_bytes, opened.output_files)
        differ = sorted(k for k in set(made) | set(wanted) if made.get(k) != wanted.get(k))
        if environment != dict(spec.options.get("environment") or {}):
            differ.append("environment")
        if caps != (spec.output_bytes, spec.output_files_bytes, spec.output_files):
            differ.append("output caps")
        if spec.mounts or spec.workspace is not None or "mounts" in spec.options:
            differ.append("mounts")
        if wants_egress(spec):
            differ.append("egress")
        if differ:
            raise UnsafeOptionsError(
                "the ready kernel was opened with options other than the profile part of the decision's "
                f"({', '.join(differ)}); it was destroyed and nothing ran in it"
            )
        if kernel.killed is not None or kernel.opened_for() < spec.timeout_s or not _alive(sandbox.sock):
            return None
        kernel.bind(replace(spec, workspace=opened.workspace))
        return kernel, opened.workspace

    def discard_kernel(self, kernel: Any) -> None:
        """Destroy a ready kernel no session claimed: its container, then its workspace."""
        if not isinstance(kernel, DockerKernel):
            return
        try:
            with contextlib.suppress(Exception):
                kernel.close()
        finally:
            workspace = kernel.sandbox.spec.workspace
            if workspace is not None:
                self.workspaces.destroy(workspace)

    def discard(self, sandbox: Any) -> None:
        """Destroy a sandbox that will never run: its supervisor ends when its stdin closes; removed too."""
        if not isinstance(sandbox, DockerSandbox):
            return
        sandbox.used = True
        _close(sandbox.sockio)
        with contextlib.suppress(Exception):
            if sandbox.container_id is not None:
                self._remove(sandbox.container_id, quiet=True)
        if sandbox.staging is not None:
            with contextlib.suppress(Exception):
                sandbox.staging.remove()
        if sandbox.egress is not None:
            with contextlib.suppress(Exception):
                sandbox.egress.close()

    # -- run -------------------------------------------------------------------------------------------

    def run(
        self, sandbox: Any, payload: Payload, *, on_output: OnOutput | None = None,
        cancel: threading.Event | None = None, on_gone: OnGone | None = None,
    ) -> Outcome:  # fmt: skip
        if not isinstance(sandbox, DockerSandbox):
            raise SandboxError(f"DockerRunner cannot run a {type(sandbox).__name__}")
        if sandbox.used:
            raise SandboxError("a sandbox is used once; prepare a new one")
        sandbox.used = True
        got = Collected()
        start = time.monotonic()
        left: GatewayError | None = None
        egress: EgressReport | None = None
        redactor = None
        if on_output is not None and sandbox.egress is not None and sandbox.egress.values:
            on_output = redactor = OutputRedactor(on_output, sandbox.egress.values)  # live chunks, erased too
        try:
            if sandbox.spec.workspace is not None:  # the program has not run: its supervisor waits for the payload
                prepare_for_run(sandbox.spec.workspace, payload.files)
            outcome = self._run(sandbox, payload, got, start, on_output=on_output, cancel=cancel)
        except GatewayError as exc:
            # Whatever ended the run (the engine, a tampered stream, the gateway interrupted), the report
            # keeps what the program had produced, which container it was and where it connected.
            exc.outcome = exc.outcome or self._partial(sandbox, got, start)
            egress = _end_egress(sandbox)
            if egress is not None:
                exc.outcome = _redacted(sandbox, replace(exc.outcome, egress=egress))
            raise
        finally:
            if redactor is not None:
                redactor.flush()
            try:
                # The run is over, whatever ended it: its proxy ends every connection it still has (run-ended).
                egress = _end_egress(sandbox)
            finally:
                # Closing stdin ends the supervisor (it waits for exactly this after its final frame), and the
                # engine's AutoRemove removes the container. With ``on_gone`` the removal is confirmed (and forced
                # if need be) in the background, off the caller's path; without it, here.
                _close(sandbox.sockio)
                if on_gone is not None:
                    self._removals.submit(sandbox, on_gone)
                else:
                    left = self._destroy(sandbox)
        if egress is not None:
            outcome = _redacted(sandbox, replace(outcome, egress=egress))
        if left is not None:
            raise _left(str(sandbox.container_id), outcome, left)
        return outcome

    def _destroy(self, sandbox: DockerSandbox) -> GatewayError | None:
        """Force-remove a finished sandbox's container and its staging; why it could not be removed, if so."""
        try:
            if sandbox.container_id is not None:
                return self._removal_failure(sandbox.container_id)
            return None
        finally:
            if sandbox.staging is not None:
                sandbox.staging.remove()

    def execute(
        self, spec: RunSpec, payload: Payload, *, on_output: OnOutput | None = None,
        cancel: threading.Event | None = None, on_gone: OnGone | None = None,
    ) -> Outcome:  # fmt: skip
        return prepare_and_run(self, spec, payload, on_output=on_output, cancel=cancel, on_gone=on_gone)

    def settle(self, timeout_s: float = 30.0) -> bool:
        """Wait (bounded) until every background removal is done; True when none is pending."""
        return self._removals.settle(timeout_s)

    def _run(
        self, sb: DockerSandbox, payload: Payload, got: Collected, start: float, *, on_output: OnOutput | None,
        cancel: threading.Event | None,
    ) -> Outcome:  # fmt: skip
        spec = sb.spec
        assert sb.container_id is not None  # noqa: S101 - set by prepare
        cid = sb.container_id
        key = new_key()
        env = dict(spec.options.get("environment") or {})
        if sb.egress is not None:  # set over the request's: the proxy is the run's only way out anyway
            env.update(EGRESS_ENVIRONMENT)
        data = encode_payload(
            key,
            payload.code,
            payload.files,
            spec.output_files_bytes,
            spec.output_files,
            env=env,
            timeout_s=spec.timeout_s,
            language=payload.language,
            egress=sb.egress is not None,
            packages=spec.packages,
        )
        deadline = start + spec.timeout_s
        kill = False
        try:
            sb.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            # No half-close: the supervisor's stdin stays open for the whole run, and its EOF (this process
            # gone, or its engine connection lost) tells the supervisor to end the run on its own.
            sb.sock.sendall(data)
            kill = read_frames(sb.sock, FrameDecoder(key), got, spec, deadline, on_output=on_output, cancel=cancel)
        except TimeoutError:
            got.timed_out = kill = True
        except ProtocolError as exc:
            _close(sb.sockio)
            self._kill(cid)
            raise SandboxError(
                f"the sandbox's output stream failed verification ({exc}); the program tampered with it"
            ) from exc
        except OSError as exc:
            if time.monotonic() >= deadline:
                got.timed_out = kill = True
            else:
                raise map_engine_error(exc, "talking to the container") from exc
        if kill:
            # Drop the attach connection first: under gVisor a sandbox blocked writing to a stream nobody
            # reads does not die on a kill until its output can drain.
            _close(sb.sockio)
            self._kill(cid)
        if got.callback_error is not None:
            raise OutputCallbackError(
                "the output callback raised "
                f"{type(got.callback_error).__name__}: {got.callback_error}; the sandbox was killed"
            ) from got.callback_error
        if got.cancelled:
            raise CancelledRunError("the run was cancelled by its caller; the sandbox was killed")
        if got.error is not None:
            raise SandboxError(f"the sandbox could not start the program: {got.error}")
        # After the final frame the supervisor waits for its stdin to close before it exits: the container is
        # still there to be inspected (OOMKilled). Without a final frame it may already be gone (AutoRemove).
        # The engine's OOMKilled only matters for a program that reported exit 137 (see ``outcome_of``) or that
        # never reported; and when the supervisor could read the memory cgroup's OOM counter itself, its report
        # is the answer. Otherwise the engine is not asked: one round trip less on nearly every run (under
        # gVisor an inspect costs tens to hundreds of milliseconds).
        state = {} if got.final is not None and (got.oom_known or got.final["status"] != 137) else self._state(cid)
        _close(sb.sockio)
        duration_ms = round((time.monotonic() - start) * 1000)
        return outcome_of(
            got,
            state,
            duration_ms,
            runtime=sb.runtime,
            container_id=sb.container_id,
            image_id=sb.image_id,
            pulled=sb.pulled,
        )

    def _partial(self, sb: DockerSandbox, got: Collected, start: float) -> Outcome:
        """The outcome of a run that an error ended: what arrived so far, no exit code of the program's."""
        got.final = None
        return replace(
            outcome_of(got, {}, round((time.monotonic() - start) * 1000), runtime=sb.runtime,
                       container_id=sb.container_id, image_id=sb.image_id, pulled=sb.pulled),
            resource_killed=False,
        )  # fmt: skip

    def _state(self, container_id: str) -> Mapping[str, Any]:
        """The container's engine state, or an empty one when the engine already removed it."""
        try:
            state: Mapping[str, Any] = self.client.api.inspect_container(container_id)["State"]
        except docker.errors.NotFound:
            return {}
        except Exception as exc:
            raise map_engine_error(exc, "inspecting the container") from exc
        return state

    def _oom_event(self, container_id: str, since: float) -> bool:
        """Whether the engine recorded an ``oom`` event for the container since ``since`` (unix time): the answer
        that outlives the container (its state goes with it when the engine's AutoRemove removes it)."""
        try:
            events = self.client.api.events(
                since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                filters={"container": container_id, "event": "oom"},
            )  # fmt: skip
            try:
                return any(True for _ in events)
            finally:
                events.close()
        except Exception as exc:
            raise map_engine_error(exc, "reading the engine's events") from exc

    # -- kill / remove / reap --------------------------------------------------------------------------

    def _kill(self, container_id: str) -> None:
        try:
            self.client.api.kill(container_id)
        except docker.errors.APIError as exc:
            if exc.status_code in (404, 409):  # gone, or not running any more
                return
            raise map_engine_error(exc, "killing the container") from exc
        except Exception as exc:
            raise map_engine_error(exc, "killing the container") from exc

    def _remove(self, container_id: str, *, quiet: bool) -> bool:
        """Force-remove a container. True when it is gone (or the engine's AutoRemove is removing it);
        False when it could not be removed and ``quiet`` (otherwise the mapped error is raised)."""
        try:
            self.client.api.remove_container(container_id, force=True)
        except docker.errors.NotFound:
            return True
        except Exception as exc:
            if isinstance(exc, docker.errors.APIError) and exc.status_code == 409 and "in progress" in str(exc):
                return self._removed(container_id)  # the engine's AutoRemove got there first
            if not quiet:
                raise map_engine_error(exc, f"removing container {container_id[:12]}") from exc
            return False
        return True

    def _removal_failure(self, container_id: str) -> GatewayError | None:
        """Force-remove a container after its run; None when it is gone, else why it could not be removed."""
        try:
            self._remove(container_id, quiet=False)
        except GatewayError as exc:
            return exc
        return None

    def _removed(self, container_id: str) -> bool:
        """Wait (bounded) for a removal the engine is doing; True once the container is gone."""
        try:
            self.client.api.wait(container_id, timeout=_REMOVAL_WAIT_S, condition="removed")
        except docker.errors.NotFound:
            return True
        except Exception:  # noqa: BLE001 - not gone in time, or the engine cannot say: not removed
            return False
        return True

    def reap(
        self, *, everything: bool = False, expired_only: bool = False, dead: Callable[[str], bool] | None = None
    ) -> list[str]:
        """Remove this instance's containers and every expired one (``everything``: every gateway container;
        ``expired_only``: only the expired ones, whoever made them; ``dead(instance)``: also those of another
        instance it says is no longer alive)."""
        with self._step("listing the gateway's containers"):
            found = self.client.api.containers(all=True, filters={"label": f"{MANAGED_LABEL}=true"})
        now = self._clock()
        removed: list[str] = []
        live: set[str] = set()
        gone: set[str] = set()
        for entry in found:
            labels = entry.get("Labels") or {}
            decision = str(labels.get(DECISION_LABEL, ""))
            owner = str(labels.get(INSTANCE_LABEL, ""))
            mine = owner == self.instance and not expired_only
            orphan = dead is not None and owner != self.instance and dead(owner)
            if everything or mine or orphan or is_expired(labels, now):
                cid = str(entry["Id"])
                self._remove(cid, quiet=False)
                removed.append(cid)
                gone.add(decision)
            else:
                live.add(decision)
        # Staged binds of containers that no longer exist (a crashed gateway); a run being prepared right
        # now has staged before creating its container, hence the grace.
        reap_staging(live, grace_s=EXPIRY_GRACE_S, gone=gone)
        # The same for runs' egress directories in which no proxy listens any more.
        reap_egress(self._egress_directory(), grace_s=EXPIRY_GRACE_S)
        return removed

    def reap_workspaces(
        self, *, everything: bool = False, expired_only: bool = False, dead: Callable[[str], bool] | None = None
    ) -> list[str]:
        """Remove leftover workspaces as :meth:`reap` removes containers (call it after :meth:`reap`: a workspace
        is freed once no container holds it); ``dead`` defaults to :func:`instance_dead`. Returns their names."""
        return self.workspaces.reap(
            everything=everything, expired_only=expired_only, dead=instance_dead if dead is None else dead
        )


class _Removals:
    """One background thread that confirms the removal of finished sandboxes and reports each as gone.

    A run's result does not wait for the engine to tear its container down: the supervisor has already exited
    (its stdin was closed) and the engine's AutoRemove is removing it. This thread makes sure (a forced
    remove, a bounded wait), removes the staging of its mounts, and calls the run's ``on_gone`` with None or
    with why the container could not be removed (the Gateway audits that, and the container is left for
    ``gateway reap``, labelled, ending itself at its deadline). ``on_gone`` is where the Gateway frees the
    run's host slot, so a container counts against the host's bound until it is gone."""

    def __init__(self, destroy: Callable[[DockerSandbox], GatewayError | None]) -> None:
        self._destroy = destroy
        self._cond = threading.Condition()
        self._queue: list[tuple[DockerSandbox, OnGone]] = []
        self._busy = 0
        self._thread: threading.Thread | None = None

    def submit(self, sandbox: DockerSandbox, on_gone: OnGone) -> None:
        with self._cond:
            self._queue.append((sandbox, on_gone))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="gateway-removals", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    if not self._cond.wait(5.0) and not self._queue:
                        self._thread = None
                        return
                    continue
                sandbox, on_gone = self._queue.pop(0)
                self._busy += 1
            try:
                try:
                    error = self._destroy(sandbox)
                except Exception as exc:  # noqa: BLE001 - reported to on_gone, the thread goes on
                    error = exc if isinstance(exc, GatewayError) else SandboxError(f"removal failed: {exc}")
                with contextlib.suppress(Exception):
                    on_gone(error)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def settle(self, timeout_s: float) -> bool:
        give_up = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._busy:
                left = give_up - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
            return True

    def close(self) -> None:
        self.settle(60.0)


def _redacted(sandbox: DockerSandbox, outcome: Outcome) -> Outcome:
    """``outcome`` with the values of the run's secrets erased from what it returns (``redact_outcome``)."""
    return outcome if sandbox.egress is None else redact_outcome(outcome, sandbox.egress.values)


def _end_egress(sandbox: DockerSandbox) -> EgressReport | None:
    """Close a run's proxy (idempotent); its report, or None for a run without egress."""
    if sandbox.egress is None:
        return None
    try:
        return sandbox.egress.close()
    except Exception as exc:
        raise SandboxError(f"closing the run's egress proxy failed: {exc}") from exc


def _left(container_id: str, outcome: Outcome, cause: GatewayError) -> GatewayError:
    """The error for a run whose container could not be removed afterwards, keeping the run's outcome.

    An engine that was lost (unreachable) is reported as such: the run's own report may be cut short too.
    Otherwise the run ended on its own terms and only the removal failed (``runner.container_left``)."""
    where = f"its container {container_id[:12]} could not be removed ({cause.message})"
    error: GatewayError
    if isinstance(cause, EngineUnavailableError):
        error = EngineUnavailableError(
            f"the Docker engine was lost during the run; {where}; the container ends itself at its deadline "
            "and `gateway reap` removes it once the engine is back"
        )
    else:
        ran = "the program finished and reported" if outcome.exit_code is not None else "the run ended"
        error = ContainerLeftError(
            f"{ran}, but {where}; it was left for `gateway reap` (it also ends itself at its deadline)"
        )
    error.__cause__ = cause
    error.outcome = outcome
    return error


def is_expired(labels: Mapping[str, str], now: float) -> bool:
    """True when a gateway container is past its deadline label plus the grace (or carries no valid one:
    made by a gateway too old to label it, so nobody is waiting for it)."""
    try:
        deadline = float(labels.get(DEADLINE_LABEL, ""))
    except ValueError:
        return True
    return now > deadline + EXPIRY_GRACE_S


def _create_args(kwargs: Mapping[str, Any], api: Any) -> dict[str, Any]:
    """``create_container`` arguments through docker-py's public low-level API.

    The assembled keys are sorted by our own two allow-lists (container config, host config) into
    ``create_container`` and ``create_host_config`` (``mounts`` are the engine's own ``Mounts`` objects, passed
    as they are: non-recursive binds of staging paths, see ``mounts.py``). Anything else is refused: the
    guard already passed these options, so a leftover is a bug.
    ``stdin_once`` has no keyword of its own in docker-py: ``create_container`` sets ``StdinOnce`` (and the
    attach flags) from ``stdin_open`` when ``detach`` is false, so that is how it is expressed.
    ``use_config_proxy=False``: docker-py would otherwise copy proxy settings from the client's config file
    into the sandbox's environment, which the policy never allowed.
    """
    args = dict(kwargs)
    stdin_once = bool(args.pop("stdin_once", False))
    host = {k: args.pop(k) for k in list(args) if k in HOST_CONFIG_KEYS or k in ("log_config", "auto_remove")}
    transport: dict[str, Any] = {k: args.pop(k) for k in ("command", "entrypoint", "stdin_open", "tty") if k in args}
    args.pop("detach", None)  # expressed through stdin_once below
    leftovers = sorted(set(args) - CONTAINER_CONFIG_KEYS)
    if leftovers:
        raise UnsafeOptionsError(f"options outside the allow-lists reached the runner: {', '.join(leftovers)}")
    create: dict[str, Any] = {
        **args,
        **transport,
        "detach": not stdin_once,
        "host_config": api.create_host_config(**host),
        "use_config_proxy": False,
    }
    return create


def _stage(spec: RunSpec, kwargs: Mapping[str, Any]) -> Staging | None:
    """Bind the judged mounts at this run's staging paths and check the assembled mounts name exactly them."""
    if not spec.mounts and "mounts" not in kwargs:
        return None
    decision_id = str((kwargs.get("labels") or {}).get(DECISION_LABEL, ""))
    staging = Staging.stage(spec.mounts, decision_id)
    try:
        staging.check_options(kwargs.get("mounts"))
    except BaseException:
        staging.remove()
        raise
    return staging


def _unix_socket_path(base_url: str | None) -> str | None:
    """The unix socket the client would use, when it is one (``DOCKER_HOST`` or the default)."""
    url = base_url if base_url is not None else os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    for prefix in ("unix://", "http+unix://"):
        if url.startswith(prefix):
            return url[len(prefix) :] or None
    return None


def _raw_socket(sockio: Any) -> Any:
    """The socket under docker-py's attach object; we need per-call timeouts and a half-close."""
    sock = getattr(sockio, "_sock", sockio)
    for needed in ("recv", "sendall", "settimeout", "shutdown"):
        if not hasattr(sock, needed):
            raise SandboxError(f"the engine's attach connection ({type(sock).__name__}) is not a socket")
    return sock


def _alive(sock: Any) -> bool:
    """True when an idle sandbox's attach connection is still open and silent: a waiting supervisor writes
    nothing, so anything readable (EOF: the container ended; or bytes) means it is not fit to serve."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _close(sockio: Any) -> None:
    """Close docker-py's attach object, its socket and its HTTP response (``SocketIO.close`` forgets the
    socket without closing it, so take the socket first)."""
    if sockio is None:
        return
    sock = getattr(sockio, "_sock", None)
    response = getattr(sockio, "_response", None)
    for closable in (sockio, sock, response):
        if closable is not None:
            with contextlib.suppress(Exception):
                closable.close()

"""The runner interface: what a sandbox backend receives and what it gives back.

A runner turns an allowed decision into one contained execution. It never decides anything: the options it
gets were assembled (and guarded) by the policy engine; it only adds its own transport keys. The interface
separates *preparing* a hardened container (``prepare``) from *handing it one payload* (``run``) so that a
warm pool can prepare containers ahead of time; ``execute`` is both in one call. What it receives, the
``RunSpec``, lives in ``gateway.runspec`` (the decision builds it) and is re-exported here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from gateway.errors import GatewayError
from gateway.payload import Payload
from gateway.runspec import PULL_POLICIES, HostMount, RunSpec

if TYPE_CHECKING:
    from gateway.decision.engine import Assembler
    from gateway.decision.settings import SandboxProfile
    from gateway.egress.proxy import EgressReport
    from gateway.slots import Slot

__all__ = [
    "KERNEL_KILL_REASONS",
    "NOTHING_RAN",
    "POOL_STATUSES",
    "PULL_POLICIES",
    "STREAMS",
    "CellResult",
    "HostMount",
    "Kernel",
    "KernelRunner",
    "OnGone",
    "OnOutput",
    "Outcome",
    "Payload",
    "PoolStatus",
    "PoolingRunner",
    "RunSpec",
    "Runner",
    "Sandbox",
    "prepare_and_run",
]

STREAMS = ("stdout", "stderr")
"""The names an output callback receives as its first argument."""

OnOutput = Callable[[str, bytes], None]
"""An output-chunk callback ``(stream, data)``: ``stream`` is ``"stdout"`` or ``"stderr"``, ``data`` the next
bytes of it that the outcome keeps (see ``Runner.run``)."""

POOL_STATUSES = ("hit", "miss", "cold")
PoolStatus = Literal["hit", "miss", "cold"]
"""How a run found its sandbox: ``hit`` (a warm pooled container was claimed), ``miss`` (its profile has a
pool, but it was empty: the run went cold), ``cold`` (no pool serves its options: pooling off, or a request
with host mounts)."""

OnGone = Callable[[GatewayError | None], None]
"""Called once a run's sandbox no longer exists (``Runner.run(..., on_gone=)``), possibly later and from
another thread: with None, or with the error that kept its container from being removed."""


@dataclass(frozen=True)
class Outcome:
    """What happened. ``exit_code`` is ``None`` whenever the program did not finish on its own."""

    exit_code: int | None
    """The program's exit status (a signal ``n`` is ``128 + n``); 137 when killed for memory; ``None`` when
    the runner killed it (deadline, output flood) or the sandbox died under it (``resource_killed``)."""
    stdout: bytes
    """At most ``output_bytes`` of what the program wrote to stdout."""
    stderr: bytes
    """At most ``output_bytes`` of what the program wrote to stderr."""
    stdout_truncated: bool
    stderr_truncated: bool
    stdout_bytes: int
    """Bytes of stdout the runner saw (``>= len(stdout)``)."""
    stderr_bytes: int
    timed_out: bool
    """Killed at the deadline."""
    oom_killed: bool
    """The engine reported an out-of-memory kill in the container."""
    output_limit_killed: bool
    """Killed because a stream went past ``output_bytes``."""
    resource_killed: bool
    """The sandbox itself died without reporting the program's exit (gVisor under its pids limit)."""
    duration_ms: int
    """From the hand-over of the payload to the end of collection."""
    container_id: str | None
    image_id: str | None
    files: Mapping[str, bytes] = field(default_factory=dict)
    """Files the program wrote under ``/workspace/out``, by path relative to it (binary-safe)."""
    files_truncated: bool = False
    """Some files under ``/workspace/out`` were left out because of ``output_files_bytes`` or ``output_files``."""
    pulled: bool = False
    """An image pull happened for this run (to be audited)."""
    sandbox: Mapping[str, str] = field(default_factory=dict)
    """What the backend names the sandbox by besides ``container_id``, for the outcome record (Kubernetes:
    ``namespace``, ``pod``, ``pod_uid``, ``pod_sha256`` and, when the kubelet ended the Pod, ``reason``:
    ``OOMKilled``, ``Evicted``, ``DeadlineExceeded``). Empty for the Docker backend."""
    pool: PoolStatus | None = None
    """``hit`` / ``miss`` / ``cold`` (see ``POOL_STATUSES``), set by the Gateway; None from a bare runner."""
    egress: EgressReport | None = None
    """A run with network ``egress``: its connection records and totals from the run's proxy; None otherwise."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly view (bytes decoded as UTF-8 with replacement; file contents as sizes)."""
        return {
            "exit_code": self.exit_code,
            "stdout": self.stdout.decode("utf-8", "replace"),
            "stderr": self.stderr.decode("utf-8", "replace"),
            "stdout_truncated": self.stdout_truncated,
            "stderr_truncated": self.stderr_truncated,
            "stdout_bytes": self.stdout_bytes,
            "stderr_bytes": self.stderr_bytes,
            "timed_out": self.timed_out,
            "oom_killed": self.oom_killed,
            "output_limit_killed": self.output_limit_killed,
            "resource_killed": self.resource_killed,
            "duration_ms": self.duration_ms,
            "container_id": self.container_id,
            "image_id": self.image_id,
            "files": {name: len(data) for name, data in sorted(self.files.items())},
            "files_truncated": self.files_truncated,
            "pulled": self.pulled,
            **({"sandbox": dict(self.sandbox)} if self.sandbox else {}),
            "pool": self.pool,
        }


NOTHING_RAN = Outcome(
    exit_code=None,
    stdout=b"",
    stderr=b"",
    stdout_truncated=False,
    stderr_truncated=False,
    stdout_bytes=0,
    stderr_bytes=0,
    timed_out=False,
    oom_killed=False,
    output_limit_killed=False,
    resource_killed=False,
    duration_ms=0,
    container_id=None,
    image_id=None,
    files={},
    files_truncated=False,
    pulled=False,
)
"""The outcome reported when no container ran (a runner error before or during create)."""


KERNEL_KILL_REASONS = (
    "interrupt_ignored",
    "memory",
    "exited",
    "expired",
    "protocol",
    "unresponsive",
    "lost",
    "cancelled",
    "callback",
    "closed",
)
"""Why a kernel is gone (``CellResult.killed``, ``Kernel.killed``): ``interrupt_ignored`` (a cell was still
running ``grace_s`` after the SIGINT at its deadline), ``memory`` (the memory cgroup's OOM killer ended the
interpreter), ``exited`` (the interpreter ended: ``os._exit``, a signal), ``expired`` (the kernel's lifetime
ended), ``protocol`` (the program broke
the kernel's own channels: closed its stdout, stderr or result pipe, or wrote to the result pipe; or the frames
failed verification), ``unresponsive`` (the supervisor did not end the cell by the host's own deadline),
``lost`` (the container ended without a word: the engine, or a kill from outside), ``cancelled`` / ``callback``
(the caller's cancel event, or its output callback raised), ``closed`` (``Kernel.close``)."""


@dataclass(frozen=True)
class CellResult:
    """What one kernel cell came to: its ``outcome`` as a run's, plus the repr of its last expression and whether
    the kernel lives on."""

    outcome: Outcome
    """The cell as a run: its stdout / stderr (capped per cell at ``output_bytes``; an exception's traceback is
    on stderr), the files under ``/workspace/out`` that changed during the cell, ``exit_code`` 0 (the cell ran
    to its end) or 1 (it raised), ``None`` when it was interrupted or the kernel was killed (the interpreter's
    own status when it ``exited``, 137 for ``memory``); ``timed_out`` when its deadline struck (interrupted or
    killed for it); ``output_limit_killed`` when it was interrupted because its stdout or stderr went past
    ``output_bytes`` (what followed was dropped in the sandbox; the kernel lives on); ``oom_killed``;
    ``duration_ms`` from the hand-over of the cell."""
    value: str | None
    """``repr`` of the value of the cell's last statement when that is an expression whose value is not None
    (as IPython shows it), at most ``output_bytes`` of it (UTF-8); None otherwise."""
    value_truncated: bool
    interrupted: bool
    """The cell was interrupted (SIGINT) at its deadline or for an output flood, and came back: the kernel is
    usable."""
    killed: str | None
    """Why the kernel is gone after this cell (see ``KERNEL_KILL_REASONS``); None while it lives."""

    def to_dict(self) -> dict[str, Any]:
        """The outcome's view plus ``value``, ``value_truncated``, ``interrupted`` and ``killed``."""
        return {
            **self.outcome.to_dict(),
            "value": self.value,
            "value_truncated": self.value_truncated,
            "interrupted": self.interrupted,
            "killed": self.killed,
        }


@runtime_checkable
class Kernel(Protocol):
    """A live persistent interpreter in one hardened container of its own (``KernelRunner.open_kernel``): one
    namespace, its imports and its workspace kept from cell to cell. It holds its host slot until it is gone."""

    @property
    def container_id(self) -> str | None: ...

    @property
    def killed(self) -> str | None:
        """Why the kernel is gone (``KERNEL_KILL_REASONS``); None while it lives."""
        ...

    def execute(
        self, code: str, *, timeout_s: float, files: Mapping[str, bytes] | None = None,
        env: Mapping[str, str] | None = None, on_output: OnOutput | None = None, cancel: threading.Event | None = None,
    ) -> CellResult:  # fmt: skip
        """Run one cell; one at a time (a second caller meanwhile gets ``SandboxError``, nothing runs).

        ``files`` are written into the kernel's ``/workspace`` first (over what is there, following no link; one
        that cannot be written raises ``WorkspacePathError`` and the cell does not run, the kernel lives on);
        ``env`` is set in the interpreter's ``os.environ`` for this cell only, then restored. A variable the
        interpreter reads only at start (``PYTHON*``, ``LC_*``, ``LANG``, ``LANGUAGE``, ``HOME``, ``TZ``) is
        refused (``RequestError``).

        ``on_output`` and ``cancel`` as for ``Runner.run``; a cancel or a callback that raises kills the
        kernel (``CancelledRunError`` / ``OutputCallbackError`` carry the cell's outcome so far). A kernel that
        is gone raises ``SandboxError`` naming why. Everything else, the program's doing, is in the result."""
        ...

    def close(self) -> None:
        """Kill the kernel and remove its container (then free its slot); idempotent. Raises the error that
        kept the container from being removed (left labelled for ``gateway reap``)."""
        ...


@runtime_checkable
class KernelRunner(Protocol):
    """A backend that can run kernels (sessions' kernel mode)."""

    def open_kernel(
        self, spec: RunSpec, *, files: Mapping[str, bytes] | None = None, slot: Slot | None = None,
        grace_s: float = ...,
    ) -> Kernel:  # fmt: skip
        """Create a hardened container from ``spec`` exactly as for a run (guarded, labelled; ``spec.timeout_s``
        is the kernel's lifetime: its supervisor ends it then, and reapers remove it after), start the
        interpreter in it with ``files`` placed in the workspace and ``spec``'s environment, and return once
        it is ready for cells. ``slot`` is held until the kernel is gone (released at once if opening fails);
        ``grace_s``: how long an interrupted cell may take to come back before the kernel is killed."""
        ...


@runtime_checkable
class Sandbox(Protocol):
    """A prepared container waiting for one payload. Owned by the runner that made it; used once."""

    @property
    def container_id(self) -> str | None: ...

    @property
    def spec(self) -> RunSpec: ...


@runtime_checkable
class Runner(Protocol):
    """A sandbox backend. Every method maps its backend's failures to ``gateway.errors.RunnerError``s."""

    @property
    def assembler(self) -> Assembler:
        """The backend's option builder and guard; the Gateway hands it to the decision."""
        ...

    def close(self) -> None:
        """Release what the runner holds (its engine client, when it created one)."""
        ...

    def prepare(self, spec: RunSpec) -> Sandbox:
        """Create (and start) a hardened container waiting for a payload."""
        ...

    def run(
        self, sandbox: Sandbox, payload: Payload, *, on_output: OnOutput | None = None,
        cancel: threading.Event | None = None, on_gone: OnGone | None = None,
    ) -> Outcome:  # fmt: skip
        """Hand over the payload, wait, collect, and always destroy the sandbox.

        ``on_output(stream, data)`` is called, in the calling thread, with each chunk of verified output as it
        arrives, and only with bytes the outcome keeps: the chunks of a stream joined are exactly the outcome's
        ``stdout`` / ``stderr``, and nothing past the output cap is passed. Caps, deadline, kill-on-flood and
        audit are the same with or without it. A callback that raises ends the run: the sandbox is killed and
        removed and ``OutputCallbackError`` (the callback's exception as its cause) carries the outcome so far.

        ``cancel``: once set, the run is abandoned within a bounded poll interval: the sandbox is killed and
        removed and ``CancelledRunError`` carries the outcome so far.

        ``on_gone``: the removal of the finished sandbox may happen after this returns (off the caller's
        path); ``on_gone`` is called exactly once, when the sandbox no longer exists (see ``OnGone``). Without
        it, the sandbox is removed before this returns and a failed removal raises ``ContainerLeftError``."""
        ...

    def execute(
        self, spec: RunSpec, payload: Payload, *, on_output: OnOutput | None = None,
        cancel: threading.Event | None = None, on_gone: OnGone | None = None,
    ) -> Outcome:  # fmt: skip
        """``prepare`` + ``run``; nothing is left behind on any error. ``on_gone`` is called exactly once
        whatever happens (at once when ``prepare`` fails)."""
        ...

    def reap(self, *, everything: bool = False, expired_only: bool = False) -> list[str]:
        """Remove this runner's own leftover containers and every expired one (``everything``: every container
        of any gateway instance; ``expired_only``: only those past their deadline, what a starting gateway
        does); return their ids."""
        ...

    def image_id(self, image: str) -> str | None:
        """The local id of ``image``, or ``None`` when it is not present."""
        ...


def prepare_and_run(
    runner: Runner, spec: RunSpec, payload: Payload, *, on_output: OnOutput | None = None,
    cancel: threading.Event | None = None, on_gone: OnGone | None = None,
) -> Outcome:  # fmt: skip
    """:meth:`Runner.execute` of every backend: ``prepare`` (which cleans up after itself when it fails; then
    ``on_gone`` is called at once) and ``run``."""
    try:
        sandbox = runner.prepare(spec)
    except BaseException:
        if on_gone is not None:
            on_gone(None)
        raise
    return runner.run(sandbox, payload, on_output=on_output, cancel=cancel, on_gone=on_gone)


@runtime_checkable
class PoolingRunner(Runner, Protocol):
    """A runner that can prepare sandboxes for a warm pool (``gateway.runner.pool.WarmPool``).

    A pooled sandbox is made from the profile alone, before any request: nothing of a request (environment,
    files, mounts, the labels that name it) is in it. At claim time the runner re-runs its guard on the
    options the container was created with and checks they are exactly the profile part of what the
    request's decision assembled; only then is the sandbox bound to the request's run specification."""

    def prepare_idle(self, profile: SandboxProfile, *, ttl_s: float) -> Sandbox:
        """Create and start a hardened sandbox of ``profile`` waiting for one payload; it expires (any reaper
        may remove it) ``ttl_s`` seconds from now."""
        ...

    def claim(self, sandbox: Sandbox, spec: RunSpec) -> Sandbox | None:
        """Bind an idle sandbox to one request's ``spec`` (guard + exact profile match, and the sandbox still
        alive), or raise ``UnsafeOptionsError`` / ``SandboxError``; None when the sandbox died while idle. The
        result goes to :meth:`Runner.run`."""
        ...

    def discard(self, sandbox: Sandbox) -> None:
        """Destroy a sandbox that will never run (an idle pooled one); never raises."""
        ...

    def pool_key(self, profile: SandboxProfile) -> str:
        """The digest naming ``profile``'s options (the pool label of its containers)."""
        ...

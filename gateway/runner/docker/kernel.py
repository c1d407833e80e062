"""Kernels on Docker: one long-lived hardened container running the supervisor in kernel mode, cells sent over
its attach connection (``gateway.runner.kernel.HostKernel`` speaks the cell protocol).

The container is made exactly as a run's (``DockerRunner.prepare``: the same options, guard, labels and
``AutoRemove``; its deadline label is the kernel's lifetime, so ``gateway reap`` and the start-up reap of dead
instances remove it like any run's container). The attach socket carries the engine's multiplexed streams
(``collect.Demux``); when the supervisor does not answer by the host's deadline, the container is killed and
removed.

A ready kernel (``DockerRunner.prepare_kernel``, kept by the warm pool) is opened the same way before any
session asks for it, from the profile part of a session's options; a session that claims it binds its own spec
(:meth:`DockerKernel.bind`). A ready kernel never has egress.

A kernel with egress has one proxy for its whole life (``DockerSandbox.egress``, opened and bound with its
container as a run's): each cell takes what the proxy saw since the cell before, the limits (connections, bytes,
rate) are the whole session's, and the proxy is closed when the kernel ends, on every path (closed, killed,
discarded, failed to start).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gateway.errors import GatewayError
from gateway.runner.docker.collect import Demux
from gateway.runner.docker.egress import OutputRedactor, redact_outcome
from gateway.runner.docker.errors import map_engine_error
from gateway.runner.frames import KERNEL_GRACE_S, KERNEL_READY_S
from gateway.runner.kernel import HostKernel

if TYPE_CHECKING:
    from gateway.egress import EgressReport
    from gateway.runner.docker.runner import DockerRunner, DockerSandbox
    from gateway.runner.interface import CellResult, OnOutput, Outcome, RunSpec
    from gateway.slots import Slot

__all__ = ["KERNEL_GRACE_S", "KERNEL_READY_S", "DockerKernel"]

_RECV = 1 << 16
MEMORY_SETTLE_S = 2.0
"""How long a kernel whose stream ended without a word waits for the engine to see its container exit before it
reads ``OOMKilled``; a container already removed (the engine's AutoRemove) is judged by the engine's ``oom``
events instead."""


class DockerKernel(HostKernel["DockerSandbox"]):
    """A live kernel in its own container (``DockerRunner.open_kernel``); see ``gateway.runner.interface.Kernel``."""

    def __init__(self, runner: DockerRunner, sandbox: DockerSandbox, slot: Slot | None, grace_s: float) -> None:
        super().__init__(sandbox, slot, grace_s)
        self._runner = runner
        self._demux = Demux()
        self._opened_at = time.monotonic()
        self._opened_unix = time.time()
        """Before the opening payload is sent: the supervisor's lifetime counts from a moment after this."""
        self._egress_lock = threading.Lock()
        self._egress_left: EgressReport | None = None
        """What closing the proxy left to take (the connections the kernel's end cut), until it is taken."""

    @property
    def sandbox(self) -> DockerSandbox:
        """The kernel's container and its attach connection."""
        return self._sandbox

    def bind(self, spec: RunSpec) -> None:
        """A ready kernel claimed by a session: its cells are judged by the session's spec from now on (the
        runner checked it asks for exactly what the kernel was opened with)."""
        self._sandbox = replace(self._sandbox, spec=spec)

    def opened_for(self) -> float:
        """Seconds left of the deadline the kernel was opened with (its supervisor's lifetime)."""
        return self._sandbox.spec.timeout_s - (time.monotonic() - self._opened_at)

    @property
    def where(self) -> str:
        return f"container {str(self.container_id)[:12]}"

    def _send(self, data: bytes, timeout: float) -> None:
        with self._engine():
            self._sandbox.sock.settimeout(timeout)
            self._sandbox.sock.sendall(data)

    def _receive(self, timeout: float) -> Iterable[tuple[int, bytes]] | None:
        with self._engine():
            self._sandbox.sock.settimeout(timeout)
            chunk = self._sandbox.sock.recv(_RECV)
        return self._demux.feed(chunk) if chunk else None

    @contextlib.contextmanager
    def _engine(self) -> Iterator[None]:
        """A failed socket is the engine's error (a timeout stays one: nothing came in time)."""
        try:
            yield
        except TimeoutError:
            raise
        except OSError as exc:
            raise map_engine_error(exc, "talking to the kernel") from exc

    def _ended(self) -> bool:
        """Whether the engine says the container no longer runs (False when it cannot say)."""
        if self.container_id is None:
            return False
        try:
            return not self._runner._state(self.container_id).get("Running")
        except GatewayError:
            return False

    def _memory(self) -> bool:
        """Whether the engine says the container was killed for memory (False once it is removed). Asked when the
        kernel's stream ended without a word: the engine may not have seen the container exit yet (gVisor ends
        the whole sandbox), so a state that still says running is asked again for up to
        :data:`MEMORY_SETTLE_S`; once the container is gone, the engine's ``oom`` events answer."""
        if self.container_id is None:
            return False
        deadline = time.monotonic() + MEMORY_SETTLE_S
        with contextlib.suppress(GatewayError):
            while True:
                state = self._runner._state(self.container_id)
                if state and not state.get("Running"):
                    return bool(state.get("OOMKilled"))
                if not state or time.monotonic() >= deadline:  # removed (AutoRemove), or the engine is slow
                    return self._runner._oom_event(self.container_id, self._opened_unix)
                time.sleep(0.05)
        return False

    @property
    def _egress(self) -> bool:
        return self._sandbox.egress is not None

    def _egress_take(self) -> EgressReport | None:
        egress = self._sandbox.egress
        if egress is None:
            return None
        with self._egress_lock:
            left, self._egress_left = self._egress_left, None
            return left if left is not None else egress.take()

    def execute(
        self, code: str, *, timeout_s: float, files: Mapping[str, bytes] | None = None,
        env: Mapping[str, str] | None = None, on_output: OnOutput | None = None, cancel: threading.Event | None = None,
    ) -> CellResult:  # fmt: skip
        """A cell, as the host kernel runs it; with secrets, its live output chunks have their values erased too."""
        egress = self._sandbox.egress
        redactor = None
        if on_output is not None and egress is not None and egress.values:
            on_output = redactor = OutputRedactor(on_output, egress.values)
        try:
            return super().execute(code, timeout_s=timeout_s, files=files, env=env, on_output=on_output, cancel=cancel)
        finally:
            if redactor is not None:
                redactor.flush()

    def _with_egress(self, outcome: Outcome) -> Outcome:
        """The cell's outcome with its egress, and the values of the kernel's secrets erased from its output."""
        outcome = super()._with_egress(outcome)
        egress = self._sandbox.egress
        return outcome if egress is None else redact_outcome(outcome, egress.values)

    def _close_egress(self) -> None:
        """End the proxy (its connections record ``run-ended``) and keep what it left for the next take."""
        egress = self._sandbox.egress
        if egress is None:
            return
        with self._egress_lock, contextlib.suppress(Exception):  # best effort: the container is gone already
            self._egress_left = egress.close()

    def _sandbox_facts(self) -> Mapping[str, Any]:
        sb = self._sandbox
        return {"container_id": sb.container_id, "image_id": sb.image_id, "pulled": sb.pulled}

    def _end(self) -> GatewayError | None:
        """Kill and remove the container; why it could not be removed, if so."""
        # Closing stdin ends the supervisor (it kills every process and exits); the forced remove makes sure.
        self._sandbox.close()
        try:
            with contextlib.suppress(GatewayError):
                if self._sandbox.container_id is not None:
                    self._runner._kill(self._sandbox.container_id)
        finally:
            self._close_egress()  # the kernel has ended: so do its connections
        return self._runner._destroy(self._sandbox)

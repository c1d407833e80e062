"""Kernels on Kubernetes: one long-lived hardened Pod running the supervisor in kernel mode, cells sent over its
attach session, the verified frames of each cell read back one WebSocket message at a time.

The Pod is made exactly as a run's (``KubernetesRunner.prepare``: the decision's manifest, guarded again, created,
watched until running, attached). Its ``activeDeadlineSeconds`` must cover the kernel's lifetime plus the start
margin (``open_kernel`` refuses a shorter one), so the kubelet ends it and any reaper deletes it once that has
passed. The payload opens the kernel (``encode_payload(kernel=True)``: the per-kernel frame key, the files, the
environment, the lifetime); each cell is ``encode_cell``, and the frames that come back continue the same keyed
sequence. The supervisor interrupts a cell at its deadline and kills the kernel when the cell does not come back
within ``grace_s``; the host keeps its own deadline a margin beyond that, and deletes the Pod itself when the
supervisor does not answer by then. Closing the attach session closes the supervisor's stdin (``stdinOnce``): it
kills everything and exits; the Pod is deleted (grace 0) as well.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from gateway.errors import CancelledRunError, ContainerLeftError, GatewayError, OutputCallbackError, SandboxError
from gateway.runner.frames import (
    FRAME_CELL,
    FRAME_VALUE,
    KERNEL_READY_S,
    Collected,
    Frame,
    FrameDecoder,
    ProtocolError,
    cell_end,
    cell_frame,
    read_timeout,
    take_frame,
)
from gateway.runner.interface import CellResult, OnOutput, Outcome
from gateway.runner.supervisor import encode_cell, encode_payload, new_key

if TYPE_CHECKING:
    from gateway.runner.kubernetes.runner import KubernetesRunner, KubernetesSandbox
    from gateway.slots import Slot

__all__ = ["KubernetesKernel"]

_MARGIN_S = 5.0
"""The host's own deadline for a cell: its timeout, the grace, and this margin for the supervisor to report."""
_DIAG_BYTES = 4096


class KubernetesKernel:
    """A live kernel in its own Pod (``KubernetesRunner.open_kernel``); see ``gateway.runner.interface.Kernel``."""

    def __init__(self, runner: KubernetesRunner, sandbox: KubernetesSandbox, slot: Slot | None, grace_s: float) -> None:
        if sandbox.attach is None:
            raise SandboxError("the kernel's Pod has no attach session")
        self._runner = runner
        self._sandbox = sandbox
        self._attach = sandbox.attach
        self._slot = slot
        self._grace_s = grace_s
        self._key = new_key()
        self._decoder = FrameDecoder(self._key)
        self._busy = threading.Lock()
        self._gone = threading.Lock()
        self._seq = 0
        self._dead = False
        self._reason: str | None = None
        self.killed: str | None = None
        """Why the kernel is gone (``KERNEL_KILL_REASONS``); None while it lives."""
        self.diagnostics = bytearray()
        """What the supervisor wrote on the container's stderr and the API server's status (at most 4 KiB)."""

    @property
    def container_id(self) -> str | None:
        return self._sandbox.container_id

    @property
    def pod(self) -> str:
        """``namespace/name`` of the kernel's Pod."""
        return f"{self._sandbox.namespace}/{self._sandbox.name}"

    # -- open ------------------------------------------------------------------------------------------

    def start(self, files: Mapping[str, bytes]) -> None:
        """Hand over the opening payload and wait until the interpreter is ready (the cell frame of ``seq`` 0)."""
        spec = self._sandbox.spec
        data = encode_payload(
            self._key, "", files, spec.output_files_bytes, spec.output_files,
            env=dict(spec.options.get("environment") or {}), timeout_s=spec.timeout_s, kernel=True,
            value_cap=spec.output_bytes, grace_s=self._grace_s,
        )  # fmt: skip
        got = Collected()
        cell: dict[str, Any] | None = None
        with self._talking(got):
            self._attach.send(data, timeout=KERNEL_READY_S)
            for frame in self._frames(got, time.monotonic() + KERNEL_READY_S, None):
                if frame.kind == FRAME_CELL:
                    cell = cell_frame(frame.data, 0)
                    break
                take_frame(frame.kind, frame.data, got, spec)
        if cell is None:
            why = got.error or bytes(self.diagnostics).decode("utf-8", "replace").strip() or "no answer"
            if got.final is not None:
                why = f"{why}; it ended ({got.final.get('killed', 'exited')})"
            if got.timed_out:
                why = f"not ready within {KERNEL_READY_S:g} s"
            self._die("lost")
            raise SandboxError(f"the kernel in Pod {self.pod} did not start: {why}; the Pod was deleted")

    # -- cells -----------------------------------------------------------------------------------------

    def execute(
        self, code: str, *, timeout_s: float, on_output: OnOutput | None = None,
        cancel: threading.Event | None = None,
    ) -> CellResult:  # fmt: skip
        if not timeout_s > 0:
            raise SandboxError(f"a cell's timeout_s must be > 0 seconds, got {timeout_s!r}")
        if not self._busy.acquire(blocking=False):
            raise SandboxError(
                f"a cell is already running in the kernel of Pod {self.pod}; cells of one kernel run one at a time: "
                "send the next one when it has returned"
            )
        try:
            if self.killed is not None:
                raise SandboxError(f"the kernel of Pod {self.pod} is gone ({self.killed}); open a new kernel")
            return self._execute(code, timeout_s, on_output, cancel)
        finally:
            self._busy.release()

    def _execute(
        self, code: str, timeout_s: float, on_output: OnOutput | None, cancel: threading.Event | None
    ) -> CellResult:
        spec = self._sandbox.spec
        self._seq += 1
        got = Collected()
        start = time.monotonic()
        cell: dict[str, Any] | None = None
        value = b"\0"
        deadline = start + timeout_s + self._grace_s + _MARGIN_S
        try:
            with self._talking(got):
                self._attach.send(encode_cell(code, timeout_s), timeout=deadline - time.monotonic())
                for frame in self._frames(got, deadline, cancel):
                    if frame.kind == FRAME_VALUE:
                        value = frame.data or b"\0"
                    elif frame.kind == FRAME_CELL:
                        cell = cell_frame(frame.data, self._seq)
                        break
                    elif take_frame(frame.kind, frame.data, got, spec, on_output) and got.callback_error is not None:
                        break
                    # Past the output cap the supervisor drops the rest and interrupts the cell: read on to its end.
        except GatewayError as exc:
            exc.outcome = self._outcome(got, start, exit_code=None, files_truncated=False)
            raise
        end = cell_end(got, cell, value, gone=self.killed, memory=self._memory)
        outcome = self._outcome(
            got, start, exit_code=end.exit_code, files_truncated=end.files_truncated, timed_out=end.timed_out,
            lost=end.killed == "lost", oom=end.killed == "memory",
        )  # fmt: skip
        if end.killed is not None:
            self._die(end.killed)
        if got.callback_error is not None:
            error: GatewayError = OutputCallbackError(
                f"the output callback raised {type(got.callback_error).__name__}: {got.callback_error}; the kernel "
                "was killed"
            )
            error.__cause__ = got.callback_error
            error.outcome = outcome
            raise error
        if got.cancelled:
            error = CancelledRunError("the cell was cancelled by its caller; the kernel was killed")
            error.outcome = outcome
            raise error
        return CellResult(
            outcome=outcome, value=end.value, value_truncated=end.value_truncated, interrupted=end.interrupted,
            killed=end.killed,
        )  # fmt: skip

    def _memory(self) -> bool:
        """Whether the kubelet says the Pod ended for memory (it ended without a word); keeps its reason."""
        with contextlib.suppress(GatewayError):
            state, self._reason = self._runner._settle(self._sandbox)
            return bool(state.get("OOMKilled"))
        return False

    def _outcome(
        self, got: Collected, start: float, *, exit_code: int | None, files_truncated: bool, timed_out: bool = False,
        lost: bool = False, oom: bool = False,
    ) -> Outcome:  # fmt: skip
        sb = self._sandbox
        return Outcome(
            exit_code=exit_code,
            stdout=bytes(got.stdout.kept),
            stderr=bytes(got.stderr.kept),
            stdout_truncated=got.stdout.truncated,
            stderr_truncated=got.stderr.truncated,
            stdout_bytes=got.stdout.seen,
            stderr_bytes=got.stderr.seen,
            timed_out=timed_out,
            oom_killed=got.oom_reported or oom,
            output_limit_killed=got.output_limit_killed,
            resource_killed=lost,
            duration_ms=round((time.monotonic() - start) * 1000),
            container_id=sb.container_id,
            image_id=sb.image_id,
            files={name: bytes(content) for name, content in got.files.items()},
            files_truncated=files_truncated,
            pulled=False,
            sandbox=sb.names(self._reason),
        )

    @contextlib.contextmanager
    def _talking(self, got: Collected) -> Iterator[None]:
        """Map what can go wrong on the session: a stream that fails verification (the program tampered with it)
        or the API server; either way the kernel is killed."""
        try:
            yield
        except ProtocolError as exc:
            self._die("protocol")
            raise SandboxError(
                f"the kernel's output stream failed verification ({exc}); the program tampered with it; the "
                "kernel was killed"
            ) from exc
        except TimeoutError:
            got.timed_out = True
        except GatewayError:
            if self.killed is not None:
                return  # closed meanwhile (another thread): the result says so
            self._die("lost")
            raise

    def _frames(self, got: Collected, deadline: float, cancel: threading.Event | None) -> Iterator[Frame]:
        """Verified frames: those left over from the last message first, then read until the session ends, the
        deadline (``got.timed_out``) or the cancel (``got.cancelled``). The caller stops after a cell's frame;
        whatever follows it stays in the decoder for the next cell."""
        data = b""
        while True:
            yield from self._decoder.feed(data)
            data = b""
            if self._decoder.finished:
                return
            timeout = read_timeout(got, deadline, cancel)
            if timeout is None:
                return
            try:
                message = self._attach.recv(timeout)
            except TimeoutError:
                continue  # the loop checks the cancel event and the deadline again
            if message is None:
                return
            channel, part = message
            if channel == 1:
                data = part
            elif len(self.diagnostics) < _DIAG_BYTES:
                self.diagnostics += part[: _DIAG_BYTES - len(self.diagnostics)]

    # -- the end ---------------------------------------------------------------------------------------

    def _die(self, reason: str) -> GatewayError | None:
        """End the session, delete the Pod, free the slot (once); why the Pod could not be deleted, if so."""
        with self._gone:
            if self.killed is None:
                self.killed = reason
            if self._dead:
                return None
            self._dead = True
            slot, self._slot = self._slot, None
        try:
            # Closing the session closes the supervisor's stdin (stdinOnce): it kills every process and exits.
            self._attach.close()
            try:
                self._runner.client.delete_pod(self._sandbox.namespace, self._sandbox.name)
            except GatewayError as exc:
                error = ContainerLeftError(
                    f"the kernel's Pod {self.pod} could not be deleted ({exc.message}); it was left for "
                    "`gateway reap` (its activeDeadlineSeconds ends it too)"
                )
                error.__cause__ = exc
                return error
            return None
        finally:
            if slot is not None:
                slot.release()

    def close(self) -> None:
        error = self._die("closed")
        if error is not None:
            raise error

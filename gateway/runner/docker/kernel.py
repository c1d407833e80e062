"""Kernels on Docker: one long-lived hardened container running the supervisor in kernel mode, cells sent over
its attach connection, the verified frames of each cell read back.

The container is made exactly as a run's (``DockerRunner.prepare``: the same options, guard, labels and
``AutoRemove``; its deadline label is the kernel's lifetime, so ``gateway reap`` and the start-up reap of dead
instances remove it like any run's container). The payload opens the kernel (``encode_payload(kernel=True)``:
the per-kernel frame key, the files, the environment, the lifetime); each cell is ``encode_cell``, and the
frames that come back continue the same keyed sequence. The supervisor interrupts a cell at its deadline and
kills the kernel when the cell does not come back within ``grace_s``; the host keeps its own deadline a margin
beyond that, and kills the container itself when the supervisor does not answer by then.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from gateway.errors import CancelledRunError, GatewayError, OutputCallbackError, SandboxError
from gateway.runner.docker.collect import Demux
from gateway.runner.docker.errors import map_engine_error
from gateway.runner.frames import (
    FRAME_CELL,
    FRAME_VALUE,
    KERNEL_GRACE_S,
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
    from gateway.runner.docker.runner import DockerRunner, DockerSandbox
    from gateway.slots import Slot

__all__ = ["KERNEL_GRACE_S", "KERNEL_READY_S", "DockerKernel"]

_MARGIN_S = 5.0
"""The host's own deadline for a cell: its timeout, the grace, and this margin for the supervisor to report."""
_RECV = 1 << 16
_DIAG_BYTES = 4096


class DockerKernel:
    """A live kernel (``DockerRunner.open_kernel``); see ``gateway.runner.interface.Kernel``."""

    def __init__(self, runner: DockerRunner, sandbox: DockerSandbox, slot: Slot | None, grace_s: float) -> None:
        self._runner = runner
        self._sandbox = sandbox
        self._slot = slot
        self._grace_s = grace_s
        self._key = new_key()
        self._decoder = FrameDecoder(self._key)
        self._demux = Demux()
        self._busy = threading.Lock()
        self._gone = threading.Lock()
        self._seq = 0
        self._dead = False
        self.killed: str | None = None
        """Why the kernel is gone (``KERNEL_KILL_REASONS``); None while it lives."""
        self.diagnostics = bytearray()
        """What the supervisor wrote on the container's stderr (at most 4 KiB): why it could not start."""

    @property
    def container_id(self) -> str | None:
        return self._sandbox.container_id

    # -- open ------------------------------------------------------------------------------------------

    def start(self, files: Mapping[str, bytes]) -> None:
        """Hand over the opening payload and wait until the interpreter is ready (the cell frame of ``seq`` 0)."""
        spec = self._sandbox.spec
        data = encode_payload(
            self._key,
            "",
            files,
            spec.output_files_bytes,
            spec.output_files,
            env=dict(spec.options.get("environment") or {}),
            timeout_s=spec.timeout_s,
            kernel=True,
            value_cap=spec.output_bytes,
            grace_s=self._grace_s,
        )
        got = Collected()
        cell: dict[str, Any] | None = None
        with self._talking(got):
            self._sandbox.sock.settimeout(KERNEL_READY_S)
            self._sandbox.sock.sendall(data)
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
            raise SandboxError(f"the kernel in container {str(self.container_id)[:12]} did not start: {why}")

    # -- cells -----------------------------------------------------------------------------------------

    def execute(
        self, code: str, *, timeout_s: float, on_output: OnOutput | None = None,
        cancel: threading.Event | None = None,
    ) -> CellResult:  # fmt: skip
        if not timeout_s > 0:
            raise SandboxError(f"a cell's timeout_s must be > 0 seconds, got {timeout_s!r}")
        if not self._busy.acquire(blocking=False):
            raise SandboxError(
                f"a cell is already running in kernel {str(self.container_id)[:12]}; cells of one kernel run one "
                "at a time: send the next one when it has returned"
            )
        try:
            if self.killed is not None:
                raise SandboxError(f"kernel {str(self.container_id)[:12]} is gone ({self.killed}); open a new kernel")
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
        try:
            with self._talking(got):
                self._sandbox.sock.settimeout(timeout_s + self._grace_s + _MARGIN_S)
                self._sandbox.sock.sendall(encode_cell(code, timeout_s))
                for frame in self._frames(got, start + timeout_s + self._grace_s + _MARGIN_S, cancel):
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
        end = cell_end(got, cell, value, gone=self.killed, memory=self._engine_oom)
        killed = end.killed
        outcome = self._outcome(
            got,
            start,
            exit_code=end.exit_code,
            files_truncated=end.files_truncated,
            timed_out=end.timed_out,
            lost=killed == "lost",
            oom=killed == "memory",
        )
        if killed is not None:
            self._die(killed)
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
            outcome=outcome,
            value=end.value,
            value_truncated=end.value_truncated,
            interrupted=end.interrupted,
            killed=killed,
        )

    def _ended(self) -> bool:
        """Whether the engine says the container no longer runs (False when it cannot say)."""
        if self.container_id is None:
            return False
        try:
            return not self._runner._state(self.container_id).get("Running")
        except GatewayError:
            return False

    def _engine_oom(self) -> bool:
        """Whether the engine says the container was killed for memory (False once it is removed)."""
        if self.container_id is None:
            return False
        with contextlib.suppress(GatewayError):
            return bool(self._runner._state(self.container_id).get("OOMKilled"))
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
            pulled=sb.pulled,
        )

    @contextlib.contextmanager
    def _talking(self, got: Collected) -> Iterator[None]:
        """Map what can go wrong on the connection: a stream that fails verification (the program tampered with
        it) or the engine; either way the kernel is killed."""
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
        except OSError as exc:
            if self.killed is not None or self._ended():
                return  # closed meanwhile (another thread), or the container ended: the result says so
            self._die("lost")
            raise map_engine_error(exc, "talking to the kernel") from exc

    def _frames(self, got: Collected, deadline: float, cancel: threading.Event | None) -> Iterator[Frame]:
        """Verified frames: those left over from the last read first, then read until EOF, the deadline
        (``got.timed_out``) or the cancel (``got.cancelled``). The caller stops after a cell's frame; whatever
        follows it stays in the decoder for the next cell."""
        sock = self._sandbox.sock
        data = b""
        while True:
            yield from self._decoder.feed(data)
            if self._decoder.finished:
                return
            timeout = read_timeout(got, deadline, cancel)
            if timeout is None:
                return
            sock.settimeout(timeout)
            try:
                chunk = sock.recv(_RECV)
            except TimeoutError:
                data = b""
                continue  # the loop checks the cancel event and the deadline again
            if not chunk:
                return
            out = bytearray()
            for stream, part in self._demux.feed(chunk):
                if stream == 1:
                    out += part
                elif len(self.diagnostics) < _DIAG_BYTES:
                    self.diagnostics += part[: _DIAG_BYTES - len(self.diagnostics)]
            data = bytes(out)

    # -- the end ---------------------------------------------------------------------------------------

    def _die(self, reason: str) -> GatewayError | None:
        """Kill and remove the container, free the slot (once); why the container could not be removed, if so."""
        with self._gone:
            if self.killed is None:
                self.killed = reason
            if self._dead:
                return None
            self._dead = True
            slot, self._slot = self._slot, None
        try:
            # Closing stdin ends the supervisor (it kills every process and exits); the forced remove makes sure.
            self._sandbox.close()
            with contextlib.suppress(GatewayError):
                if self._sandbox.container_id is not None:
                    self._runner._kill(self._sandbox.container_id)
            return self._runner._destroy(self._sandbox)
        finally:
            if slot is not None:
                slot.release()

    def close(self) -> None:
        error = self._die("closed")
        if error is not None:
            raise error

"""The host side of a kernel, whatever the backend: the cell protocol over one long-lived connection to a sandbox
whose supervisor runs in kernel mode. A backend adds only its transport and its words (``HostKernel``).

The payload opens the kernel (``encode_payload(kernel=True)``: the per-kernel frame key, the files, the
environment, the lifetime); each cell is ``encode_cell``, and the frames that come back continue the same keyed
sequence and are judged by ``frames.cell_end``. The supervisor interrupts a cell at its deadline and kills the
kernel when the cell does not come back within ``grace_s``; the host keeps its own deadline a margin beyond that,
and ends the sandbox itself when the supervisor does not answer by then. Cells run one at a time; a kernel that
ended for any reason (``KERNEL_KILL_REASONS``) stays ended, and its slot is freed once, when its sandbox is gone.

A kernel with egress (a backend that gives its sandbox a proxy for its whole life: ``_egress_take``) has the
supervisor's bridge from its opening payload on, the proxy's variables set over each cell's ``env``, and each cell's
``Outcome.egress`` is what the proxy saw since the cell before (:meth:`HostKernel.take_egress`).
"""

from __future__ import annotations

import abc
import contextlib
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gateway.errors import CancelledRunError, GatewayError, OutputCallbackError, RequestError, SandboxError
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
from gateway.runner.interface import CellResult, OnOutput, Outcome, Sandbox
from gateway.runner.supervisor import (
    EGRESS_ENVIRONMENT,
    STARTUP_ENV,
    STARTUP_ENV_PREFIXES,
    encode_cell,
    encode_payload,
    new_key,
)
from gateway.runner.workspace import path_refusal

if TYPE_CHECKING:
    from gateway.egress import EgressReport
    from gateway.slots import Slot

__all__ = ["HostKernel"]

MARGIN_S = 5.0
"""The host's own deadline for a cell: its timeout, the grace, and this margin for the supervisor to report."""
_DIAG_BYTES = 4096

S = TypeVar("S", bound=Sandbox)


class HostKernel(abc.ABC, Generic[S]):
    """A live kernel in ``sandbox`` (see ``gateway.runner.interface.Kernel``): the cell protocol, the one-cell guard,
    why it ended, and ending it once. A backend supplies its transport (``_send``, ``_receive``, ``_end``), what
    its engine knows (``_memory``, ``_ended``), and its words (``where``, ``_sandbox_facts``).

    The transport raises ``TimeoutError`` when nothing came in time and a ``GatewayError`` when the connection or
    the engine failed; either kills the kernel unless it ended meanwhile."""

    def __init__(self, sandbox: S, slot: Slot | None, grace_s: float) -> None:
        self._sandbox = sandbox
        self._slot = slot
        self._grace_s = grace_s
        self._key = new_key()
        self._decoder = FrameDecoder(self._key)
        self._busy = threading.Lock()
        self._gone = threading.Lock()
        self._seq = 0
        self._dead = False
        self.killed: str | None = None
        """Why the kernel is gone (``KERNEL_KILL_REASONS``); None while it lives."""
        self.diagnostics = bytearray()
        """What came on the connection besides the supervisor's stdout (at most 4 KiB): why it could not start."""

    @property
    def container_id(self) -> str | None:
        return self._sandbox.container_id

    # -- what a backend supplies -----------------------------------------------------------------------

    @property
    @abc.abstractmethod
    def where(self) -> str:
        """The sandbox in the backend's words, for messages (``the kernel in <where> ...``)."""

    @abc.abstractmethod
    def _send(self, data: bytes, timeout: float) -> None:
        """Write ``data`` to the supervisor's stdin within ``timeout`` seconds."""

    @abc.abstractmethod
    def _receive(self, timeout: float) -> Iterable[tuple[int, bytes]] | None:
        """What came within ``timeout`` seconds, as ``(stream, bytes)`` parts (stream 1: the supervisor's stdout,
        where its frames are); None once the connection has ended."""

    @abc.abstractmethod
    def _end(self) -> GatewayError | None:
        """Close the connection (the supervisor's stdin EOF: it kills every process and exits) and remove the
        sandbox; why it could not be removed, if so. Called once."""

    @abc.abstractmethod
    def _memory(self) -> bool:
        """Whether the engine says the sandbox was killed for memory (it ended without a word)."""

    @abc.abstractmethod
    def _sandbox_facts(self) -> Mapping[str, Any]:
        """The sandbox's fields of each cell's ``Outcome`` (``container_id``, ``image_id``, ...)."""

    def _ended(self) -> bool:
        """Whether the engine says the sandbox no longer runs (False when it cannot say): a failed connection to
        an ended sandbox is the cell's result, not an error."""
        return False

    @property
    def _egress(self) -> bool:
        """Whether the sandbox has a proxy (egress): the backend then supplies ``_egress_take``."""
        return False

    def _egress_take(self) -> EgressReport | None:
        """What the sandbox's proxy saw since the last take (after ``_end``: what its closing left); None
        without egress."""
        return None

    def take_egress(self) -> EgressReport | None:
        """The connection records and totals of the kernel's proxy not yet in a cell's outcome (None without
        egress): after :meth:`close`, the connections the end cut (``run-ended``); each once."""
        return self._egress_take()

    # -- open ------------------------------------------------------------------------------------------

    def start(self, files: Mapping[str, bytes]) -> None:
        """Hand over the opening payload and wait until the interpreter is ready (the cell frame of ``seq`` 0)."""
        spec = self._sandbox.spec
        env = dict(spec.options.get("environment") or {})
        if self._egress:  # set over the request's: the proxy is the kernel's only way out anyway
            env.update(EGRESS_ENVIRONMENT)
        data = encode_payload(
            self._key, "", files, spec.output_files_bytes, spec.output_files, env=env, timeout_s=spec.timeout_s,
            kernel=True, value_cap=spec.output_bytes, grace_s=self._grace_s, egress=self._egress,
        )  # fmt: skip
        got = Collected()
        cell: dict[str, Any] | None = None
        with self._talking(got):
            self._send(data, KERNEL_READY_S)
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
            left = self._die("lost")
            raise SandboxError(
                f"the kernel in {self.where} did not start: {why}; "
                + ("it was removed" if left is None else left.message)
            )

    # -- cells -----------------------------------------------------------------------------------------

    def execute(
        self, code: str, *, timeout_s: float, files: Mapping[str, bytes] | None = None,
        env: Mapping[str, str] | None = None, on_output: OnOutput | None = None, cancel: threading.Event | None = None,
    ) -> CellResult:  # fmt: skip
        if not timeout_s > 0:
            raise SandboxError(f"a cell's timeout_s must be > 0 seconds, got {timeout_s!r}")
        starting = sorted(k for k in env or {} if k.startswith(STARTUP_ENV_PREFIXES) or k in STARTUP_ENV)
        if starting:
            raise RequestError(
                f"a kernel cell's env cannot set {', '.join(starting)}: the interpreter reads them only when it "
                "starts, and the kernel's has started; nothing ran",
                hint="give them when the session is created (its env is the kernel's), or run the program in a "
                "subprocess from the cell with env=...",
            )
        if not self._busy.acquire(blocking=False):
            raise SandboxError(
                f"a cell is already running in the kernel in {self.where}; cells of one kernel run one at a time: "
                "send the next one when it has returned"
            )
        try:
            if self.killed is not None:
                raise SandboxError(f"the kernel in {self.where} is gone ({self.killed}); open a new kernel")
            env = dict(env or {})
            if self._egress:  # as at its opening: over the cell's own
                env.update(EGRESS_ENVIRONMENT)
            try:
                cell = self._execute(
                    code, timeout_s, files=dict(files or {}), env=env, on_output=on_output, cancel=cancel
                )
            except GatewayError as exc:
                if isinstance(exc.outcome, Outcome):
                    exc.outcome = self._with_egress(exc.outcome)
                raise
            return replace(cell, outcome=self._with_egress(cell.outcome))
        finally:
            self._busy.release()

    def _execute(
        self, code: str, timeout_s: float, *, files: dict[str, bytes], env: dict[str, str],
        on_output: OnOutput | None, cancel: threading.Event | None,
    ) -> CellResult:  # fmt: skip
        spec = self._sandbox.spec
        self._seq += 1
        got = Collected()
        start = time.monotonic()
        cell: dict[str, Any] | None = None
        value = b"\0"
        deadline = start + timeout_s + self._grace_s + MARGIN_S
        try:
            with self._talking(got):
                self._send(encode_cell(code, timeout_s, files=files, env=env), deadline - time.monotonic())
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
        refused = cell.get("refused") if cell is not None else None
        if isinstance(refused, dict):  # a file could not be written: the cell did not run, the kernel lives on
            raise path_refusal(
                str(refused.get("name")), OSError(refused.get("errno"), refused.get("strerror")),
                "; the cell did not run (the files before it in name order were written)",
            )  # fmt: skip
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

    def _with_egress(self, outcome: Outcome) -> Outcome:
        """``outcome`` with what the proxy saw during the cell (taken after the kernel died, if it did, so that the
        connections its end cut are the cell's)."""
        report = self._egress_take()
        return outcome if report is None else replace(outcome, egress=report)

    def _outcome(
        self, got: Collected, start: float, *, exit_code: int | None, files_truncated: bool, timed_out: bool = False,
        lost: bool = False, oom: bool = False,
    ) -> Outcome:  # fmt: skip
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
            files={name: bytes(content) for name, content in got.files.items()},
            files_truncated=files_truncated,
            **self._sandbox_facts(),
        )

    @contextlib.contextmanager
    def _talking(self, got: Collected) -> Iterator[None]:
        """Map what can go wrong on the connection: a stream that fails verification (the program tampered with
        it) or the transport; either way the kernel is killed."""
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
            if self.killed is not None or self._ended():
                return  # closed meanwhile (another thread), or the sandbox ended: the result says so
            self._die("lost")
            raise

    def _frames(self, got: Collected, deadline: float, cancel: threading.Event | None) -> Iterator[Frame]:
        """Verified frames: those left over from the last read first, then read until the connection ends, the
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
                parts = self._receive(timeout)
            except TimeoutError:
                continue  # the loop checks the cancel event and the deadline again
            if parts is None:
                return
            out = bytearray()
            for stream, part in parts:
                if stream == 1:
                    out += part
                elif len(self.diagnostics) < _DIAG_BYTES:
                    self.diagnostics += part[: _DIAG_BYTES - len(self.diagnostics)]
            data = bytes(out)

    # -- the end ---------------------------------------------------------------------------------------

    def _die(self, reason: str) -> GatewayError | None:
        """End the connection, remove the sandbox, free the slot (once); why the sandbox could not be removed."""
        with self._gone:
            if self.killed is None:
                self.killed = reason
            if self._dead:
                return None
            self._dead = True
            slot, self._slot = self._slot, None
        try:
            return self._end()
        finally:
            if slot is not None:
                slot.release()

    def close(self) -> None:
        error = self._die("closed")
        if error is not None:
            raise error

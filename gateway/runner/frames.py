"""The supervisor's authenticated frames, host side, the same for every backend: their format, the decoder that
verifies them, and what a run's frames add up to (per-stream caps, output files, the final status: the
``Outcome``), or a kernel cell's (``cell_end``).

Every frame is ``type (1 byte) | length (4 bytes, big-endian) | data | mac (16 bytes)`` where ``mac`` is the
first 16 bytes of HMAC-SHA256 under the per-run key over ``sequence (8 bytes) | type | length | data``. The key
travels only in the payload; a program that writes to the container's stdout some other way (for instance
through ``/proc/1/fd/1``) cannot produce a valid frame, and the host stops at the first frame that fails
verification.

A backend reads the sandbox's stdout its own way (Docker: the multiplexed attach stream,
``runner/docker/collect.py``; Kubernetes: the attach WebSocket) and hands every chunk to a ``FrameDecoder`` and
every frame to ``take_frame``. Everything here works on what was read (and, in ``outcome_of``, the backend's
final state of the sandbox), so it is unit-tested without an engine.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.runner.interface import OnOutput, Outcome, RunSpec

__all__ = [
    "CANCEL_POLL_S",
    "FRAME_CELL",
    "FRAME_ERROR",
    "FRAME_EXIT",
    "FRAME_FILE_DATA",
    "FRAME_FILE_NAME",
    "FRAME_META",
    "FRAME_STDERR",
    "FRAME_STDOUT",
    "FRAME_VALUE",
    "KERNEL_GRACE_S",
    "KERNEL_READY_S",
    "MAX_FRAME",
    "CellEnd",
    "Collected",
    "Frame",
    "FrameDecoder",
    "ProtocolError",
    "Stream",
    "cell_end",
    "cell_frame",
    "encode_frame",
    "outcome_of",
    "read_timeout",
    "take_frame",
]

FRAME_STDOUT = b"o"
FRAME_STDERR = b"e"
FRAME_FILE_NAME = b"n"
FRAME_FILE_DATA = b"f"
FRAME_META = b"m"
"""Sent once after the program ended, before its files: JSON ``{"oom_killed": bool, "oom_known": bool}``, from
the kernel's own ``oom_kill`` counter of the container's memory cgroup (the engine only knows it once the
container exited, and by then AutoRemove may have taken the container away). ``oom_known``: the counter could
be read before and after the run, so the host need not ask the engine."""
FRAME_EXIT = b"x"
"""Last frame: JSON ``{"status": int, "files_truncated": bool}``."""
FRAME_ERROR = b"!"
"""Last frame when the supervisor could not start the program: JSON ``{"error": str}``."""
FRAME_VALUE = b"v"
"""Kernel mode, once per cell before ``FRAME_CELL``: one flag byte (1: the cell's last statement was an expression
with a value other than None, 2: its repr was cut at the value cap, 4: the cell raised) and the repr's bytes.
What the program's interpreter reported: data of the program's, like its output."""
FRAME_CELL = b"c"
"""Kernel mode: a cell ended (the kernel is ready for the next one), JSON ``{"seq": int, "interrupted": bool,
"files_truncated": bool}``; ``seq`` 0 is the kernel's readiness. Not a final frame. A kernel that cannot go on
sends ``FRAME_EXIT`` with ``"killed"``: ``interrupt_ignored``, ``exited``, ``expired`` or ``protocol``."""
MAX_FRAME = 1 << 20
"""Largest frame data the host accepts; the supervisor sends at most 64 KiB per frame."""
MAC_BYTES = 16
_HEADER = struct.Struct(">cI")
_SEQ = struct.Struct(">Q")
_KNOWN = frozenset(
    {FRAME_STDOUT, FRAME_STDERR, FRAME_META, FRAME_FILE_NAME, FRAME_FILE_DATA, FRAME_EXIT, FRAME_ERROR, FRAME_VALUE,
     FRAME_CELL}
)  # fmt: skip

CANCEL_POLL_S = 0.2
"""How long one socket read waits at most when a cancel event is given, so that a cancel is seen promptly."""
KERNEL_GRACE_S = 2.0
"""How long an interrupted kernel cell may take to come back before the supervisor kills the kernel (every
backend's default ``grace_s``)."""
KERNEL_READY_S = 60.0
"""How long a new kernel may take to say it is ready (its interpreter started, under gVisor too)."""
_VALUE = 1
_VALUE_CUT = 2
_RAISED = 4


class ProtocolError(Exception):
    """The supervisor's stream is malformed or failed verification."""


@dataclass(frozen=True, slots=True)
class Frame:
    kind: bytes
    data: bytes


def _mac(key: bytes, seq: int, head: bytes, data: bytes) -> bytes:
    return hmac.new(key, _SEQ.pack(seq) + head + data, hashlib.sha256).digest()[:MAC_BYTES]


def encode_frame(key: bytes, seq: int, kind: bytes, data: bytes) -> bytes:
    """One frame as the supervisor writes it (used by tests to build streams)."""
    head = _HEADER.pack(kind, len(data))
    return head + data + _mac(key, seq, head, data)


class FrameDecoder:
    """Incremental decoder of the supervisor's frames, holding at most one frame of unread bytes.

    ``feed`` takes whatever bytes arrived and yields every complete, verified frame. Anything malformed,
    unknown, oversized or with a bad MAC raises ``ProtocolError``: the stream is not trusted past that point.
    """

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._buf = bytearray()
        self._seq = 0
        self.finished = False
        """A final frame (exit or error) was decoded; anything after it is a protocol error."""

    @property
    def pending(self) -> int:
        return len(self._buf)

    def feed(self, chunk: bytes) -> Iterator[Frame]:
        self._buf += chunk
        while len(self._buf) >= _HEADER.size:
            if self.finished:
                raise ProtocolError("data after the final frame")
            kind, length = _HEADER.unpack_from(self._buf)
            if kind not in _KNOWN:
                raise ProtocolError(f"unknown frame type {kind!r}")
            if length > MAX_FRAME:
                raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
            end = _HEADER.size + length + MAC_BYTES
            if len(self._buf) < end:
                return
            head = bytes(self._buf[: _HEADER.size])
            data = bytes(self._buf[_HEADER.size : _HEADER.size + length])
            mac = bytes(self._buf[_HEADER.size + length : end])
            if not hmac.compare_digest(mac, _mac(self._key, self._seq, head, data)):
                raise ProtocolError(f"frame {self._seq} failed verification")
            del self._buf[:end]
            self._seq += 1
            if kind in (FRAME_EXIT, FRAME_ERROR):
                self.finished = True
            yield Frame(kind, data)


@dataclass
class Stream:
    """One output stream: what is kept (at most the cap) and how much the program produced."""

    kept: bytearray = field(default_factory=bytearray)
    seen: int = 0
    truncated: bool = False

    def take(self, data: bytes, cap: int) -> tuple[bool, bytes]:
        """Keep what fits under ``cap``. Returns (True once the program has produced more than that, the
        bytes kept from ``data``: what an output callback may see)."""
        self.seen += len(data)
        kept = data[: max(cap - len(self.kept), 0)]
        self.kept += kept
        if self.seen > cap:
            self.truncated = True
        return self.truncated, kept


@dataclass
class Collected:
    stdout: Stream = field(default_factory=Stream)
    stderr: Stream = field(default_factory=Stream)
    files: dict[str, bytearray] = field(default_factory=dict)
    files_bytes: int = 0
    current_file: str | None = None
    final: dict[str, Any] | None = None
    error: str | None = None
    diagnostics: bytearray = field(default_factory=bytearray)
    timed_out: bool = False
    output_limit_killed: bool = False
    oom_reported: bool = False
    """The supervisor saw the memory cgroup's OOM killer strike during the run (``FRAME_META``)."""
    oom_known: bool = False
    """The supervisor could read the memory cgroup's OOM counter (``FRAME_META``): its report is the answer."""
    cancelled: bool = False
    """The caller's cancel event was set: the reading stopped and the container must be killed."""
    callback_error: Exception | None = None
    """The output callback raised this: the reading stopped and the container must be killed."""


def read_timeout(
    got: Collected, deadline: float, cancel: threading.Event | None, clock: Callable[[], float] = time.monotonic
) -> float | None:
    """How long the next read of a run's output may wait: until the deadline (on ``clock``), and at most
    ``CANCEL_POLL_S`` when a cancel event is given; None when reading must stop (``got.cancelled`` or
    ``got.timed_out`` set)."""
    if cancel is not None and cancel.is_set():
        got.cancelled = True
        return None
    remaining = deadline - clock()
    if remaining <= 0:
        got.timed_out = True
        return None
    return remaining if cancel is None else min(remaining, CANCEL_POLL_S)


def take_frame(kind: bytes, data: bytes, got: Collected, spec: RunSpec, on_output: OnOutput | None = None) -> bool:
    """Account for one verified frame. Returns True when the container must be killed: an output cap was
    crossed, or ``on_output`` raised (``got.callback_error``).

    ``on_output`` is called with the part of a stdout/stderr chunk that is kept under the cap, before the cap
    check ends the run: the streamed bytes of a stream are exactly the outcome's bytes of it, and nothing is
    streamed past the cap. A callback that raises stops the run like a flood does (the caller kills and removes
    the container); it is not called again."""
    if kind in (FRAME_STDOUT, FRAME_STDERR):
        name = "stdout" if kind == FRAME_STDOUT else "stderr"
        stream = got.stdout if kind == FRAME_STDOUT else got.stderr
        truncated, kept = stream.take(data, spec.output_bytes)
        if truncated:
            got.output_limit_killed = True
        if kept and on_output is not None:
            try:
                on_output(name, kept)
            except Exception as exc:  # noqa: BLE001 - the caller's failure ends the run, contained and reported
                got.callback_error = exc
                return True
        if truncated:
            return True
    elif kind == FRAME_FILE_NAME:
        # An honest supervisor stops at both caps (it charges each name's bytes, as here): more is tampering.
        if len(got.files) >= spec.output_files:
            raise ProtocolError(f"more output files than the cap of {spec.output_files}")
        got.files_bytes += len(data)
        if got.files_bytes > spec.output_files_bytes:
            raise ProtocolError("output files (names and contents) exceed their cap")
        name = data.decode("utf-8", "replace")
        if not name or name.startswith("/") or ".." in name.split("/") or name in got.files:
            raise ProtocolError(f"bad output file name {name!r}")
        got.files[name] = bytearray()
        got.current_file = name
    elif kind == FRAME_FILE_DATA:
        if got.current_file is None:
            raise ProtocolError("file data before a file name")
        got.files_bytes += len(data)
        if got.files_bytes > spec.output_files_bytes:
            raise ProtocolError("output files (names and contents) exceed their cap")
        got.files[got.current_file] += data
    elif kind == FRAME_META:
        try:
            meta = json.loads(data)
        except ValueError as exc:
            raise ProtocolError("malformed meta frame") from exc
        got.oom_reported = isinstance(meta, dict) and meta.get("oom_killed") is True
        got.oom_known = isinstance(meta, dict) and meta.get("oom_known") is True
    elif kind == FRAME_EXIT:
        final = json.loads(data)
        if not isinstance(final, dict) or not isinstance(final.get("status"), int):
            raise ProtocolError("malformed exit frame")
        got.final = final
    elif kind == FRAME_ERROR:
        try:
            got.error = str(json.loads(data).get("error"))
        except (ValueError, AttributeError):
            got.error = data.decode("utf-8", "replace")
    return False


def outcome_of(
    got: Collected, state: Mapping[str, Any], duration_ms: int, *, runtime: str, container_id: str | None,
    image_id: str | None, pulled: bool,
) -> Outcome:  # fmt: skip
    engine_oom = bool(state.get("OOMKilled")) or got.oom_reported
    oom = False
    resource_killed = False
    exit_code: int | None
    files_truncated = False
    if got.timed_out or got.output_limit_killed:
        exit_code = None
    elif got.final is not None:
        exit_code = int(got.final["status"])
        files_truncated = bool(got.final.get("files_truncated"))
        oom = engine_oom and exit_code == 137
    elif engine_oom:
        exit_code, oom = 137, True
    elif runtime == "runsc":
        # gVisor counts its own threads against the pids limit: a sandbox killed for a resource limit
        # exits without a word from the supervisor. That is not the program's own exit.
        exit_code, resource_killed = None, True
    else:
        # The supervisor never reported: it was killed (by the program, which runs as the same uid) or
        # could not even be started. Whatever the container's own status says, it is not the program's
        # exit code, so none is reported.
        exit_code, resource_killed = None, True
    return Outcome(
        exit_code=exit_code,
        stdout=bytes(got.stdout.kept),
        stderr=bytes(got.stderr.kept),
        stdout_truncated=got.stdout.truncated,
        stderr_truncated=got.stderr.truncated,
        stdout_bytes=got.stdout.seen,
        stderr_bytes=got.stderr.seen,
        timed_out=got.timed_out,
        oom_killed=oom,
        output_limit_killed=got.output_limit_killed,
        resource_killed=resource_killed,
        duration_ms=duration_ms,
        container_id=container_id,
        image_id=image_id,
        files={name: bytes(content) for name, content in got.files.items()},
        files_truncated=files_truncated or (got.final is None and bool(got.files)),
        pulled=pulled,
    )


# --- kernels: what one cell's frames come to -----------------------------------------------------------------


def cell_frame(data: bytes, seq: int) -> dict[str, Any]:
    """A ``FRAME_CELL``'s JSON, which must end cell ``seq``; anything else is a ``ProtocolError``."""
    try:
        cell = json.loads(data)
    except ValueError as exc:
        raise ProtocolError("malformed cell frame") from exc
    if not isinstance(cell, dict) or cell.get("seq") != seq:
        raise ProtocolError(f"cell frame for cell {cell.get('seq') if isinstance(cell, dict) else '?'}, not {seq}")
    return cell


@dataclass(frozen=True, slots=True)
class CellEnd:
    """How one kernel cell ended, from its frames and the kernel's state: the fields of its ``CellResult``."""

    killed: str | None
    """Why the kernel is gone after the cell (``KERNEL_KILL_REASONS``); None while it lives."""
    interrupted: bool
    exit_code: int | None
    timed_out: bool
    files_truncated: bool
    value: str | None
    value_truncated: bool


def cell_end(
    got: Collected, cell: Mapping[str, Any] | None, value: bytes, *, gone: str | None,
    memory: Callable[[], bool] = lambda: False,
) -> CellEnd:  # fmt: skip
    """Judge one cell: ``cell`` is its ``FRAME_CELL`` (None when none came), ``value`` its ``FRAME_VALUE`` data,
    ``gone`` why the kernel was already gone (closed meanwhile), ``memory()`` whether the engine says the sandbox
    was killed for memory (asked only when it ended without a word)."""
    killed: str | None = None
    if got.callback_error is not None:
        killed = "callback"
    elif got.cancelled:
        killed = "cancelled"
    elif got.timed_out:
        killed = "unresponsive"
    elif got.final is not None:
        killed = str(got.final.get("killed") or "exited")
        if killed == "exited" and got.oom_reported:
            killed = "memory"
    elif cell is None:
        killed = gone or "lost"
        if killed == "lost" and memory():
            killed = "memory"  # gVisor: the whole sandbox went, for memory (when the engine still knows)
    interrupted = bool(cell and cell.get("interrupted"))
    flags = value[0] if value else 0
    exit_code: int | None = None
    if cell is not None and not interrupted:
        exit_code = 1 if flags & _RAISED else 0
    elif killed == "memory":
        exit_code = 137
    elif killed == "exited" and got.final is not None:
        exit_code = int(got.final["status"])
    return CellEnd(
        killed=killed,
        interrupted=interrupted,
        exit_code=exit_code,
        timed_out=(interrupted and not got.output_limit_killed) or killed in ("interrupt_ignored", "unresponsive"),
        files_truncated=bool(cell and cell.get("files_truncated")) or (cell is None and bool(got.files)),
        value=value[1:].decode("utf-8", "replace") if flags & _VALUE else None,
        value_truncated=bool(flags & _VALUE_CUT),
    )

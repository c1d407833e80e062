"""The package's one pool of worker processes: fresh interpreters of this package that speak in frames over their
stdin and stdout. Verify, report and OCSF export map tasks over a :class:`WorkerPool`; the service's long-lived
decision workers are built from its parts (:func:`start_worker`, :func:`frame`, :class:`Frames`, :func:`reap`).

**Starting** (:func:`start_worker`). A worker is a fresh interpreter (``sys.executable``; never a fork of a
process that may run threads, and never a re-run of the caller's ``__main__``) that imports this very package,
wherever the caller imported it from. It is started with ``-P``: ``python -c`` would otherwise put the current
directory first on its import path, and a ``gateway/`` directory there (a checkout, or a file planted by whoever
can write to it) would be what the worker imports and runs instead of the caller's package.

**Frames.** Every message, either way, is a frame: a 4-byte big-endian length, then that many bytes (the payload,
encoded by the user: JSON, a pickle of the parent's own objects). A length above :data:`MAX_FRAME_BYTES` is not a
frame: text written into the pipe reads as a length of at least 512 MiB. In a worker, :func:`worker_streams`
moves stdout aside before anything is written, so that a stray ``print`` reaches stderr, never the frames.

**A batch of tasks** (:class:`WorkerPool`)::

    with WorkerPool(CODE, pool_size(workers, paths), head=head, name="verify worker") as pool:
        for answer in pool.map(tasks, decode):   # tasks: bytes each; answers in task order
            ...

The pool starts its workers and sends each the ``head`` frame (what every task needs: a key, filters); ``map``
hands the tasks out at once, one at a time to each idle worker, and yields the answers, decoded, in task order. At
most ``ahead`` times as many tasks as workers are handed out beyond the answer the caller waits for, which bounds
both the answers held here and what a task leaves behind until the caller takes its answer (an export's temporary
files). A worker whose stdout ends while it holds a task (it died), an answer that is not a frame or that
``decode`` refuses, a worker that cannot be written to, or every worker gone with tasks left: each is a
:class:`WorkerError` that names the worker's pid and the task, raised where the caller iterates, never a hang on a
dead worker. The end of the ``with`` block closes every worker's stdin (a worker ends when its stdin does), kills
the ones still on a task (or that do not end within :data:`GRACE_S`) and reaps them all, however the block ends.
The worker's side is :func:`serve`: the head makes a handler, and each task frame is answered with what it returns.
:func:`pool_size` is how many workers a batch gets.

**A long-lived worker** (the service's decision workers, driven by an event loop) uses the same parts:

- ``proc = start_worker(CODE)``; the parent writes ``frame(payload)`` to ``proc.stdin`` (from an event loop,
  through ``loop.connect_write_pipe``) and reads ``proc.stdout`` through a :class:`Frames` (from an event loop, a
  protocol of ``loop.connect_read_pipe`` whose ``data_received`` calls :meth:`Frames.feed` then :meth:`Frames.pop`
  until it returns ``None``);
- the end of ``proc.stdout`` (``connection_lost``) is the worker's death: its jobs in flight fail, and it is
  replaced; a ``ValueError`` from :class:`Frames` is garbage: the worker is killed (which ends its stdout too);
- in the worker, :func:`worker_streams` gives the descriptor frames arrive on and the file answers go to; a
  :class:`Frames` fed with ``os.read`` splits them (``whole`` tells whether one has arrived, for batching);
- at the end, :func:`reap` (``proc``, a grace) closes its stdin, kills it if it has not ended within the grace, and
  waits for it (it blocks: from an event loop, in a thread).
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Final, TypeVar

if TYPE_CHECKING:
    import selectors
    import subprocess

# subprocess and selectors (~10 ms to import) are imported where the parent uses them: a worker imports this
# module for its own side (serve, Frames) and never starts a process.

__all__ = [
    "GRACE_S",
    "MAX_FRAME_BYTES",
    "PARALLEL_MIN_BYTES",
    "Frames",
    "WorkerError",
    "WorkerPool",
    "frame",
    "pool_size",
    "reap",
    "serve",
    "start_worker",
    "worker_streams",
]

_PACKAGE_ROOT: Final = str(Path(__file__).resolve().parents[1])
"""The directory holding the ``gateway`` package the caller runs: first on each worker's ``PYTHONPATH``."""

_HEADER: Final = struct.Struct("!I")
MAX_FRAME_BYTES: Final = (512 << 20) - 1
"""The longest frame either side accepts (a service's request body may be 256 MiB); a longer length is garbage:
text, whose first byte is printable, reads as 512 MiB or more."""
GRACE_S: Final = 5.0
"""How long a :class:`WorkerPool` waits for an idle worker to end once its stdin is closed, before killing it."""
PARALLEL_MIN_BYTES: Final = 96 << 20
"""Below this many bytes to read, :func:`pool_size` keeps a batch in process unless workers are asked for:
starting a worker interpreter (~0.2-0.3 s of CPU) would cost more than it saves."""

_T = TypeVar("_T")


def start_worker(code: str, *, stderr: int | None = None) -> subprocess.Popen[bytes]:
    """Start ``python -P -c code`` with pipes on stdin and stdout (``stderr``: inherited unless given)."""
    import subprocess  # noqa: PLC0415 - the parent's side only (see the imports)

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, "-P", "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        close_fds=True,
        env=env,
    )


def reap(proc: subprocess.Popen[bytes], grace: float = 0.0) -> bool:
    """End a worker: close its stdin (a worker ends when its stdin does), wait up to ``grace`` seconds, kill it if
    it is still running, wait for it, close its stdout. Returns whether it ended on its own. It blocks (up to
    ``grace``): an event loop calls it in a thread."""
    import subprocess  # noqa: PLC0415 - the parent's side only (see the imports)

    if proc.stdin is not None:
        with contextlib.suppress(OSError):  # it died with bytes of ours unread: nothing more to say to it
            proc.stdin.close()
    ended = True
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        ended = False
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    return ended


def pool_size(requested: int | None, files: Sequence[str | os.PathLike[str]], tasks: int | None = None) -> int:
    """How many processes a batch over ``files`` gets, one per task at most (``tasks``: one per file unless
    given), and one per CPU. ``requested``: that many (``1``: in process); ``None``: one per CPU when the files
    hold :data:`PARALLEL_MIN_BYTES` or more (a file gone since it was listed counts nothing), else 1."""
    cpus = os.cpu_count() or 1
    if requested is None:
        total = 0
        for path in files:
            try:
                total += os.stat(path).st_size
            except OSError:
                continue  # gone since it was listed: whoever reads it reports that, in order
        if total < PARALLEL_MIN_BYTES:
            return 1
        requested = cpus
    return max(1, min(requested, cpus, len(files) if tasks is None else tasks))


# --- frames ----------------------------------------------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    """``payload`` as one frame (its length first)."""
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"a frame of {len(payload):,} bytes: more than the {MAX_FRAME_BYTES:,} a worker reads")
    return _HEADER.pack(len(payload)) + payload


class Frames:
    """Whole frames out of the bytes a pipe gives, in pieces of any size: :meth:`feed` what was read, then
    :meth:`pop` each whole frame. A length beyond :data:`MAX_FRAME_BYTES` raises ``ValueError`` (garbage)."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def _size(self) -> int | None:
        """The length of the first frame when its header has arrived."""
        if len(self._buffer) < _HEADER.size:
            return None
        size: int = _HEADER.unpack_from(self._buffer)[0]
        if size > MAX_FRAME_BYTES:
            raise ValueError(
                f"not a frame: a length of {size:,} bytes (first bytes {bytes(self._buffer[:16])!r}): "
                "something other than the worker's protocol was written into its pipe"
            )
        return size

    @property
    def whole(self) -> bool:
        """Whether a whole frame has arrived."""
        size = self._size()
        return size is not None and len(self._buffer) >= _HEADER.size + size

    @property
    def held(self) -> int:
        """Bytes held (a pipe that ends while some are held ended in the middle of a frame)."""
        return len(self._buffer)

    def pop(self) -> bytes | None:
        """The next whole frame's payload, else ``None``."""
        if not self.whole:
            return None
        end = _HEADER.size + (self._size() or 0)
        payload = bytes(self._buffer[_HEADER.size : end])
        del self._buffer[:end]  # a bytearray drops its front without copying the rest
        return payload


# --- the worker's side -------------------------------------------------------------------------------------------


def worker_streams() -> tuple[int, BinaryIO]:
    """In a worker, first thing: the descriptor the parent's frames arrive on (stdin), and the file answer frames
    go to (the pipe that was stdout). Stdout itself points at stderr from here on: a stray ``print`` (the worker's
    own, or a library's) reaches the log, never the frames."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return sys.stdin.fileno(), out


def _read_frames(fd: int) -> Iterator[bytes]:
    """The frames arriving on ``fd`` until it ends (a partial frame at the end is dropped: its sender is gone)."""
    frames = Frames()
    while True:
        payload = frames.pop()
        if payload is not None:
            yield payload
            continue
        data = os.read(fd, 1 << 16)
        if not data:
            return
        frames.feed(data)


def serve(start: Callable[[bytes], Callable[[bytes], bytes]]) -> int:
    """A :class:`WorkerPool` worker's main loop: ``start(head)`` makes the task handler from the pool's head frame,
    then each task frame is answered with the frame of what the handler returns, until stdin ends. Returns the
    exit status (2: stdin ended before the head). A handler that raises ends the worker (its traceback on stderr),
    which the pool reports as a :class:`WorkerError` naming it."""
    fd, out = worker_streams()
    frames = _read_frames(fd)
    head = next(frames, None)
    if head is None:
        return 2
    handle = start(head)
    for task in frames:
        out.write(frame(handle(task)))
        out.flush()
    return 0


# --- the parent's side of a batch --------------------------------------------------------------------------------


class WorkerError(Exception):
    """A :class:`WorkerPool` worker ended, could not be written to, or answered something that is not an answer."""

    def __init__(self, message: str, *, pid: int | None = None, task: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid
        """The worker's process id (``None``: no single worker is at fault, e.g. every one ended)."""
        self.task = task
        """The position, in ``map``'s tasks, of the task it held (``None``: it held none)."""


class _Member:
    """One worker of a pool: its process, the frames read from it so far, the task it holds."""

    __slots__ = ("frames", "gone", "proc", "task")

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.frames = Frames()
        self.task: int | None = None
        self.gone = False
        """Whether its stdout ended."""


class WorkerPool:
    """``count`` workers running ``code`` (which calls :func:`serve`), each sent ``head`` first, over which one
    sequence of tasks is mapped (:meth:`map`); see the module. A context manager: its end reaps every worker.

    ``ahead``: tasks handed out beyond the answer the caller waits for, per worker. ``stderr``: the workers'
    (inherited unless given, e.g. ``subprocess.DEVNULL``). ``name`` names the workers in errors ("verify worker").
    ``start`` starts each worker (:func:`start_worker`; a test passes one that fails). Raises ``OSError`` when a
    worker cannot be started (those started are reaped first)."""

    def __init__(
        self,
        code: str,
        count: int,
        *,
        head: bytes = b"",
        ahead: int = 2,
        stderr: int | None = None,
        name: str = "worker",
        start: Callable[..., subprocess.Popen[bytes]] = start_worker,
    ) -> None:
        import selectors  # noqa: PLC0415 - the parent's side only (see the imports)

        if count < 1 or ahead < 1:
            raise ValueError(f"a pool needs at least one worker and one task ahead (got {count} and {ahead})")
        self.name = name
        self._bound = ahead * count
        self._members: list[_Member] = []
        self._selector: selectors.BaseSelector = selectors.DefaultSelector()
        self._tasks: Iterator[bytes] | None = None
        self._next: bytes | None = None  # the next task to hand out
        self._sent = 0  # tasks handed out
        self._taken = 0  # answers the caller has taken
        try:
            for _ in range(count):
                member = _Member(start(code, stderr=stderr))
                self._members.append(member)
                if member.proc.stdout is not None:  # always: start_worker makes the pipes
                    self._selector.register(member.proc.stdout.fileno(), selectors.EVENT_READ, member)
                self._send(member, head)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [m.proc.pid for m in self._members]

    def map(self, tasks: Iterable[bytes], decode: Callable[[bytes], _T]) -> Iterator[_T]:
        """Hand ``tasks`` out (the first ones now, before this returns: the caller may do work of its own while the
        workers do theirs) and yield their answers, each ``decode``\\ d, in task order. Raises
        :class:`WorkerError` where the caller iterates (see the module). One ``map`` per pool."""
        if self._tasks is not None:
            raise RuntimeError("a WorkerPool maps one sequence of tasks; start another pool for another")
        self._tasks = iter(tasks)
        self._next = next(self._tasks, None)
        self._hand_out()
        return self._answers(decode)

    def _answers(self, decode: Callable[[bytes], _T]) -> Iterator[_T]:
        done: dict[int, _T] = {}
        while True:
            if self._taken in done:
                yield done.pop(self._taken)
                self._taken += 1
                self._hand_out()
            elif self._taken == self._sent and self._next is None:
                return
            else:
                for member, payload in self._receive():
                    at, member.task = member.task, None
                    if at is None:
                        raise WorkerError(f"{self._who(member)} answered without a task", pid=member.proc.pid)
                    try:
                        done[at] = decode(payload)
                    except Exception as exc:  # whatever decode refuses is not an answer
                        raise WorkerError(
                            f"{self._who(member)} answered task {at} with something that is not an answer "
                            f"({type(exc).__name__}: {exc})",
                            pid=member.proc.pid,
                            task=at,
                        ) from exc
                self._hand_out()

    def _hand_out(self) -> None:
        """Give the next tasks to idle workers, within the bound ahead of the answer the caller waits for."""
        if self._tasks is None:
            return
        idle = (m for m in self._members if m.task is None and not m.gone)
        while self._next is not None and self._sent < self._taken + self._bound:
            member = next(idle, None)
            if member is None:
                return
            member.task = self._sent
            self._send(member, self._next)
            self._sent += 1
            self._next = next(self._tasks, None)

    def _send(self, member: _Member, payload: bytes) -> None:
        stdin = member.proc.stdin
        try:
            if stdin is None:  # pragma: no cover - start_worker always makes a pipe
                raise BrokenPipeError("no stdin")
            stdin.write(frame(payload))
            stdin.flush()
        except OSError as exc:
            raise WorkerError(
                f"{self._who(member)} cannot be sent {'its task' if member.task is not None else 'its head'} "
                f"({exc}): it ended; its stderr says why",
                pid=member.proc.pid,
                task=member.task,
            ) from exc

    def _receive(self) -> list[tuple[_Member, bytes]]:
        """Wait until a worker answers; the answers read (worker, payload). A worker whose stdout ended is dropped
        when it held no task (the others take the rest), else it is the error."""
        if not self._selector.get_map():
            raise WorkerError(f"every {self.name} ended with {self._sent - self._taken} task(s) unanswered")
        answers: list[tuple[_Member, bytes]] = []
        for key, _events in self._selector.select():
            member: _Member = key.data
            data = os.read(key.fd, 1 << 16)
            if not data:
                self._selector.unregister(key.fd)
                member.gone = True
                status = self._status(member)
                if member.task is not None or member.frames.held:
                    doing = f"on task {member.task}" if member.task is not None else "in the middle of a frame"
                    raise WorkerError(
                        f"{self._who(member)} ended ({status}) {doing}; its stderr says why",
                        pid=member.proc.pid,
                        task=member.task,
                    )
                continue
            member.frames.feed(data)
            try:
                while (payload := member.frames.pop()) is not None:
                    answers.append((member, payload))
            except ValueError as exc:
                raise WorkerError(f"{self._who(member)} sent {exc}", pid=member.proc.pid, task=member.task) from exc
        return answers

    def _who(self, member: _Member) -> str:
        return f"{self.name} {member.proc.pid}"

    @staticmethod
    def _status(member: _Member) -> str:
        import subprocess  # noqa: PLC0415 - the parent's side only (see the imports)

        try:
            code = member.proc.wait(timeout=1.0)  # its stdout ended: it is ending, if not gone
        except subprocess.TimeoutExpired:
            return "its stdout closed, the process still running"
        return f"exit status {code}" if code >= 0 else f"killed by signal {-code}"

    def close(self) -> None:
        """Close every worker's stdin, kill those still on a task at once, give the others :data:`GRACE_S` to end,
        and reap all. Called by the ``with`` block's end; safe to call again."""
        for member in self._members:
            if member.proc.stdin is not None:
                with contextlib.suppress(OSError):  # it ended with bytes of ours unread
                    member.proc.stdin.close()
        for member in self._members:
            reap(member.proc, 0.0 if member.task is not None else GRACE_S)
        self._members = []
        self._selector.close()

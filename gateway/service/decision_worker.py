"""A decision worker: the interpreter that decides the service's dry runs and checks its request bodies, a batch
at a time, and answers with data only. :func:`worker_main` is the process, :func:`decide_batch` one batch; the
service's side is :mod:`gateway.service.decisions`.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from gateway import Caller, ExecutionResult, Gateway, PolicySet
from gateway._workers import Frames, frame, worker_streams
from gateway.audit.batched import BatchedAuditSink
from gateway.errors import AuditUnavailableError, MalformedRequestError
from gateway.service.replies import MESSAGE_MAX_VALUES, check_json_body, decision_reply, render_json

__all__ = [
    "BATCH",
    "BATCH_S",
    "JobReader",
    "Malformed",
    "RenderedAnswer",
    "answer_frame",
    "decide_batch",
    "job_frame",
    "render_answer",
    "run_job",
    "worker_main",
]

BATCH: Final = 16
"""The most jobs a worker decides before it makes their records durable (one fsync) and answers them."""
BATCH_S: Final = 0.005
"""The longest the answers decided in a batch wait for the jobs after them: a job expected to take them past it
is decided only once they are durable and sent."""


def job_frame(message: Any) -> bytes:
    """A frame to a worker (:func:`gateway._workers.frame`): the message pickled (the service's own objects: its
    policies, its runner factory)."""
    return frame(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def answer_frame(header: dict[str, Any], content: bytes = b"") -> bytes:
    """A frame from a worker, which handles hostile bodies: a JSON header line (kind, job, status, headers,
    violations), then the rendered body. Data only: the service never unpickles what a worker sends."""
    return frame(json.dumps(header, separators=(",", ":")).encode("utf-8") + b"\n" + content)


@dataclass(frozen=True, slots=True)
class RenderedAnswer:
    """The answer to a job, rendered: what the endpoint sends and counts (the same bytes from a worker or from
    the service's own process)."""

    status: int
    content: bytes
    headers: dict[str, str]
    violations: list[dict[str, Any]] | None
    """The decision's violations when it denied (counted by rule in the metrics); None otherwise."""


def render_answer(result: ExecutionResult) -> RenderedAnswer:
    """The answer to a dry run or to an invalid request, as the endpoint sends it."""
    reply = decision_reply(result)
    violations = None
    if reply.status == 200 and not reply.body["allowed"]:
        violations = reply.body["decision"]["violations"]
    return RenderedAnswer(reply.status, render_json(reply.body), reply.header_map(), violations)


class JobReader:
    """The service's frames, read from the worker's stdin in batches: :meth:`batch` waits for one whole frame,
    then takes every other whole frame that has already arrived (at most :data:`BATCH`), so that one fsync
    covers the records of every job in the batch."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._frames = Frames()
        self._eof = False

    def _read(self) -> None:
        data = os.read(self._fd, 1 << 16)
        if not data:
            self._eof = True
        self._frames.feed(data)

    def batch(self) -> list[Any] | None:
        """The next messages (unpickled), or None once stdin is closed and every whole frame was taken."""
        while not self._frames.whole:
            if self._eof:
                return None
            self._read()
        while not self._eof and select.select([self._fd], [], [], 0)[0]:
            self._read()
        messages: list[Any] = []
        while len(messages) < BATCH and (payload := self._frames.pop()) is not None:
            messages.append(pickle.loads(payload))  # noqa: S301 - the service that started this process, its pipe
        return messages


class Malformed(str):
    """A job's body that is not JSON: the message of its 400 ``request.malformed``."""


def run_job(gateway: Gateway, kind: str, body: bytes, caller: Caller) -> ExecutionResult | Malformed | None:
    """One job: the body checked as JSON (the check the service's event loop does not make), then decided
    (``decide``), checked as an execution's intake (``intake``: ``None`` when valid), or, an MCP message
    (``message``), checked to hold at most :data:`MESSAGE_MAX_VALUES` values (``None`` when it does)."""
    try:
        check_json_body(body, max_values=MESSAGE_MAX_VALUES if kind == "message" else None)
    except MalformedRequestError as exc:
        return Malformed(exc.message)
    if kind == "decide":
        return gateway.decide(body, caller=caller)
    if kind == "intake":
        return gateway.intake(body, caller=caller)
    return None


class _Failed(str):
    """A job whose Gateway call raised (which it never should): the error's text."""


_Outcome = ExecutionResult | Malformed | _Failed | None
"""What a job comes to: a result to answer, a body that is not JSON, a failure, or a valid intake."""


def decide_batch(
    gateway: Gateway,
    records: BatchedAuditSink,
    messages: list[Any],
    send: Callable[[bytes], None],
    *,
    batch_s: float = BATCH_S,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Decide one batch of messages from the service, in order, and ``send`` the answer frames: each job decided
    by ``gateway``, whose sink is ``records``, a policy set applied from the next job on.

    The jobs decided so far are answered, once their records are written and durable
    (:meth:`BatchedAuditSink.flush`), at the end of the batch, or before a job whose expected cost (the
    service's estimate for its principal, in the job) would take them past ``batch_s`` of ``clock``: an
    expensive job (a hostile body) never holds back the answers decided before it. When the write fails, every
    job it covered is answered as a dry run whose record could not be made durable (503, fail closed). Each
    answer says the CPU its job took (what the service learns its principal's cost from)."""
    done: list[tuple[int, _Outcome, float]] = []
    started = clock()
    for message in messages:
        if message[0] in ("decide", "intake", "message"):
            kind, number, body, principal, token_id, expected_ms = message
            if done and clock() - started + expected_ms / 1000 >= batch_s:
                send(_answers(records, done))
                done, started = [], clock()
            cpu = time.thread_time()
            try:
                result: _Outcome = run_job(gateway, kind, body, Caller(principal, token_id))
            except Exception as exc:  # noqa: BLE001 - answered as a failure of this job, never a dead worker
                result = _Failed(f"{type(exc).__name__}: {exc}")
            done.append((number, result, (time.thread_time() - cpu) * 1000))
        elif message[0] == "policies":
            _, default, by_principal, strict = message  # as strict as the service's set
            gateway.policies = PolicySet.of(default, by_principal, strict=strict)
    if done:
        send(_answers(records, done))


def _answers(records: BatchedAuditSink, done: list[tuple[int, _Outcome, float]]) -> bytes:
    """The answer frames of the jobs done, once their records are written and durable, else 503 for each result
    (a malformed body or a valid intake recorded nothing)."""
    try:
        records.flush()
    except AuditUnavailableError as exc:  # nothing of these is known durable: none of them is answered 200
        done = [(n, _unrecorded(r, exc) if isinstance(r, ExecutionResult) else r, cpu) for n, r, cpu in done]
    return b"".join(_answer(*job) for job in done)


def _unrecorded(result: ExecutionResult, exc: AuditUnavailableError) -> ExecutionResult:
    """The result of a dry run whose records could not be made durable: the Gateway's own for that case."""
    return ExecutionResult(result.request_id, result.decision, error=exc, audit_ok=False)


def _answer(number: int, result: _Outcome, cpu_ms: float) -> bytes:
    cpu = round(cpu_ms, 3)
    if isinstance(result, Malformed):
        return answer_frame({"kind": "malformed", "job": number, "message": str(result), "cpu_ms": cpu})
    if isinstance(result, _Failed):
        return answer_frame({"kind": "failed", "job": number, "error": str(result)})
    if result is None:
        return answer_frame({"kind": "valid", "job": number, "cpu_ms": cpu})
    answer = render_answer(result)
    header = {"kind": "decided", "job": number, "status": answer.status, "headers": answer.headers}
    return answer_frame({**header, "violations": answer.violations, "cpu_ms": cpu}, answer.content)


def worker_main() -> int:
    """A decision worker's process: an init frame, then jobs and policy sets until stdin closes.

    The init frame carries the service's runner factory (whose assembler the decisions use), its trail's
    directory (the worker appends to the same trail, each record naming the worker's process in its
    ``gateway`` identity) and its policy set, as strict as the service's: a principal the set does not list (a
    reload removed it, or added it and its set has not reached this worker yet) is refused 401, never decided
    under the default policy. The worker builds a :class:`~gateway.Gateway` without a pool (it
    never runs anything) and decides its jobs in one thread, a batch at a time (:func:`decide_batch`)."""
    # Ctrl-C, a stop (systemd signals the whole group) and a reload are the service's: it finishes its requests,
    # then closes the worker's stdin, which is when a worker ends (or when the service itself is gone).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    jobs_fd, out = worker_streams()  # a stray print goes to the log, never into the frames
    frames = JobReader(jobs_fd)
    batch = frames.batch()
    if not batch or batch[0][0] != "init":
        return 2
    _, runner_factory, audit_dir, default, by_principal, strict = batch[0]
    from gateway.audit import JsonlAuditTrail  # noqa: PLC0415 - after the init, with its directory

    trail = JsonlAuditTrail.from_env(audit_dir)
    runner = runner_factory()
    records = BatchedAuditSink(trail)
    gateway = Gateway(PolicySet.of(default, by_principal, strict=strict), runner=runner, audit=records)
    out.write(answer_frame({"kind": "ready", "pid": os.getpid()}))
    out.flush()

    def send(frames: bytes) -> None:
        out.write(frames)
        out.flush()

    batch = batch[1:]  # jobs that came with the init
    try:
        while batch is not None:
            decide_batch(gateway, records, batch, send)
            batch = frames.batch()
    finally:  # no gateway.close(): the stop record is the service's, which started no worker's "gateway"
        with contextlib.suppress(Exception):
            runner.close()
        trail.close()
    return 0

"""Dry runs (``POST /v1/decisions``) decided, and executions' and MCP messages' bodies checked, in worker processes:
the service's decisions use every CPU, and its own process never parses a body it has not seen to be a valid
request (or, for ``/mcp``, JSON of a bounded number of values).

A dry run is Python CPU work from end to end: the intake, every rule, the assembly and its guard, two audit
records. In one interpreter it shares one core with the HTTP stack (one GIL), so the service hands each dry run
to one of ``decision_workers`` worker interpreters and awaits the answer while its event loop goes on serving.
An execution's body goes to a worker first too (an ``intake`` job, :meth:`Gateway.intake`): the worker parses it,
answers 400 for a body that is not JSON and records and answers an invalid request, and the service runs only a
request the worker found valid, whose size the request schema bounds. Every principal shares the service's event
loop; a body that is cheap to send and dear to parse (3.9 MB of empty JSON arrays: ~470 ms) so costs a worker,
against its principal's share, not every principal's loop. A body for ``/mcp``, which the MCP SDK parses in the
event loop, is checked by a worker first too (a ``message`` job): JSON of at most
:data:`~gateway.service.replies.MESSAGE_MAX_VALUES` values. Jobs of every kind check that the body is JSON first
(:func:`~gateway.service.replies.check_json_body`), the check the service used to make in its event loop.

Each worker is started with :func:`gateway._workers.start_worker` (a fresh interpreter of this package, ``-P``)
and receives, before any job:

- the runner factory the service was built with (pickled by reference: ``gateway serve``'s Docker or
  Kubernetes factory), whose assembler the worker's decisions use, exactly as the service's own;
- the directory of the service's trail: the worker appends to the same trail (it takes writers from several
  processes: the trail's file lock serialises them and each re-reads the tail another one moved), each record
  naming the worker's own process in its ``gateway`` identity;
- the policy set: the very :class:`~gateway.policy.Policy` objects the service loaded, compiled again there (the
  same sha256). A reload sends the new set to every worker; a job sent after it is decided under it.

A worker builds a :class:`~gateway.Gateway` without a pool (it never runs anything) and decides its jobs in
batches, in one thread (:func:`decide_batch`): it takes every job that has arrived (at most :data:`BATCH`),
does each (:meth:`Gateway.decide`, or :meth:`Gateway.intake`), its records built but not yet written, then writes
them all in one hold of the trail's lock, makes them durable with one fsync, and only then answers each job of
the batch (sooner, before a job expected to hold them past :data:`BATCH_S`; when the write or the fsync fails,
every job of the batch is a 503: fail closed). Two workers so take turns on the trail once per batch, not once
per record (each turn re-reads the tail the other moved).
It sends back the status, the rendered body, the headers and the violations (for the metrics): the same answer
the service would have made itself. Frames are a 4-byte big-endian length and a payload, over
the worker's stdin and stdout (pipes that only the two processes hold). To the worker the payload is a pickle
(the service's own objects: its policies, its runner factory); from the worker, which handles hostile request
bodies, it is data only and never unpickled: a JSON header line (kind, job, status, headers, violations) and
the rendered body. The worker's stray prints go to stderr (the server's log), never into the frames.

Each principal has a share of the workers (:class:`_Share`): its dry runs go to them only while the CPU they are
expected to cost, from what its recent ones cost on a worker (each answer says), fits in :data:`SHARE_MS` (at
least one at a time; a dry run holds its room until it leaves the worker, even when its client has gone). A
worker takes a dry run only when it is idle or when what it holds and the dry run are expected to cost at most
:data:`WORKER_MS`: a dear dry run (a body the request schema checks entry by entry: 300 ms of a worker) goes
only to an idle worker. Everything else waits in the service, where :meth:`DecisionWorkers._dispatch` sends,
each time a worker can take one, the first waiting dry run of the principal that used the workers least lately
(its use halves every :data:`USED_HALF_LIFE_S`). So a principal's dear dry runs, or those of several principals
together, never queue on a worker ahead of another principal's: a cheap dry run waits at most for the dear ones
the workers hold (one each) to finish, not for every principal's; cheap ones go out many at a time, so batches
stay full. The request quotas count requests, not their cost: this is what keeps some principals' dry runs
from holding back everyone else's. A dry run that is not sent within 30 s is answered 503
``service.decision_failed``.

When no worker is ready (they are starting, or one died and its replacement is starting, or the runner factory
cannot be sent: a test's closure), the service decides in process, as with ``decision_workers: 0``: a dry run is
never refused for want of a worker. A job in flight on a worker that dies is answered 503
``service.decision_failed`` (its ``request.received`` may be in the trail without a decision: a crash, not a
silent loss); the worker is replaced after a back-off. A worker that does not answer a job within
30 s (``_DECIDE_S``) is treated the same way (killed, the job 503): no dry run waits forever. Nothing of a
worker outlives the service: it ends when its stdin closes (the service's shutdown, or the service's death)
and is killed if it does not.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
import math
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from starlette.concurrency import run_in_threadpool

from gateway import Caller, ExecutionResult, Gateway, PolicySet
from gateway._workers import start_worker
from gateway.errors import AuditUnavailableError, DecisionWorkerError, MalformedRequestError
from gateway.policy import Policy
from gateway.service.replies import MESSAGE_MAX_VALUES, check_json_body, decision_reply, render_json

if TYPE_CHECKING:
    from gateway.audit import JsonlAuditTrail
    from gateway.runner import Runner

__all__ = [
    "BATCH",
    "BATCH_S",
    "SHARE_MS",
    "Decided",
    "DecisionWorkers",
    "decided",
    "default_decision_workers",
    "worker_main",
]

_log = logging.getLogger("gateway.service")

BATCH: Final = 16
"""The most jobs a worker decides before it makes their records durable (one fsync) and answers them."""
BATCH_S: Final = 0.005
"""The longest the answers decided in a batch wait for the jobs after them: a job expected to take them past it
is decided only once they are durable and sent."""
_HEADER: Final = struct.Struct("!I")
_WORKER: Final = "from gateway.service.decisions import worker_main; raise SystemExit(worker_main())"
_RESPAWN_S: Final = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Back-off before replacing a worker that died (the last step repeats while they keep dying)."""
SHARE_MS: Final = 60.0
"""A principal's dry runs on the workers at once: as many as fit in this much of the workers' CPU, estimated from
what its recent dry runs cost (at least one). Cheap dry runs (1.5-2.5 ms) go out 24 or more at a time, more
than a client's 16 connections (30 ms cost one such client ~5 % of its decisions/s); a principal whose dry runs
cost 300 ms each (a hostile body) has one on the workers and its others wait their turn, so that it cannot fill
the workers' queues ahead of everyone else's dry runs."""
WORKER_MS: Final = 30.0
"""A worker takes a dry run when it is idle, or when the dry runs it holds and this one are expected to cost at
most this much of its CPU: cheap dry runs (1.5-2.5 ms) go out a dozen or more to a worker, enough for its batches,
and a dear one (a hostile body) only to an idle worker. What no worker takes waits in the service."""
USED_HALF_LIFE_S: Final = 1.0
"""How fast a principal's use of the workers is forgotten: the dispatcher sends first the dry run of the principal
that used them least lately."""
_FIRST_COST_MS: Final = SHARE_MS
"""The cost expected of a principal's jobs until one has been timed (its first answer then sets it): its whole
share, on an idle worker, so that a principal new to the service has one job on the workers until its cost is
known (a dear one cannot take every worker first); a cheap principal is held back for one answer."""
_CLOSE_S: Final = 10.0
_DECIDE_S: Final = 30.0
"""The longest a dry run waits for its worker (a decision takes milliseconds): then 503, and the worker, stuck,
is killed and replaced."""


def default_decision_workers() -> int:
    """One per CPU, at most four: the event loop's own share of a dry run is small (about a fifth)."""
    return max(1, min(4, os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class Decided:
    """A dry run's answer, rendered: what the endpoint sends and counts."""

    status: int
    content: bytes
    headers: dict[str, str]
    violations: list[dict[str, Any]] | None
    """The decision's violations when it denied (counted by rule in the metrics); None otherwise."""


@dataclass(frozen=True, slots=True)
class _Job:
    """A job sent (to a worker, or in process): what awaits its answer, and the share of its principal it holds
    until it leaves the worker (answered, or with the worker), even when its client has gone."""

    future: asyncio.Future[Decided | None]
    share: _Share
    cost: float


@dataclass(frozen=True, slots=True)
class _Sent:
    """Where the dispatcher sent a job: to ``worker`` as job ``number``, or in process (``worker`` None)."""

    worker: _Worker | None
    number: int
    job: _Job


def decided(result: ExecutionResult) -> Decided:
    """The answer to a dry run, as the endpoint sends it (in process or in a worker: the same bytes)."""
    reply = decision_reply(result)
    violations = None
    if reply.status == 200 and not reply.body["allowed"]:
        violations = reply.body["decision"]["violations"]
    return Decided(reply.status, render_json(reply.body), reply.header_map(), violations)


def _policy_documents(policies: PolicySet) -> tuple[Policy, dict[str, Policy]]:
    return policies.default.policy, {name: c.policy for name, c in policies.by_principal.items()}


def _frame(message: Any) -> bytes:
    """A frame to a worker: the message pickled."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def _answer_frame(header: dict[str, Any], content: bytes = b"") -> bytes:
    """A frame from a worker: a JSON header line, then the rendered body (data only: never unpickled)."""
    data = json.dumps(header, separators=(",", ":")).encode("utf-8") + b"\n" + content
    return _HEADER.pack(len(data)) + data


class _Frames(asyncio.Protocol):
    """Reads a worker's frames from its stdout and hands each header and body on; tells when the pipe closes."""

    def __init__(
        self,
        on_message: Callable[[dict[str, Any], bytes], None],
        on_bad: Callable[[str], None],
        on_closed: Callable[[], None],
    ) -> None:
        self._buffer = bytearray()
        self._on_message = on_message
        self._on_bad = on_bad
        self._on_closed = on_closed

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if len(self._buffer) < _HEADER.size + size:
                return
            payload = bytes(self._buffer[_HEADER.size : _HEADER.size + size])
            del self._buffer[: _HEADER.size + size]
            head, _, content = payload.partition(b"\n")
            try:
                header = json.loads(head)
            except ValueError as exc:
                self._on_bad(f"a frame that is not a decision worker's answer ({exc})")
                return
            if not isinstance(header, dict):
                self._on_bad("a frame whose header is not a JSON object")
                return
            self._on_message(header, content)

    def connection_lost(self, exc: Exception | None) -> None:
        self._on_closed()


class _Worker:
    """One worker process, seen from the event loop: its pipes, its jobs in flight, whether it is ready."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        on_ready: Callable[[], None],
        on_ended: Callable[[_Worker], None],
        on_free: Callable[[], None],
    ) -> None:
        self.proc = proc
        self.ready = False
        self.closed = False
        self.jobs: dict[int, _Job] = {}
        """Jobs in flight, by number."""
        self._on_ready = on_ready
        self._on_ended = on_ended
        self._on_free = on_free
        self._writer: asyncio.WriteTransport | None = None
        self._reader: asyncio.ReadTransport | None = None

    async def connect(self, loop: asyncio.AbstractEventLoop, init: bytes) -> None:
        if self.proc.stdin is None or self.proc.stdout is None:
            raise OSError("the decision worker has no pipes")
        self._writer, _ = await loop.connect_write_pipe(asyncio.Protocol, self.proc.stdin)
        self._reader, _ = await loop.connect_read_pipe(
            lambda: _Frames(self._message, lambda why: self.kill(f"sent {why}"), self._lost), self.proc.stdout
        )
        self._writer.write(init)

    def send(self, frame: bytes) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(frame)

    def _message(self, header: dict[str, Any], content: bytes) -> None:
        kind = header.get("kind")
        if kind == "ready":
            self.ready = True
            self._on_ready()
            _log.info("decision worker %d ready", self.proc.pid)
            self._on_free()
            return
        job = self._finish(header.get("job", 0))
        if job is None:
            return
        cpu = header.get("cpu_ms")
        if isinstance(cpu, (int, float)) and 0 <= cpu < 1e9:
            job.share.learn(float(cpu), job.cost, time.monotonic())
        self._on_free()
        if job.future.done():  # its client has gone
            return
        if kind == "decided":
            job.future.set_result(Decided(header["status"], content, header["headers"], header["violations"]))
        elif kind == "valid":  # an intake: the request is valid, nothing was recorded
            job.future.set_result(None)
        elif kind == "malformed":
            job.future.set_exception(MalformedRequestError(str(header.get("message"))))
        else:  # "failed": Gateway.decide raised, which it never should
            job.future.set_exception(RuntimeError(f"decision worker {self.proc.pid}: {header.get('error')}"))

    def _finish(self, number: Any) -> _Job | None:
        """The job leaves the worker: its principal's share gets its room back."""
        job = self.jobs.pop(number, None)
        if job is not None:
            job.share.give_back(job.cost)
        return job

    def withdraw(self, number: int) -> None:
        """A job whose frame was never sent (its request left first) leaves the worker."""
        self._finish(number)

    def kill(self, why: str) -> None:
        """Kill the worker, stuck or out of protocol (its jobs in flight fail; it is replaced): ``why`` is logged."""
        _log.error("decision worker %d %s; killing it", self.proc.pid, why)
        with contextlib.suppress(OSError):
            self.proc.kill()
        if self._reader is not None:
            self._reader.close()

    def _lost(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.ready = False
        for number in list(self.jobs):
            job = self._finish(number)
            if job is not None and not job.future.done():
                job.future.set_exception(
                    DecisionWorkerError(f"the decision worker {self.proc.pid} ended while deciding this request")
                )
        if self._writer is not None:
            self._writer.close()
        self._on_ended(self)
        self._on_free()

    @property
    def load_ms(self) -> float:
        """The CPU ms its jobs in flight are expected to cost."""
        return sum(job.cost for job in self.jobs.values())

    def takes(self, cost: float) -> bool:
        """Whether it takes a dry run expected to cost ``cost`` now (:data:`WORKER_MS`)."""
        return not self.jobs or self.load_ms + cost <= WORKER_MS

    def close(self) -> None:
        """End the worker: its stdin closes, it finishes the jobs it holds and exits."""
        if self._writer is not None:
            self._writer.close()


class _Share:
    """One principal's account with the decision workers: what one of its dry runs is expected to cost, what it
    has in flight against :data:`SHARE_MS`, how much of the workers it used lately (what the dispatcher orders
    principals by) and its dry runs waiting to be sent, first come, first served."""

    def __init__(self) -> None:
        self.cost_ms = _FIRST_COST_MS
        """What one of its dry runs is expected to cost (:meth:`learn`)."""
        self.timed = False
        """Whether one of its dry runs has been timed (before, :data:`_FIRST_COST_MS` is a guess)."""
        self.in_flight_ms = 0.0
        self.in_flight = 0
        self.waiting: collections.deque[asyncio.Future[_Sent]] = collections.deque()
        """Its dry runs waiting to be sent: each learns where it went."""
        self._used_ms = 0.0
        self._used_at = time.monotonic()

    def fits(self) -> bool:
        """Whether one more of its dry runs fits its share (at least one always does)."""
        return self.in_flight == 0 or self.in_flight_ms + self.cost_ms <= SHARE_MS

    def used_ms(self, now: float) -> float:
        """The worker CPU its dry runs used lately (sent ones counted at their expected cost until answered),
        halving every :data:`USED_HALF_LIFE_S`."""
        return self._used_ms * math.pow(0.5, max(0.0, now - self._used_at) / USED_HALF_LIFE_S)

    def _use(self, ms: float, now: float) -> None:
        self._used_ms, self._used_at = max(0.0, self.used_ms(now) + ms), now

    def grant(self, now: float) -> float:
        """Count one of its dry runs in flight; returns the cost it holds until it leaves (:meth:`give_back`)."""
        cost = self.cost_ms
        self.in_flight_ms += cost
        self.in_flight += 1
        self._use(cost, now)
        return cost

    def give_back(self, cost: float) -> None:
        """One of its dry runs left the workers (or was decided in process)."""
        self.in_flight -= 1
        self.in_flight_ms = self.in_flight_ms - cost if self.in_flight else 0.0

    def learn(self, cpu_ms: float, cost: float, now: float) -> None:
        """A dry run counted at ``cost`` took ``cpu_ms`` on a worker: its use is corrected, and the expected
        cost is the first one timed, then a moving average (a fifth of it the last one), so that one dear dry
        run (300 ms) closes the share to one at a time, a few cheap ones do not open it again, and the odd slow
        one of a cheap principal (a collection, a new segment) changes little."""
        self._use(cpu_ms - cost, now)
        self.cost_ms = 0.8 * self.cost_ms + 0.2 * cpu_ms if self.timed else cpu_ms
        self.timed = True


class DecisionWorkers:
    """The service's decision workers (see the module); :meth:`decide` is what ``POST /v1/decisions`` awaits."""

    def __init__(self, gateway: Gateway, runner: Callable[[], Runner] | None, count: int) -> None:
        """``count`` workers making their runner with ``runner`` (the service's factory) and appending to the
        gateway's trail; none when ``count`` is 0, without a factory, or when the trail is not a directory."""
        directory = getattr(gateway.audit, "directory", None)
        self.gateway = gateway
        self.count = count if runner is not None and isinstance(directory, Path) else 0
        self._runner = runner
        self._audit_dir = directory
        self._workers: list[_Worker] = []
        self._jobs = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deaths = 0
        self._closing = False
        self._respawns: set[asyncio.Task[None]] = set()
        self._shares: dict[str, _Share] = {}  # one per principal that asked for a dry run: bounded by the file

    @property
    def ready(self) -> int:
        """How many workers are ready to decide."""
        return sum(1 for w in self._workers if w.ready)

    def pids(self) -> list[int]:
        """The process ids of the workers ready to decide."""
        return [w.proc.pid for w in self._workers if w.ready]

    def _init_frame(self) -> bytes | None:
        default, by_principal = _policy_documents(self.gateway.policies)
        try:
            return _frame(("init", self._runner, str(self._audit_dir), default, by_principal))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            _log.warning("dry runs are decided in process: the runner factory cannot go to a worker (%s)", exc)
            return None

    async def start(self) -> None:
        """Start the workers (the service decides in process until one is ready)."""
        self._loop = asyncio.get_running_loop()
        if self.count > 0 and self._init_frame() is None:
            self.count = 0
        for _ in range(self.count):
            await self._spawn()

    async def _spawn(self) -> None:
        init = self._init_frame()
        if init is None or self._closing or self._loop is None:
            return
        try:
            proc = await run_in_threadpool(start_worker, _WORKER)
        except OSError as exc:
            _log.error("cannot start a decision worker: %s", exc)
            self._schedule_respawn()
            return
        worker = _Worker(proc, self._ready, self._ended, self._dispatch)
        self._workers.append(worker)
        try:
            await worker.connect(self._loop, init)
        except OSError as exc:
            _log.error("cannot talk to decision worker %d: %s", proc.pid, exc)
            worker.close()
            self._ended(worker)  # killed, and replaced after the back-off

    def _ready(self) -> None:
        self._deaths = 0

    def _ended(self, worker: _Worker) -> None:
        with contextlib.suppress(ValueError):
            self._workers.remove(worker)
        with contextlib.suppress(OSError):
            worker.proc.kill()
        worker.proc.wait()
        if not self._closing:
            status = worker.proc.returncode
            _log.error("decision worker %d ended (status %s); it will be replaced", worker.proc.pid, status)
            self._schedule_respawn()

    def _schedule_respawn(self) -> None:
        if self._loop is None or self._closing:
            return
        delay = _RESPAWN_S[min(self._deaths, len(_RESPAWN_S) - 1)]
        self._deaths += 1

        async def respawn() -> None:
            await asyncio.sleep(delay)
            await self._spawn()

        task = self._loop.create_task(respawn())
        self._respawns.add(task)
        task.add_done_callback(self._respawns.discard)

    async def decide(self, body: bytes, caller: Caller) -> Decided:
        """The dry run's answer, from a worker, else decided in process (:meth:`_job`). Raises
        :class:`MalformedRequestError` for a body that is not JSON."""
        answer = await self._job("decide", body, caller)
        if answer is None:  # pragma: no cover - a worker answers "valid" only to an intake
            raise DecisionWorkerError("a decision worker answered a dry run as an intake")
        return answer

    async def intake(self, body: bytes, caller: Caller) -> Decided | None:
        """An execution's body checked as its intake does (:meth:`Gateway.intake`), in a worker: ``None`` when
        the request is valid (execute it), else the answer to the invalid request, recorded by the worker. Raises
        :class:`MalformedRequestError` for a body that is not JSON. The service's own process so parses only
        valid requests, whose size the request schema bounds: a body that is cheap to send and dear to parse
        costs a worker, against its principal's share, not the event loop every principal shares."""
        return await self._job("intake", body, caller)

    async def message(self, body: bytes, caller: Caller) -> None:
        """An MCP message's body checked in a worker before the MCP SDK parses it in the event loop: JSON of at
        most :data:`~gateway.service.replies.MESSAGE_MAX_VALUES` values, else :class:`MalformedRequestError`.
        The SDK so parses only bodies of bounded cost; a body dear to parse costs a worker, against its
        principal's share."""
        await self._job("message", body, caller)  # answered "valid" (None), else it raised

    async def _job(self, kind: str, body: bytes, caller: Caller) -> Decided | None:
        """A job for the workers (``decide``, ``intake`` or ``message``). It waits in the service until it is sent
        (:meth:`_dispatch`): while its principal's share is full, or no worker takes it, or jobs of principals
        that used the workers less lately wait too."""
        share = self._shares.get(caller.principal)
        if share is None:
            share = self._shares[caller.principal] = _Share()
        turn: asyncio.Future[_Sent] = asyncio.get_running_loop().create_future()
        share.waiting.append(turn)
        self._dispatch()
        if not turn.done():  # it waits: the workers or its share are full, or others wait before it
            try:
                await asyncio.wait((turn,), timeout=_DECIDE_S)  # never cancels turn: what was sent is known
            except asyncio.CancelledError:
                self._abandon(turn)
                raise
        if not turn.done():
            self._abandon(turn)
            raise DecisionWorkerError(
                f"the decision workers did not take this request of principal {caller.principal!r} within "
                f"{_DECIDE_S:g} s (its share, or every worker, held by the requests before it)"
            )
        sent = turn.result()
        if sent.worker is None:
            try:
                return await run_in_threadpool(_in_process, self.gateway, kind, body, caller)
            finally:
                self._withdraw(sent)
        sent.worker.send(_frame((kind, sent.number, body, caller.principal, caller.token_id, sent.job.cost)))
        try:
            return await asyncio.wait_for(sent.job.future, _DECIDE_S)
        except TimeoutError:
            sent.worker.kill(f"no answer to a job within {_DECIDE_S:g} s")  # its jobs, this one too, leave with it
            raise DecisionWorkerError(
                f"the decision worker {sent.worker.proc.pid} did not answer within {_DECIDE_S:g} s"
            ) from None

    def _dispatch(self) -> None:
        """Send the waiting dry runs that can go: each time the first waiting one of the principal that used the
        workers least lately (of those whose share has room), to the worker with the least work expected, if
        that worker takes it (:meth:`_Worker.takes`); else none goes until a dry run leaves a worker. With no
        worker ready, in process (bounded by the shares alone). A dry run is on its worker from here on (its
        frame goes out when its request resumes): the next ones see the worker's load with it."""
        now = time.monotonic()
        while True:
            candidates = []
            for share in self._shares.values():
                while share.waiting and share.waiting[0].done():  # abandoned while it waited
                    share.waiting.popleft()
                if share.waiting and share.fits():
                    candidates.append(share)
            if not candidates:
                return
            share = min(candidates, key=lambda s: s.used_ms(now))
            ready = [w for w in self._workers if w.ready]
            worker = min(ready, key=lambda w: w.load_ms) if ready else None
            if worker is not None and not worker.takes(share.cost_ms):
                return
            cost = share.grant(now)
            job = _Job(asyncio.get_running_loop().create_future(), share, cost)
            number = next(self._jobs)
            if worker is not None:
                worker.jobs[number] = job  # it gives the share back when it leaves the worker
            share.waiting.popleft().set_result(_Sent(worker, number, job))

    def _abandon(self, turn: asyncio.Future[_Sent]) -> None:
        """A dry run whose request left while it waited: the dispatcher skips it, or, sent already, it leaves."""
        if turn.done():
            self._withdraw(turn.result())
        else:
            turn.cancel()

    def _withdraw(self, sent: _Sent) -> None:
        """A dry run decided in process, or abandoned before its frame went to its worker: its room goes back."""
        if sent.worker is None:
            sent.job.share.give_back(sent.job.cost)
        else:
            sent.worker.withdraw(sent.number)
        self._dispatch()

    def policies_changed(self, policies: PolicySet) -> None:
        """A reload made ``policies`` the service's: every worker decides under them from its next job on. Any
        thread (the reload runs in one)."""
        if self._loop is None:
            return
        frame = _frame(("policies", *_policy_documents(policies)))

        def broadcast() -> None:
            for worker in self._workers:
                worker.send(frame)

        self._loop.call_soon_threadsafe(broadcast)

    async def close(self) -> None:
        """End every worker (each finishes the jobs it holds), killing one that does not end in time."""
        self._closing = True
        for task in list(self._respawns):
            task.cancel()
        workers = list(self._workers)
        for worker in workers:
            worker.close()
        for worker in workers:
            try:
                await asyncio.wait_for(run_in_threadpool(worker.proc.wait), _CLOSE_S)
            except TimeoutError:
                _log.error("decision worker %d did not end; killing it", worker.proc.pid)
                worker.proc.kill()
                await run_in_threadpool(worker.proc.wait)


# --- the worker process --------------------------------------------------------------------------------------


class _Jobs:
    """The service's frames, read from the worker's stdin in batches: :meth:`batch` waits for one whole frame,
    then takes every other whole frame that has already arrived (at most :data:`BATCH`), so that one fsync
    covers the records of every job in the batch."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()
        self._eof = False

    def _read(self) -> None:
        data = os.read(self._fd, 1 << 16)
        if not data:
            self._eof = True
        self._buffer += data

    def _whole(self) -> int:
        """How many bytes of the buffer hold whole frames, counting at most BATCH frames."""
        at = count = 0
        while count < BATCH and len(self._buffer) >= at + _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer, at)
            if len(self._buffer) < at + _HEADER.size + size:
                break
            at += _HEADER.size + size
            count += 1
        return at

    def batch(self) -> list[Any] | None:
        """The next messages (unpickled), or None once stdin is closed and every whole frame was taken."""
        while not self._whole():
            if self._eof:
                return None
            self._read()
        while not self._eof and select.select([self._fd], [], [], 0)[0]:
            self._read()
        end = self._whole()
        view, messages, at = memoryview(self._buffer), [], 0
        while at < end:
            (size,) = _HEADER.unpack_from(view, at)
            # The service that started this process, over its own pipe.
            messages.append(pickle.loads(view[at + _HEADER.size : at + _HEADER.size + size]))  # noqa: S301
            at += _HEADER.size + size
        view.release()
        del self._buffer[:end]
        return messages


class _Batched:
    """The worker's trail as its Gateway sees it: each record built when the Gateway appends it (a record that
    cannot be built fails its job at once), and written with the rest of its batch by :meth:`write`: in order,
    under one hold of the trail's lock (the other writers of the trail wait for it once per batch, not once
    per record), then made durable with one fsync, before any job of the batch is answered (a dry run acts on
    nothing but its answer)."""

    def __init__(self, trail: JsonlAuditTrail) -> None:
        self.trail = trail
        self._records: list[dict[str, Any]] = []

    def append(self, event_type: str, data: Any, *, durable: bool = True, **kw: Any) -> None:
        self._records.append(self.trail.build(event_type, data, **kw))

    def write(self) -> None:
        """Write the records appended since the last call and make them durable; raises
        :class:`AuditUnavailableError` when they cannot all be (their jobs are then answered 503)."""
        records, self._records = self._records, []
        self.trail.append_built(records, durable=False)
        self.trail.sync()

    def close(self) -> None:
        self.trail.close()

    @property
    def protected_paths(self) -> tuple[str, ...]:
        return self.trail.protected_paths


class _Malformed(str):
    """A job's body that is not JSON: the message of its 400 ``request.malformed``."""


def _run_job(gateway: Gateway, kind: str, body: bytes, caller: Caller) -> ExecutionResult | _Malformed | None:
    """One job: the body checked as JSON (the check the service's event loop does not make), then decided
    (``decide``), checked as an execution's intake (``intake``: ``None`` when valid), or, an MCP message
    (``message``), checked to hold at most :data:`MESSAGE_MAX_VALUES` values (``None`` when it does)."""
    try:
        check_json_body(body, max_values=MESSAGE_MAX_VALUES if kind == "message" else None)
    except MalformedRequestError as exc:
        return _Malformed(exc.message)
    if kind == "decide":
        return gateway.decide(body, caller=caller)
    if kind == "intake":
        return gateway.intake(body, caller=caller)
    return None


def _in_process(gateway: Gateway, kind: str, body: bytes, caller: Caller) -> Decided | None:
    """A job decided in this process (no worker ready, or ``decision_workers: 0``), answered as a worker would."""
    result = _run_job(gateway, kind, body, caller)
    if isinstance(result, _Malformed):
        raise MalformedRequestError(str(result))
    return None if result is None else decided(result)


def decide_batch(gateway: Gateway, records: _Batched, messages: list[Any], send: Callable[[bytes], None]) -> None:
    """Decide one batch of messages from the service, in order, and ``send`` the answer frames: each job decided
    by ``gateway``, whose sink is ``records``, a policy set applied from the next job on. The jobs decided so far
    are answered, once their records are written and durable (:meth:`_Batched.write`), at the end of the batch,
    or before a job whose expected cost (the service's estimate for its principal, in the job) would take them
    past :data:`BATCH_S`: a dear job (a hostile body) never holds back the answers decided before it. When the
    write fails, every job it covered is answered as a dry run whose record could not be made durable (503,
    fail closed)."""
    done: list[tuple[int, _Answer, float]] = []
    started = time.monotonic()
    for message in messages:
        if message[0] in ("decide", "intake", "message"):
            kind, number, body, principal, token_id, expected_ms = message
            if done and time.monotonic() - started + expected_ms / 1000 >= BATCH_S:
                send(_answers(records, done))
                done, started = [], time.monotonic()
            cpu = time.thread_time()
            try:
                result: _Answer = _run_job(gateway, kind, body, Caller(principal, token_id))
            except Exception as exc:  # noqa: BLE001 - answered as a failure of this job, never a dead worker
                result = _Failed(f"{type(exc).__name__}: {exc}")
            done.append((number, result, (time.thread_time() - cpu) * 1000))
        elif message[0] == "policies":
            gateway.policies = PolicySet.of(message[1], message[2])
    if done:
        send(_answers(records, done))


class _Failed(str):
    """A job whose Gateway call raised (which it never should): the error's text."""


_Answer = ExecutionResult | _Malformed | _Failed | None
"""What a job comes to: a result to answer, a body that is not JSON, a failure, or a valid intake."""


def _answers(records: _Batched, done: list[tuple[int, _Answer, float]]) -> bytes:
    """The answer frames of the jobs done, once their records are written and durable, else 503 for each result
    (a malformed body or a valid intake recorded nothing)."""
    try:
        records.write()
    except AuditUnavailableError as exc:  # nothing of these is known durable: none of them is answered 200
        done = [(n, _unrecorded(r, exc) if isinstance(r, ExecutionResult) else r, cpu) for n, r, cpu in done]
    return b"".join(_answer(*job) for job in done)


def _unrecorded(result: ExecutionResult, exc: AuditUnavailableError) -> ExecutionResult:
    """The result of a dry run whose records could not be made durable: the Gateway's own for that case."""
    return ExecutionResult(result.request_id, result.decision, error=exc, audit_ok=False)


def _answer(number: int, result: _Answer, cpu_ms: float) -> bytes:
    cpu = round(cpu_ms, 3)
    if isinstance(result, _Malformed):
        return _answer_frame({"kind": "malformed", "job": number, "message": str(result), "cpu_ms": cpu})
    if isinstance(result, _Failed):
        return _answer_frame({"kind": "failed", "job": number, "error": str(result)})
    if result is None:
        return _answer_frame({"kind": "valid", "job": number, "cpu_ms": cpu})
    answer = decided(result)
    header = {"kind": "decided", "job": number, "status": answer.status, "headers": answer.headers}
    return _answer_frame({**header, "violations": answer.violations, "cpu_ms": cpu}, answer.content)


def worker_main() -> int:
    """A decision worker: an init frame, then jobs and policy sets until stdin closes (see the module)."""
    # Ctrl-C, a stop (systemd signals the whole group) and a reload are the service's: it finishes its requests,
    # then closes the worker's stdin, which is when a worker ends (or when the service itself is gone).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print goes to the log, never into the frames
    frames = _Jobs(sys.stdin.fileno())
    batch = frames.batch()
    if not batch or batch[0][0] != "init":
        return 2
    _, runner_factory, audit_dir, default, by_principal = batch[0]
    from gateway.audit import JsonlAuditTrail  # noqa: PLC0415 - after the init, with its directory

    trail = JsonlAuditTrail.from_env(audit_dir)
    runner: Runner = runner_factory()
    records = _Batched(trail)
    gateway = Gateway(PolicySet.of(default, by_principal), runner=runner, audit=records)
    out.write(_answer_frame({"kind": "ready", "pid": os.getpid()}))
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

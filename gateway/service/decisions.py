"""The service's side of the decision workers: dry runs (``POST /v1/decisions``) decided, and executions' and
MCP messages' bodies checked, in worker processes, so that the service's decisions use every CPU and its own
process never parses a body it has not seen to be a valid request (or, for ``/mcp``, bounded JSON).

:class:`DecisionWorkers` sends the jobs and awaits their answers; each principal's share of the workers is
:mod:`gateway.service.shares`, the worker itself :mod:`gateway.service.decision_worker`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
import os
import pickle
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from starlette.concurrency import run_in_threadpool

from gateway import Caller, Gateway, PolicySet
from gateway._workers import Frames, reap, start_worker
from gateway.errors import DecisionWorkerError, GatewayError, MalformedRequestError
from gateway.policy import Policy
from gateway.service.decision_worker import Malformed, RenderedAnswer, job_frame, render_answer, run_job
from gateway.service.shares import Share, next_principal, worker_takes

if TYPE_CHECKING:
    from gateway.runner import Runner

__all__ = ["DECIDE_S", "WORKER_CODE", "DecisionWorkers", "default_decision_workers"]

_log = logging.getLogger("gateway.service")

WORKER_CODE: Final = "from gateway.service.decision_worker import worker_main; raise SystemExit(worker_main())"
"""What a decision worker's interpreter runs (:func:`~gateway.service.decision_worker.worker_main`)."""
_RESPAWN_S: Final = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Back-off before replacing a worker that died (the last step repeats while they keep dying)."""
_CLOSE_S: Final = 10.0
DECIDE_S: Final = 30.0
"""The longest a job waits to be sent, and then for its worker's answer (a decision takes milliseconds): then
503 ``service.decision_failed``, and a worker that did not answer, stuck, is killed and replaced."""


def default_decision_workers() -> int:
    """One per CPU, at most four: the event loop's own share of a dry run is small (about a fifth)."""
    return max(1, min(4, os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class _Job:
    """A job sent (to a worker, or in process): what awaits its answer, and the room of its principal's share
    it holds (``cost``) until it leaves the worker (answered, or with the worker), even when its client has
    gone."""

    future: asyncio.Future[RenderedAnswer | None]
    principal: str
    cost: float


@dataclass(frozen=True, slots=True)
class _Sent:
    """Where the dispatcher sent a job: to ``worker`` as job ``number``, or in process (``worker`` None)."""

    worker: _Worker | None
    number: int
    job: _Job


def _policy_documents(policies: PolicySet) -> tuple[Policy, dict[str, Policy], bool]:
    """What a worker builds its policy set from: as strict as the service's (a principal it does not list is
    refused, never decided under the default)."""
    return policies.default.policy, {name: c.policy for name, c in policies.by_principal.items()}, policies.strict


def _in_process(
    gateway: Gateway, kind: str, body: bytes, caller: Caller, refused: Callable[[Caller], GatewayError | None]
) -> RenderedAnswer | None:
    """A job decided in this process (no worker ready, or ``decision_workers: 0``), answered as a worker would;
    its caller is checked again (``refused``) after its wait for this thread."""
    if (error := refused(caller)) is not None:
        raise error
    result = run_job(gateway, kind, body, caller)
    if isinstance(result, Malformed):
        raise MalformedRequestError(str(result))
    return None if result is None else render_answer(result)


class _Worker(asyncio.Protocol):
    """One worker process, seen from the event loop: its pipes, its jobs in flight, whether it is ready. It is the
    protocol that reads its stdout (:class:`gateway._workers.Frames`): each answer is handled, what is not a frame
    or not an answer kills it, and the end of the pipe is its end (it died, was killed, or ended at close)."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        on_ready: Callable[[], None],
        on_ended: Callable[[_Worker], None],
        on_left: Callable[[_Job, float | None], None],
        on_free: Callable[[], None],
    ) -> None:
        """``on_left``: a job left the worker (the CPU ms it took when its answer says, else None)."""
        self.proc = proc
        self.ready = False
        self.ended = asyncio.Event()
        """Set once its stdout has ended (it died, or was killed, or ended at the service's close)."""
        self.jobs: dict[int, _Job] = {}
        """Jobs in flight, by number."""
        self._on_ready = on_ready
        self._on_ended = on_ended
        self._on_left = on_left
        self._on_free = on_free
        self._frames = Frames()
        self._writer: asyncio.WriteTransport | None = None
        self._reader: asyncio.ReadTransport | None = None

    async def connect(self, loop: asyncio.AbstractEventLoop, init: bytes) -> None:
        if self.proc.stdin is None or self.proc.stdout is None:
            raise OSError("the decision worker has no pipes")
        self._writer, _ = await loop.connect_write_pipe(asyncio.Protocol, self.proc.stdin)
        self._reader, _ = await loop.connect_read_pipe(lambda: self, self.proc.stdout)
        self._writer.write(init)

    def send(self, frame: bytes) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(frame)

    def data_received(self, data: bytes) -> None:
        self._frames.feed(data)
        while True:
            try:
                payload = self._frames.pop()
            except ValueError as exc:  # a length no frame has
                self.kill(f"sent {exc}")
                return
            if payload is None:
                return
            head, _, content = payload.partition(b"\n")
            try:
                header = json.loads(head)
            except ValueError as exc:
                self.kill(f"sent a frame that is not a decision worker's answer ({exc})")
                return
            if not isinstance(header, dict):
                self.kill("sent a frame whose header is not a JSON object")
                return
            self._message(header, content)

    def _message(self, header: dict[str, Any], content: bytes) -> None:
        kind = header.get("kind")
        if kind == "ready":
            self.ready = True
            self._on_ready()
            _log.info("decision worker %d ready", self.proc.pid)
            self._on_free()
            return
        job = self.jobs.pop(header.get("job", 0), None)
        if job is None:
            return
        cpu = header.get("cpu_ms")
        self._on_left(job, float(cpu) if isinstance(cpu, (int, float)) and 0 <= cpu < 1e9 else None)
        self._on_free()
        if job.future.done():  # its client has gone
            return
        if kind == "decided":
            answer = RenderedAnswer(header["status"], content, header["headers"], header["violations"])
            job.future.set_result(answer)
        elif kind == "valid":  # an intake: the request is valid, nothing was recorded
            job.future.set_result(None)
        elif kind == "malformed":
            job.future.set_exception(MalformedRequestError(str(header.get("message"))))
        else:  # "failed": Gateway.decide raised, which it never should
            job.future.set_exception(RuntimeError(f"decision worker {self.proc.pid}: {header.get('error')}"))

    def _finish(self, number: int) -> _Job | None:
        """The job leaves the worker unanswered: its principal's share gets its room back."""
        job = self.jobs.pop(number, None)
        if job is not None:
            self._on_left(job, None)
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

    def connection_lost(self, exc: Exception | None) -> None:
        """Its stdout ended: its jobs in flight fail, its stdin leaves the event loop, it is reaped and replaced."""
        if self.ended.is_set():
            return
        self.ended.set()
        self.ready = False
        for number in list(self.jobs):
            job = self._finish(number)
            if job is not None and not job.future.done():
                job.future.set_exception(
                    DecisionWorkerError(f"the decision worker {self.proc.pid} ended while deciding this request")
                )
        writer = self._writer
        if writer is not None and (not writer.is_closing() or writer.get_write_buffer_size()):
            writer.abort()  # what it has not read it never will; its pipe leaves the event loop now, not once drained
        self._on_ended(self)
        self._on_free()

    @property
    def load_ms(self) -> float:
        """The CPU ms its jobs in flight are expected to cost."""
        return sum(job.cost for job in self.jobs.values())

    def takes(self, cost: float) -> bool:
        """Whether it takes a job expected to cost ``cost`` now (:func:`~gateway.service.shares.worker_takes`)."""
        return worker_takes([job.cost for job in self.jobs.values()], cost)

    def close(self) -> None:
        """End the worker: its stdin closes, it finishes the jobs it holds and exits."""
        if self._writer is not None:
            self._writer.close()


class DecisionWorkers:
    """The service's decision workers; :meth:`decide` is what ``POST /v1/decisions`` awaits, :meth:`intake` what
    ``POST /v1/executions`` awaits before it runs anything, :meth:`message` what ``/mcp`` awaits.

    Each job waits in the service until :meth:`_dispatch` sends it: its principal's :class:`Share` must have
    room, a worker must take it (:func:`~gateway.service.shares.worker_takes`), and of the principals waiting,
    the one that used the workers least lately goes first (:func:`~gateway.service.shares.next_principal`). A
    job not sent within ``timeout_s`` is a 503 ``service.decision_failed``.

    When no worker is ready (they are starting, one died and its replacement is starting, or the runner factory
    cannot be pickled: a test's closure), a job is done in process, as with ``decision_workers: 0``: a dry run
    is never refused for want of a worker. A job in flight on a worker that dies is a 503 (its
    ``request.received`` may be in the trail without a decision: a crash, not a silent loss), and the worker is
    replaced after a back-off; a worker that does not answer within ``timeout_s`` is killed, the same way. Nothing
    of a worker outlives the service: it ends when its stdin closes (the service's shutdown, or its death) and
    is killed if it does not."""

    def __init__(
        self,
        gateway: Gateway,
        runner: Callable[[], Runner] | None,
        count: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        worker_code: str = WORKER_CODE,
        timeout_s: float = DECIDE_S,
        refusal: Callable[[str, str | None], GatewayError | None] | None = None,
    ) -> None:
        """``count`` workers making their runner with ``runner`` (the service's factory) and appending to the
        gateway's trail; none when ``count`` is 0, without a factory, or when the trail is not a directory.
        ``clock`` (seconds) dates the shares' use; ``worker_code`` is what each worker's interpreter runs.
        ``refusal(principal, token_id)`` (:meth:`Service.refusal_of`) says why a job's caller may no longer be
        served (a reload removed its principal or revoked its token while the job waited): asked when its turn
        comes; None: never asked (a gateway without principals)."""
        directory = getattr(gateway.audit, "directory", None)
        self.gateway = gateway
        self.count = count if runner is not None and isinstance(directory, Path) else 0
        self._runner = runner
        self._audit_dir = directory
        self._clock = clock
        self._worker_code = worker_code
        self._timeout_s = timeout_s
        self._refusal = refusal
        self._workers: list[_Worker] = []
        self._readied = asyncio.Event()
        """Set each time a worker says it is ready: what :meth:`wait_ready` waits for."""
        self._jobs = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deaths = 0
        self._closing = False
        self._respawns: set[asyncio.Task[None]] = set()
        # One share and one queue per principal that sent a job: bounded by the principals file.
        self._shares: dict[str, Share] = {}
        self._waiting: dict[str, collections.deque[asyncio.Future[_Sent]]] = {}
        """Each principal's jobs waiting to be sent, first come, first served: each learns where it went."""

    @property
    def ready(self) -> int:
        """How many workers are ready to decide."""
        return sum(1 for w in self._workers if w.ready)

    def pids(self) -> list[int]:
        """The process ids of the workers ready to decide."""
        return [w.proc.pid for w in self._workers if w.ready]

    async def wait_ready(self, count: int | None = None, timeout_s: float = DECIDE_S) -> bool:
        """Wait (bounded) until ``count`` workers (default: all of them) are ready; True when they are. The service
        never waits for them (it decides in process meanwhile): a test or a benchmark does."""
        wanted = self.count if count is None else count

        async def readied() -> None:
            while self.ready < wanted:
                self._readied.clear()
                await self._readied.wait()

        try:
            await asyncio.wait_for(readied(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _init_frame(self) -> bytes | None:
        try:
            return job_frame(("init", self._runner, str(self._audit_dir), *_policy_documents(self.gateway.policies)))
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
            proc = await run_in_threadpool(start_worker, self._worker_code)
        except OSError as exc:
            _log.error("cannot start a decision worker: %s", exc)
            self._schedule_respawn()
            return
        worker = _Worker(proc, self._ready, self._ended, self._left, self._dispatch)
        self._workers.append(worker)
        try:
            await worker.connect(self._loop, init)
        except OSError as exc:
            _log.error("cannot talk to decision worker %d: %s", proc.pid, exc)
            worker.close()
            self._ended(worker)  # killed, and replaced after the back-off

    def _ready(self) -> None:
        self._deaths = 0
        self._readied.set()

    def _ended(self, worker: _Worker) -> None:
        """Its stdout ended, or it could not be talked to: reaped (killed if it still runs), then replaced."""
        with contextlib.suppress(ValueError):
            self._workers.remove(worker)
        reap(worker.proc)  # its pipes' transports are closing: no read or write of them is pending
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

    async def decide(self, body: bytes, caller: Caller) -> RenderedAnswer:
        """The dry run's answer, from a worker, else decided in process (:meth:`_job`). Raises
        :class:`MalformedRequestError` for a body that is not JSON."""
        answer = await self._job("decide", body, caller)
        if answer is None:  # pragma: no cover - a worker answers "valid" only to an intake
            raise DecisionWorkerError("a decision worker answered a dry run as an intake")
        return answer

    async def intake(self, body: bytes, caller: Caller) -> RenderedAnswer | None:
        """An execution's body checked as its intake does (:meth:`Gateway.intake`), in a worker: ``None`` when
        the request is valid (execute it), else the answer to the invalid request, recorded by the worker. Raises
        :class:`MalformedRequestError` for a body that is not JSON. The service's own process so parses only
        valid requests, whose size the request schema bounds: a body that is cheap to send and expensive to
        parse costs a worker, against its principal's share, not the event loop every principal shares."""
        return await self._job("intake", body, caller)

    async def message(self, body: bytes, caller: Caller) -> None:
        """An MCP message's body checked in a worker before the MCP SDK parses it in the event loop: JSON of at
        most :data:`~gateway.service.replies.MESSAGE_MAX_VALUES` values, else :class:`MalformedRequestError`.
        The SDK so parses only bodies of bounded cost; a body expensive to parse costs a worker, against its
        principal's share."""
        await self._job("message", body, caller)  # answered "valid" (None), else it raised

    async def _job(self, kind: str, body: bytes, caller: Caller) -> RenderedAnswer | None:
        """A job for the workers (``decide``, ``intake`` or ``message``). It waits in the service until it is sent
        (:meth:`_dispatch`): while its principal's share is full, or no worker takes it, or jobs of principals
        that used the workers less lately wait too. When its turn comes its caller is checked again: one that a
        reload removed or revoked meanwhile is refused (the ``refusal``'s error, 401), nothing decided."""
        self._shares.setdefault(caller.principal, Share())
        turn: asyncio.Future[_Sent] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(caller.principal, collections.deque()).append(turn)
        self._dispatch()
        if not turn.done():  # it waits: the workers or its share are full, or others wait before it
            try:
                await asyncio.wait((turn,), timeout=self._timeout_s)  # never cancels turn: what was sent is known
            except asyncio.CancelledError:
                self._abandon(turn)
                raise
        if not turn.done():
            self._abandon(turn)
            raise DecisionWorkerError(
                f"the decision workers did not take this request of principal {caller.principal!r} within "
                f"{self._timeout_s:g} s (its share, or every worker, held by the requests before it)"
            )
        sent = turn.result()
        if (error := self._refused(caller)) is not None:  # removed or revoked while it waited for its turn
            self._withdraw(sent)
            raise error
        if sent.worker is None:
            try:
                return await run_in_threadpool(_in_process, self.gateway, kind, body, caller, self._refused)
            finally:
                self._withdraw(sent)
        sent.worker.send(job_frame((kind, sent.number, body, caller.principal, caller.token_id, sent.job.cost)))
        try:
            return await asyncio.wait_for(sent.job.future, self._timeout_s)
        except TimeoutError:
            # its jobs, this one too, leave with it
            sent.worker.kill(f"no answer to a job within {self._timeout_s:g} s")
            raise DecisionWorkerError(
                f"the decision worker {sent.worker.proc.pid} did not answer within {self._timeout_s:g} s"
            ) from None

    def _dispatch(self) -> None:
        """Send the waiting jobs that can go: each time the first waiting one of the principal that goes next
        (:func:`~gateway.service.shares.next_principal`), to the worker with the least work expected, if that
        worker takes it; else none goes until a job leaves a worker. With no worker ready, in process (bounded
        by the shares alone). A job is on its worker from here on (its frame goes out when its request
        resumes): the next ones see the worker's load with it."""
        now = self._clock()
        while True:
            for waiting in self._waiting.values():
                while waiting and waiting[0].done():  # abandoned while it waited
                    waiting.popleft()
            principal = next_principal(((p, self._shares[p]) for p, w in self._waiting.items() if w), now)
            if principal is None:
                return
            share = self._shares[principal]
            ready = [w for w in self._workers if w.ready]
            worker = min(ready, key=lambda w: w.load_ms) if ready else None
            if worker is not None and not worker.takes(share.cost_ms):
                return
            self._shares[principal] = share.granted(now)
            job = _Job(asyncio.get_running_loop().create_future(), principal, share.cost_ms)
            number = next(self._jobs)
            if worker is not None:
                worker.jobs[number] = job  # it gives the share back when it leaves the worker
            self._waiting[principal].popleft().set_result(_Sent(worker, number, job))

    def _left(self, job: _Job, cpu_ms: float | None) -> None:
        """A job left the workers (answered, with its worker, withdrawn, or decided in process): its room goes
        back to its principal's share, which learns what it cost when a worker timed it."""
        share = self._shares[job.principal].given_back(job.cost)
        if cpu_ms is not None:
            share = share.learnt(cpu_ms, job.cost, self._clock())
        self._shares[job.principal] = share

    def _refused(self, caller: Caller) -> GatewayError | None:
        """Why ``caller`` may no longer be served (the ``refusal`` given), or None."""
        return None if self._refusal is None else self._refusal(caller.principal, caller.token_id)

    def _abandon(self, turn: asyncio.Future[_Sent]) -> None:
        """A job whose request left while it waited: the dispatcher skips it, or, sent already, it leaves."""
        if turn.done():
            self._withdraw(turn.result())
        else:
            turn.cancel()

    def _withdraw(self, sent: _Sent) -> None:
        """A job decided in process, or abandoned before its frame went to its worker: its room goes back."""
        if sent.worker is None:
            self._left(sent.job, None)
        else:
            sent.worker.withdraw(sent.number)
        self._dispatch()

    def policies_changed(self, policies: PolicySet) -> None:
        """A reload made ``policies`` the service's: every worker decides under them from its next job on. Any
        thread (the reload runs in one)."""
        if self._loop is None:
            return
        frame = job_frame(("policies", *_policy_documents(policies)))

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
        for worker in workers:  # each, once its stdout ends, is reaped (_ended)
            try:
                await asyncio.wait_for(worker.ended.wait(), _CLOSE_S)
            except TimeoutError:
                worker.kill(f"did not end within {_CLOSE_S:g} s of the service's close")
                await worker.ended.wait()

"""Executions over HTTP that follow their client: live output as server-sent events, and cancellation when the
client goes away.

``POST /v1/executions`` with ``Accept: text/event-stream`` (:class:`EventStreamExecution`) answers with events
as the program writes::

    event: stdout
    data: "hello\\n"

    event: result
    data: {"request_id": "...", "allowed": true, "exit_code": 0, "stdout": "hello\\n", ...}

Each ``stdout`` / ``stderr`` event's data is a JSON string: the chunk's bytes decoded as UTF-8 with replacement
characters, by one incremental decoder per stream, so a character split across chunks is not mangled and the
streamed text joined equals the result's ``stdout`` / ``stderr`` exactly. Chunks are coalesced
(:class:`_Batch`): those that arrive within :data:`COALESCE_S` of the first of a batch, up to
:data:`COALESCE_BYTES`, make one event per run of one stream, in their order. A program writing a byte at a
time so costs one wake-up of the event loop and one event per batch, not per write (10,000 flushed 1-byte
writes were about 9,000 hand-overs between threads and as many events: four times the CPU of the same run
answered as JSON). The last event is one ``result``
whose data is the body the JSON response would have had (the result object; for a run that failed after it
started, the error body with its ``result``). What the gateway refuses before anything runs (401, 403 denied,
413, 415, 422, ...) is an ordinary JSON error response, not a stream: the response starts only at the first
chunk or at the result, whichever comes first. A stream's headers are sent before the request id is known, so
it has no ``X-Request-Id`` header; the ``result`` carries ``request_id``.

Memory and back-pressure: the worker thread running :meth:`Gateway.execute` adds chunks to the batch, which
holds at most :data:`COALESCE_BYTES` (and one chunk more); while it is full the worker waits (the runner stops
reading, the sandbox's pipe fills and the program blocks on its writes), so a slow client slows the program
instead of growing the gateway's memory. What is held is never more than the run's output caps allow, which
bound the result anyway. A client that stops reading altogether would stall the runner and with it the deadline's
check, so a wait longer than the stall limit (``stream_stall_s`` in the server config, default :data:`STALL_S`)
counts as the client being gone: the run is cancelled. Every write to the client has the same limit: past it the
server stops writing and the connection is closed. The admission slot is given back as soon as the run ends,
whatever the client reads, so a client that never reads holds nothing past its run.

Cancellation (:func:`execute_watched` for the JSON response, the stream likewise): the ASGI ``receive``
channel is watched for ``http.disconnect``; a client that disconnects (or a stall) sets the run's cancel
event, the sandbox is killed and removed, and the outcome is recorded with ``gateway.cancelled``.
"""

from __future__ import annotations

import codecs
import functools
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from gateway import Caller, ExecutionResult

__all__ = [
    "COALESCE_BYTES", "COALESCE_S", "EVENT_STREAM", "STALL_S", "EventStreamExecution",
    "execute_watched", "wants_events",
]  # fmt: skip

EVENT_STREAM = "text/event-stream"
STALL_S = 30.0
"""A client that takes no chunk for this long is treated as gone (its run is cancelled)."""
COALESCE_S = 0.05
"""Chunks arriving within this long of the first of a batch are sent together: output is late by at most this."""
COALESCE_BYTES = 64 * 1024
"""A batch this large is sent at once; while one is this large, the worker waits (back-pressure)."""

Respond = Callable[[ExecutionResult], Response]
Execute = Callable[..., ExecutionResult]
"""``execute(body, caller, cancel=event, on_output=callback)``: the service's execution in a worker thread."""


def wants_events(request: Request) -> bool:
    """Whether the client asked for server-sent events (``Accept`` names ``text/event-stream``)."""
    accept = request.headers.get("accept", "")
    return any(part.split(";")[0].strip().lower() == EVENT_STREAM for part in accept.split(","))


async def _cancel_on_disconnect(receive: Receive, cancel: threading.Event) -> None:
    """Set ``cancel`` when the client disconnects (the body has been read: the next message is the
    disconnect)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return


async def execute_watched(request: Request, execute: Execute, body: bytes, caller: Caller) -> ExecutionResult:
    """``execute`` in a worker thread, cancelled if the client disconnects before it ends."""
    cancel = threading.Event()
    work = functools.partial(execute, body, caller, cancel=cancel)
    async with anyio.create_task_group() as group:
        group.start_soon(_cancel_on_disconnect, request.receive, cancel)
        try:
            # Not abandoned if this task is cancelled: the thread ends the run (cancel is set) and is waited for.
            result = await anyio.to_thread.run_sync(work)
        finally:
            cancel.set()  # a no-op for a finished run; ends the run if this task was cancelled
            group.cancel_scope.cancel()
    return result


def _event(name: str, data: Any) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class _StalledError(Exception):
    """The client took nothing for the stall limit."""


class _Batch:
    """The chunks between the worker thread and the response, consecutive chunks of one stream joined, in their
    order. The worker adds chunks (:meth:`put`), waiting while the batch holds ``max_bytes``, and wakes the event
    loop only for the first chunk of a batch and when the batch is full; the response takes a batch
    (:meth:`take`) once it is full, ended, or ``window_s`` after its first chunk."""

    def __init__(self, *, window_s: float, max_bytes: int, stall_s: float) -> None:
        self._window_s = window_s
        self._max_bytes = max_bytes
        self._stall_s = stall_s
        self._lock = threading.Condition()
        self._runs: list[tuple[str, bytearray]] = []
        self._bytes = 0
        self._ended = False
        self._closed = False
        self._some = anyio.Event()  # the event loop's side: set only in the event loop
        self._full = anyio.Event()

    def put(self, stream: str, data: bytes) -> bool:
        """In the worker thread: add a chunk. False when the response is gone, or took nothing for the stall
        limit (the run is to be cancelled)."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._closed or self._bytes < self._max_bytes, self._stall_s):
                return False
            if self._closed:
                return False
            first = not self._runs
            if self._runs and self._runs[-1][0] == stream:
                self._runs[-1][1].extend(data)
            else:
                self._runs.append((stream, bytearray(data)))
            self._bytes += len(data)
            full = self._bytes >= self._max_bytes
        if first or full:
            anyio.from_thread.run_sync(self._wake, full)
        return True

    def end(self) -> None:
        """In the worker thread: no more chunks will come."""
        with self._lock:
            self._ended = True
        anyio.from_thread.run_sync(self._wake, True)

    def _wake(self, full: bool) -> None:
        self._some.set()
        if full:
            self._full.set()

    async def take(self) -> list[tuple[str, bytes]] | None:
        """The next batch (each run of one stream once); None once the worker ended and all was taken."""
        while True:
            await self._some.wait()
            with anyio.move_on_after(self._window_s):
                await self._full.wait()
            with self._lock:
                runs, ended = self._runs, self._ended
                self._runs, self._bytes = [], 0
                self._some, self._full = anyio.Event(), anyio.Event()  # before any later chunk can wake them
                if ended:
                    self._wake(True)  # nothing more will: the next take returns at once
                self._lock.notify_all()
            if runs or ended:
                return [(stream, bytes(data)) for stream, data in runs] or None

    def close(self) -> None:
        """The response is over: a waiting or later :meth:`put` returns False."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()


class EventStreamExecution(Response):
    """The response of a streamed execution (see the module docstring); ``respond`` builds the JSON response
    of a result (the one a non-streaming request gets)."""

    def __init__(
        self, execute: Execute, body: bytes, caller: Caller, respond: Respond, *,
        release: Callable[[], Awaitable[object]] | None = None, stall_s: float = STALL_S,
        coalesce_s: float = COALESCE_S,
    ) -> None:  # fmt: skip
        super().__init__(media_type=EVENT_STREAM)
        self._stall_s = stall_s
        self._coalesce_s = coalesce_s
        self._execute = execute
        self._release = release
        """Called once, as soon as the run has ended (the admission slot it held): not when the response has been
        read, so a client that stops reading holds no slot past its run."""
        self._body = body
        self._caller = caller
        self._respond = respond

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._stream(scope, receive, send)
        finally:
            await self._run_ended()

    async def _run_ended(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            await release()

    async def _send(self, send: Send, message: Message) -> None:
        """``send`` within the stall limit; past it the client counts as gone (:class:`_StalledError`)."""
        with anyio.move_on_after(self._stall_s) as scope:
            await send(message)
        if scope.cancelled_caught:
            raise _StalledError

    async def _stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        cancel = threading.Event()
        batch = _Batch(window_s=self._coalesce_s, max_bytes=COALESCE_BYTES, stall_s=self._stall_s)
        outcome: list[ExecutionResult] = []

        def on_output(stream: str, data: bytes) -> None:
            if cancel.is_set():
                return  # the runner sees the cancel at its next read and kills the sandbox
            if not batch.put(stream, data):
                cancel.set()  # the response is gone, or the client takes nothing: treated as gone

        def work() -> None:
            try:
                outcome.append(self._execute(self._body, self._caller, on_output=on_output, cancel=cancel))
            finally:
                batch.end()

        async with anyio.create_task_group() as group:
            group.start_soon(_cancel_on_disconnect, receive, cancel)

            async def run() -> None:
                try:
                    await anyio.to_thread.run_sync(work)
                finally:
                    await self._run_ended()

            group.start_soon(run)
            try:
                await self._relay(batch, outcome, scope, receive, send)
            except (OSError, _StalledError):
                # The client went away, or takes nothing: stop writing (an unfinished response makes the server
                # close the connection); the watcher, the closed queue or the cancel below ends the run.
                pass
            finally:
                cancel.set()  # a no-op for a finished run
                batch.close()
            group.cancel_scope.cancel()

    async def _relay(
        self, batch: _Batch, outcome: list[ExecutionResult], scope: Scope, receive: Receive, send: Send
    ) -> None:
        decoders = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in ("stdout", "stderr")}
        started = False
        while (runs := await batch.take()) is not None:
            if not started:
                start = {"type": "http.response.start", "status": 200, "headers": self._stream_headers()}
                await self._send(send, start)
                started = True
            texts = [(stream, decoders[stream].decode(data)) for stream, data in runs]
            body = b"".join(_event(stream, text) for stream, text in texts if text)
            if body:
                await self._send(send, {"type": "http.response.body", "body": body, "more_body": True})
        # The worker has finished, or failed without a result.
        if not outcome:
            raise RuntimeError("the execution ended without a result")
        response = self._respond(outcome[0])
        if not started:  # nothing ran, or nothing was written: a plain response (JSON, or an error)
            if response.status_code != 200:
                await response(scope, receive, send)  # a small JSON error body
                return
            await self._send(send, {"type": "http.response.start", "status": 200, "headers": self._stream_headers()})
        tail = b"".join(
            _event(name, rest) for name, decoder in decoders.items() if (rest := decoder.decode(b"", final=True))
        )
        body = tail + _event("result", json.loads(bytes(response.body)))
        await self._send(send, {"type": "http.response.body", "body": body, "more_body": False})

    @staticmethod
    def _stream_headers() -> list[tuple[bytes, bytes]]:
        return [
            (b"content-type", f"{EVENT_STREAM}; charset=utf-8".encode()),
            (b"cache-control", b"no-store"),
            (b"x-accel-buffering", b"no"),
        ]

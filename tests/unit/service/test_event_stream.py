"""Streamed output is coalesced (``gateway.service.streaming``): many tiny writes make few server-sent events,
with the same text per stream and the same order, and a chunk followed by silence is not held back.

The response runs against a fake execution (its ``execute`` calls ``on_output`` as a runner would, in the worker
thread) and a recording ASGI ``send``; no server, no engine. The coalescing window is injected: a long one makes
the batches depend only on sizes and the end of the run, not on timing.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import anyio
from starlette.responses import JSONResponse, Response
from starlette.types import Message

from gateway import Caller
from gateway.service.streaming import COALESCE_BYTES, EventStreamExecution

CALLER = Caller(principal="alice", token_id="0123abcd")
LONG_WINDOW_S = 600.0
"""Longer than any run here: a batch is sent when it is full or when the run ended."""

Writes = list[tuple[str, bytes]]


def _response(writes: Writes, coalesce_s: float, between: Callable[[int], None] = lambda _: None) -> Response:
    def execute(_body: bytes, _caller: Caller, *, cancel: threading.Event, on_output: Any) -> object:
        for i, (stream, data) in enumerate(writes):
            between(i)
            on_output(stream, data)
        return object()

    def respond(_result: object) -> Response:
        return JSONResponse({"stdout": b"".join(d for s, d in writes if s == "stdout").decode()})

    return EventStreamExecution(execute, b"{}", CALLER, respond, coalesce_s=coalesce_s)


def _events(response: Response, on_body: Callable[[bytes], None] = lambda _: None) -> list[tuple[str, Any]]:
    sent: list[Message] = []

    async def receive() -> Message:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            on_body(message["body"])

    async def main() -> None:
        await response({"type": "http", "method": "POST", "path": "/v1/executions"}, receive, send)

    anyio.run(main)
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == 200
    stream = b"".join(m["body"] for m in sent[1:]).decode()
    events = []
    for block in stream.split("\n\n")[:-1]:
        name, data = block.split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def test_many_tiny_writes_make_few_events_with_the_same_text_in_the_same_order() -> None:
    """2,000 one-byte writes (a character split across two of them, and stderr between) make one event per run
    of one stream, not one per write; each stream's text and the order of the runs are unchanged."""
    writes: Writes = [("stdout", b"a")] * 1000 + [("stderr", b"e")] * 10
    writes += [("stdout", b) for b in (b"\xc3", b"\xa9")] + [("stdout", b"b")] * 988
    events = _events(_response(writes, LONG_WINDOW_S))
    assert events[:-1] == [("stdout", "a" * 1000), ("stderr", "e" * 10), ("stdout", "\u00e9" + "b" * 988)]
    assert events[-1][0] == "result"
    assert events[-1][1]["stdout"] == "a" * 1000 + "\u00e9" + "b" * 988


def test_a_batch_is_sent_once_it_reaches_coalesce_bytes() -> None:
    """However long the window, output is sent in batches of about COALESCE_BYTES: the service never gathers
    more than that (plus one chunk) before sending."""
    chunk = 1024
    writes: Writes = [("stdout", bytes([ord("a") + i % 26]) * chunk) for i in range(4 * COALESCE_BYTES // chunk)]
    events = _events(_response(writes, LONG_WINDOW_S))
    texts = [data for name, data in events if name == "stdout"]
    assert "".join(texts) == "".join(d.decode() for _, d in writes)
    assert len(texts) >= 4
    assert max(len(text) for text in texts) < COALESCE_BYTES + chunk


def test_a_chunk_followed_by_silence_is_sent_without_waiting_for_more() -> None:
    """A program that writes and then waits (here: until its first output has reached the client) has that
    output sent after the window: the run ends only because the event arrived."""
    reached = threading.Event()

    def between(i: int) -> None:
        if i == 1:  # the second write waits for the first to reach the client
            assert reached.wait(timeout=30), "the first chunk was held back"

    events = _events(
        _response([("stdout", b"first\n"), ("stdout", b"second\n")], 0.01, between), lambda _: reached.set()
    )
    assert events[:-1] == [("stdout", "first\n"), ("stdout", "second\n")]


def test_a_response_that_is_gone_cancels_the_run() -> None:
    """When the client cannot be written to (here: the first body write fails), the worker's next chunk finds
    the response gone and the run's cancel event is set: the program stops being read instead of filling the
    service's memory."""
    cancelled: list[bool] = []
    total = 1000

    def execute(_body: bytes, _caller: Caller, *, cancel: threading.Event, on_output: Any) -> object:
        for _ in range(total):
            if cancel.is_set():
                break
            on_output("stdout", b"x" * 1024)
        cancelled.append(cancel.is_set())
        return object()

    response = EventStreamExecution(execute, b"{}", CALLER, lambda _r: JSONResponse({}), coalesce_s=LONG_WINDOW_S)

    async def receive() -> Message:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            raise OSError("the client is gone")

    async def main() -> None:
        await response({"type": "http", "method": "POST", "path": "/v1/executions"}, receive, send)

    anyio.run(main)
    assert cancelled == [True]

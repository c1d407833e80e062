"""The one pool of worker processes (``gateway._workers``): answers in task order, a bounded look-ahead, a worker
that dies or sends garbage is an error naming it (never a hang), and nothing of a worker outlives the pool."""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway import _workers
from gateway._workers import Frames, WorkerError, WorkerPool, frame, pool_size, reap, start_worker

ECHO = (
    "from gateway._workers import serve\n"
    "def start(head):\n"
    "    def task(data):\n"
    "        if data == b'die':\n"
    "            import os; os._exit(3)\n"
    "        if data == b'hang':\n"
    "            import time; time.sleep(120)\n"
    "        print('a stray print goes to stderr')\n"
    "        return head + b':' + data\n"
    "    return task\n"
    "raise SystemExit(serve(start))\n"
)
"""Answers ``head:task``; ends with status 3 on ``die``; never answers ``hang``."""


def _gone(pids: list[int]) -> bool:
    """Whether none of ``pids`` is a process any more (reaped: not even a zombie)."""
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


def test_answers_come_in_task_order_from_every_worker() -> None:
    tasks = [str(n).encode() for n in range(40)]
    with WorkerPool(ECHO, 3, head=b"h", stderr=subprocess.DEVNULL) as pool:
        answers = list(pool.map(tasks, bytes.decode))
        pids = pool.pids
    assert answers == [f"h:{n}" for n in range(40)]
    assert len(pids) == 3
    assert _gone(pids)


def test_tasks_are_handed_out_at_most_ahead_times_the_workers_beyond_the_answer_taken() -> None:
    pulled = [0]

    def tasks() -> Iterator[bytes]:
        for n in range(12):
            pulled[0] += 1
            yield b"%d" % n

    seen = []
    with WorkerPool(ECHO, 2, ahead=1, stderr=subprocess.DEVNULL) as pool:
        answers = pool.map(tasks(), bytes)
        assert pulled == [3]  # two handed out before map returned, and the next one read
        for _answer in answers:
            seen.append(pulled[0])
    # when answer k is taken, tasks up to k + 1 are out (2 workers, 1 ahead each) and task k + 2 is read
    assert seen == [min(k + 3, 12) for k in range(12)]


def test_a_worker_that_dies_on_a_task_is_an_error_naming_it_and_the_task() -> None:
    tasks = [b"a", b"b", b"die", b"c"]
    with WorkerPool(ECHO, 2, head=b"h", stderr=subprocess.DEVNULL, name="test worker") as pool:
        pids = pool.pids
        with pytest.raises(WorkerError) as caught:
            list(pool.map(tasks, bytes))
    assert caught.value.task == 2
    assert caught.value.pid in pids
    assert f"test worker {caught.value.pid} ended (exit status 3) on task 2" in str(caught.value)
    assert _gone(pids)


def test_a_worker_that_writes_garbage_is_an_error_not_a_hang() -> None:
    garbage = "import os, sys, time\nsys.stdin.buffer.read(4)\nos.write(1, b'Traceback: oops\\n')\ntime.sleep(120)\n"
    with WorkerPool(garbage, 1) as pool:
        pids = pool.pids
        with pytest.raises(WorkerError) as caught:
            list(pool.map([b"x"], bytes))
    assert f"worker {pids[0]} sent not a frame" in str(caught.value)
    assert "Traceback: oops" in str(caught.value)
    assert _gone(pids)


def test_an_answer_that_decode_refuses_is_an_error_naming_the_task() -> None:
    def decode(data: bytes) -> int:
        return int(data.split(b":")[1])

    with WorkerPool(ECHO, 2, stderr=subprocess.DEVNULL) as pool, pytest.raises(WorkerError) as caught:
        list(pool.map([b"1", b"2", b"three", b"4"], decode))
    assert caught.value.task == 2
    assert "answered task 2 with something that is not an answer (ValueError" in str(caught.value)


def test_workers_that_end_at_once_are_an_error() -> None:
    # Raised by the constructor (its head cannot be sent) or by map: how soon the workers end is the machine's.
    with pytest.raises(WorkerError), WorkerPool("pass", 2) as pool:
        list(pool.map([b"1", b"2", b"3"], bytes))


def test_a_caller_that_stops_early_leaves_no_worker_behind() -> None:
    with WorkerPool(ECHO, 2, stderr=subprocess.DEVNULL) as pool:
        answers = pool.map([b"first", b"hang", b"hang"], bytes)
        assert next(answers) == b":first"
        pids = pool.pids
    assert _gone(pids)  # the two on "hang" were killed, not waited for


def test_a_pool_that_cannot_start_its_workers_raises_oserror() -> None:
    started: list[subprocess.Popen[bytes]] = []

    def second_fails(code: str, *, stderr: int | None = None) -> subprocess.Popen[bytes]:
        if started:
            raise OSError("no more processes")
        started.append(start_worker(code, stderr=stderr))
        return started[0]

    with pytest.raises(OSError, match="no more processes"):
        WorkerPool(ECHO, 2, start=second_fails)
    assert started[0].returncode is not None  # the first one was reaped


def test_frames_are_whole_whatever_pieces_the_pipe_gives() -> None:
    payloads = [b"", b"x", bytes(range(256)) * 300, b"\x00\x00\x00\x05"]
    stream = b"".join(frame(p) for p in payloads)
    rng = random.Random(7)  # noqa: S311 - reproducible cuts, not cryptography
    for _ in range(20):
        frames, got, at = Frames(), [], 0
        while at < len(stream):
            step = rng.randrange(1, 5000)
            frames.feed(stream[at : at + step])
            at += step
            while (payload := frames.pop()) is not None:
                got.append(payload)
        assert got == payloads
        assert frames.held == 0


def test_text_in_the_pipe_is_not_a_frame() -> None:
    frames = Frames()
    frames.feed(b"hello\n")
    with pytest.raises(ValueError, match="not a frame"):
        frames.pop()


def test_pool_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    files = []
    for n in range(3):
        files.append(tmp_path / f"{n}")
        files[-1].write_bytes(b"x" * 1000)
    assert pool_size(None, files) == 1  # small: in process
    assert pool_size(2, files) == 2
    assert pool_size(9, files) == 3  # one per file
    assert pool_size(9, files, tasks=8) == 4  # one per CPU
    assert pool_size(0, files) == 1
    monkeypatch.setattr(_workers, "PARALLEL_MIN_BYTES", 3000)
    assert pool_size(None, [*files, tmp_path / "gone"]) == 4
    monkeypatch.setattr(_workers, "PARALLEL_MIN_BYTES", 3001)
    assert pool_size(None, files) == 1


def test_reap_kills_a_worker_that_does_not_end_when_its_stdin_does() -> None:
    polite = start_worker("import sys; sys.stdin.buffer.read()")
    stubborn = start_worker("import time; time.sleep(120)")
    assert reap(polite, 60.0)
    assert polite.returncode == 0
    assert not reap(stubborn, 0.1)
    assert stubborn.returncode == -9

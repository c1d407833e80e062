"""The decision workers with real worker processes and the fake runner (no engine): the answer a worker renders
is the in-process answer, and a job in flight on a worker that dies is a 503, never a hang."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import fcntl
import json
import os
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from gateway import Caller, Gateway
from gateway.audit import JsonlAuditTrail, verify_trail
from gateway.audit.segments import AuditIO
from gateway.errors import AuditUnavailableError, DecisionWorkerError, http_status_for
from gateway.policy import load_policy
from gateway.resources import default_policy_path
from gateway.runner.fake import FakeRunner
from gateway.service import decisions
from gateway.service.decisions import DecisionWorkers, decided

CALLER = Caller("alice", "gw_id_test")


def _gateway(directory: Path) -> Gateway:
    return Gateway(load_policy(default_policy_path()), runner=FakeRunner(), audit=JsonlAuditTrail(directory))


async def _ready(workers: DecisionWorkers, count: int) -> None:
    deadline = time.monotonic() + 60
    while workers.ready < count:
        assert time.monotonic() < deadline, "the workers did not get ready"
        await asyncio.sleep(0.05)


def _first_job_error(gateway: Gateway, *, then_in_process: bool = False) -> DecisionWorkerError | None:
    """Start one worker (``decisions._WORKER`` as the test set it), send it one job: the error that job ended
    with, if any; ``then_in_process``: a second job must then be decided (in process, while it is replaced)."""

    async def scenario() -> DecisionWorkerError | None:
        workers = DecisionWorkers(gateway, FakeRunner, 1)
        await workers.start()
        try:
            await _ready(workers, 1)
            try:
                await asyncio.wait_for(workers.decide(b'{"code": "print(1)"}', CALLER), 30)
            except DecisionWorkerError as exc:
                if then_in_process:
                    assert (await workers.decide(b'{"code": "print(1)"}', CALLER)).status == 200
                return exc
            return None
        finally:
            await workers.close()

    try:
        return asyncio.run(scenario())
    finally:
        gateway.close()


def test_a_worker_answers_as_the_service_would(tmp_path: Path) -> None:
    gateway = _gateway(tmp_path / "audit")

    async def scenario() -> tuple[decisions.Decided, decisions.Decided, decisions.Decided]:
        workers = DecisionWorkers(gateway, FakeRunner, 1)
        await workers.start()
        try:
            await _ready(workers, 1)
            allowed = await workers.decide(b'{"code": "print(1)"}', CALLER)
            denied = await workers.decide(b'{"code": "print(1)", "network": "bridge"}', CALLER)
            invalid = await workers.decide(b'{"code": 1}', CALLER)
        finally:
            await workers.close()
        return allowed, denied, invalid

    allowed, denied, invalid = asyncio.run(scenario())
    local = decided(gateway.decide(b'{"code": "print(1)"}', caller=CALLER))
    gateway.close()
    assert allowed.status == local.status == 200
    mine, theirs = json.loads(allowed.content), json.loads(local.content)
    assert mine.keys() == theirs.keys()
    assert mine["decision"]["options"].keys() == theirs["decision"]["options"].keys()
    assert [r["rule"] for r in mine["decision"]["results"]] == [r["rule"] for r in theirs["decision"]["results"]]
    assert allowed.headers["X-Request-Id"] == mine["request_id"]
    assert allowed.violations is None
    assert denied.status == 200
    assert json.loads(denied.content)["allowed"] is False
    assert [v["rule"] for v in denied.violations or []] == ["network.mode"]
    assert invalid.status == 422
    assert json.loads(invalid.content)["code"] == "request.invalid"


_READY_THEN_FIRST_JOB = """
import os, sys
from gateway.service.decisions import _answer_frame, _Jobs
out, jobs = os.fdopen(os.dup(1), "wb"), _Jobs(0)
jobs.batch()
out.write(_answer_frame({"kind": "ready", "pid": os.getpid()})); out.flush()
jobs.batch()
"""
"""A fake worker's start: it reads the init frame, says it is ready and reads its first job (what follows says
what it does with it)."""

_DIES_ON_FIRST_JOB = _READY_THEN_FIRST_JOB + "os._exit(3)\n"


def test_a_job_in_flight_on_a_dying_worker_is_a_503(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decisions, "_WORKER", _DIES_ON_FIRST_JOB)
    error = _first_job_error(_gateway(tmp_path / "audit"), then_in_process=True)
    assert isinstance(error, DecisionWorkerError)
    assert http_status_for(error) == 503
    assert error.code == "service.decision_failed"


def test_no_worker_without_a_trail_directory_or_a_factory(tmp_path: Path) -> None:
    from gateway.audit import MemoryAuditSink

    in_memory = Gateway(load_policy(default_policy_path()), runner=FakeRunner(), audit=MemoryAuditSink())
    assert DecisionWorkers(in_memory, FakeRunner, 2).count == 0
    assert DecisionWorkers(_gateway(tmp_path / "audit"), None, 2).count == 0


_ANSWERS_WITH_A_PICKLE = (
    _READY_THEN_FIRST_JOB
    + """
import pickle, struct

class Exploit:
    def __reduce__(self):
        return (open, (sys.argv[1] if len(sys.argv) > 1 else os.environ["PLANTED"], "w"))

data = pickle.dumps(("decided", 1, 200, b"{}", {}, Exploit()))
out.write(struct.pack("!I", len(data)) + data); out.flush()
sys.stdin.buffer.read()
"""
)


def test_a_worker_answer_is_never_unpickled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker handles hostile bodies: what it sends back is data. A pickle in its answer (here one that would
    create a file when loaded) breaks the protocol: the job fails with a 503, the worker is killed, nothing runs."""
    planted = tmp_path / "planted"
    monkeypatch.setenv("PLANTED", str(planted))
    monkeypatch.setattr(decisions, "_WORKER", _ANSWERS_WITH_A_PICKLE)
    error = _first_job_error(_gateway(tmp_path / "audit"))
    assert isinstance(error, DecisionWorkerError)
    assert not planted.exists()


_NEVER_ANSWERS = _READY_THEN_FIRST_JOB + "import time\ntime.sleep(3600)\n"


def test_a_worker_that_never_answers_is_a_503_and_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decisions, "_WORKER", _NEVER_ANSWERS)
    monkeypatch.setattr(decisions, "_DECIDE_S", 1.0)
    error = _first_job_error(_gateway(tmp_path / "audit"), then_in_process=True)
    assert isinstance(error, DecisionWorkerError)
    assert "did not answer within 1 s" in error.message


class _CountingIO(AuditIO):
    def __init__(self, *, fail_fsync: bool = False) -> None:
        self.fsyncs = 0
        self.locks = 0
        self.fail_fsync = fail_fsync

    def flock(self, fd: int, operation: int) -> None:
        self.locks += operation == fcntl.LOCK_EX
        super().flock(fd, operation)

    def fsync(self, fd: int) -> None:
        if self.fail_fsync:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        self.fsyncs += 1
        super().fsync(fd)


def _answers(frames: bytes) -> list[tuple[dict[str, Any], bytes]]:
    """The answer frames a worker wrote, as (header, body)."""
    answers, at = [], 0
    while at < len(frames):
        (size,) = struct.unpack_from("!I", frames, at)
        head, _, body = frames[at + 4 : at + 4 + size].partition(b"\n")
        answers.append((json.loads(head), body))
        at += 4 + size
    return answers


def _batch_gateway(directory: Path, io: AuditIO) -> tuple[Gateway, decisions._Batched]:
    records = decisions._Batched(JsonlAuditTrail(directory, io=io))
    policy = load_policy(default_policy_path())
    return Gateway(policy, runner=FakeRunner(), audit=records), records


def _job(number: int, body: bytes, expected_ms: float = 1.0) -> tuple[str, int, bytes, str, str, float]:
    return ("decide", number, body, CALLER.principal, CALLER.token_id, expected_ms)


def test_a_batch_is_answered_in_order_after_one_write_and_one_fsync_covering_its_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch's records go to the trail in one turn (one hold of its lock: the other writers wait once per
    batch), then one fsync, then the answers."""
    monkeypatch.setattr(decisions, "BATCH_S", 3600.0)  # however slow this machine is: one batch, one answer write
    io = _CountingIO()
    gateway, sink = _batch_gateway(tmp_path, io)
    batch = [_job(1, b'{"code": "print(1)"}'), _job(2, b'{"code": "print(1)", "network": "bridge"}'), _job(3, b"{")]
    sent: list[bytes] = []
    decisions.decide_batch(gateway, sink, batch, sent.append)
    assert len(sent) == 1
    answers = _answers(sent[0])
    assert (io.locks, io.fsyncs) == (1, 1)
    assert [(h["job"], h["kind"], h.get("status")) for h, _ in answers] == [
        (1, "decided", 200), (2, "decided", 200), (3, "malformed", None),
    ]  # fmt: skip
    assert answers[2][0]["message"].startswith("the body is not JSON: ")  # the service answers it 400, audited
    assert [json.loads(body).get("allowed") for _, body in answers[:2]] == [True, False]
    assert answers[1][0]["violations"][0]["rule"] == "network.mode"
    sink.close()
    lines = [line for path in sorted(tmp_path.glob("trail-*.jsonl")) for line in path.read_text().splitlines()]
    records = [json.loads(line) for line in lines]
    assert [r["event_type"] for r in records] == ["request.received", "policy.decision"] * 2
    assert verify_trail(tmp_path).ok


def test_a_batch_whose_records_cannot_be_made_durable_is_refused_whole(tmp_path: Path) -> None:
    """Fail closed: no job of a batch is answered with its decision unless the batch's records are durable."""
    gateway, sink = _batch_gateway(tmp_path, _CountingIO(fail_fsync=True))
    batch = [_job(1, b'{"code": "print(1)"}'), _job(2, b'{"code": 1}')]
    sent: list[bytes] = []
    decisions.decide_batch(gateway, sink, batch, sent.append)
    answers = _answers(b"".join(sent))
    assert [(h["job"], h["status"]) for h, _ in answers] == [(1, 503), (2, 503)]
    assert {json.loads(body)["code"] for _, body in answers} == {"audit.unavailable"}
    with pytest.raises(AuditUnavailableError):  # the trail failed: it refuses everything after, its close too
        sink.close()


def test_a_policy_set_in_a_batch_applies_to_the_jobs_after_it(tmp_path: Path) -> None:
    gateway, sink = _batch_gateway(tmp_path, _CountingIO())
    tight = load_policy(default_policy_path())
    allowed = gateway.policies.default.policy
    bad = b'{"code": "print(1)", "limits": {"timeout_s": 25}}'
    tight = dataclasses.replace(tight, name="tight")
    batch = [_job(1, bad), ("policies", tight, {}), _job(2, bad)]
    sent: list[bytes] = []
    decisions.decide_batch(gateway, sink, batch, sent.append)
    answers = _answers(b"".join(sent))
    names = [json.loads(body)["decision"]["policy"]["name"] for _, body in answers]
    assert names == [allowed.name, "tight"]
    sink.close()


def test_a_batch_that_takes_too_long_answers_what_it_decided_so_far(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no time at all for a batch (BATCH_S 0), each job is made durable and answered before the next one
    is decided."""
    monkeypatch.setattr(decisions, "BATCH_S", 0.0)
    io = _CountingIO()
    gateway, sink = _batch_gateway(tmp_path, io)
    sent: list[bytes] = []

    def send(frames: bytes) -> None:
        sent.append(frames)
        assert io.fsyncs == len(sent)  # each answer only after its own records' fsync

    decisions.decide_batch(gateway, sink, [_job(n, b'{"code": "print(1)"}') for n in (1, 2, 3)], send)
    assert [[h["job"] for h, _ in _answers(frames)] for frames in sent] == [[1], [2], [3]]
    sink.close()


def test_the_answers_decided_so_far_go_out_before_a_job_expected_to_be_dear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job whose principal's dry runs cost more than BATCH_S (the service's estimate, in the job) is decided
    only once the answers before it are durable and sent: a hostile body never holds back another's answer."""
    monkeypatch.setattr(decisions, "BATCH_S", 0.5)
    gateway, sink = _batch_gateway(tmp_path, _CountingIO())
    sent: list[bytes] = []
    cheap = b'{"code": "print(1)"}'
    batch = [_job(1, cheap, 0.0), _job(2, cheap, 1000.0), _job(3, cheap, 0.0)]
    decisions.decide_batch(gateway, sink, batch, sent.append)
    assert [[h["job"] for h, _ in _answers(frames)] for frames in sent] == [[1], [2, 3]]
    sink.close()


def test_jobs_are_read_in_batches_of_the_whole_frames_that_have_arrived() -> None:
    read_fd, write_fd = os.pipe()
    try:
        frames = [decisions._frame(("decide", n, b"{}", "a", "t", 1.0)) for n in range(1, 4)]
        os.write(write_fd, b"".join(frames) + frames[0][:7])  # three whole frames and the start of a fourth
        jobs = decisions._Jobs(read_fd)
        assert [m[1] for m in jobs.batch() or []] == [1, 2, 3]
        os.write(write_fd, frames[0][7:])
        assert [m[1] for m in jobs.batch() or []] == [1]
        many = b"".join(decisions._frame(("decide", n, b"{}", "a", "t", 1.0)) for n in range(decisions.BATCH + 2))
        os.write(write_fd, many)
        assert len(jobs.batch() or []) == decisions.BATCH
        assert len(jobs.batch() or []) == 2
        os.close(write_fd)
        write_fd = -1
        assert jobs.batch() is None
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


def test_a_share_counts_dry_runs_in_flight_against_their_expected_cost() -> None:
    share = decisions._Share()
    share.cost_ms = decisions.SHARE_MS / 2  # each dry run expected to cost half the share
    first, second = share.grant(0.0), share.grant(0.0)
    assert not share.fits()  # no room: a third waits
    share.give_back(first)
    assert share.fits()
    share.give_back(second)
    assert (share.in_flight, share.in_flight_ms) == (0, 0.0)
    share.learn(10 * decisions.SHARE_MS, share.cost_ms, 0.0)  # one dear dry run closes the share to one at a time...
    assert share.cost_ms > decisions.SHARE_MS
    assert share.fits()  # ...which still gets one on the workers
    held = share.grant(0.0)
    assert not share.fits()
    for _ in range(3):
        share.learn(1.0, 1.0, 0.0)  # a few cheap ones do not open it again
    assert share.cost_ms > decisions.SHARE_MS
    share.give_back(held)
    assert share.fits()


def test_a_principals_first_dry_runs_are_expected_dear_until_one_is_timed() -> None:
    share = decisions._Share()
    assert share.cost_ms > decisions.WORKER_MS  # an idle worker of its own...
    first = share.grant(0.0)
    assert not share.fits()  # ...and one at a time: new principals cannot take every worker
    share.give_back(first)
    share.learn(1.5, first, 0.0)
    assert share.cost_ms == 1.5  # the first timing replaces the guess: a cheap principal is held back once
    share.learn(101.5, 1.5, 0.0)
    assert share.cost_ms == 0.8 * 1.5 + 0.2 * 101.5  # then a moving average


def test_a_share_counts_what_it_used_lately_at_the_cost_sent_then_at_the_cost_measured() -> None:
    share = decisions._Share()
    share.cost_ms = 10.0
    cost = share.grant(100.0)
    assert share.used_ms(100.0) == 10.0  # sent: counted at its expected cost
    share.learn(30.0, cost, 100.0)  # it took 30 ms
    assert share.used_ms(100.0) == 30.0
    assert share.used_ms(100.0 + decisions.USED_HALF_LIFE_S) == 15.0  # forgotten by half every half-life
    share.learn(0.0, 1000.0, 100.0)  # never below nothing
    assert share.used_ms(100.0) == 0.0


def test_a_dry_run_sent_as_its_client_leaves_gives_its_room_back(tmp_path: Path) -> None:
    gateway = _gateway(tmp_path / "audit")

    async def scenario() -> None:
        workers = DecisionWorkers(gateway, None, 0)  # no worker: dry runs are sent to be decided in process
        share = workers._shares[CALLER.principal] = decisions._Share()
        share.cost_ms = decisions.SHARE_MS
        held = share.grant(time.monotonic())  # the share is full
        waiting = asyncio.ensure_future(workers.decide(b'{"code": "print(1)"}', CALLER))
        await asyncio.sleep(0)
        assert len(share.waiting) == 1
        share.give_back(held)
        workers._dispatch()  # sent...
        assert not share.waiting
        assert share.in_flight == 1
        waiting.cancel()  # ...and cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert (share.in_flight, share.in_flight_ms) == (0, 0.0)

    try:
        asyncio.run(scenario())
    finally:
        gateway.close()


HEAVY = json.dumps({"code": "print(1)", "env": {f"V{i}": "v" * 100 for i in range(20000)}}).encode()
"""A body the request schema refuses only after checking each of its 20,000 entries: ~300 ms of a worker."""


def _answer_order(tmp_path: Path, heavies: list[Caller], dear_each: int) -> list[str]:
    """One worker: each principal of ``heavies`` has a dear dry run timed (its cost is known), then sends
    ``dear_each`` at once, then another principal sends one cheap dry run: the order they were answered in."""
    gateway = _gateway(tmp_path / "audit")
    light = Caller("light", "gw_id_l")

    async def scenario() -> list[str]:
        workers = DecisionWorkers(gateway, FakeRunner, 1)
        await workers.start()
        try:
            await _ready(workers, 1)
            for heavy in heavies:
                assert (await workers.decide(HEAVY, heavy)).status == 422
            order: list[str] = []

            async def one(name: str, body: bytes, caller: Caller) -> None:
                answer = await workers.decide(body, caller)
                assert answer.status == (200 if caller is light else 422)
                order.append(name)

            tasks = [
                asyncio.ensure_future(one(f"{h.principal}.{n}", HEAVY, h)) for n in range(dear_each) for h in heavies
            ]
            await asyncio.sleep(0.05)
            tasks.append(asyncio.ensure_future(one("light", b'{"code": "print(1)"}', light)))
            await asyncio.gather(*tasks)
            return order
        finally:
            await workers.close()

    try:
        return asyncio.run(scenario())
    finally:
        gateway.close()


def test_a_principal_sending_dear_dry_runs_does_not_hold_back_another_ones(tmp_path: Path) -> None:
    """One worker; a principal whose dry runs each cost a worker hundreds of ms sends five at once, then another
    principal sends one cheap dry run: it is answered before most of the dear ones (first come, first served on
    the worker, it was answered last)."""
    order = _answer_order(tmp_path, [Caller("heavy", "gw_id_h")], 5)
    assert order.index("light") <= 2, order


def test_principals_sending_dear_dry_runs_together_do_not_hold_back_another_ones(tmp_path: Path) -> None:
    """One worker; three principals whose dry runs each cost it hundreds of ms send two each at once (their
    shares let one each on the worker), then another principal sends one cheap dry run: it is answered right
    after the dear one the worker holds, not after one of each of the three (they wait in the service, and the
    next dry run sent is the one of the principal that used the workers least lately)."""
    order = _answer_order(tmp_path, [Caller(f"heavy{n}", f"gw_id_h{n}") for n in range(3)], 2)
    assert order.index("light") <= 1, order


def test_a_dry_run_abandoned_by_its_client_holds_its_share_until_it_leaves_the_worker(tmp_path: Path) -> None:
    """A client that leaves does not free its principal's share while the worker still decides its dry run:
    else sending dear bodies and hanging up would get round the share."""
    gateway = _gateway(tmp_path / "audit")

    async def scenario() -> None:
        workers = DecisionWorkers(gateway, FakeRunner, 1)
        await workers.start()
        try:
            await _ready(workers, 1)
            (worker,) = workers._workers
            task = asyncio.ensure_future(workers.decide(HEAVY, CALLER))
            while not worker.jobs:
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            share = workers._shares[CALLER.principal]
            assert share.in_flight == 1  # still on the worker
            deadline = time.monotonic() + 60
            while share.in_flight:
                assert time.monotonic() < deadline, "the abandoned dry run never left the worker"
                await asyncio.sleep(0.01)
            assert not worker.jobs
            assert share.timed  # its cost was learnt all the same
            assert share.cost_ms > 3 * decisions.WORKER_MS
        finally:
            await workers.close()

    try:
        asyncio.run(scenario())
    finally:
        gateway.close()

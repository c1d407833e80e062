"""The decision workers with real worker processes and the fake runner (no engine): the answer a worker renders
is the in-process answer, and a job in flight on a worker that dies is a 503, never a hang."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from audit_support import CountingIO

from gateway import Caller, Gateway, PolicySet
from gateway._workers import Frames
from gateway.audit import AuditReceipt, JsonlAuditTrail, MemoryAuditSink, verify_trail
from gateway.audit.batched import BatchedAuditSink
from gateway.errors import AuditUnavailableError, AuthenticationError, DecisionWorkerError, http_status_for
from gateway.policy import load_policy
from gateway.resources import default_policy_path
from gateway.runner.fake import FakeRunner
from gateway.service.decision_worker import BATCH, JobReader, RenderedAnswer, decide_batch, job_frame, render_answer
from gateway.service.decisions import DecisionWorkers
from gateway.service.shares import SHARE_MS, Share

CALLER = Caller("alice", "gw_id_test")


def _gateway(directory: Path) -> Gateway:
    return Gateway(load_policy(default_policy_path()), runner=FakeRunner(), audit=JsonlAuditTrail(directory))


def _first_job_error(
    gateway: Gateway, worker_code: str, *, then_in_process: bool = False, timeout_s: float = 30.0
) -> DecisionWorkerError | None:
    """Start one worker running ``worker_code``, send it one job: the error that job ended with, if any;
    ``then_in_process``: a second job must then be decided (in process, while it is replaced)."""

    async def scenario() -> DecisionWorkerError | None:
        workers = DecisionWorkers(gateway, FakeRunner, 1, worker_code=worker_code, timeout_s=timeout_s)
        await workers.start()
        try:
            assert await workers.wait_ready(1, timeout_s=60)
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

    async def scenario() -> tuple[RenderedAnswer, RenderedAnswer, RenderedAnswer]:
        workers = DecisionWorkers(gateway, FakeRunner, 1)
        await workers.start()
        try:
            assert await workers.wait_ready(1, timeout_s=60)
            allowed = await workers.decide(b'{"code": "print(1)"}', CALLER)
            denied = await workers.decide(b'{"code": "print(1)", "network": "bridge"}', CALLER)
            invalid = await workers.decide(b'{"code": 1}', CALLER)
        finally:
            await workers.close()
        return allowed, denied, invalid

    allowed, denied, invalid = asyncio.run(scenario())
    local = render_answer(gateway.decide(b'{"code": "print(1)"}', caller=CALLER))
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
from gateway.service.decision_worker import answer_frame, JobReader
out, jobs = os.fdopen(os.dup(1), "wb"), JobReader(0)
jobs.batch()
out.write(answer_frame({"kind": "ready", "pid": os.getpid()})); out.flush()
jobs.batch()
"""
"""A fake worker's start: it reads the init frame, says it is ready and reads its first job (what follows says
what it does with it)."""

_DIES_ON_FIRST_JOB = _READY_THEN_FIRST_JOB + "os._exit(3)\n"


def test_a_job_in_flight_on_a_dying_worker_is_a_503(tmp_path: Path) -> None:
    error = _first_job_error(_gateway(tmp_path / "audit"), _DIES_ON_FIRST_JOB, then_in_process=True)
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
    error = _first_job_error(_gateway(tmp_path / "audit"), _ANSWERS_WITH_A_PICKLE)
    assert isinstance(error, DecisionWorkerError)
    assert not planted.exists()


_WRITES_TEXT = (
    _READY_THEN_FIRST_JOB
    + 'out.write(b"Traceback (most recent call last):\\n"); out.flush()\nsys.stdin.buffer.read()\n'
)


def test_a_worker_that_writes_what_is_not_a_frame_is_killed_and_its_job_is_a_503(tmp_path: Path) -> None:
    """Text in the answer pipe (a library writing to the real stdout) reads as a length of hundreds of MiB: it is
    not waited for, the worker is killed and its job answered 503 at once."""
    error = _first_job_error(_gateway(tmp_path / "audit"), _WRITES_TEXT, then_in_process=True)
    assert isinstance(error, DecisionWorkerError)
    assert "ended while deciding" in error.message


_NEVER_ANSWERS = _READY_THEN_FIRST_JOB + "import time\ntime.sleep(3600)\n"


def test_a_worker_that_never_answers_is_a_503_and_is_killed(tmp_path: Path) -> None:
    error = _first_job_error(_gateway(tmp_path / "audit"), _NEVER_ANSWERS, then_in_process=True, timeout_s=1.0)
    assert isinstance(error, DecisionWorkerError)
    assert "did not answer within 1 s" in error.message


def _answers(frames: bytes) -> list[tuple[dict[str, Any], bytes]]:
    """The answer frames a worker wrote, as (header, body)."""
    reader, answers = Frames(), []
    reader.feed(frames)
    while (payload := reader.pop()) is not None:
        head, _, body = payload.partition(b"\n")
        answers.append((json.loads(head), body))
    assert not reader.held, "a partial frame"
    return answers


def _batch_gateway(directory: Path, io: CountingIO) -> tuple[Gateway, BatchedAuditSink]:
    records = BatchedAuditSink(JsonlAuditTrail(directory, io=io))
    policy = load_policy(default_policy_path())
    return Gateway(policy, runner=FakeRunner(), audit=records), records


def _job(number: int, body: bytes, expected_ms: float = 1.0) -> tuple[str, int, bytes, str, str, float]:
    return ("decide", number, body, CALLER.principal, CALLER.token_id, expected_ms)


def _still() -> float:
    """A clock that does not move: however slow this machine is, a batch takes no time."""
    return 0.0


def test_a_batch_is_answered_in_order_after_one_write_and_one_fsync_covering_its_records(tmp_path: Path) -> None:
    """A batch's records go to the trail in one turn (one hold of its lock: the other writers wait once per
    batch), then one fsync, then the answers."""
    io = CountingIO()
    gateway, sink = _batch_gateway(tmp_path, io)
    batch = [_job(1, b'{"code": "print(1)"}'), _job(2, b'{"code": "print(1)", "network": "bridge"}'), _job(3, b"{")]
    sent: list[bytes] = []
    decide_batch(gateway, sink, batch, sent.append, clock=_still)
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
    gateway, sink = _batch_gateway(tmp_path, CountingIO(fail_fsync=True))
    batch = [_job(1, b'{"code": "print(1)"}'), _job(2, b'{"code": 1}')]
    sent: list[bytes] = []
    decide_batch(gateway, sink, batch, sent.append, clock=_still)
    answers = _answers(b"".join(sent))
    assert [(h["job"], h["status"]) for h, _ in answers] == [(1, 503), (2, 503)]
    assert {json.loads(body)["code"] for _, body in answers} == {"audit.unavailable"}
    with pytest.raises(AuditUnavailableError):  # the trail failed: it refuses everything after, its close too
        sink.close()


def test_a_policy_set_in_a_batch_applies_to_the_jobs_after_it(tmp_path: Path) -> None:
    gateway, sink = _batch_gateway(tmp_path, CountingIO())
    tight = load_policy(default_policy_path())
    allowed = gateway.policies.default.policy
    bad = b'{"code": "print(1)", "limits": {"timeout_s": 25}}'
    tight = dataclasses.replace(tight, name="tight")
    batch: list[Any] = [_job(1, bad), ("policies", tight, {}, False), _job(2, bad)]
    sent: list[bytes] = []
    decide_batch(gateway, sink, batch, sent.append, clock=_still)
    answers = _answers(b"".join(sent))
    names = [json.loads(body)["decision"]["policy"]["name"] for _, body in answers]
    assert names == [allowed.name, "tight"]
    sink.close()


def test_a_batch_that_takes_too_long_answers_what_it_decided_so_far(tmp_path: Path) -> None:
    """With no time at all for a batch (``batch_s`` 0), each job is made durable and answered before the next
    one is decided."""
    io = CountingIO()
    gateway, sink = _batch_gateway(tmp_path, io)
    sent: list[bytes] = []

    def send(frames: bytes) -> None:
        sent.append(frames)
        assert io.fsyncs == len(sent)  # each answer only after its own records' fsync

    batch = [_job(n, b'{"code": "print(1)"}') for n in (1, 2, 3)]
    decide_batch(gateway, sink, batch, send, batch_s=0.0, clock=_still)
    assert [[h["job"] for h, _ in _answers(frames)] for frames in sent] == [[1], [2], [3]]
    sink.close()


def test_the_answers_decided_so_far_go_out_before_a_job_expected_to_be_expensive(tmp_path: Path) -> None:
    """A job whose principal's dry runs cost more than ``batch_s`` (the service's estimate, in the job) is
    decided only once the answers before it are durable and sent: a hostile body never holds back another's
    answer."""
    gateway, sink = _batch_gateway(tmp_path, CountingIO())
    sent: list[bytes] = []
    cheap = b'{"code": "print(1)"}'
    batch = [_job(1, cheap, 0.0), _job(2, cheap, 1000.0), _job(3, cheap, 0.0)]
    decide_batch(gateway, sink, batch, sent.append, batch_s=0.5, clock=_still)
    assert [[h["job"] for h, _ in _answers(frames)] for frames in sent] == [[1], [2, 3]]
    sink.close()


def test_jobs_are_read_in_batches_of_the_whole_frames_that_have_arrived() -> None:
    read_fd, write_fd = os.pipe()
    try:
        frames = [job_frame(("decide", n, b"{}", "a", "t", 1.0)) for n in range(1, 4)]
        os.write(write_fd, b"".join(frames) + frames[0][:7])  # three whole frames and the start of a fourth
        jobs = JobReader(read_fd)
        assert [m[1] for m in jobs.batch() or []] == [1, 2, 3]
        os.write(write_fd, frames[0][7:])
        assert [m[1] for m in jobs.batch() or []] == [1]
        many = b"".join(job_frame(("decide", n, b"{}", "a", "t", 1.0)) for n in range(BATCH + 2))
        os.write(write_fd, many)
        assert len(jobs.batch() or []) == BATCH
        assert len(jobs.batch() or []) == 2
        os.close(write_fd)
        write_fd = -1
        assert jobs.batch() is None
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)


def test_a_dry_run_sent_as_its_client_leaves_gives_its_room_back(tmp_path: Path) -> None:
    gateway = _gateway(tmp_path / "audit")

    async def scenario() -> None:
        workers = DecisionWorkers(gateway, None, 0, clock=_still)  # no worker: dry runs go in process
        workers._shares[CALLER.principal] = Share(cost_ms=SHARE_MS).granted(0.0)  # the share is full
        waiting = asyncio.ensure_future(workers.decide(b'{"code": "print(1)"}', CALLER))
        await asyncio.sleep(0)
        assert len(workers._waiting[CALLER.principal]) == 1
        workers._shares[CALLER.principal] = workers._shares[CALLER.principal].given_back(SHARE_MS)
        workers._dispatch()  # sent...
        assert not workers._waiting[CALLER.principal]
        assert workers._shares[CALLER.principal].in_flight == 1
        waiting.cancel()  # ...and cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiting
        share = workers._shares[CALLER.principal]
        assert (share.in_flight, share.in_flight_ms) == (0, 0.0)

    try:
        asyncio.run(scenario())
    finally:
        gateway.close()


# --- issue 28, H1: a dry run is decided only for a caller that still exists ------------------------------------

BODY = b'{"code": "print(1)"}'


def _strict_gateway(directory: Path) -> Gateway:
    """The service's kind of Gateway: a strict set that serves ``alice`` alone (under the default policy's
    document, so that "decided under the default" would show as success)."""
    policy = load_policy(default_policy_path())
    return Gateway(
        PolicySet.of(policy, {"alice": policy}, strict=True), runner=FakeRunner(), audit=JsonlAuditTrail(directory)
    )


def _records(directory: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for path in sorted(directory.glob("trail-*.jsonl")) for line in path.read_text().splitlines()
    ]


def test_a_worker_refuses_a_principal_its_policy_set_does_not_serve(tmp_path: Path) -> None:
    """The worker's set is as strict as the service's: a job of a principal it does not list (a reload removed
    it while the job was on its way, or added it and the worker has not heard yet) is refused 401, never decided
    under the default policy."""
    gateway = _strict_gateway(tmp_path / "audit")

    async def scenario() -> RenderedAnswer:
        workers = DecisionWorkers(gateway, FakeRunner, 1)
        await workers.start()
        try:
            assert await workers.wait_ready(1, timeout_s=60)
            return await workers.decide(BODY, Caller("mallory", "gw_id_gone"))
        finally:
            await workers.close()

    answer = asyncio.run(scenario())
    gateway.close()
    assert answer.status == 401, answer.content
    assert json.loads(answer.content)["code"] == "auth.failed"
    records = _records(tmp_path / "audit")
    assert [r for r in records if r["event_type"] == "policy.decision"] == []
    (refused,) = [r for r in records if r["event_type"] == "request.refused"]
    assert refused["principal"] == "mallory"
    assert refused["gateway"]["pid"] != os.getpid()  # the worker's record: it was the worker that refused


def test_a_policy_set_sent_to_a_worker_stays_strict(tmp_path: Path) -> None:
    """A reload's set reaches the workers strict too: after it, a principal it no longer lists is refused."""
    gateway, sink = _batch_gateway(tmp_path, CountingIO())
    policy = load_policy(default_policy_path())
    sent: list[bytes] = []
    reloaded = ("policies", policy, {"bob": policy}, True)  # what DecisionWorkers.policies_changed sends
    decide_batch(gateway, sink, [reloaded, _job(1, BODY)], sent.append, clock=_still)
    ((header, body),) = _answers(b"".join(sent))
    assert header["status"] == 401, body
    assert json.loads(body)["code"] == "auth.failed"
    sink.close()


class _HeldSink(MemoryAuditSink):
    """Holds the first ``request.received`` until :attr:`release` is set (a dry run being decided)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def append(self, event_type: str, data: Mapping[str, Any], **extra: Any) -> AuditReceipt:
        if event_type == "request.received" and not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(60), "never released"
        return super().append(event_type, data, **extra)


def test_a_dry_run_whose_caller_was_revoked_while_it_waited_for_its_turn_is_refused() -> None:
    """The caller is checked again when its job's turn comes (Service.refusal_of): a revocation while it waited
    behind its principal's share refuses it, nothing decided."""
    sink = _HeldSink()
    policy = load_policy(default_policy_path())
    gateway = Gateway(PolicySet.of(policy, {"alice": policy}, strict=True), runner=FakeRunner(), audit=sink)
    revoked: set[str | None] = set()

    def refusal(principal: str, token_id: str | None) -> AuthenticationError | None:
        return AuthenticationError(f"{principal} revoked") if token_id in revoked else None

    async def scenario() -> tuple[RenderedAnswer, BaseException | RenderedAnswer]:
        workers = DecisionWorkers(gateway, None, 0, clock=_still, refusal=refusal)
        first = asyncio.ensure_future(workers.decide(BODY, CALLER))  # in process, held at its first record
        assert await asyncio.to_thread(sink.entered.wait, 60)
        second = asyncio.ensure_future(workers.decide(BODY, CALLER))  # waits: its share holds the first
        await asyncio.sleep(0)
        assert not second.done()
        revoked.add(CALLER.token_id)
        sink.release.set()
        answers = await asyncio.gather(first, second, return_exceptions=True)
        assert not isinstance(answers[0], BaseException)
        share = workers._shares[CALLER.principal]
        assert (share.in_flight, share.in_flight_ms) == (0, 0.0)  # the refused one gave its room back
        return answers[0], answers[1]

    first, second = asyncio.run(scenario())
    assert first.status == 200  # decided before the revocation
    assert isinstance(second, AuthenticationError), second
    assert [r["event_type"] for r in sink.records].count("policy.decision") == 1

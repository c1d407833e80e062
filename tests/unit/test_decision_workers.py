"""The decision workers with real worker processes and the fake runner (no engine): the answer a worker renders
is the in-process answer, and a job in flight on a worker that dies is a 503, never a hang."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from gateway import Caller, Gateway
from gateway.audit import JsonlAuditTrail
from gateway.errors import DecisionWorkerError, http_status_for
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
from gateway.service.decisions import _answer_frame, _read_frame
out = os.fdopen(os.dup(1), "wb")
_read_frame(sys.stdin.buffer)
out.write(_answer_frame({"kind": "ready", "pid": os.getpid()})); out.flush()
_read_frame(sys.stdin.buffer)
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

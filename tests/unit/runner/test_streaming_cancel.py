"""Streaming output and cancellation without an engine: the frame accounting, the read loop's cancel check,
the Gateway's plumbing (with the FakeRunner) and the CLI's live output. Containment is tested on the real
engine in ``tests/integration/test_streaming.py``."""

from __future__ import annotations

import json
import threading
from typing import Any, ClassVar

import pytest

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.cli import main, run_cmd
from gateway.errors import CancelledRunError, OutputCallbackError, exit_code_for, http_status_for
from gateway.policy import load_policy
from gateway.resources import default_policy_path
from gateway.result import ExecutionResult
from gateway.runner.docker.collect import read_frames
from gateway.runner.fake import FakeRunner, make_outcome
from gateway.runner.frames import CANCEL_POLL_S, FRAME_STDERR, FRAME_STDOUT, Collected, FrameDecoder, take_frame
from gateway.runner.interface import RunSpec

SPEC = RunSpec({"image": "img"}, timeout_s=5, output_bytes=10)


class Chunks:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    def __call__(self, stream: str, data: bytes) -> None:
        self.calls.append((stream, data))


def audited_outcome(sink: MemoryAuditSink) -> dict[str, Any]:
    (record,) = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    data: dict[str, Any] = record["data"]
    return data


# -- frame accounting ----------------------------------------------------------------------------------


def test_the_callback_gets_only_the_bytes_kept_under_the_cap() -> None:
    got, chunks = Collected(), Chunks()
    assert not take_frame(FRAME_STDOUT, b"abcd", got, SPEC, chunks)
    assert not take_frame(FRAME_STDERR, b"E", got, SPEC, chunks)
    assert take_frame(FRAME_STDOUT, b"efghijklmnop", got, SPEC, chunks)  # crosses the cap of 10: kill
    assert chunks.calls == [("stdout", b"abcd"), ("stderr", b"E"), ("stdout", b"efghij")]
    assert bytes(got.stdout.kept) == b"abcdefghij"
    assert got.output_limit_killed
    assert got.stdout.truncated
    assert got.stdout.seen == 16
    # Past the cap nothing more is handed over (the runner stops reading anyway).
    take_frame(FRAME_STDOUT, b"more", got, SPEC, chunks)
    assert len(chunks.calls) == 3


def test_a_raising_callback_stops_the_run_and_keeps_what_it_was_handed() -> None:
    got = Collected()

    def broken(stream: str, data: bytes) -> None:
        raise BrokenPipeError("client gone")

    assert take_frame(FRAME_STDOUT, b"abc", got, SPEC, broken)  # True: the container must be killed
    assert isinstance(got.callback_error, BrokenPipeError)
    assert bytes(got.stdout.kept) == b"abc"
    assert not got.output_limit_killed


def _still() -> float:
    """A clock that does not move: however slow this machine is, no time passes between two reads."""
    return 0.0


class _BlockedSocket:
    """An attach socket on which nothing arrives: every read times out after its timeout."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def settimeout(self, t: float) -> None:
        self.timeouts.append(t)

    def recv(self, n: int) -> bytes:
        raise TimeoutError


def test_read_frames_stops_when_cancelled_and_polls_with_a_bounded_timeout() -> None:
    got, cancel = Collected(), threading.Event()

    class Cancelling(_BlockedSocket):
        def recv(self, n: int) -> bytes:
            if len(self.timeouts) == 3:
                cancel.set()  # set "from elsewhere" while a read is waiting
            raise TimeoutError

    sock = Cancelling()
    assert read_frames(sock, FrameDecoder(b"k" * 32), got, SPEC, 60.0, cancel=cancel, clock=_still)
    assert got.cancelled
    assert not got.timed_out
    assert len(sock.timeouts) == 3
    assert all(t <= CANCEL_POLL_S for t in sock.timeouts)


def test_read_frames_without_cancel_waits_up_to_the_deadline_as_before() -> None:
    sock = _BlockedSocket()
    with pytest.raises(TimeoutError):  # the runner maps it to timed_out, as it always did
        read_frames(sock, FrameDecoder(b"k" * 32), Collected(), SPEC, 30.0, clock=_still)
    assert sock.timeouts == [30.0]


def test_a_cancel_set_before_reading_stops_at_once() -> None:
    cancel = threading.Event()
    cancel.set()
    sock, got = _BlockedSocket(), Collected()
    assert read_frames(sock, FrameDecoder(b"k" * 32), got, SPEC, 30.0, cancel=cancel, clock=_still)
    assert got.cancelled
    assert sock.timeouts == []


def test_the_new_errors_are_in_the_one_table() -> None:
    assert (CancelledRunError.code, exit_code_for(CancelledRunError), http_status_for(CancelledRunError)) == (
        "gateway.cancelled", 125, 499,
    )  # fmt: skip
    assert (OutputCallbackError.code, exit_code_for(OutputCallbackError), http_status_for(OutputCallbackError)) == (
        "gateway.output_callback", 125, 500,
    )  # fmt: skip


# -- the Gateway's plumbing ----------------------------------------------------------------------------


def make_gateway(runner: FakeRunner) -> tuple[Gateway, MemoryAuditSink]:
    sink = MemoryAuditSink()
    return Gateway(load_policy(default_policy_path()), runner=runner, audit=sink), sink


def test_gateway_hands_the_callback_to_the_runner_and_the_chunks_are_the_result() -> None:
    runner = FakeRunner(outcome=make_outcome(stdout=b"out\n", stderr=b"err\n"))
    gw, _ = make_gateway(runner)
    chunks = Chunks()
    result = gw.execute({"code": "x"}, on_output=chunks)
    assert result.error is None
    assert result.exit_status == 0
    assert chunks.calls == [("stdout", b"out\n"), ("stderr", b"err\n")]
    assert result.outcome is not None
    assert (result.outcome.stdout, result.outcome.stderr) == (b"out\n", b"err\n")


def test_a_raising_callback_is_an_audited_error_and_no_sandbox_is_left() -> None:
    runner = FakeRunner(outcome=make_outcome(stdout=b"out\n", stderr=b"err\n"))
    gw, sink = make_gateway(runner)

    def broken(stream: str, data: bytes) -> None:
        raise ConnectionResetError("peer reset")

    result = gw.execute({"code": "x"}, on_output=broken)
    assert result.error is not None
    assert result.error.code == "gateway.output_callback"
    assert isinstance(result.error.__cause__, ConnectionResetError)
    assert result.exit_status == 125
    assert result.outcome is not None
    assert result.outcome.stdout == b"out\n"
    assert result.outcome.exit_code is None
    assert runner.live == set()
    assert audited_outcome(sink)["error"]["code"] == "gateway.output_callback"


def test_cancel_before_the_run_runs_nothing_and_is_audited() -> None:
    runner = FakeRunner()
    gw, sink = make_gateway(runner)
    cancel = threading.Event()
    cancel.set()
    result = gw.execute({"code": "print(2+2)"}, cancel=cancel)
    assert result.error is not None
    assert result.error.code == "gateway.cancelled"
    assert result.outcome is None
    assert result.exit_status == 125
    assert runner.prepared == []
    assert runner.calls == []
    assert audited_outcome(sink)["error"]["code"] == "gateway.cancelled"


def test_cancel_during_the_run_ends_it_with_the_output_so_far() -> None:
    runner = FakeRunner(outcome=make_outcome(stdout=b"out\n", stderr=b"err\n"))
    gw, sink = make_gateway(runner)
    cancel = threading.Event()
    chunks = Chunks()

    def disconnect_after_first(stream: str, data: bytes) -> None:
        chunks(stream, data)
        cancel.set()

    result = gw.execute({"code": "x"}, on_output=disconnect_after_first, cancel=cancel)
    assert result.error is not None
    assert result.error.code == "gateway.cancelled"
    assert chunks.calls == [("stdout", b"out\n")]
    assert result.outcome is not None
    assert (result.outcome.stdout, result.outcome.stderr) == (b"out\n", b"")
    assert runner.live == set()
    audited = audited_outcome(sink)
    assert audited["error"]["code"] == "gateway.cancelled"
    assert audited["exit_code"] is None


# -- the CLI -------------------------------------------------------------------------------------------


class _Recording:
    """Stands in for ``Gateway`` in the CLI: a real Gateway on a FakeRunner, recording what it was handed."""

    handed: ClassVar[list[Any]] = []

    @classmethod
    def from_env(cls, policy: Any, audit_dir: Any, *, runner: Any = None) -> Gateway:  # as Gateway.from_env
        fake = FakeRunner(outcome=make_outcome(stdout="héllo\n".encode(), stderr=b"warn\n"))
        gw = Gateway(load_policy(default_policy_path()), runner=fake, audit=MemoryAuditSink())
        execute = gw.execute

        def recording(request: Any, **kw: Any) -> Any:
            cls.handed.append(kw.get("on_output"))
            return execute(request, **kw)

        gw.execute = recording  # type: ignore[method-assign]
        return gw


@pytest.fixture
def fake_gateway(monkeypatch: pytest.MonkeyPatch) -> type[_Recording]:
    _Recording.handed = []
    monkeypatch.setattr(run_cmd, "Gateway", _Recording)
    return _Recording


def test_cli_run_writes_output_live_and_once(
    fake_gateway: type[_Recording], capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["run", "--code", "x"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert out == "héllo\n"  # streamed, and not printed again at the end
    assert err.count("warn\n") == 1
    assert isinstance(fake_gateway.handed[0], run_cmd._LiveOutput)


def test_cli_live_output_decodes_characters_split_across_chunks(capsys: pytest.CaptureFixture[str]) -> None:
    live = run_cmd._LiveOutput()
    data = "é€\n".encode()
    for i in range(len(data)):
        live("stdout", data[i : i + 1])
    live("stderr", b"\xff")
    live.finish(ExecutionResult("r", None, outcome=make_outcome(stdout=data, stderr=b"\xff")))
    out, err = capsys.readouterr()
    assert (out, err) == ("é€\n", "\ufffd")


def test_cli_json_is_one_object_at_the_end(fake_gateway: type[_Recording], capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--json", "--code", "x"])
    out, _ = capsys.readouterr()
    assert rc == 0
    assert fake_gateway.handed == [None]
    assert json.loads(out)["stdout"] == "héllo\n"

"""Streaming output and cancellation on the real engine (runc and gVisor).

What the HTTP service's server-sent events will rely on: output chunks reach the caller while the program
runs, exactly the bytes the result keeps (caps and flood kill unchanged), and a caller who abandons a run (a
client that disconnects) or whose callback fails gets the container killed and removed, audited. Every claim
about containers is checked by asking the engine.
"""

from __future__ import annotations

import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.policy import load_policy
from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import Payload, RunSpec
from tests.conftest import mount_policy

pytestmark = pytest.mark.integration

Options = Callable[..., dict[str, Any]]


class Chunks:
    """An output callback that records every chunk, per stream, in arrival order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []

    def __call__(self, stream: str, data: bytes) -> None:
        self.calls.append((stream, data))

    def joined(self, stream: str) -> bytes:
        return b"".join(data for name, data in self.calls if name == stream)


def execution_outcome(sink: MemoryAuditSink) -> dict[str, Any]:
    (record,) = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    data: dict[str, Any] = record["data"]
    return data


@pytest.fixture
def gateway(engine: Any, runtime: str) -> Iterator[tuple[Gateway, MemoryAuditSink]]:
    """A Gateway on the real engine with the shipped policy for the runtime (strict requires gVisor)."""
    sink = MemoryAuditSink()
    policy = load_policy(policies_dir() / ("strict.yaml" if runtime == "runsc" else "default.yaml"))
    with Gateway(policy, runner=DockerRunner(engine), audit=sink) as gw:
        yield gw, sink


def test_chunks_arrive_while_the_program_runs(engine: Any, runtime: str, shared_dir: Path) -> None:
    # The program prints, then waits for a file that only the output callback creates, then prints again:
    # it can only finish if its first line reached the caller while it was still running.
    sink = MemoryAuditSink()
    go = shared_dir / "go"
    seen_first = threading.Event()
    chunks = Chunks()

    def on_output(stream: str, data: bytes) -> None:
        chunks(stream, data)
        if b"first" in chunks.joined("stdout") and not seen_first.is_set():
            assert not go.exists()
            go.write_text("go")
            seen_first.set()

    code = """
    import os, sys, time
    print("first", flush=True)
    for _ in range(600):
        if os.path.exists("/data/go"):
            break
        time.sleep(0.05)
    else:
        sys.exit(3)
    print("second", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    """
    request = {
        "code": textwrap.dedent(code),
        "runtime": runtime,
        "limits": {"timeout_s": 60},
        "mounts": [{"source": str(shared_dir), "target": "/data", "mode": "ro"}],
    }
    with Gateway(mount_policy(shared_dir), runner=DockerRunner(engine), audit=sink) as gw:
        result = gw.execute(request, on_output=on_output)
    assert result.error is None, result.error
    assert seen_first.is_set()
    assert result.outcome is not None
    assert result.outcome.exit_code == 0, result.outcome.stderr  # 3: the first line never reached us live
    assert result.outcome.stdout == b"first\nsecond\n"
    # The first line was a chunk of its own, delivered before the program wrote the second.
    assert chunks.calls[0] == ("stdout", b"first\n")
    assert chunks.joined("stdout") == result.outcome.stdout
    assert chunks.joined("stderr") == result.outcome.stderr == b"to stderr\n"


def test_streamed_bytes_are_exactly_the_result(runner: DockerRunner, options_for: Options) -> None:
    code = """
    import os, sys
    for i in range(200):
        os.write(1, bytes([i]) * (i * 37 % 1000 + 1))
        os.write(2, b"e%d\\n" % i)
    os.write(1, b"\\xff\\xfe not utf-8 \\xc3")
    """
    chunks = Chunks()
    spec = RunSpec(options_for(), timeout_s=30, output_bytes=1 << 20)
    outcome = runner.execute(spec, Payload(textwrap.dedent(code)), on_output=chunks)
    assert outcome.exit_code == 0, outcome.stderr
    assert {name for name, _ in chunks.calls} == {"stdout", "stderr"}
    assert chunks.joined("stdout") == outcome.stdout
    assert chunks.joined("stderr") == outcome.stderr
    assert outcome.stdout.endswith(b"\xff\xfe not utf-8 \xc3")
    assert len(outcome.stdout) == outcome.stdout_bytes


def test_a_flood_is_truncated_identically_with_and_without_a_callback(
    runner: DockerRunner, options_for: Options
) -> None:
    code = "import os\nwhile True:\n    os.write(1, b'0123456789' * 1000)\n"
    cap = 25_000
    spec = RunSpec(options_for(), timeout_s=30, output_bytes=cap)
    plain = runner.execute(spec, Payload(code))
    chunks = Chunks()
    streamed = runner.execute(spec, Payload(code), on_output=chunks)
    for outcome in (plain, streamed):
        assert outcome.output_limit_killed
        assert outcome.stdout_truncated
        assert outcome.exit_code is None
        assert not outcome.timed_out
        assert outcome.stdout_bytes > cap
    assert streamed.stdout == plain.stdout == (b"0123456789" * 3000)[:cap]
    # Nothing past the cap was ever handed to the callback.
    assert chunks.joined("stdout") == streamed.stdout
    assert all(name == "stdout" for name, _ in chunks.calls)


def test_cancel_kills_and_removes_the_container_and_is_audited(
    engine: Any, gateway: tuple[Gateway, MemoryAuditSink], runtime: str, managed_containers: Callable[[], list[str]]
) -> None:
    gw, sink = gateway
    ready = threading.Event()
    cancel = threading.Event()
    running: list[str] = []

    def on_output(stream: str, data: bytes) -> None:
        running.extend(managed_containers())  # the program is still running: its container is there
        ready.set()

    def disconnect() -> None:  # what the service does when its client goes away: another thread sets it
        if ready.wait(30):
            cancel.set()

    client = threading.Thread(target=disconnect)
    client.start()
    code = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"
    result = gw.execute(
        {"code": code, "runtime": runtime, "limits": {"timeout_s": 20}}, on_output=on_output, cancel=cancel
    )
    client.join()
    assert result.error is not None
    assert result.error.code == "gateway.cancelled"
    assert result.exit_status == 125
    assert result.outcome is not None
    assert result.outcome.stdout == b"ready\n"
    assert result.outcome.exit_code is None
    assert not result.outcome.timed_out
    cid = result.outcome.container_id
    assert cid in running
    assert cid not in managed_containers()
    with pytest.raises(docker.errors.NotFound):
        engine.api.inspect_container(cid)
    audited = execution_outcome(sink)
    assert audited["error"]["code"] == "gateway.cancelled"
    assert audited["container_id"] == cid
    assert audited["exit_code"] is None


def test_a_raising_callback_leaves_no_container(
    engine: Any, gateway: tuple[Gateway, MemoryAuditSink], runtime: str, managed_containers: Callable[[], list[str]]
) -> None:
    gw, sink = gateway

    def on_output(stream: str, data: bytes) -> None:
        raise RuntimeError("the client's socket broke")

    code = "import time\nprint('hello', flush=True)\ntime.sleep(60)\n"
    result = gw.execute({"code": code, "runtime": runtime, "limits": {"timeout_s": 20}}, on_output=on_output)
    assert result.error is not None
    assert result.error.code == "gateway.output_callback"
    assert isinstance(result.error.__cause__, RuntimeError)
    assert "the client's socket broke" in result.error.message
    assert result.outcome is not None
    assert result.outcome.stdout == b"hello\n"  # the chunk the callback was handed is in the result
    assert not result.outcome.timed_out
    cid = result.outcome.container_id
    assert cid is not None
    assert cid not in managed_containers()
    with pytest.raises(docker.errors.NotFound):
        engine.api.inspect_container(cid)
    assert execution_outcome(sink)["error"]["code"] == "gateway.output_callback"

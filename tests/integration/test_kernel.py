"""Kernels against the real engine: one long-lived hardened container per kernel, cells over the frame
protocol, state kept between cells, and every hostile cell leaving the kernel usable or killed and reported
(never half-alive). State, interrupt and kill under runc and gVisor (runsc); the rest under runc."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from gateway.errors import CancelledRunError, OutputCallbackError, SandboxError
from gateway.runner.docker.kernel import DockerKernel
from gateway.runner.docker.options import DEADLINE_LABEL, INSTANCE_LABEL, MANAGED_LABEL
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import CellResult, Kernel, RunSpec
from gateway.slots import HostSlots

pytestmark = pytest.mark.integration

Options = Callable[..., dict[str, Any]]


@pytest.fixture
def open_kernel(runner: DockerRunner) -> Iterator[Callable[..., DockerKernel]]:
    """Opens kernels (lifetime 300 s unless told, 64 KiB output cap, 1 s grace) and closes each at the end."""
    opened: list[DockerKernel] = []

    def make(
        options: dict[str, Any], *, lifetime_s: float = 300, output_bytes: int = 1 << 16, **kw: Any
    ) -> DockerKernel:
        kernel = runner.open_kernel(RunSpec(options, timeout_s=lifetime_s, output_bytes=output_bytes), grace_s=1, **kw)
        opened.append(kernel)
        return kernel

    yield make
    for kernel in opened:
        kernel.close()


def assert_gone(engine: Any, container_id: str | None) -> None:
    assert container_id is not None
    with pytest.raises(docker.errors.NotFound):
        engine.api.inspect_container(container_id)


def usable(kernel: DockerKernel) -> None:
    result = kernel.execute("state", timeout_s=10)
    assert (result.value, result.killed) == ("'kept'", None)


def test_state_imports_and_files_persist_across_cells(
    open_kernel: Callable[..., DockerKernel], options_for: Options
) -> None:
    kernel = open_kernel(options_for())
    assert isinstance(kernel, Kernel)
    first = kernel.execute("import json\nstate = 'kept'\nopen('notes.txt', 'w').write('a')\nprint(2+2)", timeout_s=10)
    assert (first.outcome.exit_code, first.outcome.stdout, first.value, first.killed) == (0, b"4\n", None, None)
    second = kernel.execute("open('out/r.json', 'w').write(json.dumps(open('notes.txt').read()))\nstate", timeout_s=10)
    assert second.value == "'kept'"
    assert dict(second.outcome.files) == {"r.json": b'"a"'}
    assert not second.value_truncated


def test_last_expression_repr_is_bounded(open_kernel: Callable[..., DockerKernel], make_options: Options) -> None:
    kernel = open_kernel(make_options(), output_bytes=1000)
    result = kernel.execute("list(range(10000))", timeout_s=10)
    assert result.value is not None
    assert result.value.startswith("[0, 1, 2,")
    assert len(result.value) == 1000
    assert result.value_truncated


def test_an_exception_is_a_traceback_and_the_kernel_stays_usable(
    open_kernel: Callable[..., DockerKernel], options_for: Options
) -> None:
    kernel = open_kernel(options_for())
    kernel.execute("state = 'kept'", timeout_s=10)
    result = kernel.execute("{}['missing']", timeout_s=10)
    assert result.outcome.exit_code == 1
    assert result.outcome.stderr.startswith(b'Traceback (most recent call last):\n  File "<cell 2>", line 1')
    assert result.outcome.stderr.endswith(b"KeyError: 'missing'\n")
    assert (result.value, result.killed) == (None, None)
    usable(kernel)


def test_a_cell_over_its_deadline_is_interrupted_and_the_kernel_stays_usable(
    open_kernel: Callable[..., DockerKernel], options_for: Options
) -> None:
    kernel = open_kernel(options_for())
    kernel.execute("state = 'kept'", timeout_s=10)
    result = kernel.execute("while True:\n    pass", timeout_s=1)
    assert result.interrupted
    assert result.outcome.timed_out
    assert result.outcome.exit_code is None
    assert result.outcome.stderr.endswith(b"KeyboardInterrupt\n")
    assert result.killed is None
    usable(kernel)


def test_a_cell_ignoring_the_interrupt_gets_the_kernel_killed_and_reported(
    open_kernel: Callable[..., DockerKernel], options_for: Options, engine: Any, tmp_path: Path
) -> None:
    slots = HostSlots(tmp_path / "slots", 1, wait_s=0)
    kernel = open_kernel(options_for(), slot=slots.take())
    assert slots.try_take() is None  # the kernel holds the host's one slot while it lives
    result = kernel.execute(
        "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass", timeout_s=1
    )
    assert result.killed == kernel.killed == "interrupt_ignored"
    assert result.outcome.timed_out
    assert not result.interrupted
    assert_gone(engine, kernel.container_id)
    freed = slots.try_take()
    assert freed is not None  # and frees it once its container is gone
    freed.release()
    with pytest.raises(Exception, match="is gone \\(interrupt_ignored\\); open a new kernel"):
        kernel.execute("1", timeout_s=1)


def test_memory_bomb_kills_the_kernel_and_says_memory(
    open_kernel: Callable[..., DockerKernel], options_for: Options
) -> None:
    # runc: the memory cgroup's OOM killer ends the interpreter and the supervisor says so; gVisor: the whole
    # sandbox goes, and the engine's OOMKilled says why.
    kernel = open_kernel(options_for(mem_limit=128 << 20, memswap_limit=128 << 20))
    result = kernel.execute("hog = []\nwhile True:\n    hog.append(bytearray(1 << 20))", timeout_s=30)
    assert result.killed == "memory"
    assert result.outcome.oom_killed
    assert result.outcome.exit_code == 137


def test_one_large_allocation_is_a_memory_error_and_the_kernel_stays_usable(
    open_kernel: Callable[..., DockerKernel], make_options: Options
) -> None:
    kernel = open_kernel(make_options())
    kernel.execute("state = 'kept'", timeout_s=10)
    result = kernel.execute("bytearray(1 << 40)", timeout_s=30)
    assert result.outcome.stderr.endswith(b"MemoryError\n")
    assert result.killed is None
    usable(kernel)


def test_output_flood_is_cut_at_the_cap_and_interrupted_and_the_kernel_stays_usable(
    open_kernel: Callable[..., DockerKernel], options_for: Options
) -> None:
    kernel = open_kernel(options_for(), output_bytes=4096)
    kernel.execute("state = 'kept'", timeout_s=10)
    streamed: list[bytes] = []

    def keep(stream: str, data: bytes) -> None:
        if stream == "stdout":
            streamed.append(data)

    result = kernel.execute("while True:\n    print('x' * 1000)", timeout_s=60, on_output=keep)
    assert result.outcome.stdout == b"".join(streamed) == (b"x" * 1000 + b"\n") * 4 + b"x" * 92
    assert result.outcome.stdout_truncated
    assert result.outcome.output_limit_killed
    assert result.interrupted
    assert not result.outcome.timed_out  # stopped for its output, long before its deadline
    assert result.killed is None
    usable(kernel)


def test_output_flood_ignoring_the_interrupt_gets_the_kernel_killed(
    open_kernel: Callable[..., DockerKernel], make_options: Options, engine: Any
) -> None:
    kernel = open_kernel(make_options(), output_bytes=4096)
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    print('x' * 1000)"
    result = kernel.execute(code, timeout_s=60)
    assert len(result.outcome.stdout) == 4096
    assert result.killed == "interrupt_ignored"
    assert_gone(engine, kernel.container_id)


def test_fork_bomb_is_held_by_the_pids_limit_and_the_kernel_stays_usable(
    open_kernel: Callable[..., DockerKernel], make_options: Options
) -> None:
    kernel = open_kernel(make_options())
    kernel.execute("state = 'kept'", timeout_s=10)
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = kernel.execute(bomb, timeout_s=2)
    assert result.interrupted  # the kernel's own process came back; the forks died with the cell
    assert result.killed is None
    usable(kernel)
    assert kernel.execute("import subprocess\nsubprocess.run(['true']).returncode", timeout_s=10).value == "0"


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.close(1)",
        "import os\nos.write(4, b'\\xff' * 64)",
        "import os\nos.write(1, b'o\\x00\\x00\\x00\\x01x' + bytes(16))",  # a forged frame is only output
    ],
)
def test_breaking_the_kernels_channels_leaves_it_usable_or_killed_and_reported(
    open_kernel: Callable[..., DockerKernel], make_options: Options, engine: Any, code: str
) -> None:
    kernel = open_kernel(make_options())
    kernel.execute("state = 'kept'", timeout_s=10)
    result = kernel.execute(code, timeout_s=10)
    if result.killed is None:
        usable(kernel)
    else:
        assert result.killed in ("protocol", "exited")
        assert_gone(engine, kernel.container_id)


def test_close_removes_the_container_and_reapers_know_it(
    runner: DockerRunner, open_kernel: Callable[..., DockerKernel], make_options: Options, engine: Any
) -> None:
    kernel = open_kernel(make_options(), lifetime_s=120)
    labels = engine.api.inspect_container(kernel.container_id)["Config"]["Labels"]
    assert labels[MANAGED_LABEL] == "true"
    assert labels[INSTANCE_LABEL] == runner.instance
    assert float(labels[DEADLINE_LABEL]) >= time.time() + 100  # the kernel's lifetime, not one cell's
    kernel.close()
    assert kernel.killed == "closed"
    assert_gone(engine, kernel.container_id)
    kernel.close()  # idempotent


def test_start_up_reap_removes_a_dead_instances_kernel(engine: Any, make_options: Options) -> None:
    other = DockerRunner(engine, instance=f"{os.environ['GATEWAY_INSTANCE']}-dead")
    kernel = other.open_kernel(RunSpec(make_options(), timeout_s=300, output_bytes=1024))
    try:
        found = DockerRunner(engine).reap(expired_only=True, dead=lambda instance: instance == other.instance)
        assert kernel.container_id in found
        assert_gone(engine, kernel.container_id)
        result: CellResult = kernel.execute("1", timeout_s=5)
        assert result.killed == "lost"  # the kernel says it is gone: never half-alive
    finally:
        kernel.close()


def test_a_kernel_that_dies_between_cells_says_so_at_the_next_cell(
    open_kernel: Callable[..., DockerKernel], make_options: Options, engine: Any
) -> None:
    kernel = open_kernel(make_options())
    quit_soon = "import os, threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), os._exit(5))).start()"
    assert kernel.execute(quit_soon, timeout_s=10).killed is None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(engine.api.top(kernel.container_id)["Processes"]) > 1:
        time.sleep(0.1)  # until only the supervisor is left (a bound on the wait, not a pace)
    result = kernel.execute("1", timeout_s=10)
    assert (result.killed, result.outcome.exit_code) == ("exited", 5)
    assert_gone(engine, kernel.container_id)


def test_the_kernels_lifetime_ends_it(open_kernel: Callable[..., DockerKernel], make_options: Options) -> None:
    kernel = open_kernel(make_options(), lifetime_s=2)
    result = kernel.execute("import time\ntime.sleep(60)", timeout_s=60)
    assert result.killed == "expired"


def test_cancel_and_a_raising_callback_kill_the_kernel_and_one_cell_runs_at_a_time(
    open_kernel: Callable[..., DockerKernel], make_options: Options, engine: Any
) -> None:
    kernel = open_kernel(make_options())
    cancel = threading.Event()
    errors: list[BaseException] = []

    def sleep_a_minute() -> None:
        try:
            kernel.execute("import time\ntime.sleep(60)", timeout_s=60, cancel=cancel)
        except BaseException as exc:  # noqa: BLE001 - looked at below, in the test's thread
            errors.append(exc)

    running = threading.Thread(target=sleep_a_minute)
    running.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not kernel._busy.locked():
        time.sleep(0.01)
    with pytest.raises(SandboxError, match="a cell is already running"):
        kernel.execute("1", timeout_s=5)
    cancel.set()
    running.join(60)
    assert [type(e) for e in errors] == [CancelledRunError]
    assert kernel.killed == "cancelled"
    assert_gone(engine, kernel.container_id)

    def fail(_stream: str, _data: bytes) -> None:
        raise RuntimeError("callback broke")

    other = open_kernel(make_options())
    with pytest.raises(OutputCallbackError) as caught:
        other.execute("print('hi')", timeout_s=10, on_output=fail)
    assert caught.value.outcome is not None
    assert other.killed == "callback"
    assert_gone(engine, other.container_id)


def test_files_and_environment_given_at_open_reach_the_kernel(
    open_kernel: Callable[..., DockerKernel], make_options: Options
) -> None:
    kernel = open_kernel(make_options(environment={"GREETING": "hello"}), files={"data/in.csv": b"a,b\n1,2\n"})
    result = kernel.execute("import os\n(open('data/in.csv').read(), os.environ['GREETING'])", timeout_s=10)
    assert result.value == "('a,b\\n1,2\\n', 'hello')"


@pytest.mark.parametrize(
    ("code", "value", "error"),
    [
        ("import ctypes\nctypes.CDLL(None).ptrace(16, 1, 0, 0)", "-1", b""),  # PTRACE_ATTACH to the supervisor
        ("open('/proc/1/fd/1', 'wb').write(b'forged')", None, b"PermissionError"),  # its frame stream
        ("open('/proc/1/environ', 'rb').read()", None, b"PermissionError"),
    ],
)
def test_the_supervisor_stays_out_of_a_cells_reach(
    open_kernel: Callable[..., DockerKernel], make_options: Options, code: str, value: str | None, error: bytes
) -> None:
    kernel = open_kernel(make_options())
    kernel.execute("state = 'kept'", timeout_s=10)
    result = kernel.execute(code, timeout_s=10)
    assert result.value == value
    assert error in result.outcome.stderr
    assert result.killed is None
    usable(kernel)


def test_a_kernel_ends_itself_when_its_gateway_is_killed(engine: Any, make_options: Options) -> None:
    opener = (
        "import json, sys, time\n"
        "from gateway.runner.docker.runner import DockerRunner\n"
        "from gateway.runner.interface import RunSpec\n"
        "kernel = DockerRunner().open_kernel(RunSpec(json.loads(sys.argv[1]), timeout_s=300, output_bytes=1024))\n"
        "print(kernel.container_id, flush=True)\n"
        "time.sleep(300)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", opener, json.dumps(make_options())], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        container_id = proc.stdout.readline().strip()
        assert engine.api.inspect_container(container_id)["State"]["Running"]
    finally:
        proc.kill()  # SIGKILL: no close, no finally in the gateway
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    with contextlib.suppress(docker.errors.NotFound):  # its supervisor saw stdin close, ended, and was removed
        engine.api.wait(container_id, timeout=30, condition="removed")
    assert_gone(engine, container_id)

"""Layer 4 for kernels: `KubernetesRunner.open_kernel` against the fake API server (tests/kubernetes/fakeapi.py, whose
fake container speaks the supervisor's kernel mode): one Pod and one attach session per kernel, cells over it,
every kill path reported with its reason and the Pod deleted, and the Pod's deadline covering the lifetime."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit.memory import MemoryAuditSink
from gateway.decision.sessions import KERNEL_MARGIN_S
from gateway.errors import CancelledRunError, ContainerLeftError, GatewayError, OutputCallbackError, SandboxError
from gateway.policy import Policy, load_policy
from gateway.resources import policies_dir
from gateway.runner.interface import Kernel, KernelRunner, RunSpec
from gateway.runner.kubernetes.kernel import KubernetesKernel
from gateway.runner.kubernetes.runner import KubernetesRunner
from gateway.slots import HostSlots
from tests.kubernetes.conftest import kernel_spec
from tests.kubernetes.fakeapi import Action, FakeApiServer

TRACEBACK = b"Traceback (most recent call last):\n  File \"<cell 1>\", line 1\nKeyError: 'x'\n"


def _open(runner: KubernetesRunner, policy: Policy, **kw: Any) -> KubernetesKernel:
    lifetime_s = kw.pop("lifetime_s", 300)
    return runner.open_kernel(kernel_spec(runner.assembler, policy, lifetime_s=lifetime_s), grace_s=0.2, **kw)


def _calls(api: FakeApiServer) -> list[tuple[str, str]]:
    return [(method, what) for method, what, _ in api.cluster.calls]


def test_a_kernel_is_one_pod_and_one_attach_session_for_all_its_cells(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    assert isinstance(kube_runner, KernelRunner)
    spec = kernel_spec(kube_runner.assembler, default_policy, lifetime_s=600, env={"APP_MODE": "hello"})
    answers: list[list[Action]] = [
        [("out", b"4\n"), ("meta", False), ("value", 0, b""), ("cell", False)],
        [("file", "r.json", b'"a"'), ("meta", False), ("value", 1, b"'kept'"), ("cell", False)],
    ]
    fake_api.cluster.cell_program = lambda cell: answers.pop(0)
    kernel = kube_runner.open_kernel(spec, files={"data/in.csv": b"a,b\n"}, grace_s=0.5)
    assert isinstance(kernel, Kernel)
    first = kernel.execute("state = 'kept'\nprint(2+2)", timeout_s=10)
    second = kernel.execute("state", timeout_s=3)
    assert (first.outcome.exit_code, first.outcome.stdout, first.value, first.killed) == (0, b"4\n", None, None)
    assert (second.outcome.exit_code, second.value, dict(second.outcome.files)) == (0, "'kept'", {"r.json": b'"a"'})
    # the payload opened a kernel: its lifetime, grace, value cap, files and environment
    (payload,) = fake_api.cluster.payloads
    assert (payload["kernel"], payload["timeout_s"], payload["grace_s"], payload["value_cap"]) == (1, 600, 0.5, 1 << 16)
    assert (payload["env"], payload["files"]) == ({"APP_MODE": "hello"}, {"data/in.csv": b"a,b\n"})
    assert [(c["code"], c["timeout_s"]) for c in fake_api.cluster.cells] == [
        ("state = 'kept'\nprint(2+2)", 10.0),
        ("state", 3.0),
    ]
    # the Pod is the decision's manifest, unchanged, with the lifetime as its deadline; the outcome names it
    (submitted,) = fake_api.cluster.submitted
    assert submitted == spec.options["pod"]
    assert submitted["spec"]["activeDeadlineSeconds"] == 600 + 60
    assert second.outcome.sandbox["pod_sha256"] == spec.options["pod_sha256"]
    assert second.outcome.sandbox["pod_uid"]
    assert _calls(fake_api) == [("POST", "pods"), ("WATCH", "pods"), ("WS", "attach")]
    kernel.close()
    kernel.close()  # idempotent
    assert kernel.killed == "closed"
    assert _calls(fake_api)[3:] == [("DELETE", "pod")]
    assert fake_api.cluster.live() == []
    with pytest.raises(SandboxError, match=r"is gone \(closed\); open a new kernel"):
        kernel.execute("1", timeout_s=1)


def test_a_cells_files_and_env_travel_in_its_cell_to_the_pods_supervisor(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    kernel = _open(kube_runner, default_policy)
    try:
        kernel.execute("print(2+2)", timeout_s=5, files={"in/data.bin": b"\x00\xff"}, env={"APP_CELL": "1"})
        kernel.execute("print(2+2)", timeout_s=5)
    finally:
        kernel.close()
    assert [(c["files"], c["env"]) for c in fake_api.cluster.cells] == [
        ({"in/data.bin": b"\x00\xff"}, {"APP_CELL": "1"}),
        ({}, {}),
    ]


def test_an_exception_an_interrupt_and_an_output_flood_leave_the_kernel_usable(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    answers: list[list[Action]] = [
        [("err", TRACEBACK), ("meta", False), ("value", 4, b""), ("cell", False)],
        [("out", b"started\n"), ("err", b"KeyboardInterrupt\n"), ("meta", False), ("value", 4, b""), ("cell", True)],
        [("out", b"x" * 5000), ("meta", False), ("value", 4, b""), ("cell", True)],
        [("meta", False), ("value", 1, b"'kept'"), ("cell", False)],
    ]
    fake_api.cluster.cell_program = lambda cell: answers.pop(0)
    kernel = kube_runner.open_kernel(kernel_spec(kube_runner.assembler, default_policy, output_bytes=4096), grace_s=0.2)
    try:
        raised = kernel.execute("{}['x']", timeout_s=5)
        assert (raised.outcome.exit_code, raised.outcome.stderr, raised.killed) == (1, TRACEBACK, None)
        looped = kernel.execute("while True: pass", timeout_s=1)
        assert (looped.interrupted, looped.outcome.timed_out, looped.outcome.exit_code) == (True, True, None)
        assert looped.killed is None
        flood = kernel.execute("while True: print('x' * 1000)", timeout_s=5)
        assert (flood.interrupted, flood.outcome.output_limit_killed, flood.outcome.timed_out) == (True, True, False)
        assert (len(flood.outcome.stdout), flood.outcome.stdout_truncated, flood.killed) == (4096, True, None)
        assert kernel.execute("state", timeout_s=5).value == "'kept'"
        assert fake_api.cluster.live() != []
    finally:
        kernel.close()
    assert fake_api.cluster.live() == []


ENDS = [
    # (the final frame's reason and status, the cell's exit code, its timed_out)
    ("interrupt_ignored", 137, None, True),
    ("expired", 124, None, False),
    ("exited", 3, 3, False),
    ("protocol", 125, None, False),
]


@pytest.mark.parametrize("end", ENDS, ids=[e[0] for e in ENDS])
def test_a_kernel_the_supervisor_ends_is_reported_with_its_reason_and_deleted(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy, tmp_path: Path,
    end: tuple[str, int, int | None, bool],
) -> None:  # fmt: skip
    reason, status, exit_code, timed_out = end
    fake_api.cluster.cell_program = lambda cell: [("out", b"a"), ("meta", False), ("killed", reason, status)]
    slots = HostSlots(tmp_path / "slots", 1, wait_s=0)
    kernel = _open(kube_runner, default_policy, slot=slots.take())
    assert slots.try_take() is None  # the kernel holds the host's one slot while it lives
    result = kernel.execute("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile 1: pass", timeout_s=1)
    assert result.killed == kernel.killed == reason
    assert (result.outcome.exit_code, result.outcome.timed_out, result.outcome.stdout) == (exit_code, timed_out, b"a")
    assert fake_api.cluster.live() == []
    assert _calls(fake_api)[-1] == ("DELETE", "pod")
    assert slots.try_take() is not None  # ... and frees it once the Pod is gone
    with pytest.raises(SandboxError, match=f"is gone \\({reason}\\)"):
        kernel.execute("1", timeout_s=1)
    kernel.close()


def test_a_kernel_that_dies_between_cells_says_so_at_the_next_cell(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.cell_program = lambda cell: [("meta", False), ("value", 0, b""), ("cell", False),
                                                  ("killed", "expired", 124)]  # fmt: skip
    kernel = _open(kube_runner, default_policy)
    assert kernel.execute("1", timeout_s=1).killed is None
    assert kernel.execute("2", timeout_s=1).killed == "expired"
    assert fake_api.cluster.live() == []


def test_the_kubelet_ending_the_pod_is_memory_or_lost_with_the_reason(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.cell_program = lambda cell: [("out", b"allocating\n"), ("oom",)]
    kernel = _open(kube_runner, default_policy)
    result = kernel.execute("x = bytearray(1 << 40)", timeout_s=5)
    assert (result.killed, result.outcome.exit_code, result.outcome.oom_killed) == ("memory", 137, True)
    assert result.outcome.sandbox["reason"] == "OOMKilled"
    fake_api.cluster.cell_program = lambda cell: [("evict",)]
    kernel = _open(kube_runner, default_policy)
    result = kernel.execute("1", timeout_s=5)
    assert (result.killed, result.outcome.resource_killed, result.outcome.exit_code) == ("lost", True, None)
    assert result.outcome.sandbox["reason"] == "Evicted"
    assert fake_api.cluster.live() == []


def test_a_supervisor_that_does_not_answer_is_unresponsive(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.cell_program = lambda cell: [("out", b"started\n"), ("hang",)]
    kernel = _open(kube_runner, default_policy)
    result = kernel.execute("1", timeout_s=0.1)  # the host gives up 0.1 + 0.2 (grace) + 5 s (margin) later
    assert (result.killed, result.outcome.timed_out, result.outcome.stdout) == ("unresponsive", True, b"started\n")
    assert fake_api.cluster.live() == []


def test_cancel_a_raising_callback_and_a_tampered_stream_kill_the_kernel(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.cell_program = lambda cell: [("out", b"a"), ("hang",)]
    cancel = threading.Event()
    kernel = _open(kube_runner, default_policy)
    with pytest.raises(CancelledRunError) as cancelled:
        kernel.execute("1", timeout_s=30, on_output=lambda stream, data: cancel.set(), cancel=cancel)
    assert (cancelled.value.outcome.stdout, kernel.killed) == (b"a", "cancelled")

    def boom(stream: str, data: bytes) -> None:
        raise RuntimeError("client went away")

    kernel = _open(kube_runner, default_policy)
    with pytest.raises(OutputCallbackError, match="client went away"):
        kernel.execute("1", timeout_s=30, on_output=boom)
    assert kernel.killed == "callback"
    fake_api.cluster.cell_program = lambda cell: [("raw", b"o\x00\x00\x00\x02hi" + b"\x00" * 16)]
    kernel = _open(kube_runner, default_policy)
    with pytest.raises(SandboxError, match="failed verification"):
        kernel.execute("1", timeout_s=30)
    assert kernel.killed == "protocol"
    assert fake_api.cluster.live() == []


def test_cells_run_one_at_a_time(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.cell_program = lambda cell: [("sleep", 1.0), ("meta", False), ("value", 0, b""), ("cell", False)]
    kernel = _open(kube_runner, default_policy)
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(kernel.execute("slow()", timeout_s=10)))
    first.start()
    until = time.monotonic() + 10
    while not fake_api.cluster.cells and time.monotonic() < until:
        time.sleep(0.01)
    with pytest.raises(SandboxError, match="already running"):
        kernel.execute("2", timeout_s=1)
    first.join(timeout=20)
    assert results[0].killed is None
    assert len(fake_api.cluster.cells) == 1  # the refused cell never reached the kernel
    kernel.close()


def test_a_pod_whose_deadline_ends_before_the_lifetime_is_refused(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy, tmp_path: Path
) -> None:
    spec = kernel_spec(kube_runner.assembler, default_policy, lifetime_s=60)
    slots = HostSlots(tmp_path / "slots", 1, wait_s=0)
    with pytest.raises(SandboxError, match="activeDeadlineSeconds 120, shorter than its lifetime of 3600 s"):
        kube_runner.open_kernel(RunSpec(spec.options, timeout_s=3600, output_bytes=1024), slot=slots.take())
    assert fake_api.cluster.calls == []  # nothing was created
    assert slots.try_take() is not None


def test_a_failed_open_deletes_the_pod_and_frees_the_slot(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy, tmp_path: Path
) -> None:
    slots = HostSlots(tmp_path / "slots", 1, wait_s=0)
    fake_api.cluster.fail("WS", "attach", 403)
    with pytest.raises(GatewayError):
        _open(kube_runner, default_policy, slot=slots.take())
    assert fake_api.cluster.live() == []
    assert slots.try_take() is not None


def test_a_kernel_pod_that_cannot_be_deleted_is_reported_and_reaped(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    kernel = _open(kube_runner, default_policy)
    fake_api.cluster.fail("DELETE", "pod", 500, times=99)
    with pytest.raises(ContainerLeftError, match="left for `gateway reap`"):
        kernel.close()
    (left,) = fake_api.cluster.live()
    fake_api.cluster.failures.clear()
    assert kube_runner.reap() == [f"gateway-sandboxes/{left}"]


def test_another_gateway_reaps_a_kernel_pod_only_after_its_lifetime(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    kernel = _open(kube_runner, default_policy, lifetime_s=120)
    other = KubernetesRunner(kube_runner.client, instance="another-gateway")
    assert other.reap(expired_only=True) == []
    assert other.reap() == []  # a live gateway's kernel is not another's to delete
    (name,) = fake_api.cluster.live()
    pod = fake_api.cluster.pods[("gateway-sandboxes", name)]
    pod["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"  # its lifetime (and the backstop) long over
    assert other.reap(expired_only=True) == [f"gateway-sandboxes/{name}"]
    kernel.close()  # the Pod is gone already: closing is still clean
    assert kernel.killed == "closed"


def test_a_gateway_opens_a_kernel_session_on_kubernetes_whose_pod_outlives_its_lifetime(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, tmp_path: Path
) -> None:
    """Through `Gateway.sessions`, not the runner: the decision assembles the Pod for the session's lifetime, so
    `open_kernel` takes it (a Pod made for one execution's timeout would be refused: its deadline cannot grow)."""
    policy = load_policy(policies_dir() / "examples" / "sessions.yaml")
    with Gateway(policy, runner=kube_runner, audit=MemoryAuditSink(), slots=HostSlots(tmp_path / "slots", 2)) as gw:
        created = gw.sessions.create({"mode": "kernel", "principal": "agent", "lifetime_s": 1800})
        assert created.allowed, created.to_dict()
        session_id = created.to_dict()["session_id"]
        result = gw.sessions.execute(session_id, {"code": "print(2+2)", "principal": "agent"})
        assert result.error is None, result.error
        assert result.outcome is not None
        assert result.outcome.stdout == b"4\n"
        gw.sessions.close(session_id, principal="agent")
    (pod,) = fake_api.cluster.submitted
    assert pod["spec"]["activeDeadlineSeconds"] >= 1800 + KERNEL_MARGIN_S
    assert _calls(fake_api).count(("DELETE", "pod")) == 1

"""Layer 3: the Pods the Kubernetes backend assembles, run for real with `podman kube play` on this machine,
with the hardening probed from inside by a program handed to the in-Pod supervisor through its framed,
authenticated protocol (tests/kubernetes/podman.py says what podman honours, ignores and refuses).

RuntimeClass, NetworkPolicy, ephemeral-storage and the emptyDir's memory medium and size are ignored by podman;
layers 1 and 2 (tests/kubernetes/test_pod_manifests.py) cover those fields of the same manifests.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.decision import evaluate
from gateway.errors import SandboxError
from gateway.policy import load_policy
from gateway.request import parse_request
from gateway.resources import policies_dir
from gateway.runner.interface import RunSpec
from gateway.runner.kubernetes.kernel import KubernetesKernel
from gateway.runner.kubernetes.pod import KubernetesAssembler
from tests.kubernetes.conftest import kernel_spec
from tests.kubernetes.podman import Podman
from tests.kubernetes.probe import PROBE

pytestmark = [pytest.mark.integration, pytest.mark.slow]

IMAGE = "gateway/sandbox-python:3.11-bookworm"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI requires podman for the Kubernetes layer-3 tests: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def podman(engine: Any) -> Iterator[Podman]:
    if shutil.which("podman") is None or shutil.which("catatonit") is None:
        _unavailable("podman (and catatonit) are not installed; run scripts/setup.sh")
    machine = Podman.create(IMAGE)
    try:
        yield machine
    finally:
        machine.destroy()


def _spec(policy_name: str, **request: Any) -> RunSpec:
    policy = load_policy(policies_dir() / policy_name)
    assembler = KubernetesAssembler(instance="podman")
    decision = evaluate(policy, parse_request({"code": "pass", **request}), assembler=assembler)
    assert decision.allowed, [v.message for v in decision.violations]
    assert decision.run is not None
    return decision.run


@pytest.mark.parametrize("policy_name", ["default.yaml", "strict.yaml"])
def test_the_pod_holds_from_inside(podman: Podman, policy_name: str) -> None:
    spec = _spec(policy_name)
    pod = spec.options["pod"]
    outcome = podman.play(pod, spec, PROBE)
    assert outcome.exit_code == 0, outcome.stderr
    probe = json.loads(outcome.stdout)
    ctx = pod["spec"]["containers"][0]["securityContext"]
    assert (probe["uid"], probe["gid"], probe["euid"]) == (ctx["runAsUser"], ctx["runAsGroup"], ctx["runAsUser"])
    assert 0 not in probe["groups"]
    assert probe["cap_eff"] == probe["cap_prm"] == probe["cap_bnd"] == "0000000000000000"
    assert probe["no_new_privs"] == "1"
    assert probe["seccomp"] == "2"  # a filter is installed (RuntimeDefault)
    assert probe["root_writable"] == 30  # EROFS
    assert probe["usr_writable"] == 30
    assert probe["root_mount"][1].split(",")[0] == "ro"
    assert probe["tmp_writable"] is True
    assert probe["workspace_writable"] is True
    assert probe["interfaces"] == ["lo"]
    assert probe["routes"] == []
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert int(probe["memory"]) == int(limits["memory"])
    quota, period = (int(x) for x in probe["cpu"])
    assert quota / period == pytest.approx(int(limits["cpu"].removesuffix("m")) / 1000)
    # A Pod has no pids field: on a node the kubelet's podPidsLimit bounds it; podman's kube play applies none
    # (not even its containers.conf pids_limit), so the probe reads "max" here and nothing is asserted on it.
    assert probe["hostname"] == "sandbox"
    assert probe["sa_token"] is False
    assert probe["env_keys"] == []  # enableServiceLinks false: no service variables
    assert probe["pid1"] == " ".join(pod["spec"]["containers"][0]["command"])[:200]  # the supervisor is PID 1
    # podman ignores the emptyDir's medium and sizeLimit: /tmp is a disk volume there (a kubelet mounts a tmpfs
    # of sizeLimit, which layers 1 and 2 check on the manifest). When it is a tmpfs, its size must be the limit.
    fstype = probe["tmp_mount"][0]
    if fstype == "tmpfs":
        assert probe["tmp_size"] <= int(pod["spec"]["volumes"][0]["emptyDir"]["sizeLimit"])


def test_memory_beyond_the_limit_is_an_oom(podman: Podman) -> None:
    spec = _spec("default.yaml", limits={"memory": "64m"})
    outcome = podman.play(spec.options["pod"], spec, "x = bytearray(200 * 1024 * 1024)\nprint(len(x))")
    assert outcome.oom_killed
    assert outcome.exit_code == 137
    assert outcome.stdout == b""


def test_the_deadline_and_the_output_cap(podman: Podman) -> None:
    spec = _spec("default.yaml", limits={"timeout_s": 2})
    outcome = podman.play(spec.options["pod"], spec, "print('started', flush=True)\nwhile True: pass")
    assert outcome.timed_out
    assert outcome.exit_code is None
    assert outcome.stdout == b"started\n"
    spec = _spec("default.yaml", limits={"output_bytes": 65536})
    outcome = podman.play(spec.options["pod"], spec, "import sys\nwhile True: sys.stdout.write('x' * 65536)")
    assert outcome.output_limit_killed
    assert len(outcome.stdout) == 65536


# --- kernels: a session's long-lived Pod, the backend's own KubernetesKernel over the FIFO and attached pipes ------


@pytest.fixture
def open_kernel(podman: Podman) -> Iterator[Callable[..., KubernetesKernel]]:
    """Opens kernels in a session's Pod (policies/examples/sessions.yaml plus ``request``; 120 s lifetime, 1 s
    grace) and closes each at the end: nothing of its Pod is left."""
    opened: list[KubernetesKernel] = []

    def make(**request: Any) -> KubernetesKernel:
        policy = load_policy(policies_dir() / "examples" / "sessions.yaml")
        spec = kernel_spec(KubernetesAssembler(instance="podman"), policy, lifetime_s=120, **request)
        opened.append(podman.open_kernel(spec.options["pod"], spec, files={"data/in.csv": b"a,b\n1,2\n"}))
        return opened[-1]

    yield make
    for kernel in opened:
        kernel.close()
    assert podman.run(["ps", "--all", "--quiet"]).stdout.strip() == ""


@pytest.fixture
def kernel(open_kernel: Callable[..., KubernetesKernel]) -> KubernetesKernel:
    return open_kernel()


def test_a_kernel_pod_keeps_state_across_cells_and_holds_from_inside(kernel: KubernetesKernel) -> None:
    first = kernel.execute("import json\nstate = 'kept'\nrows = open('data/in.csv').read()\nprint(2+2)", timeout_s=10)
    assert (first.outcome.exit_code, first.outcome.stdout, first.value, first.killed) == (0, b"4\n", None, None)
    second = kernel.execute("open('out/r.json', 'w').write(json.dumps(rows))\nstate", timeout_s=10)
    assert (second.value, dict(second.outcome.files)) == ("'kept'", {"r.json": b'"a,b\\n1,2\\n"'})
    probe = json.loads(kernel.execute(PROBE, timeout_s=20).outcome.stdout)
    assert probe["uid"] != 0
    assert probe["cap_eff"] == probe["cap_bnd"] == "0000000000000000"
    assert (probe["no_new_privs"], probe["root_writable"], probe["interfaces"]) == ("1", 30, ["lo"])
    assert probe["pid1"].startswith("/usr/bin/python3 -I -S -c")  # the supervisor is PID 1, out of the cell's way
    raised = kernel.execute("{}['missing']", timeout_s=10)
    assert (raised.outcome.exit_code, raised.killed) == (1, None)
    assert raised.outcome.stderr.endswith(b"KeyError: 'missing'\n")


def test_an_infinite_loop_is_interrupted_and_the_kernel_lives_on(kernel: KubernetesKernel) -> None:
    kernel.execute("state = 'kept'", timeout_s=10)
    result = kernel.execute("while True:\n    pass", timeout_s=1)
    assert (result.interrupted, result.outcome.timed_out, result.outcome.exit_code) == (True, True, None)
    assert result.outcome.stderr.endswith(b"KeyboardInterrupt\n")
    assert result.killed is None
    assert kernel.execute("state", timeout_s=10).value == "'kept'"


def test_a_cell_ignoring_the_interrupt_gets_the_kernel_killed(kernel: KubernetesKernel) -> None:
    code = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    result = kernel.execute(code, timeout_s=1)
    assert result.killed == kernel.killed == "interrupt_ignored"
    assert (result.outcome.timed_out, result.interrupted) == (True, False)
    with pytest.raises(SandboxError, match=r"is gone \(interrupt_ignored\)"):
        kernel.execute("1", timeout_s=1)


def test_a_memory_bomb_kills_the_kernel_and_says_memory(open_kernel: Callable[..., KubernetesKernel]) -> None:
    kernel = open_kernel(limits={"memory": "64m"})
    result = kernel.execute("hog = []\nwhile True:\n    hog.append(bytearray(1 << 20))", timeout_s=30)
    assert (result.killed, result.outcome.oom_killed, result.outcome.exit_code) == ("memory", True, 137)


def test_a_kernel_ends_itself_when_its_attach_session_ends(podman: Podman, kernel: KubernetesKernel) -> None:
    """The gateway gone (its attach session ended, nothing deleted): the supervisor's stdin closes, it kills the
    interpreter and exits, and the container stops on its own."""
    assert kernel.execute("state = 'kept'", timeout_s=10).killed is None
    name = str(kernel.container_id)
    assert podman.running(name)
    podman.attached[name].close()
    until = time.monotonic() + 30
    while podman.running(name) and time.monotonic() < until:
        time.sleep(0.1)
    assert not podman.running(name)

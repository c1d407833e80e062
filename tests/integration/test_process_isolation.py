"""The program cannot reach anything outside its own process tree, and the deadline holds without the client.

Every test here is an attack run against the real engine, under runc and under gVisor (runsc): tracing or
freezing the container's init and the supervisor, the system calls a code sandbox never needs, reading the
supervisor's ``/proc`` entries, and a gateway CLI killed in the middle of a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gateway.runner.docker.runner as runner_module
from gateway.resources import policies_dir
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import Outcome, Payload, RunSpec
from tests.integration.conftest import INSTANCE_LABEL, MANAGED_LABEL, gateway_containers

pytestmark = pytest.mark.integration

Options = Callable[..., dict[str, Any]]
ROOT = Path(__file__).resolve().parents[2]


def run(runner: DockerRunner, options: dict[str, Any], code: str, *, timeout_s: float = 20, **kw: Any) -> Outcome:
    env = kw.pop("env", None)
    if env is not None:
        options = {**options, "environment": env}
    spec = RunSpec(options, timeout_s=timeout_s, output_bytes=1 << 20, **kw)
    return runner.execute(spec, Payload(textwrap.dedent(code)))


def report(outcome: Outcome) -> Any:
    assert outcome.exit_code == 0, outcome
    return json.loads(outcome.stdout.decode().strip().splitlines()[-1])


_PTRACE = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
def attach(pid):
    ctypes.set_errno(0)
    rc = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
    err = ctypes.get_errno()
    if rc == 0:
        os.waitpid(pid, 0x40000000)  # __WALL: the stop arrives; leave it stopped (the freeze)
    return {"rc": rc, "errno": err}
print(json.dumps({"init": attach(1), "parent": attach(os.getppid()), "ppid": os.getppid()}))
"""


def test_ptrace_attach_to_init_and_to_the_supervisor_fails(
    runner: DockerRunner, options_for: Options, runtime: str
) -> None:
    outcome = run(runner, options_for(), _PTRACE)
    got = report(outcome)
    for who in ("init", "parent"):
        assert got[who]["rc"] == -1, (who, got)
        assert got[who]["errno"] in (1, 38), (who, got)  # EPERM (seccomp or no access) or ENOSYS


_SYSCALLS = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buf = ctypes.create_string_buffer(64)
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
remote = iovec(0x400000, 64)
params = ctypes.create_string_buffer(120)
desc = ctypes.create_string_buffer(b"user:x")
calls = {
    "process_vm_readv": (310, 1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0),
    "process_vm_writev": (311, 1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0),
    "ptrace_traceme": (101, 0, 0, 0, 0),
    "io_uring_setup": (425, 4, params),
    "userfaultfd": (323, 0),
    "bpf": (321, 0, params, 120),
    "perf_event_open": (298, params, 0, -1, -1, 0),
    "keyctl": (250, 0, -3, 0),
    "add_key": (248, b"user", b"x", b"y", 1, -4),
    "request_key": (249, b"user", b"x", 0, 0),
}
out = {}
for name, args in calls.items():
    ctypes.set_errno(0)
    rc = libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    out[name] = {"rc": rc, "errno": ctypes.get_errno()}
print(json.dumps(out))
"""


_HOST_KERNEL_ONLY = {"io_uring_setup", "ptrace_traceme", "perf_event_open", "keyctl", "add_key", "request_key"}
"""Calls gVisor's sentry implements itself (no host kernel reached): refused under runsc only when runsc applies
the OCI profile (registered with ``--oci-seccomp``)."""


def _runsc_applies_seccomp(engine: Any) -> bool:
    args = engine.info().get("Runtimes", {}).get("runsc", {}).get("runtimeArgs") or []
    return any(str(a).lstrip("-").startswith("oci-seccomp") for a in args)


def test_syscalls_a_code_sandbox_never_needs_are_refused(
    runner: DockerRunner, options_for: Options, runtime: str, engine: Any
) -> None:
    got = report(run(runner, options_for(), _SYSCALLS))
    if runtime == "runsc" and not _runsc_applies_seccomp(engine):
        got = {name: result for name, result in got.items() if name not in _HOST_KERNEL_ONLY}
    for name, result in got.items():
        assert result["rc"] == -1, (name, got)
        assert result["errno"] in (1, 38), (name, got)  # EPERM or ENOSYS: refused, not merely failing on its args


_FREEZE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
print("before", flush=True)
for pid in (1, os.getppid()):
    if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH, then leave it stopped: the freeze of issue 14
        os.waitpid(pid, 0x40000000)
print("after", flush=True)
"""


def test_a_program_that_tries_to_freeze_init_still_gets_its_output_and_a_true_report(
    runner: DockerRunner, options_for: Options, engine: Any, runtime: str
) -> None:
    outcome = run(runner, options_for(), _FREEZE, timeout_s=15)
    assert outcome.stdout == b"before\nafter\n", outcome
    assert outcome.exit_code == 0
    assert not outcome.timed_out
    assert outcome.container_id is not None
    assert outcome.container_id not in gateway_containers(engine)


_SIGNALS = """
import os, signal, time
print("before", flush=True)
for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGKILL):
    try:
        os.kill(1, sig)
        print(sig.name, "sent", flush=True)
    except PermissionError:
        print(sig.name, "refused", flush=True)
    time.sleep(0.2)
print("after", flush=True)
"""


def test_the_program_cannot_signal_the_supervisor(runner: DockerRunner, options_for: Options, runtime: str) -> None:
    """The gateway's seccomp profile refuses kill/tkill/tgkill/sigqueue/pidfd_open aimed at PID 1: under
    gVisor, which delivers such signals to a namespace's init, this is what keeps the supervisor alive."""
    outcome = run(runner, options_for(), _SIGNALS, timeout_s=10)
    assert outcome.stdout == b"before\nSIGSTOP refused\nSIGTERM refused\nSIGKILL refused\nafter\n", outcome
    assert outcome.exit_code == 0
    assert not outcome.timed_out


def test_under_the_engine_default_profile_the_kernel_still_shields_init_under_runc(
    runner: DockerRunner, make_options: Options
) -> None:
    options = make_options()
    options["security_opt"] = [o for o in options["security_opt"] if not str(o).startswith("seccomp=")]
    outcome = run(runner, options, _SIGNALS, timeout_s=10)
    assert outcome.stdout.endswith(b"after\n"), outcome  # sent, and ignored by the namespace's init
    assert outcome.exit_code == 0


def test_a_program_that_tries_to_stop_its_supervisor_is_reported_truthfully(
    runner: DockerRunner, options_for: Options, engine: Any, runtime: str
) -> None:
    code = (
        "import os, signal\nprint('before', flush=True)\n"
        "try:\n    os.kill(1, signal.SIGSTOP)\nexcept PermissionError:\n    pass\nprint('after', flush=True)\n"
    )
    outcome = run(runner, options_for(), code, timeout_s=4)
    assert outcome.stdout == b"before\nafter\n", outcome
    assert outcome.exit_code == 0
    assert outcome.container_id is not None
    assert outcome.container_id not in gateway_containers(engine)


_PROC = """
import json, os, base64
me = os.getpid()
found = {}
def grab(path, size=1 << 16):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return "open:%d" % exc.errno
    try:
        return base64.b64encode(os.read(fd, size)).decode()
    except OSError as exc:
        return "read:%d" % exc.errno
    finally:
        os.close(fd)
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    if pid == me:
        continue
    entry = {"environ": grab("/proc/%d/environ" % pid), "maps": grab("/proc/%d/maps" % pid),
             "cmdline": grab("/proc/%d/cmdline" % pid)}
    mem = {}
    try:
        maps = base64.b64decode(entry["maps"]).decode() if ":" not in entry["maps"] else ""
    except Exception:
        maps = ""
    for line in maps.splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if "rw" not in line.split()[1]:
            continue
        try:
            with open("/proc/%d/mem" % pid, "rb", buffering=0) as f:
                f.seek(lo)
                mem[line.split()[0]] = base64.b64encode(f.read(min(hi - lo, 1 << 20))).decode()
        except OSError as exc:
            mem[line.split()[0]] = "mem:%d" % exc.errno
    entry["mem"] = mem
    fds = {}
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except OSError as exc:
        names = []
        fds["list"] = "list:%d" % exc.errno
    for name in names:
        fds[name] = grab("/proc/%d/fd/%s" % (pid, name))
    entry["fds"] = fds
    found[pid] = entry
print(json.dumps({"me": me, "found": found}))
"""


def _decoded(value: Any) -> list[bytes]:
    if isinstance(value, dict):
        return [b for v in value.values() for b in _decoded(v)]
    if isinstance(value, str) and ":" not in value:
        import base64

        return [base64.b64decode(value)]
    return []


def test_the_supervisor_reveals_no_secret_through_proc(
    runner: DockerRunner, options_for: Options, runtime: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys: list[bytes] = []
    real = runner_module.new_key

    def recorded() -> bytes:
        keys.append(real())
        return keys[-1]

    monkeypatch.setattr(runner_module, "new_key", recorded)  # the real key, only remembered by the test
    canary = "s3cret-" + os.urandom(8).hex()
    outcome = run(runner, options_for(), _PROC, env={"APP_TOKEN": canary}, timeout_s=30)
    got = report(outcome)
    assert got["found"], "the program saw no other process at all"
    (key,) = keys
    leaked = b"".join(_decoded(got["found"]))
    assert canary.encode() not in leaked, "an environment value was readable in another process"
    assert key not in leaked, "the frame key was readable"
    assert key.hex().encode() not in leaked, "the frame key (hex) was readable"
    assert b"APP_TOKEN" not in leaked


# -- the deadline without the client ---------------------------------------------------------------------


def _cli(runtime: str, audit_dir: Path, code: str, timeout: float) -> subprocess.Popen[bytes]:
    policy = policies_dir() / ("strict.yaml" if runtime == "runsc" else "default.yaml")
    argv = [sys.executable, "-m", "gateway", "run", "--json", "--policy", str(policy), "--audit-dir", str(audit_dir)]
    argv += ["--timeout", str(timeout), "--code", code]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)


def _wait_for_container(engine: Any, proc: subprocess.Popen[bytes], limit: float = 30) -> str:
    ours = [f"{MANAGED_LABEL}=true", f"{INSTANCE_LABEL}={os.environ['GATEWAY_INSTANCE']}"]
    end = time.monotonic() + limit
    while time.monotonic() < end:
        running = engine.api.containers(filters={"label": ours, "status": "running"})
        if running:
            return str(running[0]["Id"])
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError("the gateway never started a container")


def _gone_within(engine: Any, container_id: str, seconds: float) -> bool:
    import docker.errors

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            engine.containers.get(container_id)
        except docker.errors.NotFound:
            return True
        time.sleep(0.2)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


_SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(600)\n"


def test_a_killed_gateway_leaves_no_sandbox_running_past_its_deadline(
    engine: Any, runtime: str, tmp_path: Path
) -> None:
    timeout = 4.0
    proc = _cli(runtime, tmp_path / "audit", _SLEEPER, timeout)
    try:
        cid = _wait_for_container(engine, proc)
        time.sleep(1)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        # No reaper runs: the sandbox itself must end and the engine remove it.
        assert _gone_within(engine, cid, timeout + 5), f"container {cid[:12]} outlived the killed gateway"
    finally:
        _stop(proc)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_gateway_removes_its_sandbox_and_records_the_outcome(
    engine: Any, tmp_path: Path, signum: int
) -> None:
    audit_dir = tmp_path / "audit"
    proc = _cli("runc", audit_dir, _SLEEPER, 30)
    try:
        cid = _wait_for_container(engine, proc)
        time.sleep(1)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        _stop(proc)
    assert _gone_within(engine, cid, 5), f"container {cid[:12]} left behind"
    result = json.loads(out)
    assert result["error"]["code"] == "gateway.interrupted", (result, err)
    assert proc.returncode == 128 + signum
    records = [json.loads(line) for seg in audit_dir.glob("*.jsonl") for line in seg.read_text().splitlines()]
    outcome = [r for r in records if r["event_type"] == "execution.outcome"]
    assert len(outcome) == 1, records
    assert outcome[0]["data"]["error"]["code"] == "gateway.interrupted"
    assert outcome[0]["data"]["container_id"] == cid


def test_gateway_run_sweeps_expired_sandboxes_first_and_audits_it(engine: Any, tmp_path: Path) -> None:
    from tests.integration.conftest import DEADLINE_LABEL, SANDBOX_IMAGE

    expired = {
        MANAGED_LABEL: "true",
        INSTANCE_LABEL: "a-gateway-that-was-killed",
        DEADLINE_LABEL: str(int(time.time()) - 3600),
    }
    live = {**expired, DEADLINE_LABEL: str(int(time.time()) + 3600)}
    old = engine.containers.create(SANDBOX_IMAGE, command=["true"], labels=expired)
    other = engine.containers.create(SANDBOX_IMAGE, command=["true"], labels=live)
    audit_dir = tmp_path / "audit"
    try:
        proc = _cli("runc", audit_dir, "print(4)", 10)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
        ids = [str(c["Id"]) for c in engine.api.containers(all=True)]
        assert old.id not in ids
        assert other.id in ids  # another instance's live sandbox is not touched
    finally:
        for container in (old, other):
            with contextlib.suppress(Exception):
                container.remove(force=True)
    records = [json.loads(line) for seg in audit_dir.glob("*.jsonl") for line in seg.read_text().splitlines()]
    (reaped,) = [r for r in records if r["event_type"] == "containers.reaped"]
    assert old.id in reaped["data"]["container_ids"]
    assert reaped["data"]["expired_only"] is True

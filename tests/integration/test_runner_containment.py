"""The containment suite: every check runs against the real engine, under runc and under gVisor (runsc), and
in both modes: ``cold`` (a container created for the run) and ``pooled`` (a container created and started ahead
from the options' profile part alone, idle for a moment, then claimed through the warm pool's claim: guard
again, exact profile match, and only then the payload)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import Outcome, Payload, RunSpec
from tests.integration.pooled_runner import MODES, runner_for

pytestmark = pytest.mark.integration

Options = Callable[..., dict[str, Any]]


@pytest.fixture(params=MODES)
def runner(request: pytest.FixtureRequest, engine: Any) -> DockerRunner:
    """The runner of the suite, in each mode (overrides the package fixture)."""
    return runner_for(request.param, engine)


def run(runner: DockerRunner, options: dict[str, Any], code: str, *, timeout_s: float = 20, **spec: Any) -> Outcome:
    spec.setdefault("output_bytes", 1 << 20)
    return runner.execute(RunSpec(options, timeout_s=timeout_s, **spec), Payload(textwrap.dedent(code)))


def assert_gone(engine: Any, container_id: str | None) -> None:
    import docker.errors

    assert container_id is not None
    with pytest.raises(docker.errors.NotFound):
        engine.containers.get(container_id)


def test_print_2_plus_2(runner: DockerRunner, options_for: Options, engine: Any) -> None:
    outcome = run(runner, options_for(), "print(2+2)")
    assert outcome.exit_code == 0
    assert outcome.stdout == b"4\n"
    assert outcome.stderr == b""
    assert not (outcome.timed_out)
    assert not (outcome.oom_killed)
    assert not (outcome.stdout_truncated)
    assert not (outcome.resource_killed)
    assert outcome.image_id is not None
    assert outcome.image_id.startswith("sha256:")
    assert_gone(engine, outcome.container_id)


def test_exit_status_and_stderr_are_the_programs(runner: DockerRunner, options_for: Options) -> None:
    outcome = run(runner, options_for(), "import sys\nprint('bad', file=sys.stderr)\nsys.exit(3)")
    assert outcome.exit_code == 3
    assert outcome.stderr == b"bad\n"
    assert outcome.stdout == b""


def test_memory_bomb_is_reported_oom(runner: DockerRunner, options_for: Options, engine: Any) -> None:
    outcome = run(runner, options_for(), "a = []\nwhile True:\n    a.append(b'x' * 10**7)\n")
    assert outcome.oom_killed or outcome.resource_killed
    if outcome.oom_killed:
        assert outcome.exit_code == 137
    assert not outcome.timed_out
    assert_gone(engine, outcome.container_id)


@pytest.mark.parametrize("code", ["while True:\n    pass\n", "import time\ntime.sleep(10**6)\n"], ids=["loop", "sleep"])
def test_killed_at_deadline(runner: DockerRunner, options_for: Options, engine: Any, code: str) -> None:
    deadline = 2.0
    outcome = run(runner, options_for(), code, timeout_s=deadline)
    # From the hand-over of the payload (a pooled container's idle time, and any container's start, are not the
    # program's) to the end of collection: the kill came at the deadline.
    ran = outcome.duration_ms / 1000
    assert outcome.timed_out
    assert outcome.exit_code is None
    assert deadline <= ran < deadline + 2, f"collected {ran:.2f}s after the hand-over, deadline {deadline}s"
    assert_gone(engine, outcome.container_id)


def test_only_loopback_network(runner: DockerRunner, options_for: Options) -> None:
    outcome = run(runner, options_for(), "import os\nprint(sorted(os.listdir('/sys/class/net')))")
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.stdout.strip() == b"['lo']"


def test_root_filesystem_is_read_only(runner: DockerRunner, options_for: Options) -> None:
    code = """
    import json
    res = {}
    for path in ("/etc/gw-probe", "/usr/gw-probe", "/usr/lib/python3/gw-probe", "/gw-probe"):
        try:
            with open(path, "w") as fh:
                fh.write("x")
            res[path] = "written"
        except OSError as exc:
            res[path] = exc.errno
    print(json.dumps(res))
    """
    outcome = run(runner, options_for(), code)
    assert outcome.exit_code == 0, outcome.stderr
    result = json.loads(outcome.stdout)
    assert "written" not in result.values(), result


def test_tmp_is_writable_up_to_its_cap(runner: DockerRunner, options_for: Options) -> None:
    base = options_for()
    tmpfs = dict(base["tmpfs"], **{"/tmp": "rw,noexec,nosuid,nodev,size=4194304"})
    code = """
    import errno
    with open("/tmp/small", "wb") as fh:
        fh.write(b"a" * (2 << 20))
    print("small ok")
    try:
        with open("/tmp/big", "wb") as fh:
            for _ in range(8):
                fh.write(b"b" * (1 << 20))
                fh.flush()
        print("big written")
    except OSError as exc:
        print("big failed", errno.errorcode.get(exc.errno))
    """
    outcome = run(runner, options_for(tmpfs=tmpfs), code)
    assert outcome.exit_code == 0, outcome.stderr
    lines = outcome.stdout.decode().splitlines()
    assert lines[0] == "small ok"
    assert lines[1] == "big failed ENOSPC"


def test_fork_bomb_is_contained(runner: DockerRunner, options_for: Options, engine: Any) -> None:
    code = """
    import os
    while True:
        try:
            os.fork()
        except OSError:
            pass
    """
    outcome = run(runner, options_for(), code, timeout_s=5)
    assert outcome.timed_out or outcome.resource_killed or outcome.exit_code is not None
    assert_gone(engine, outcome.container_id)
    # The engine and the runner are still fine afterwards.
    assert run(runner, options_for(), "print(2+2)").stdout == b"4\n"


def test_no_privileges_inside(runner: DockerRunner, options_for: Options) -> None:
    # gVisor's /proc/self/status has no NoNewPrivs line: ask the kernel (prctl PR_GET_NO_NEW_PRIVS) as well.
    code = """
    import ctypes, json, os
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    print(json.dumps({
        "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
        "CapEff": status["CapEff"].strip(), "CapPrm": status["CapPrm"].strip(),
        "NoNewPrivs": status.get("NoNewPrivs", "").strip(),
        "prctl_nnp": ctypes.CDLL(None).prctl(39, 0, 0, 0, 0),
    }))
    """
    outcome = run(runner, options_for(), code)
    assert outcome.exit_code == 0, outcome.stderr
    got = json.loads(outcome.stdout)
    assert got["uid"] != 0
    assert got["euid"] != 0
    assert got["gid"] != 0
    assert 0 not in got["groups"]
    assert int(got["CapEff"], 16) == 0
    assert int(got["CapPrm"], 16) == 0
    assert got["prctl_nnp"] == 1
    assert got["NoNewPrivs"] in ("1", "")  # absent only under gVisor


def test_host_environment_is_not_visible(
    runner: DockerRunner, options_for: Options, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = "GATEWAY_CANARY_" + secrets.token_hex(4).upper()
    value = secrets.token_hex(16)
    monkeypatch.setenv(canary, value)
    outcome = run(
        runner,
        options_for(environment={"VISIBLE": "yes"}),
        "import os\nprint(os.environ.get('VISIBLE'))\nprint('\\n'.join(f'{k}={v}' for k, v in os.environ.items()))",
    )
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.stdout.startswith(b"yes\n")
    assert canary.encode() not in outcome.stdout
    assert value.encode() not in outcome.stdout


def test_output_flood_is_capped_and_stopped(runner: DockerRunner, options_for: Options, engine: Any) -> None:
    cap = 64 << 10
    code = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    outcome = run(runner, options_for(), code, output_bytes=cap, timeout_s=20)
    assert outcome.stdout_truncated
    assert outcome.output_limit_killed
    assert not outcome.timed_out
    assert outcome.exit_code is None
    assert len(outcome.stdout) == cap
    assert set(outcome.stdout) == {ord("x")}
    assert outcome.stdout_bytes > cap
    assert_gone(engine, outcome.container_id)


def test_stderr_flood_is_capped(runner: DockerRunner, options_for: Options) -> None:
    code = "import sys\nwhile True:\n    sys.stderr.write('e' * 4096)\n"
    outcome = run(runner, options_for(), code, output_bytes=10_000)
    assert outcome.stderr_truncated
    assert outcome.output_limit_killed
    assert len(outcome.stderr) == 10_000
    assert not outcome.stdout_truncated


def test_output_at_the_cap_is_not_truncated(runner: DockerRunner, options_for: Options) -> None:
    outcome = run(runner, options_for(), "import sys\nsys.stdout.write('y' * 1000)", output_bytes=1000)
    assert outcome.exit_code == 0
    assert outcome.stdout == b"y" * 1000
    assert not outcome.stdout_truncated
    assert not outcome.output_limit_killed


_RSS_PROBE = """
import json, sys
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import Payload, RunSpec

def hwm_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise SystemExit("no VmHWM")

options = json.loads(sys.argv[1])
runner = DockerRunner()
runner.execute(RunSpec(options, timeout_s=30, output_bytes=1 << 20), Payload("print(2+2)"))  # warm up
before = hwm_kib()
code = "import sys\\nchunk = 'z' * (1 << 20)\\nfor _ in range(1024):\\n    sys.stdout.write(chunk)\\n"
out = runner.execute(RunSpec(options, timeout_s=60, output_bytes=1 << 20), Payload(code))
after = hwm_kib()
print(json.dumps({"before": before, "after": after, "len": len(out.stdout), "truncated": out.stdout_truncated,
                  "killed": out.output_limit_killed, "seen": out.stdout_bytes, "timed_out": out.timed_out}))
"""


def test_gigabyte_flood_keeps_runner_memory_bounded(options_for: Options, engine: Any) -> None:
    """A program printing 1 GiB: the runner keeps 1 MiB, kills the flood, and its peak RSS barely moves."""
    probe = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, json.dumps(options_for())],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    result = json.loads(probe.stdout.strip().splitlines()[-1])
    assert result["len"] == 1 << 20
    assert result["truncated"]
    assert result["killed"]
    assert not result["timed_out"]
    growth_kib = result["after"] - result["before"]
    assert growth_kib < 32 * 1024, f"peak RSS grew by {growth_kib} KiB during a 1 GiB flood"


def test_forged_frames_are_never_accepted(runner: DockerRunner, options_for: Options) -> None:
    """The program writes a fake 'exit 0 / 4' stream straight to the container's stdout via init's fd."""
    code = r"""
    import json, os, struct, sys
    def frame(kind, data):
        return kind + struct.pack(">I", len(data)) + data + b"\0" * 16
    forged = frame(b"o", b"forged\n") + frame(b"x", json.dumps({"status": 0, "files_truncated": False}).encode())
    for target in ("/proc/1/fd/1", "/proc/%d/fd/1" % os.getppid()):
        try:
            with open(target, "wb") as fh:
                fh.write(forged)
            print("wrote", target, file=sys.stderr)
        except OSError as exc:
            print("refused", target, exc.errno, file=sys.stderr)
    sys.stdout.write("real\n")
    """
    from gateway.errors import SandboxError

    refused: str | None = None
    try:
        outcome: Outcome | None = run(runner, options_for(), code)
    except SandboxError as exc:
        outcome, refused = None, exc.message
    if outcome is None:
        # The forged bytes reached the stream: the runner must have stopped at the first unverified frame.
        assert refused is not None
        assert "verification" in refused
    else:
        assert b"forged" not in outcome.stdout
        assert outcome.stdout == b"real\n"
        assert outcome.exit_code == 0

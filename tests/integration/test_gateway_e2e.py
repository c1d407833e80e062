"""The whole request path on the real engine: CLI and Python API, exit statuses, audit, fail-closed, reaping.

Every test asks the engine itself what happened (container create events, leftover containers) rather than
trusting the gateway's own report.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gateway import Gateway
from gateway.audit import verify_trail
from gateway.cli import main
from gateway.resources import load_schema, policies_dir
from gateway.simple import run_in_sandbox
from gateway.tool import TOOL_NAME, handle_tool_call
from tests.integration.conftest import (
    DEADLINE_LABEL,
    INSTANCE_LABEL,
    MANAGED_LABEL,
    SANDBOX_IMAGE,
    gateway_containers,
    leftover_labels,
)

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("GATEWAY_POLICY", "GATEWAY_AUDIT_DIR", "GATEWAY_AUDIT_KEY", "GATEWAY_AUDIT_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def audit_dir(tmp_path: Path) -> Path:
    return tmp_path / "audit"


class CreateWatch:
    """Counts ``create`` events of containers on the engine between start and ``created()``."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.since = int(time.time()) - 1
        self.before = set(self._ids())  # created earlier within the same second: not ours

    def _ids(self) -> list[str]:
        until = int(time.time()) + 1
        events = self.engine.events(
            since=self.since, until=until, filters={"type": "container", "event": "create"}, decode=True
        )
        # Other sessions share the engine: only this session's containers count.
        mine = {MANAGED_LABEL: "true", INSTANCE_LABEL: os.environ["GATEWAY_INSTANCE"]}
        return [e["id"] for e in events if mine.items() <= e.get("Actor", {}).get("Attributes", {}).items()]

    def created(self) -> list[str]:
        return [i for i in self._ids() if i not in self.before]


@pytest.fixture
def watch(engine: Any) -> CreateWatch:
    return CreateWatch(engine)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_run_prints_4_and_leaves_a_verifiable_trail(
    engine: Any, audit_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run_cli(capsys, "run", "--audit-dir", str(audit_dir), "--code", "print(2+2)")
    assert (rc, out) == (0, "4\n")
    report = verify_trail(audit_dir)
    assert report.ok
    records = [json.loads(line) for seg in sorted(audit_dir.glob("*.jsonl")) for line in seg.read_text().splitlines()]
    kinds = [r["event_type"] for r in records]
    assert kinds == [
        "gateway.start", "policy.loaded", "request.received", "policy.decision", "execution.outcome", "gateway.stop",
    ]  # fmt: skip
    validator = Draft202012Validator(load_schema("audit-record"), format_checker=Draft202012Validator.FORMAT_CHECKER)
    for record in records:
        assert list(validator.iter_errors(record)) == [], record["event_type"]
    loaded = records[1]["data"]
    assert (loaded["name"], loaded["sha256"]) == ("default", records[3]["policy"]["sha256"])
    assert loaded["source"].endswith("policies/default.yaml")
    outcome = records[4]["data"]
    assert outcome["exit_code"] == 0
    assert outcome["image"] == SANDBOX_IMAGE
    assert outcome["image_id"] == engine.images.get(SANDBOX_IMAGE).id
    assert outcome["container_id"] not in gateway_containers(engine)


def test_cli_json_result_and_program_exit_code(audit_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(
        capsys, "run", "--json", "--audit-dir", str(audit_dir), "--code", "import sys; print('x'); sys.exit(3)"
    )
    result = json.loads(out)
    assert rc == 3
    assert result["exit_code"] == 3
    assert result["stdout"] == "x\n"
    assert result["allowed"] is True


def test_deadline_exit_124_and_the_container_is_gone(
    engine: Any, audit_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    start = time.monotonic()
    rc, out, _ = run_cli(
        capsys, "run", "--json", "--timeout", "2", "--audit-dir", str(audit_dir), "--code", "while True: pass"
    )
    elapsed = time.monotonic() - start
    result = json.loads(out)
    assert rc == 124
    assert result["timed_out"] is True
    assert elapsed < 2 + 2 + 3  # deadline + kill margin + CLI start-up; not a performance assert
    assert gateway_containers(engine) == []


def test_memory_exit_137(engine: Any, audit_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(
        capsys,
        "run",
        "--json",
        "--memory",
        "64m",
        "--audit-dir",
        str(audit_dir),
        "--code",
        "x = bytearray(1024 * 1024 * 1024)",
    )
    result = json.loads(out)
    assert rc == 137
    assert result["oom_killed"] is True
    assert gateway_containers(engine) == []


@pytest.mark.parametrize(
    "flags",
    [
        ["--image", "python:latest"],
        ["--memory", "64g"],
        ["--network", "host"],
        ["--mount", "/var/run/docker.sock:/sock"],
        ["--env", "LD_PRELOAD=/tmp/evil.so"],
        # A name the sandbox itself uses is refused by the decision, not by the runner after an allow.
        ["--file", f"{__file__}:main.py"],
        ["--file", f"{__file__}:out"],
    ],
)
def test_denied_requests_exit_77_and_create_no_container(
    watch: CreateWatch, audit_dir: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    rc, _, err = run_cli(capsys, "run", "--audit-dir", str(audit_dir), *flags, "--code", "print('never')")
    assert rc == 77
    assert "denied by policy" in err
    assert watch.created() == []
    decisions = [
        json.loads(line)
        for seg in audit_dir.glob("*.jsonl")
        for line in seg.read_text().splitlines()
        if '"policy.decision"' in line
    ]
    assert decisions[-1]["data"]["decision"]["allowed"] is False


def test_invalid_request_exits_2(watch: CreateWatch, audit_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(capsys, "run", "--audit-dir", str(audit_dir), "--mount", "nonsense", "--code", "1")
    assert rc == 2
    assert "--mount" in err
    assert watch.created() == []


def test_unwritable_trail_fails_closed_and_nothing_runs(
    watch: CreateWatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the trail directory should be")
    rc, _, err = run_cli(capsys, "run", "--audit-dir", str(blocker / "audit"), "--code", "print('never')")
    assert rc == 125
    assert "audit" in err
    assert watch.created() == []


def test_read_only_trail_filesystem_fails_closed(
    watch: CreateWatch, tiny_fs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fs = tiny_fs("size=1m,ro")
    rc, out, _ = run_cli(capsys, "run", "--json", "--audit-dir", str(fs), "--code", "print('never')")
    assert rc == 125
    assert json.loads(out)["error"]["code"] == "audit.unavailable"
    assert watch.created() == []


def test_full_trail_filesystem_fails_closed(
    watch: CreateWatch, tiny_fs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    fs = tiny_fs("size=64k")
    (fs / "ballast").write_bytes(b"\0" * (64 * 1024 - 4096))  # leave less room than one request's records
    big_code = "# " + "x" * 20_000 + "\nprint('never')"
    rc, out, _ = run_cli(capsys, "run", "--json", "--audit-dir", str(fs), "--code", big_code)
    assert rc == 125
    # Refused by the free-space watermark before the write (audit.low_space), or by the full disk itself.
    assert json.loads(out)["error"]["code"] in ("audit.low_space", "audit.unavailable")
    assert watch.created() == []


def test_plain_run_prints_warnings_on_stderr_and_the_query_table_marks_them(
    engine: Any, audit_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 13 defect 4: a warning of the decision was visible only with --json."""
    policy = Path(__file__).resolve().parents[1] / "policies" / "audit-warnings" / "policy.yaml"
    argv = ["run", "--policy", str(policy), "--audit-dir", str(audit_dir), "--memory", "600m", "--code", "print(2+2)"]
    rc, out, err = run_cli(capsys, *argv)
    assert (rc, out) == (0, "4\n")
    [line] = [x for x in err.splitlines() if x.startswith("gateway: warning:")]
    assert line.startswith("gateway: warning: limits.memory at $.limits.memory: ")
    rc, out, _ = run_cli(capsys, "audit", "query", "--audit-dir", str(audit_dir), "--event-type", "policy.decision")
    assert rc == 0
    assert out.splitlines()[1].endswith("allow warn:limits.memory")


def test_missing_engine_exits_125(audit_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    rc = main(["run", "--audit-dir", str(audit_dir), "--code", "print(1)"])
    assert rc == 125
    records = [json.loads(line) for seg in audit_dir.glob("*.jsonl") for line in seg.read_text().splitlines()]
    outcome = next(r for r in records if r["event_type"] == "execution.outcome")
    assert outcome["data"]["error"]["code"] == "runner.engine_unavailable"


def _mount_policy(tmp_path: Path, root: Path) -> Path:
    text = (policies_dir() / "examples" / "readonly-data-mount.yaml").read_text()
    policy = tmp_path / "mount-policy.yaml"
    policy.write_text(text.replace("/srv/agent-data", str(root)))
    return policy


def test_allowed_ro_mount_is_readable_not_writable_and_escapes_are_denied(
    watch: CreateWatch, shared_dir: Path, tmp_path: Path, audit_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (shared_dir / "input.csv").write_text("a,b\n1,2\n")
    (shared_dir / "input.csv").chmod(0o644)
    (shared_dir / "sock-link").symlink_to("/var/run/docker.sock")
    (shared_dir / "up").symlink_to("/etc")
    policy = _mount_policy(tmp_path, shared_dir)
    code = (
        "print(open('/data/input.csv').read(), end='')\n"
        "try:\n    open('/data/new.txt', 'w')\nexcept OSError as e:\n    print('write refused', e.errno)\n"
    )
    rc, out, err = run_cli(
        capsys, "run", "--policy", str(policy), "--audit-dir", str(audit_dir),
        "--mount", f"{shared_dir}:/data:ro", "--code", code,
    )  # fmt: skip
    assert rc == 0, err
    assert out == "a,b\n1,2\nwrite refused 30\n"  # EROFS
    assert not (shared_dir / "new.txt").exists()
    created_by_allowed = len(watch.created())
    for source in (shared_dir / "sock-link", shared_dir / "up", shared_dir / ".." / "etc", Path("/var/run")):
        rc, _, err = run_cli(
            capsys, "run", "--policy", str(policy), "--audit-dir", str(audit_dir),
            "--mount", f"{source}:/data:ro", "--code", "print(1)",
        )  # fmt: skip
        assert rc == 77, (source, err)
        assert "mounts" in err
    assert len(watch.created()) == created_by_allowed


def test_strict_policy_runs_under_gvisor(
    engine: Any, runtimes: tuple[str, ...], audit_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if "runsc" not in runtimes:
        pytest.fail("runsc is not registered with the engine; scripts/setup-engine.sh registers it")
    strict = policies_dir() / "strict.yaml"
    rc, out, err = run_cli(
        capsys, "run", "--json", "--policy", str(strict), "--audit-dir", str(audit_dir),
        "--code", "import os; print(2+2); print(open('/proc/version').read())",
    )  # fmt: skip
    result = json.loads(out)
    assert rc == 0, (result, err)
    assert result["stdout"].startswith("4\n")
    assert "gVisor" in result["stdout"] or "4.4.0" in result["stdout"]  # gVisor's synthetic kernel version
    records = [json.loads(line) for seg in audit_dir.glob("*.jsonl") for line in seg.read_text().splitlines()]
    decision = next(r for r in records if r["event_type"] == "policy.decision")
    assert decision["data"]["decision"]["options"]["runtime"] == "runsc"


def test_reap_removes_labelled_leftovers_and_audits_it(
    engine: Any, audit_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    leftover = engine.containers.create(SANDBOX_IMAGE, command=["true"], labels=leftover_labels())
    other = engine.containers.create(SANDBOX_IMAGE, command=["true"], labels={"someone.else": "true"})
    far = str(int(time.time()) + 3600)
    live = {MANAGED_LABEL: "true", INSTANCE_LABEL: "another-instance", DEADLINE_LABEL: far}
    expired = {**live, DEADLINE_LABEL: str(int(time.time()) - 3600)}
    live_other = engine.containers.create(SANDBOX_IMAGE, command=["true"], labels=live)
    expired_other = engine.containers.create(SANDBOX_IMAGE, command=["true"], labels=expired)
    try:
        rc, out, _ = run_cli(capsys, "reap", "--json", "--audit-dir", str(audit_dir))
        assert rc == 0
        removed = json.loads(out)["removed"]
        assert leftover.id in removed
        assert expired_other.id in removed  # past its deadline: anyone's to reap
        assert live_other.id not in removed  # another instance's live sandbox is left alone
        assert leftover.id not in gateway_containers(engine)
        all_ids = [c.id for c in engine.containers.list(all=True)]
        assert other.id in all_ids
        assert live_other.id in all_ids
        # (`reap --all` is tested in tests/unit/runner/test_runner_units.py: on a shared engine it would remove
        # other sessions' live sandboxes)
    finally:
        for container in (other, live_other, expired_other):
            with contextlib.suppress(Exception):
                container.remove(force=True)
    reaped = [
        json.loads(line)
        for seg in audit_dir.glob("*.jsonl")
        for line in seg.read_text().splitlines()
        if '"containers.reaped"' in line
    ]
    assert leftover.id in reaped[0]["data"]["container_ids"]
    assert reaped[0]["data"]["everything"] is False


def test_python_helper_and_llm_tool(engine: Any, audit_dir: Path) -> None:
    assert run_in_sandbox("print(2+2)", timeout=10, audit_dir=audit_dir) == {"success": True, "output": "4\n"}
    denied = run_in_sandbox("print(1)", timeout=1000, audit_dir=audit_dir)
    assert denied["success"] is False
    assert "limits.timeout" in denied["error"]
    os.environ["GATEWAY_AUDIT_DIR"] = str(audit_dir)
    try:
        answer = handle_tool_call(TOOL_NAME, {"code": "import os; print(os.getuid())"})
    finally:
        del os.environ["GATEWAY_AUDIT_DIR"]
    assert answer["ok"] is True
    assert answer["stdout"] == "65534\n"
    assert verify_trail(audit_dir).ok


def test_otel_console_exports_the_span_tree(audit_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(capsys, "run", "--otel", "console", "--audit-dir", str(audit_dir), "--code", "print(2+2)")
    assert (rc, out) == (0, "4\n")
    for name in ('"gateway.execute"', '"policy.evaluate"', '"audit.append"', '"sandbox.run"'):
        assert name in err
    assert '"process.exit.code": 0' in err
    records = [json.loads(line) for seg in audit_dir.glob("*.jsonl") for line in seg.read_text().splitlines()]
    decision = next(r for r in records if r["event_type"] == "policy.decision")
    assert decision["trace_id"] in err.replace("0x", "")


FIRST_DOCTOR = ["policy", "audit", "engine", "gvisor", "mounts", "image", "sbom"]
DAEMON_CHECKS = [
    "live_restore",
    "userns_remap",
    "no_new_privileges",
    "default_bridge",
    "authz_plugin",
    "seccomp",
    "engine_version",
    "runc_version",
    "runsc_host_uds",
]


def test_doctor_reports_every_check(
    engine: Any, audit_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Doctor on this machine, against the real engine: every check, exit 1 exactly when one FAILs."""
    monkeypatch.setenv("GATEWAY_STATE_DIR", str(audit_dir.parent / "state"))  # the image's SBOM, recorded here
    assert main(["sbom", "--image", SANDBOX_IMAGE, "--record"]) == 0
    capsys.readouterr()
    rc, out, _ = run_cli(capsys, "doctor", "--json", "--audit-dir", str(audit_dir))
    report = json.loads(out)
    names = [c["name"] for c in report["checks"]]
    assert names == [*FIRST_DOCTOR, *DAEMON_CHECKS, "audit_permissions", "workspaces", "config", "principals"]
    for check in report["checks"]:
        assert check["status"] in ("PASS", "WARN", "FAIL"), check
        assert check["ok"] is (check["status"] != "FAIL"), check
        assert bool(check["remediation"]) is (check["status"] != "PASS"), check
        assert check["detail"], check
    failed = [c["name"] for c in report["checks"] if c["status"] == "FAIL"]
    assert rc == (1 if failed else 0), failed
    assert report["ok"] is (not failed)
    by_name = {c["name"]: c for c in report["checks"]}
    assert all(by_name[name]["status"] == "PASS" for name in FIRST_DOCTOR), report
    image = by_name["image"]
    assert engine.images.get(SANDBOX_IMAGE).id in image["detail"]
    # what the engine says, asked independently of doctor
    info = engine.info()
    assert (by_name["live_restore"]["status"] == "PASS") is (info.get("LiveRestoreEnabled") is True)
    has_bridge = any(n.name == "bridge" for n in engine.networks.list(names=["bridge"]))
    if not has_bridge:  # this machine runs dockerd --bridge=none
        assert by_name["default_bridge"]["status"] == "PASS"
        assert "no default bridge" in by_name["default_bridge"]["detail"]
    options = info.get("SecurityOptions") or []
    assert (by_name["seccomp"]["status"] == "PASS") is any(
        o.startswith("name=seccomp") and "unconfined" not in o for o in options
    )
    assert (by_name["authz_plugin"]["status"] == "PASS") is bool(info["Plugins"].get("Authorization"))
    assert info["RuncCommit"]["ID"] in by_name["runc_version"]["detail"]
    runsc_args = (info["Runtimes"].get("runsc") or {}).get("runtimeArgs") or []
    assert (by_name["runsc_host_uds"]["status"] == "PASS") is ("--host-uds=open" in runsc_args)
    assert engine.version()["Version"] in by_name["engine_version"]["detail"]


def test_doctor_checks_the_configured_files(
    engine: Any, audit_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "agent.yaml"
    policy.write_text((policies_dir() / "default.yaml").read_text())
    principals = tmp_path / "principals.yaml"
    assert main(["principals", "add", "agent-a", "--policy", str(policy), "--principals", str(principals)]) == 0
    capsys.readouterr()
    base = ("doctor", "--json", "--audit-dir", str(audit_dir), "--principals", str(principals))
    _rc, out, _ = run_cli(capsys, *base)
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["principals"]["status"] == "PASS"
    assert "1 principal(s), 1 policy file(s) valid" in checks["principals"]["detail"]

    policy.write_text("apiVersion: nonsense\n")  # the principal's policy no longer loads
    rc, out, _ = run_cli(capsys, *base)
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert rc == 1
    assert checks["principals"]["status"] == "FAIL"
    assert "agent-a" in checks["principals"]["detail"]

    config = tmp_path / "server.yaml"
    config.write_text("port: not-a-port\n")
    rc, out, _ = run_cli(capsys, "doctor", "--json", "--audit-dir", str(audit_dir), "--config", str(config))
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert rc == 1
    assert checks["config"]["status"] == "FAIL"
    assert str(config) in checks["config"]["detail"]


def test_doctor_fails_on_a_broken_trail(audit_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--audit-dir", str(audit_dir), "--code", "print(1)"]) == 0
    segment = next(audit_dir.glob("*.jsonl"))
    data = bytearray(segment.read_bytes())
    data[40] ^= 0x01  # one flipped bit in the first record
    segment.write_bytes(bytes(data))
    capsys.readouterr()
    rc, out, _ = run_cli(capsys, "doctor", "--json", "--audit-dir", str(audit_dir))
    report = json.loads(out)
    assert rc == 1
    audit = next(c for c in report["checks"] if c["name"] == "audit")
    assert audit["ok"] is False
    assert "broken" in audit["detail"]


def test_one_sandbox_at_its_process_limit_does_not_starve_another(engine: Any, audit_dir: Path) -> None:
    """All sandboxes share one uid; a per-uid limit (RLIMIT_NPROC) would let one fork bomb stop the others."""
    bomb = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(8); os._exit(0)\n"
        "        n += 1\n"
        "except OSError:\n"
        "    print('held', n, flush=True)\n"
        "time.sleep(6)\n"
    )
    neighbour = (
        "import subprocess\nprint(subprocess.run(['python3', '-c', 'print(41 + 1)'], capture_output=True).stdout)"
    )
    results: dict[str, Any] = {}
    with Gateway.from_env(audit_dir=audit_dir) as gw:
        thread = threading.Thread(
            target=lambda: results.setdefault("bomb", gw.execute({"code": bomb, "limits": {"timeout_s": 15}}))
        )
        thread.start()
        try:
            time.sleep(3)  # let the bomb reach its pids limit
            neighbour_result = gw.execute({"code": neighbour})
        finally:
            thread.join()
    assert results["bomb"].to_dict()["stdout"].startswith("held")
    assert neighbour_result.exit_status == 0, neighbour_result.to_dict()
    assert neighbour_result.to_dict()["stdout"] == "b'42\\n'\n"
    assert gateway_containers(engine) == []


def test_a_program_cannot_kill_its_supervisor(engine: Any, audit_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The supervisor is the container's PID 1: the gateway's seccomp profile refuses the kill (and under runc
    # the kernel would drop it anyway), and the program's own exit is reported.
    code = (
        "import os, signal\nprint('bye', flush=True)\n"
        "try:\n    os.kill(os.getppid(), signal.SIGKILL)\nexcept PermissionError:\n    print('refused', flush=True)\n"
        "os._exit(3)"
    )
    rc, out, err = run_cli(capsys, "run", "--json", "--audit-dir", str(audit_dir), "--code", code)
    result = json.loads(out)
    assert rc == 3, (result, err)
    assert result["exit_code"] == 3
    assert result["stdout"] == "bye\nrefused\n"
    assert result["resource_killed"] is False
    assert gateway_containers(engine) == []

"""Host-level bounds on the real engine: no engine log on the host disk, nothing executable on the sandbox's
writable file systems, a host-wide bound on concurrent sandboxes, and exit statuses that say what happened."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import Payload, RunSpec

pytestmark = pytest.mark.integration

Options = Callable[..., dict[str, Any]]
ROOT = Path(__file__).resolve().parents[2]


def test_containers_are_created_with_the_engine_log_off(runner: DockerRunner, options_for: Options) -> None:
    """Every byte a program prints travels only through the capped attach stream, never into an uncapped
    engine log on the host disk."""
    sandbox = runner.prepare(RunSpec(options_for(), timeout_s=20, output_bytes=1 << 20))
    try:
        info = runner.client.api.inspect_container(sandbox.container_id)
        assert info["HostConfig"]["LogConfig"]["Type"] == "none"
        assert info["LogPath"] == ""  # no log file on the host
        with pytest.raises(docker.errors.APIError, match="does not support reading"):
            runner.client.api.logs(sandbox.container_id)
    except BaseException:
        sandbox.close()
        runner.reap()
        raise
    outcome = runner.run(sandbox, Payload("print('x' * 1000)"))
    assert outcome.stdout == b"x" * 1000 + b"\n"


EXEC_ATTEMPTS = """
import json, os, shutil, subprocess
results = {}
for where in ("/tmp", "/workspace", "/workspace/out"):
    script = where + "/run.sh"
    with open(script, "w") as f:
        f.write("#!/bin/sh\\necho ran\\n")
    os.chmod(script, 0o755)
    binary = where + "/true"
    shutil.copy("/bin/true", binary)
    os.chmod(binary, 0o755)
    for path in (script, binary):
        try:
            subprocess.run([path], check=False)
            results[path] = "executed"
        except PermissionError:
            results[path] = "refused"
print(json.dumps(results))
"""


def test_nothing_written_to_tmp_or_the_workspace_can_be_executed(runner: DockerRunner, options_for: Options) -> None:
    outcome = runner.execute(
        RunSpec(options_for(), timeout_s=30, output_bytes=1 << 20), Payload(textwrap.dedent(EXEC_ATTEMPTS))
    )
    assert outcome.exit_code == 0, outcome.stderr
    results = json.loads(outcome.stdout)
    assert len(results) == 6
    assert set(results.values()) == {"refused"}, results


# --- the host-wide bound on concurrent sandboxes ---------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a `gateway` CLI process: one slot on this host, a trail in tmp_path."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "GATEWAY_AUDIT_DIR": str(tmp_path / "audit"),
        "GATEWAY_RUNTIME_DIR": str(tmp_path / "runtime"),
        "GATEWAY_SLOTS": "1",
    }


def start_cli(env: dict[str, str], code: str, *args: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "run", "--json", *args, "--code", code],
        env={**env, **extra},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any]]:
    out, err = proc.communicate(timeout=120)
    assert out, err
    return proc.returncode, json.loads(out)


@pytest.fixture
def first_running(managed_containers: Callable[[], list[str]]) -> Callable[[subprocess.Popen[str]], None]:
    def wait(proc: subprocess.Popen[str]) -> None:
        for _ in range(600):
            if managed_containers() or proc.poll() is not None:
                return
            time.sleep(0.05)

    return wait


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
        proc.communicate(timeout=60)


def test_a_run_over_the_hosts_slot_count_is_refused_after_a_bounded_wait(
    cli_env: dict[str, str],
    first_running: Callable[[subprocess.Popen[str]], None],
    managed_containers: Callable[[], list[str]],
    procs: list[subprocess.Popen[str]],
) -> None:
    # Long enough that the second CLI meets the slot held even after seconds of start-up on a loaded machine.
    first = start_cli(cli_env, "import time; time.sleep(15); print('first')", "--timeout", "40")
    procs.append(first)
    first_running(first)
    assert first.poll() is None
    held = managed_containers()
    assert len(held) == 1
    second = start_cli(cli_env, "print('second')", GATEWAY_SLOT_WAIT="0.5")
    procs.append(second)
    rc, result = finish(second)
    assert rc == 125
    assert result["error"]["code"] == "gateway.capacity"
    assert "execution slots of this host" in result["error"]["message"]
    assert managed_containers() == held  # the refused run never created a container
    rc, result = finish(first)
    assert (rc, result["stdout"]) == (0, "first\n")
    audit = Path(cli_env["GATEWAY_AUDIT_DIR"])
    outcomes = [
        json.loads(line)["data"]
        for seg in sorted(audit.glob("*.jsonl"))
        for line in seg.read_text().splitlines()
        if '"execution.outcome"' in line
    ]
    assert sorted(str((o["error"] or {}).get("code")) for o in outcomes) == ["None", "gateway.capacity"]


def test_a_run_waiting_for_a_slot_starts_only_after_the_holder_ended(
    cli_env: dict[str, str], first_running: Callable[[subprocess.Popen[str]], None], procs: list[subprocess.Popen[str]]
) -> None:
    first = start_cli(cli_env, "import time; time.sleep(3); print(time.time())")
    procs.append(first)
    first_running(first)
    second = start_cli(cli_env, "import time; print(time.time())", GATEWAY_SLOT_WAIT="90")
    procs.append(second)
    rc2, second_result = finish(second)
    rc1, first_result = finish(first)
    assert (rc1, rc2) == (0, 0), (first_result, second_result)
    # one slot: the waiting program started only after the first one had finished
    assert float(second_result["stdout"]) > float(first_result["stdout"])


# --- exit statuses that say what happened ----------------------------------------------------------------


def test_an_output_flood_is_killed_with_137_and_reported_as_such(cli_env: dict[str, str]) -> None:
    proc = start_cli(cli_env, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    rc, result = finish(proc)
    assert rc == 137, result
    assert result["output_limit_killed"] is True
    assert result["stdout_truncated"] is True
    assert result["exit_code"] is None  # the program did not exit on its own
    assert result["error"] is None  # not a gateway failure

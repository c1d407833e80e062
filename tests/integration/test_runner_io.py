"""Files in and out, mounts, refusals that create no container, and the reaper, on the real engine."""

from __future__ import annotations

import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.errors import ImageMissingError, UnsafeOptionsError
from gateway.request import parse_request
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import Outcome, Payload, RunSpec
from gateway.testing import decide
from tests.conftest import mount_policy

pytestmark = pytest.mark.integration

Options = Callable[..., dict[str, Any]]


def run(runner: DockerRunner, options: dict[str, Any], code: str, **kw: Any) -> Outcome:
    files = kw.pop("files", {})
    spec = RunSpec(options, timeout_s=kw.pop("timeout_s", 20), output_bytes=1 << 20, **kw)
    return runner.execute(spec, Payload(textwrap.dedent(code), files=files))


def test_files_in_and_out_are_binary_safe(runner: DockerRunner, options_for: Options) -> None:
    blob = bytes(range(256)) * 64
    code = """
    import os
    data = open("inputs/blob.bin", "rb").read()
    open("out/reversed.bin", "wb").write(data[::-1])
    os.makedirs("out/deep/er")
    open("out/deep/er/note.txt", "w").write("héllo")
    print(len(data), open("quoted.txt").read())
    """
    tricky = 'it\'s "quoted" $(echo nope) `x` \\ \n'
    outcome = run(runner, options_for(), code, files={"inputs/blob.bin": blob, "quoted.txt": tricky.encode()})
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.stdout == f"{len(blob)} {tricky}\n".encode()
    assert outcome.files == {"reversed.bin": blob[::-1], "deep/er/note.txt": "héllo".encode()}
    assert not outcome.files_truncated


def test_output_files_are_capped(runner: DockerRunner, options_for: Options) -> None:
    code = "open('out/a', 'wb').write(b'a' * 600)\nopen('out/b', 'wb').write(b'b' * 600)\n"
    outcome = run(runner, options_for(), code, output_files_bytes=1000)
    assert outcome.exit_code == 0
    assert outcome.files == {"a": b"a" * 600}
    assert outcome.files_truncated


def mounted_spec(runtime: str, source: Path, target: str, mode: str) -> RunSpec:
    """The run specification the decision makes for one mount (options with the staged bind, judged mounts)."""
    policy = mount_policy(source, targets=("/data", "/results"))
    request = {"code": "x", "runtime": runtime, "mounts": [{"source": str(source), "target": target, "mode": mode}]}
    decision = decide(policy, parse_request(request))
    assert decision.run is not None, [v.message for v in decision.violations]
    return decision.run


def test_read_only_mount_is_readable_not_writable(runner: DockerRunner, runtime: str, shared_dir: Path) -> None:
    (shared_dir / "input.txt").write_text("from the host")
    (shared_dir / "input.txt").chmod(0o644)
    code = """
    print(open("/data/input.txt").read())
    try:
        open("/data/new.txt", "w").write("x")
        print("written")
    except OSError as exc:
        print("refused", exc.errno)
    """
    spec = mounted_spec(runtime, shared_dir, "/data", "ro")
    outcome = runner.execute(spec, Payload(textwrap.dedent(code)))
    assert outcome.exit_code == 0, outcome.stderr
    lines = outcome.stdout.decode().splitlines()
    assert lines[0] == "from the host"
    assert lines[1].startswith("refused")
    assert not (shared_dir / "new.txt").exists()


def test_rw_mount_keeps_what_is_written(runner: DockerRunner, runtime: str, shared_dir: Path) -> None:
    shared_dir.chmod(0o777)
    spec = mounted_spec(runtime, shared_dir, "/results", "rw")
    outcome = runner.execute(spec, Payload("open('/results/kept.bin', 'wb').write(bytes([0, 255, 10]))\n"))
    assert outcome.exit_code == 0, outcome.stderr
    assert (shared_dir / "kept.bin").read_bytes() == bytes([0, 255, 10])


def test_missing_image_creates_no_container(
    runner: DockerRunner, make_options: Options, managed_containers: Callable[[], list[str]]
) -> None:
    before = managed_containers()
    with pytest.raises(ImageMissingError) as info:
        run(runner, make_options(image="gateway/no-such-image:never"), "print(1)")
    assert "scripts/build-image.sh" in info.value.message
    assert managed_containers() == before


def test_pull_from_unreachable_registry_fails_cleanly(
    runner: DockerRunner, make_options: Options, managed_containers: Callable[[], list[str]]
) -> None:
    """``if-missing`` tries the registry; a loopback address nobody listens on keeps this test local."""
    before = managed_containers()
    with pytest.raises(ImageMissingError) as info:
        run(runner, make_options(image="127.0.0.1:9/gateway/absent:1"), "print(1)", pull="if-missing")
    assert "pulling it failed" in info.value.message
    assert managed_containers() == before


@pytest.mark.parametrize(
    "override",
    [{"privileged": True}, {"network_mode": "host"}, {"cap_drop": []}, {"user": "0:0"}],
    ids=["privileged", "host-network", "caps-kept", "root"],
)
def test_unsafe_options_create_no_container(
    runner: DockerRunner, make_options: Options, managed_containers: Callable[[], list[str]], override: dict[str, Any]
) -> None:
    before = managed_containers()
    with pytest.raises(UnsafeOptionsError):
        run(runner, make_options(**override), "print(1)")
    assert managed_containers() == before


def test_reap_removes_leftover_containers(
    runner: DockerRunner, make_options: Options, managed_containers: Callable[[], list[str]]
) -> None:
    sandbox = runner.prepare(RunSpec(make_options(), timeout_s=5, output_bytes=100))
    assert sandbox.container_id in managed_containers()
    labels = runner.client.api.inspect_container(sandbox.container_id)["Config"]["Labels"]
    assert labels["io.agent-gateway.instance"] == runner.instance
    assert time.time() < int(labels["io.agent-gateway.deadline"]) <= time.time() + 7
    removed = runner.reap()
    sandbox.close()
    assert sandbox.container_id in removed
    assert sandbox.container_id not in managed_containers()


def test_prepared_sandbox_answers_one_payload(
    runner: DockerRunner, make_options: Options, managed_containers: Callable[[], list[str]]
) -> None:
    sandbox = runner.prepare(RunSpec(make_options(), timeout_s=10, output_bytes=100))
    outcome = runner.run(sandbox, Payload("print('warm')"))
    assert outcome.stdout == b"warm\n"
    assert sandbox.container_id not in managed_containers()

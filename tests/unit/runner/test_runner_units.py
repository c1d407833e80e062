"""Engine-free behaviour of the runner: payload/spec validation, the fake runner, and the Docker runner's
refusals that must happen before any container exists (checked with a recording client, not for security)."""

from __future__ import annotations

import marshal
from typing import Any

import docker.errors
import pytest

from gateway.errors import (
    ContractError,
    EngineUnavailableError,
    ImageMissingError,
    SandboxError,
    UnsafeOptionsError,
)
from gateway.payload import file_name_problem
from gateway.policy import load_policy
from gateway.request import parse_request
from gateway.resources import policies_dir
from gateway.runner import FakeRunner, Outcome, Payload, Runner, RunSpec
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.fake import make_outcome
from gateway.testing import assemble

# What the gateway would really hand the runner for a plain request under the default policy.
OPTIONS: dict[str, Any] = assemble(
    load_policy(policies_dir() / "default.yaml"), parse_request({"code": "pass"}), decision_id="d", request_id="r"
)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("a.txt", True),
        ("dir/sub/b.bin", True),
        ("out/x", True),
        ("", False),
        ("/etc/passwd", False),
        ("../x", False),
        ("a/../b", False),
        ("a//b", False),
        ("./a", False),
        ("a\\b", False),
        ("main.py", False),
        ("main.py/x", False),
        ("out", False),
        ("nul\x00", False),
        ("tab\tname", False),
        ("a" * 256, False),
    ],
)
def test_relative_paths(name: str, ok: bool) -> None:
    assert (file_name_problem(name) is None) is ok


def test_payload_reports_every_problem() -> None:
    with pytest.raises(ContractError) as info:
        Payload("x", language="ruby", files={"../a": b"", "b": "text"})  # type: ignore[dict-item]
    paths = sorted(p.path for p in info.value.problems)
    assert paths == ["$.files['../a']", "$.files['b']", "$.language"]


@pytest.mark.parametrize(
    ("kwargs", "path"),
    [
        ({"timeout_s": 0, "output_bytes": 1}, "$.timeout_s"),
        ({"timeout_s": 1, "output_bytes": -1}, "$.output_bytes"),
        ({"timeout_s": 1, "output_bytes": 1, "pull": "always"}, "$.pull"),
        ({"timeout_s": 1, "output_bytes": 1, "output_files_bytes": -5}, "$.output_files_bytes"),
        ({"timeout_s": 1, "output_bytes": 1, "output_files": -1}, "$.output_files"),
    ],
)
def test_runspec_validation(kwargs: dict[str, Any], path: str) -> None:
    with pytest.raises(ContractError) as info:
        RunSpec(OPTIONS, **kwargs)
    assert [p.path for p in info.value.problems] == [path]


def test_runspec_needs_an_image() -> None:
    with pytest.raises(ContractError):
        RunSpec({}, timeout_s=1, output_bytes=1)


def test_outcome_to_dict_is_json_friendly() -> None:
    out = make_outcome(stdout=b"4\n", files={"r.bin": b"\x00\x01"})
    d = out.to_dict()
    assert d["stdout"] == "4\n"
    assert d["stdout_bytes"] == 2
    assert d["files"] == {"r.bin": 2}


def test_fake_runner_records_calls_and_answers_deterministically() -> None:
    fake = FakeRunner()
    assert isinstance(fake, Runner)
    spec = RunSpec(OPTIONS, timeout_s=5, output_bytes=100)
    out = fake.execute(spec, Payload("print(2+2)"))
    assert out.stdout == b"4\n"
    assert out.exit_code == 0
    assert fake.calls == [(spec, Payload("print(2+2)"))]
    assert not fake.live


def test_fake_runner_scripted_outcomes_and_errors() -> None:
    spec = RunSpec(OPTIONS, timeout_s=5, output_bytes=100)
    timed_out = make_outcome(exit_code=None, timed_out=True)
    fake = FakeRunner(outcome=[timed_out, make_outcome(exit_code=3)])
    first = fake.execute(spec, Payload("a"))
    second = fake.execute(spec, Payload("b"))
    assert (first.timed_out, second.exit_code) == (True, 3)
    with pytest.raises(SandboxError):
        fake.execute(spec, Payload("c"))
    assert not fake.live
    with pytest.raises(EngineUnavailableError):
        FakeRunner(error=EngineUnavailableError("down")).execute(spec, Payload("x"))
    with pytest.raises(ImageMissingError):
        FakeRunner(images={}).execute(spec, Payload("x"))
    sandbox = FakeRunner().prepare(spec)
    runner = FakeRunner()
    leftover = runner.prepare(spec)
    assert runner.reap() == [leftover.container_id]
    assert sandbox.container_id is not None


class RecordingAPI:
    """Answers image inspection; records (and refuses) everything else. Not an engine."""

    _version = "1.41"

    def __init__(self, images: dict[str, str]) -> None:
        self.images = images
        self.calls: list[str] = []

    def inspect_image(self, image: str) -> dict[str, str]:
        self.calls.append("inspect_image")
        if image not in self.images:
            raise docker.errors.ImageNotFound(f"No such image: {image}")
        return {"Id": self.images[image]}

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            raise AssertionError(f"unexpected engine call {name}")

        return record


class RecordingClient:
    def __init__(self, images: dict[str, str]) -> None:
        self.api = RecordingAPI(images)
        self.images = self
        self.pulled: list[str] = []

    def pull(self, image: str) -> None:
        self.pulled.append(image)
        raise docker.errors.APIError("500 Server Error", explanation="dial tcp 127.0.0.1:9: connection refused")


def test_missing_image_is_a_clear_error_before_any_container() -> None:
    client = RecordingClient({})
    runner = DockerRunner(client)
    with pytest.raises(ImageMissingError) as info:
        runner.execute(RunSpec(OPTIONS, timeout_s=5, output_bytes=100), Payload("print(1)"))
    assert f"build it locally with scripts/build-image.sh {OPTIONS['image']}" in info.value.message
    assert client.api.calls == ["inspect_image"]
    assert client.pulled == []


def test_failed_pull_is_a_clear_error_before_any_container() -> None:
    client = RecordingClient({})
    runner = DockerRunner(client)
    spec = RunSpec(dict(OPTIONS, image="127.0.0.1:9/x:y"), timeout_s=5, output_bytes=100, pull="if-missing")
    with pytest.raises(ImageMissingError) as info:
        runner.execute(spec, Payload("print(1)"))
    assert "pulling it failed" in info.value.message
    assert "connection refused" in info.value.message
    assert client.pulled == ["127.0.0.1:9/x:y"]
    assert "create_container" not in client.api.calls


@pytest.mark.parametrize("key", ["command", "entrypoint", "tty", "stdin_open", "log_config"])
def test_runner_owned_keys_in_options_are_refused(key: str) -> None:
    client = RecordingClient({OPTIONS["image"]: "sha256:" + "1" * 64})
    with pytest.raises(UnsafeOptionsError):
        DockerRunner(client).prepare(RunSpec(dict(OPTIONS, **{key: ["sh"]}), timeout_s=5, output_bytes=100))
    assert client.api.calls == []


def test_unreachable_engine_is_engine_unavailable(tmp_path: Any) -> None:
    runner = DockerRunner(base_url=f"unix://{tmp_path}/no-such.sock")
    with pytest.raises(EngineUnavailableError):
        runner.image_id("anything")


def test_outcome_fields_are_frozen() -> None:
    out: Outcome = make_outcome()
    with pytest.raises(AttributeError):
        out.exit_code = 1  # type: ignore[misc]


def test_the_attach_socket_assumption_holds() -> None:
    # docker-py's attach_socket hands back the response's raw socket.SocketIO for a unix socket; the runner needs
    # the socket under it (per-call timeouts, a half-close). No public docker-py path gives it, so pin the
    # assumption: the stdlib SocketIO keeps it as _sock, and _raw_socket finds it.
    import socket

    from gateway.runner.docker.runner import _raw_socket

    left, right = socket.socketpair()
    try:
        io = socket.SocketIO(left, "rwb")
        assert _raw_socket(io) is left
        assert _raw_socket(left) is left
        with pytest.raises(SandboxError):
            _raw_socket(object())
    finally:
        left.close()
        right.close()


class ListingAPI:
    """Lists a fixed set of gateway containers and records removals. Not an engine."""

    def __init__(self, containers: list[dict[str, Any]]) -> None:
        self.listed = containers
        self.removed: list[str] = []

    def containers(self, *, all: bool, filters: dict[str, str]) -> list[dict[str, Any]]:
        assert all
        assert filters == {"label": "io.agent-gateway.managed=true"}
        return self.listed

    def remove_container(self, container_id: str, *, force: bool) -> None:
        assert force
        self.removed.append(container_id)


def test_reap_takes_its_own_and_expired_containers_and_all_only_when_asked() -> None:
    now = 1_800_000_000

    def labels(instance: str | None = None, deadline: int | None = None) -> dict[str, str]:
        out = {"io.agent-gateway.managed": "true"}
        if instance is not None:
            out["io.agent-gateway.instance"] = instance
        if deadline is not None:
            out["io.agent-gateway.deadline"] = str(deadline)
        return out

    listed = [
        {"Id": "mine", "Labels": labels("me", now + 600)},
        {"Id": "theirs-live", "Labels": labels("other", now + 600)},
        {"Id": "theirs-expired", "Labels": labels("other", now - 600)},
        {"Id": "unlabelled", "Labels": labels()},
    ]
    client = type("Client", (), {})()
    client.api = ListingAPI(listed)
    assert DockerRunner(client, instance="me", clock=lambda: now).reap() == ["mine", "theirs-expired", "unlabelled"]
    client.api = ListingAPI(listed)
    assert DockerRunner(client, instance="me", clock=lambda: now).reap(everything=True) == [c["Id"] for c in listed]


class _ScriptedSocket:
    """The attach socket of a run that reported completely: the supervisor's ``frames``, then nothing more. Like
    the supervisor, it learns the run's frame key from the payload the runner sends it."""

    def __init__(self, frames: list[tuple[bytes, bytes]]) -> None:
        self.frames = frames
        self.data = b""
        self.sent = b""
        self.shut = False

    def recv(self, n: int) -> bytes:
        chunk, self.data = self.data[:n], self.data[n:]
        return chunk

    def sendall(self, data: bytes) -> None:
        from gateway.runner.frames import encode_frame

        self.sent += data
        key = marshal.loads(self.sent[8:])["key"]  # noqa: S302 - the payload: magic, length, then marshal data
        body = b"".join(encode_frame(key, i, kind, chunk) for i, (kind, chunk) in enumerate(self.frames))
        self.data = b"\x01\x00\x00\x00" + len(body).to_bytes(4, "big") + body  # one stdout block, multiplexed

    def settimeout(self, t: float) -> None:
        pass

    def shutdown(self, how: int) -> None:
        self.shut = True

    def close(self) -> None:
        pass


class _StuckAPI:
    """An engine whose container cannot be removed after the run (scripted; not an engine)."""

    _version = "1.41"

    def __init__(self, sock: _ScriptedSocket) -> None:
        self.sock = sock

    def inspect_image(self, image: str) -> dict[str, str]:
        return {"Id": "sha256:" + "1" * 64}

    def create_host_config(self, **kw: Any) -> dict[str, Any]:
        return kw

    def create_container(self, **kw: Any) -> dict[str, str]:
        return {"Id": "c" * 64}

    def attach_socket(self, *a: Any, **kw: Any) -> _ScriptedSocket:
        return self.sock

    def start(self, cid: str) -> None:
        pass

    def inspect_container(self, cid: str) -> dict[str, Any]:
        return {"State": {"Running": True, "OOMKilled": False}}

    def remove_container(self, cid: str, force: bool) -> None:
        raise docker.errors.APIError("500 Server Error", explanation="could not kill: device or resource busy")


def test_a_container_left_after_a_complete_run_keeps_the_programs_report() -> None:
    from gateway.errors import ContainerLeftError
    from gateway.runner.frames import FRAME_EXIT, FRAME_META, FRAME_STDOUT

    frames = [(FRAME_STDOUT, b"42\n"), (FRAME_META, b'{"oom_killed":false}'), (FRAME_EXIT, b'{"status":0}')]
    sock = _ScriptedSocket(frames)
    client = type("Client", (), {"api": _StuckAPI(sock)})()
    with pytest.raises(ContainerLeftError) as info:
        DockerRunner(client).execute(RunSpec(OPTIONS, timeout_s=5, output_bytes=100), Payload("print(42)"))
    outcome = info.value.outcome
    assert outcome.stdout == b"42\n"
    assert outcome.exit_code == 0
    assert outcome.container_id == "c" * 64
    assert "could not be removed" in info.value.message
    assert info.value.code == "runner.container_left"
    assert not sock.shut  # stdin stays open for the whole run: its EOF tells the supervisor the host is gone


def test_the_supervisors_oom_report_counts_when_the_engine_no_longer_knows() -> None:
    from gateway.runner.frames import FRAME_EXIT, FRAME_META, Collected, outcome_of, take_frame

    got = Collected()
    spec = RunSpec(OPTIONS, timeout_s=5, output_bytes=100)
    take_frame(FRAME_META, b'{"oom_killed": true}', got, spec)
    take_frame(FRAME_EXIT, b'{"status": 137}', got, spec)
    out = outcome_of(got, {}, 1, runtime="runc", container_id="c", image_id=None, pulled=False)
    assert (out.oom_killed, out.exit_code) == (True, 137)


def test_the_host_refuses_more_output_files_or_name_bytes_than_the_caps() -> None:
    """An honest supervisor stops at both caps; a stream with more names is tampering (item 5)."""
    from gateway.runner.frames import FRAME_FILE_NAME, Collected, ProtocolError, take_frame

    spec = RunSpec(OPTIONS, timeout_s=1, output_bytes=1, output_files_bytes=1 << 20, output_files=2)
    got = Collected()
    take_frame(FRAME_FILE_NAME, b"a", got, spec)
    take_frame(FRAME_FILE_NAME, b"b", got, spec)
    with pytest.raises(ProtocolError, match="more output files than the cap of 2"):
        take_frame(FRAME_FILE_NAME, b"c", got, spec)
    spec = RunSpec(OPTIONS, timeout_s=1, output_bytes=1, output_files_bytes=10, output_files=100)
    got = Collected()
    take_frame(FRAME_FILE_NAME, b"12345", got, spec)
    with pytest.raises(ProtocolError, match="names and contents"):
        take_frame(FRAME_FILE_NAME, b"123456", got, spec)  # empty files are not free: names cost bytes


def test_the_outcome_record_lists_a_bounded_number_of_files() -> None:
    from gateway.result import outcome_data

    files = {f"out{i:05d}": b"" for i in range(5000)}
    data = outcome_data("img", make_outcome(files=files, files_truncated=True), None)
    assert len(data["files"]) == 32
    assert data["files_count"] == 5000
    assert data["files_omitted"]["count"] == 5000 - 32
    assert data["files_truncated"] is True
    few = outcome_data("img", make_outcome(files={"a": b"x"}), None)
    assert few["files"] == [{"name": "a", "bytes": 1, "sha256": few["files"][0]["sha256"]}]
    assert "files_omitted" not in few

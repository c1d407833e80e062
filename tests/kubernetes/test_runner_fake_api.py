"""Layer 4: the backend's API calls against the faithful fake API server (tests/kubernetes/fakeapi.py): create,
watch, attach, logs and delete, and every failure path (404, 409, 410 Gone, 429, 500, image missing,
unschedulable, OOM, eviction, tampering, the deadline, the output cap, cancel). Ends with `gateway run --backend
kubernetes` through a kubeconfig that points at the fake."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.decision import evaluate
from gateway.errors import (
    CancelledRunError,
    ContainerLeftError,
    EngineUnavailableError,
    GatewayError,
    ImageMissingError,
    OutputCallbackError,
    SandboxError,
)
from gateway.policy import Policy
from gateway.request import parse_request
from gateway.runner.interface import Payload, RunSpec
from gateway.runner.kubernetes.client import KubeClient, KubeConfig
from gateway.runner.kubernetes.errors import STATUS_TABLE, map_api_error
from gateway.runner.kubernetes.runner import KubernetesRunner
from gateway.testing import capture_audit
from tests.kubernetes.fakeapi import FakeApiServer, files_of

PAYLOAD = Payload(code="print(2+2)", language="python", files={})


def _spec(runner: KubernetesRunner, policy: Policy, **request: Any) -> RunSpec:
    decision = evaluate(policy, parse_request({"code": "print(2+2)", **request}), assembler=runner.assembler)
    assert decision.allowed, [v.message for v in decision.violations]
    assert decision.run is not None
    return decision.run


def _calls(api: FakeApiServer) -> list[tuple[str, str]]:
    return [(method, what) for method, what, _ in api.cluster.calls]


def test_a_run_creates_watches_attaches_and_deletes(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    spec = _spec(kube_runner, default_policy, env={"APP_MODE": "x"}, files={"data.txt": "hello"})
    outcome = kube_runner.execute(spec, Payload(code="print(2+2)", language="python", files={"data.txt": b"hello"}))
    assert outcome.exit_code == 0
    assert outcome.stdout == b"4\n"
    assert not (outcome.timed_out)
    assert not (outcome.oom_killed)
    assert not (outcome.resource_killed)
    assert _calls(fake_api) == [("POST", "pods"), ("WATCH", "pods"), ("WS", "attach"), ("DELETE", "pod")]
    assert fake_api.cluster.live() == []
    # the submitted manifest is the decision's, unchanged, and the outcome names it by digest and uid
    (submitted,) = fake_api.cluster.submitted
    assert submitted == spec.options["pod"]
    assert outcome.sandbox["pod_sha256"] == spec.options["pod_sha256"]
    assert outcome.sandbox["pod_uid"]
    assert outcome.sandbox["pod"] == submitted["metadata"]["name"]
    assert outcome.container_id is not None
    assert outcome.container_id.startswith("fake://")
    # the payload reached the in-Pod supervisor through attach, environment included
    (request,) = fake_api.cluster.payloads
    assert request["code"] == "print(2+2)"
    assert request["env"] == {"APP_MODE": "x"}
    assert files_of(request) == {"data.txt": b"hello"}


def test_output_files_and_stderr(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.program = lambda r: [("err", b"warn\n"), ("file", "r.txt", b"42"), ("meta", False), ("exit", 3)]
    outcome = kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert (outcome.exit_code, outcome.stderr, dict(outcome.files)) == (3, b"warn\n", {"r.txt": b"42"})


def test_the_output_cap_kills_the_pod(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.program = lambda r: [("out", b"x" * 60000)] * 40 + [("exit", 0)]
    spec = _spec(kube_runner, default_policy, limits={"output_bytes": 100000})
    outcome = kube_runner.execute(spec, PAYLOAD)
    assert outcome.output_limit_killed
    assert outcome.stdout_truncated
    assert len(outcome.stdout) == 100000
    assert outcome.exit_code is None
    assert fake_api.cluster.live() == []


def test_the_deadline_kills_the_pod(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.program = lambda r: [("out", b"started\n"), ("hang",)]
    outcome = kube_runner.execute(_spec(kube_runner, default_policy, limits={"timeout_s": 1}), PAYLOAD)
    assert outcome.timed_out
    assert outcome.exit_code is None
    assert outcome.stdout == b"started\n"
    assert fake_api.cluster.live() == []


def test_cancel_and_a_raising_callback_end_the_run(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.program = lambda r: [("out", b"a"), ("hang",)]
    cancel = threading.Event()

    def cancel_soon(stream: str, data: bytes) -> None:
        cancel.set()

    with pytest.raises(CancelledRunError) as info:
        kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD, on_output=cancel_soon, cancel=cancel)
    assert info.value.outcome.stdout == b"a"

    def boom(stream: str, data: bytes) -> None:
        raise RuntimeError("client went away")

    with pytest.raises(OutputCallbackError):
        kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD, on_output=boom)
    assert fake_api.cluster.live() == []


def test_a_tampered_stream_is_refused(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.program = lambda r: [("raw", b"o\x00\x00\x00\x02hi" + b"\x00" * 16), ("exit", 0)]
    with pytest.raises(SandboxError, match="failed verification"):
        kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert fake_api.cluster.live() == []


def test_oom_reported_by_the_kubelet(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.program = lambda r: [("out", b"allocating\n"), ("oom",)]
    outcome = kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert outcome.oom_killed
    assert outcome.exit_code == 137
    assert outcome.sandbox["reason"] == "OOMKilled"


def test_oom_reported_by_the_supervisor(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.program = lambda r: [("meta", True), ("exit", 137)]
    outcome = kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert outcome.oom_killed
    assert outcome.exit_code == 137


def test_eviction_is_reported_as_such(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.program = lambda r: [("out", b"x"), ("evict",)]
    outcome = kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert outcome.sandbox["reason"] == "Evicted"
    assert outcome.resource_killed
    assert outcome.exit_code is None
    assert not outcome.oom_killed


def test_the_supervisor_cannot_start_the_program(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.program = lambda r: [("error", "cannot start the program: no python")]
    with pytest.raises(SandboxError, match="no python") as info:
        kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert info.value.outcome.sandbox["pod_uid"]


def test_a_missing_image_is_never_pulled(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.images = set()
    with pytest.raises(ImageMissingError, match="ErrImageNeverPull") as info:
        kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert "ctr images import" in info.value.diagnostics()
    assert fake_api.cluster.live() == []
    assert ("WS", "attach") not in _calls(fake_api)


def test_an_unschedulable_pod_times_out_with_the_reason(fake_api: FakeApiServer, default_policy: Policy) -> None:
    fake_api.cluster.schedulable = False
    runner = KubernetesRunner(KubeClient(KubeConfig(host=fake_api.url)), instance="t", start_timeout_s=1.0)
    with pytest.raises(SandboxError, match="Insufficient memory"):
        runner.execute(_spec(runner, default_policy), PAYLOAD)
    assert fake_api.cluster.live() == []


@pytest.mark.parametrize("as_http", [False, True], ids=["error-event", "http-410"])
def test_a_stale_watch_is_recovered(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy, as_http: bool
) -> None:
    fake_api.cluster.gone_as_http = as_http
    fake_api.cluster.compact()  # the create's resourceVersion is then older than the compaction point
    fake_api.cluster.compacted = 10**9  # every watch from a version the runner knows is Gone ...
    original = kube_runner.client.read_pod

    def read_and_heal(namespace: str, name: str) -> dict[str, Any] | None:
        fake_api.cluster.compacted = 0  # ... until it has re-read the Pod: then watching works again
        return original(namespace, name)

    kube_runner.client.read_pod = read_and_heal  # type: ignore[method-assign]
    outcome = kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert outcome.exit_code == 0
    calls = _calls(fake_api)
    assert calls[:4] == [("POST", "pods"), ("WATCH", "pods"), ("GET", "pod"), ("WATCH", "pods")]


def test_429_is_retried_after_its_retry_after(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.fail("POST", "pods", 429, times=2, retry_after=1)
    outcome = kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert outcome.exit_code == 0
    assert kube_runner.naps == [1.0, 1.0]  # type: ignore[attr-defined]


def test_a_create_whose_answer_was_lost_adopts_its_own_pod(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.fail("POST", "pods", 500, times=1)  # the Pod is created, the answer is a 500
    outcome = kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert outcome.exit_code == 0
    assert _calls(fake_api)[:3] == [("POST", "pods"), ("POST", "pods"), ("GET", "pod")]  # 500, 409, adopt
    assert len(fake_api.cluster.submitted) == 1


def test_a_foreign_pod_of_the_same_name_is_not_adopted(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    spec = _spec(kube_runner, default_policy)
    other = KubernetesRunner(KubeClient(KubeConfig(host=fake_api.url)), instance="another-gateway")
    foreign = json.loads(json.dumps(spec.options["pod"]))
    foreign["metadata"]["labels"]["agent-gateway.io/instance"] = "another-gateway"
    other.client.create_pod("gateway-sandboxes", foreign)
    with pytest.raises(SandboxError, match="already exists and is not this decision's"):
        kube_runner.prepare(spec)
    assert fake_api.cluster.live() == [foreign["metadata"]["name"]]  # the other's Pod is left alone


def test_500s_that_do_not_stop_are_an_unavailable_api(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.fail("WATCH", "pods", 503, times=99)
    with pytest.raises(EngineUnavailableError, match="HTTP 503"):
        kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert len(kube_runner.naps) == kube_runner.client.retries  # type: ignore[attr-defined]
    assert fake_api.cluster.live() == []


def test_a_forbidden_verb_names_the_manifests(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.fail("POST", "pods", 403)
    with pytest.raises(EngineUnavailableError) as info:
        kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert "gateway kubernetes manifests" in info.value.diagnostics()


def test_an_attach_refused_deletes_the_pod(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.fail("WS", "attach", 403)
    with pytest.raises(GatewayError):
        kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert fake_api.cluster.live() == []


def test_a_pod_that_cannot_be_deleted_is_reported_with_the_outcome(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    fake_api.cluster.fail("DELETE", "pod", 500, times=99)
    with pytest.raises(ContainerLeftError) as info:
        kube_runner.execute(_spec(kube_runner, default_policy), PAYLOAD)
    assert info.value.outcome.exit_code == 0
    (left,) = fake_api.cluster.live()
    fake_api.cluster.failures.clear()
    assert kube_runner.reap() == [f"gateway-sandboxes/{left}"]  # its own: reaped
    assert fake_api.cluster.live() == []


def test_a_pod_gone_already_is_fine_to_delete(kube_runner: KubernetesRunner, fake_api: FakeApiServer) -> None:
    assert kube_runner.client.delete_pod("gateway-sandboxes", "no-such-pod") is False
    assert kube_runner.client.read_pod("gateway-sandboxes", "no-such-pod") is None


def test_the_log_endpoint_is_capped(
    kube_runner: KubernetesRunner, fake_api: FakeApiServer, default_policy: Policy
) -> None:
    spec = _spec(kube_runner, default_policy)
    kube_runner.client.create_pod("gateway-sandboxes", spec.options["pod"])
    name = spec.options["pod"]["metadata"]["name"]
    fake_api.cluster.pods[("gateway-sandboxes", name)]["_log"] = b"supervisor: malformed payload\n" * 1000
    assert kube_runner.client.read_log("gateway-sandboxes", name, limit_bytes=30) == b"supervisor: malformed payload\n"


def test_the_reaper_keeps_other_live_gateways_pods(fake_api: FakeApiServer, default_policy: Policy) -> None:
    mine = KubernetesRunner(KubeClient(KubeConfig(host=fake_api.url)), instance="me")
    theirs = KubernetesRunner(KubeClient(KubeConfig(host=fake_api.url)), instance="them")
    dead = KubernetesRunner(KubeClient(KubeConfig(host=fake_api.url)), instance="gone")
    for runner in (mine, theirs, dead):
        runner.client.create_pod("gateway-sandboxes", _spec(runner, default_policy).options["pod"])
    names = {r.instance: n for r in (mine, theirs, dead) for n in fake_api.cluster.live()
             if fake_api.cluster.pods[("gateway-sandboxes", n)]["metadata"]["labels"]["agent-gateway.io/instance"]
             == r.instance}  # fmt: skip
    assert mine.reap(expired_only=True) == []
    removed = mine.reap(dead=lambda owner: owner == "gone")
    assert sorted(removed) == sorted(f"gateway-sandboxes/{names[i]}" for i in ("me", "gone"))
    assert fake_api.cluster.live() == [names["them"]]
    # finished and expired Pods are anyone's to delete
    pod = fake_api.cluster.pods[("gateway-sandboxes", names["them"])]
    pod["metadata"]["creationTimestamp"] = "2020-01-01T00:00:00Z"
    assert mine.reap(expired_only=True) == [f"gateway-sandboxes/{names['them']}"]


def test_every_status_is_mapped() -> None:
    from kubernetes.client.exceptions import ApiException

    for status in (*STATUS_TABLE, 418, 599):
        error = map_api_error(ApiException(status=status, reason="x"), "doing it")
        assert isinstance(error, GatewayError)
        assert error.message
    assert isinstance(map_api_error(ConnectionRefusedError("no"), "x"), EngineUnavailableError)
    assert isinstance(map_api_error(ImportError("no kubernetes"), "x"), EngineUnavailableError)


def test_no_api_server_is_engine_unavailable(default_policy: Policy) -> None:
    runner = KubernetesRunner(KubeClient(KubeConfig(host="http://127.0.0.1:9"), retries=0), instance="t")
    with pytest.raises(EngineUnavailableError):
        runner.execute(_spec(runner, default_policy), PAYLOAD)


def test_the_gateway_records_the_pod_digest_and_uid(fake_api: FakeApiServer, default_policy: Policy) -> None:
    runner = KubernetesRunner(KubeClient(KubeConfig(host=fake_api.url)), instance="gw")
    with capture_audit(default_policy, runner) as (gw, sink):  # type: ignore[arg-type]
        result = gw.execute({"code": "print(2+2)"})
    assert result.exit_status == 0
    (decision,) = [r for r in sink.records if r["event_type"] == "policy.decision"]
    (outcome,) = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    options = decision["data"]["decision"]["options"]
    assert outcome["data"]["sandbox"]["pod_sha256"] == options["pod_sha256"]
    assert outcome["data"]["sandbox"]["pod_uid"]
    assert fake_api.cluster.submitted == [options["pod"]]


def _kubeconfig(path: Path, url: str) -> Path:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "nobody", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "nobody"}}],
    }  # fmt: skip
    path.write_text(json.dumps(config))
    return path


def test_gateway_run_backend_kubernetes(
    fake_api: FakeApiServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = _kubeconfig(tmp_path / "kubeconfig", fake_api.url)
    rc = main(["run", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--json", "--code", "print(2+2)"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 0, result
    assert result["stdout"] == "4\n"
    assert result["exit_code"] == 0
    fake_api.cluster.program = lambda r: [("out", b"x"), ("hang",)]
    rc = main(["run", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--timeout", "1", "--json",
               "--code", "while True: pass"])  # fmt: skip
    result = json.loads(capsys.readouterr().out)
    assert rc == 124
    assert result["timed_out"]
    fake_api.cluster.images = set()
    rc = main(["run", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--json", "--code", "1"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 125
    assert result["error"]["code"] == "runner.image_missing"
    assert fake_api.cluster.live() == []

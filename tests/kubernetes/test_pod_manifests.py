"""Layers 1 and 2: every Pod the backend builds and every object of `gateway kubernetes manifests` validates
strictly against the Kubernetes 1.33 schemas, and every Pod meets the Pod Security Standards `restricted`
profile field by field. Plus the Pod guard (every invariant refused on its own), the decision's `pod` member
(`gateway check --backend kubernetes`) and the manifests' contract."""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Callable
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import gateway
from gateway.canonical import options_bytes
from gateway.cli import main
from gateway.decision import evaluate
from gateway.errors import UnsafeOptionsError
from gateway.policy import Policy, load_policy
from gateway.request import parse_request
from gateway.resources import policies_dir
from gateway.runner.kubernetes.manifests import KUBERNETES_VERSION, ROLE_RULES, cluster_manifests, dump_all
from gateway.runner.kubernetes.pod import POD_COMMAND, KubernetesAssembler, guard, pod_digest, profile_part
from gateway.runner.supervisor import SUPERVISOR
from tests.kubernetes.conftest import all_pods, kernel_spec, shipped_policy_files

VERSION = f"{KUBERNETES_VERSION}.0"
PODS = all_pods()


def test_the_pinned_version_is_supported_in_strict_mode() -> None:
    from kubernetes_validate.utils import all_versions

    assert VERSION in all_versions()
    bogus = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": [], "nope": 1}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bogus, VERSION, strict=True)


def test_every_shipped_policy_is_covered() -> None:
    names = {p.name for p in shipped_policy_files()}
    assert {"default.yaml", "strict.yaml", "ci-bots.yaml", "datasets.yaml"} <= names
    assert any(":runsc" in name for name, _ in PODS)
    assert any(":runc" in name for name, _ in PODS)


# --- layer 1: strict schema validation ---------------------------------------------------------------------


@pytest.mark.parametrize(("name", "options"), PODS, ids=[n for n, _ in PODS])
def test_every_pod_validates_strictly(name: str, options: dict[str, Any]) -> None:
    assert kubernetes_validate.validate(options["pod"], VERSION, strict=True)
    guard(options)


def _manifests() -> list[dict[str, Any]]:
    policies = [load_policy(policies_dir() / "default.yaml"), load_policy(policies_dir() / "strict.yaml")]
    return cluster_manifests(policies)


def test_every_manifest_validates_strictly() -> None:
    docs = list(yaml.safe_load_all(dump_all(_manifests())))
    assert len(docs) >= 10
    for doc in docs:
        kubernetes_validate.validate(doc, VERSION, strict=True)


def test_the_cli_writes_one_multi_document_stream(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["kubernetes", "manifests", "--policy", str(policies_dir() / "strict.yaml")])
    out = capsys.readouterr().out
    assert rc == 0
    docs = list(yaml.safe_load_all(out))
    assert out.startswith("---\n")
    kinds = [d["kind"] for d in docs]
    assert kinds.count("Namespace") == 2
    assert {"ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "RuntimeClass", "Deployment", "Service"} <= set(
        kinds
    )
    for doc in docs:
        kubernetes_validate.validate(doc, VERSION, strict=True)
    assert main(["kubernetes", "manifests", "--replicas", "1"]) == 2


def _image(docs: list[dict[str, Any]]) -> str:
    (deployment,) = _by_kind(docs, "Deployment")
    image: str = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    return image


def test_the_gateway_image_is_tagged_with_this_version_unless_one_is_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _image(cluster_manifests()) == f"agent-exec-gateway:{gateway.__version__}"
    assert main(["kubernetes", "manifests"]) == 0
    assert _image(list(yaml.safe_load_all(capsys.readouterr().out))) == f"agent-exec-gateway:{gateway.__version__}"
    assert main(["kubernetes", "manifests", "--image", "registry.example/gateway:1.2.3"]) == 0
    assert _image(list(yaml.safe_load_all(capsys.readouterr().out))) == "registry.example/gateway:1.2.3"


# --- the manifests' contract --------------------------------------------------------------------------------


def _by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_namespaces_enforce_restricted() -> None:
    spaces = {d["metadata"]["name"]: d for d in _by_kind(_manifests(), "Namespace")}
    assert set(spaces) == {"gateway-system", "gateway-sandboxes"}
    for ns in spaces.values():
        labels = ns["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        assert labels["pod-security.kubernetes.io/enforce-version"] == "v1.33"


def test_the_role_is_minimal() -> None:
    docs = _manifests()
    (role,) = _by_kind(docs, "Role")
    (binding,) = _by_kind(docs, "RoleBinding")
    assert role["metadata"]["namespace"] == "gateway-sandboxes"
    assert not _by_kind(docs, "ClusterRole")
    assert not _by_kind(docs, "ClusterRoleBinding")
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {
        ("pods", "create"), ("pods", "get"), ("pods", "list"), ("pods", "watch"), ("pods", "delete"),
        ("pods/attach", "create"), ("pods/attach", "get"), ("pods/log", "get"),
    }  # fmt: skip
    for rule in role["rules"]:
        assert rule["apiGroups"] == [""]
        assert "*" not in rule["verbs"] + rule["resources"]
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
        assert "secrets" not in rule["resources"]
    assert role["rules"] == [dict(r) for r in ROLE_RULES]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gateway-sandboxes"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "gateway", "namespace": "gateway-system"}]


def test_the_network_policy_denies_everything() -> None:
    (policy,) = _by_kind(_manifests(), "NetworkPolicy")
    assert policy["metadata"]["namespace"] == "gateway-sandboxes"
    assert policy["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def test_the_runtime_class_only_when_a_policy_can_use_gvisor() -> None:
    default = load_policy(policies_dir() / "default.yaml")
    assert not _by_kind(cluster_manifests([default]), "RuntimeClass")
    (rc,) = _by_kind(_manifests(), "RuntimeClass")
    assert rc["handler"] == "runsc"
    assert rc["metadata"]["name"] == "gvisor"


def test_the_gateway_runs_replicated_behind_a_service() -> None:
    docs = _manifests()
    (deployment,) = _by_kind(docs, "Deployment")
    (service,) = _by_kind(docs, "Service")
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["metadata"]["namespace"] == service["metadata"]["namespace"] == "gateway-system"
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "GATEWAY_INSTANCE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in env
    text = _by_kind(docs, "ConfigMap")[0]["data"]["server.yaml"]
    config = yaml.safe_load(text)
    assert config["backend"] == "kubernetes"
    from gateway.service.config import load_server_config_text

    loaded = load_server_config_text(text, source="server.yaml")  # the gateway accepts its own configuration
    assert loaded.backend == "kubernetes"
    assert loaded.kubernetes.in_cluster
    assert config["kubernetes"] == {"namespace": "gateway-sandboxes", "in_cluster": True}
    with pytest.raises(ValueError, match="at least 2"):
        cluster_manifests([], replicas=1)


# --- layer 2: Pod Security Standards, restricted, field by field ---------------------------------------------

_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                       "projected", "secret"}  # fmt: skip


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """The checks of the Pod Security Standards ``restricted`` profile (baseline included), Kubernetes 1.33."""
    bad: list[str] = []
    pod_ctx = spec.get("securityContext") or {}
    containers = [*spec.get("containers", []), *spec.get("initContainers", []), *spec.get("ephemeralContainers", [])]
    # baseline
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            bad.append(f"host namespaces: {key}")
    if (pod_ctx.get("windowsOptions") or {}).get("hostProcess"):
        bad.append("hostProcess")
    for volume in spec.get("volumes", []):
        if "hostPath" in volume:
            bad.append("hostPath volume")
        kinds = set(volume) - {"name"}
        if not kinds <= _RESTRICTED_VOLUMES:
            bad.append(f"volume type {kinds}")
    if pod_ctx.get("sysctls"):
        bad.append("sysctls")
    if (pod_ctx.get("appArmorProfile") or {}).get("type") == "Unconfined":
        bad.append("apparmor unconfined")
    pod_seccomp = (pod_ctx.get("seccompProfile") or {}).get("type")
    if pod_seccomp == "Unconfined":
        bad.append("pod seccomp unconfined")
    for c in containers:
        ctx = c.get("securityContext") or {}
        name = c.get("name")
        if ctx.get("privileged"):
            bad.append(f"{name}: privileged")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            bad.append(f"{name}: hostPort")
        if ctx.get("procMount", "Default") != "Default":
            bad.append(f"{name}: procMount")
        if (ctx.get("seLinuxOptions") or {}).get("type") not in (None, "", "container_t", "container_init_t"):
            bad.append(f"{name}: selinux type")
        # restricted
        if ctx.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation")
        non_root = ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot"))
        if non_root is not True:
            bad.append(f"{name}: runAsNonRoot")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            bad.append(f"{name}: runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccomp {seccomp}")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            bad.append(f"{name}: capabilities not dropped")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: capabilities added")
    return bad


@pytest.mark.parametrize(("name", "options"), PODS, ids=[n for n, _ in PODS])
def test_every_pod_is_restricted(name: str, options: dict[str, Any]) -> None:
    assert restricted_violations(options["pod"]["spec"]) == []


@pytest.mark.parametrize(("policy_name", "runtime"), [("examples/sessions.yaml", "runc"), ("strict.yaml", "runsc")])
def test_a_kernel_pod_is_a_run_pod_living_as_long_as_the_kernel(policy_name: str, runtime: str) -> None:
    """A session's kernel Pod (four hours: policies/examples/sessions.yaml's lifetime ceiling) validates strictly,
    is restricted, passes the guard, and differs from a run's Pod of the same profile only in what names the run
    and in its deadline: the lifetime plus the start margin."""
    policy = load_policy(policies_dir() / policy_name)
    lifetime = 14400
    assembler = KubernetesAssembler(instance="it")
    kernel = kernel_spec(assembler, policy, lifetime_s=lifetime, runtime=runtime)
    pod = kernel.options["pod"]
    assert kubernetes_validate.validate(pod, VERSION, strict=True)
    assert restricted_violations(pod["spec"]) == []
    guard(kernel.options)
    assert pod["spec"]["activeDeadlineSeconds"] == lifetime + 60
    assert (pod["spec"].get("runtimeClassName") == "gvisor") == (runtime == "runsc")
    run = evaluate(policy, parse_request({"code": "pass", "runtime": runtime}), assembler=assembler).run
    assert run is not None
    assert run.options["pod"]["spec"]["activeDeadlineSeconds"] < lifetime
    assert profile_part(pod) == profile_part(run.options["pod"])


def test_the_gateway_deployment_is_restricted_too() -> None:
    (deployment,) = _by_kind(_manifests(), "Deployment")
    assert restricted_violations(deployment["spec"]["template"]["spec"]) == []


def test_the_restricted_check_can_fail() -> None:
    _, options = PODS[0]
    spec = copy.deepcopy(options["pod"]["spec"])
    spec["hostPID"] = True
    spec["volumes"].append({"name": "h", "hostPath": {"path": "/"}})
    ctx = spec["containers"][0]["securityContext"]
    ctx.update(allowPrivilegeEscalation=True, runAsNonRoot=False, privileged=True)
    ctx["capabilities"] = {"add": ["SYS_ADMIN"]}
    ctx["seccompProfile"] = {"type": "Unconfined"}
    found = restricted_violations(spec)
    assert len(found) >= 8, found


# --- the exact Pod, and the guard ---------------------------------------------------------------------------


def test_the_default_pod_is_exactly_the_hardened_one(default_policy: Policy) -> None:
    (options,) = [o for n, o in PODS if n == "policies/default.yaml:runc"]
    pod = options["pod"]
    spec = pod["spec"]
    (c,) = spec["containers"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert (spec["hostNetwork"], spec["hostPID"], spec["hostIPC"]) == (False, False, False)
    assert "runtimeClassName" not in spec
    assert spec["activeDeadlineSeconds"] == 10 + 60
    assert spec["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534,
        "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert c["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534, "allowPrivilegeEscalation": False,
        "privileged": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert c["resources"]["limits"] == c["resources"]["requests"]
    assert c["resources"]["limits"]["memory"] == str(256 * 1024 * 1024)
    assert c["resources"]["limits"]["cpu"] == "1000m"
    assert set(c["resources"]["limits"]) == {"memory", "cpu", "ephemeral-storage"}
    assert spec["volumes"] == [
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": str(64 * 1024 * 1024)}},
        {"name": "workspace", "emptyDir": {"medium": "Memory", "sizeLimit": str(64 * 1024 * 1024)}},
    ]
    assert c["imagePullPolicy"] == "Never"
    assert c["command"] == list(POD_COMMAND)
    assert c["command"][4].strip() == SUPERVISOR.strip()
    assert (c["stdin"], c["stdinOnce"], c["tty"]) == (True, True, False)
    assert "env" not in c
    assert pod["metadata"]["labels"]["agent-gateway.io/managed"] == "true"
    assert pod["metadata"]["annotations"]["agent-gateway.io/pids-limit"] == "64"
    assert options["pod_sha256"] == pod_digest(pod)


def test_gvisor_means_the_runtime_class() -> None:
    strict = [o for n, o in PODS if n == "policies/strict.yaml:runsc"]
    assert strict
    assert strict[0]["pod"]["spec"]["runtimeClassName"] == "gvisor"


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(options: dict[str, Any]) -> None:
        node: Any = options
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node[part]
        last: Any = int(parts[-1]) if parts[-1].isdigit() else parts[-1]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return apply


_DELETE = object()
C = "pod.spec.containers.0"
MUTATIONS = {
    "restartPolicy": ("pod.spec.restartPolicy", "Always"),
    "token": ("pod.spec.automountServiceAccountToken", True),
    "service links": ("pod.spec.enableServiceLinks", True),
    "host network": ("pod.spec.hostNetwork", True),
    "host pid": ("pod.spec.hostPID", True),
    "host ipc": ("pod.spec.hostIPC", True),
    "share pid": ("pod.spec.shareProcessNamespace", True),
    "no deadline": ("pod.spec.activeDeadlineSeconds", _DELETE),
    "node name": ("pod.spec.nodeName", "node-1"),
    "service account": ("pod.spec.serviceAccountName", "default"),
    "other runtime": ("pod.spec.runtimeClassName", "kata"),
    "pod root": ("pod.spec.securityContext.runAsUser", 0),
    "pod seccomp": ("pod.spec.securityContext.seccompProfile", {"type": "Unconfined"}),
    "sysctls": ("pod.spec.securityContext.sysctls", [{"name": "kernel.shm_rmid_forced", "value": "0"}]),
    "hostPath": ("pod.spec.volumes.0", {"name": "tmp", "hostPath": {"path": "/"}}),
    "disk emptyDir": ("pod.spec.volumes.1.emptyDir", {"sizeLimit": "1"}),
    "unbounded emptyDir": ("pod.spec.volumes.1.emptyDir", {"medium": "Memory"}),
    "two containers": ("pod.spec.containers.1", None),
    "privileged": (f"{C}.securityContext.privileged", True),
    "escalation": (f"{C}.securityContext.allowPrivilegeEscalation", True),
    "writable root": (f"{C}.securityContext.readOnlyRootFilesystem", False),
    "caps": (f"{C}.securityContext.capabilities", {"drop": ["ALL"], "add": ["NET_RAW"]}),
    "root": (f"{C}.securityContext.runAsNonRoot", False),
    "root uid": (f"{C}.securityContext.runAsUser", 0),
    "container seccomp": (f"{C}.securityContext.seccompProfile", {"type": "Unconfined"}),
    "procMount": (f"{C}.securityContext.procMount", "Unmasked"),
    "pull": (f"{C}.imagePullPolicy", "Always"),
    "command": (f"{C}.command", ["/bin/sh", "-c", "id"]),
    "args": (f"{C}.args", ["x"]),
    "env": (f"{C}.env", [{"name": "A", "value": "b"}]),
    "ports": (f"{C}.ports", [{"containerPort": 80, "hostPort": 80}]),
    "tty": (f"{C}.tty", True),
    "burstable": (f"{C}.resources.requests.memory", "1"),
    "no cpu limit": (f"{C}.resources.limits.cpu", _DELETE),
    "extra mount": (f"{C}.volumeMounts.2", {"name": "tmp", "mountPath": "/etc"}),
    "unmanaged": ("pod.metadata.labels.agent-gateway.io/managed", "false"),
    "owner": ("pod.metadata.ownerReferences", []),
    "image swap": (f"{C}.image", "evil:latest"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS), ids=sorted(MUTATIONS))
def test_the_guard_refuses_each_broken_invariant(mutation: str) -> None:
    _, options = PODS[0]
    broken = copy.deepcopy(options)
    path, value = MUTATIONS[mutation]
    if path.endswith("managed"):
        broken["pod"]["metadata"]["labels"]["agent-gateway.io/managed"] = value
    elif path == "pod.spec.containers.1":
        broken["pod"]["spec"]["containers"].append(copy.deepcopy(broken["pod"]["spec"]["containers"][0]))
    elif path == f"{C}.volumeMounts.2":
        broken["pod"]["spec"]["containers"][0]["volumeMounts"].append(value)
    else:
        _set(path, value)(broken)
    broken["pod_sha256"] = pod_digest(broken["pod"])  # re-sealed: the invariant itself must be refused
    with pytest.raises(UnsafeOptionsError) as info:
        guard(broken)
    assert info.value.problems
    assert all(p.path.startswith("$.") for p in info.value.problems)


def test_the_guard_refuses_a_manifest_changed_after_assembly() -> None:
    _, options = PODS[0]
    changed = copy.deepcopy(options)
    changed["pod"]["metadata"]["labels"]["agent-gateway.io/request"] = "someone-else"
    with pytest.raises(UnsafeOptionsError) as info:
        guard(changed)
    assert [p.path for p in info.value.problems] == ["$.pod_sha256"]


def test_mounts_and_networks_are_denied_on_kubernetes(tmp_path: Path) -> None:
    from tests.conftest import mount_policy

    (tmp_path / "data").mkdir()
    policy = mount_policy(tmp_path)
    asm = KubernetesAssembler()
    decision = evaluate(
        policy, parse_request({"code": "x", "mounts": [{"source": str(tmp_path / "data"), "target": "/data"}]}),
        assembler=asm,
    )  # fmt: skip
    assert not decision.allowed
    assert [v.rule for v in decision.violations] == ["assembly.guard"]
    assert "hostPath" in decision.violations[0].message


def test_the_decision_carries_the_pod_and_its_digest(default_policy: Policy) -> None:
    decision = evaluate(default_policy, parse_request({"code": "print(1)", "env": {"APP_X": "1"}}),
                        assembler=KubernetesAssembler(instance="me"))  # fmt: skip
    assert decision.allowed
    assert decision.run is not None
    assert decision.run.backend == "kubernetes"
    options = decision.options
    assert options is not None
    assert options["environment"] == {"APP_X": "1"}
    assert "APP_X" not in json.dumps(options["pod"])  # the environment travels in the payload only
    assert options["pod_sha256"] == pod_digest(options["pod"])
    assert options["pod"]["metadata"]["labels"]["agent-gateway.io/decision"] == decision.decision_id
    assert options_bytes(options["pod"])  # canonical, hashable JSON


def test_check_prints_the_pod_without_a_cluster(tmp_path: Path) -> None:
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"code": "print(2+2)"}))
    out = io.StringIO()
    with redirect_stdout(out):
        rc = main(["check", "--backend", "kubernetes", "--policy", str(policies_dir() / "strict.yaml"), "--json",
                   str(request)])  # fmt: skip
    assert rc == 0
    decision = json.loads(out.getvalue())
    pod = decision["pod"]
    assert pod == decision["options"]["pod"]
    assert decision["pod_sha256"] == pod_digest(pod)
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    kubernetes_validate.validate(pod, VERSION, strict=True)
    # the same through the audit trail: the decision record holds the manifest that would be submitted
    records = [
        json.loads(line)
        for f in sorted(Path(_audit_dir()).glob("trail-*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    (recorded,) = [r for r in records if r["event_type"] == "policy.decision"]
    assert recorded["data"]["decision"]["options"]["pod"] == pod


def _audit_dir() -> str:
    import os

    return os.environ["GATEWAY_AUDIT_DIR"]

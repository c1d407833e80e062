"""Pod assembly and the Pod guard: the Kubernetes counterpart of ``runner/docker/options.py``.

:class:`KubernetesAssembler` is what the Gateway hands the decision when the backend is Kubernetes. ``build``
turns the decision's :class:`~gateway.decision.SandboxSettings` (the very object the Docker assembler reads)
into the complete Pod manifest the runner will submit, byte for byte: hardened baseline always on, the fixed
supervisor as the container's command, nothing of the caller's except the values the policy judged. ``guard``
re-checks *any* options dict against the Pod invariants (field by field, every problem reported), so a bug in a
rule or in ``build`` can never submit an unsafe Pod; the runner calls it again right before ``create``.

The options a Kubernetes decision carries (and records) are::

    {"image": ..., "namespace": ..., "environment": {...}, "pod": {<the Pod manifest>}, "pod_sha256": ...}

``pod_sha256`` is the sha256 of the manifest in the canonical options format: the decision record, the outcome
record and the Pod's own annotation-free spec all refer to the one submitted manifest by it. The environment
is not in the manifest: like the Docker runner, it travels in the payload to the program's ``execve`` only.

What a Pod cannot express, and how it is covered (see docs/ARCHITECTURE.md, "Kubernetes backend"):
the pids limit (the kubelet's ``podPidsLimit``), ``nofile`` / ``core`` / ``fsize`` ulimits (the runtime's
defaults), ``noexec`` on the emptyDir tmpfs (not settable), the gateway's own seccomp profile (``RuntimeDefault``
instead, unless the node has the profile installed), and "no network" (a deny-all NetworkPolicy from
``gateway kubernetes manifests``, enforced only by a CNI that implements NetworkPolicy).
"""

from __future__ import annotations

import copy
import hashlib
import math
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gateway.canonical import options_bytes
from gateway.decision.settings import BackendLimits, SandboxProfile, SandboxSettings
from gateway.errors import EgressUnavailableError, Problem, UnsafeOptionsError
from gateway.policy.model import EGRESS
from gateway.runner.supervisor import SUPERVISOR, WORKSPACE

__all__ = [
    "ANNOTATION_POLICY",
    "CONTAINER_NAME",
    "DECISION_LABEL",
    "DEFAULT_NAMESPACE",
    "EPHEMERAL_STORAGE",
    "GVISOR_RUNTIME_CLASS",
    "INSTANCE_LABEL",
    "LABEL_PREFIX",
    "MANAGED_LABEL",
    "OPTION_KEYS",
    "POD_COMMAND",
    "POOL_LABEL",
    "REQUEST_LABEL",
    "START_MARGIN_S",
    "KubernetesAssembler",
    "build_pod",
    "guard",
    "label_value",
    "pod_digest",
    "pod_name",
    "pool_key",
    "pooled_pod",
    "profile_part",
]

LABEL_PREFIX = "agent-gateway.io/"
MANAGED_LABEL = "agent-gateway.io/managed"
INSTANCE_LABEL = "agent-gateway.io/instance"
"""The gateway instance that made the Pod (in the shipped Deployment: the gateway Pod's own name)."""
DECISION_LABEL = "agent-gateway.io/decision"
REQUEST_LABEL = "agent-gateway.io/request"
POOL_LABEL = "agent-gateway.io/pool"
"""On a warm pool's Pod instead of the decision and request labels: the first 32 hex digits of its profile's
:func:`pool_key` (a label value holds at most 63 characters)."""
ANNOTATION_POLICY = "agent-gateway.io/policy"
"""The policy's name. Its sha256 is in the decision record the decision label leads to: podman refuses annotation
values longer than 63 characters, which ``name@sha256:<hex>`` always is."""
ANNOTATION_PIDS = "agent-gateway.io/pids-limit"
"""The policy's pids limit, for the operator: a Pod has no pids field; the kubelet's ``podPidsLimit`` bounds it."""
DEFAULT_NAMESPACE = "gateway-sandboxes"
CONTAINER_NAME = "sandbox"
SANDBOX_HOSTNAME = "sandbox"
GVISOR_RUNTIME_CLASS = "gvisor"
"""The RuntimeClass a ``runsc`` profile names (``gateway kubernetes manifests`` defines it, handler ``runsc``)."""
START_MARGIN_S = 60
"""Seconds ``activeDeadlineSeconds`` allows beyond the run's own deadline: scheduling, start, hand-over."""
POD_COMMAND = ("/usr/bin/python3", "-I", "-S", "-c", SUPERVISOR.strip("\n"), WORKSPACE)
"""The container's fixed command: the supervisor every backend runs (``gateway.runner.supervisor``). Its leading
newline is dropped: podman's ``kube play`` (layer 3 of the tests) re-serialises the manifest through a YAML
library that cannot read back a block scalar starting with one."""
OPTION_KEYS = frozenset({"image", "namespace", "environment", "pod", "pod_sha256"})
"""The only keys of a Kubernetes decision's options."""
_VOLUMES = (("tmp", "/tmp"), ("workspace", WORKSPACE))  # noqa: S108 - container paths
_MI = 1024 * 1024
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_POD_KEYS = frozenset({"apiVersion", "kind", "metadata", "spec"})
_METADATA_KEYS = frozenset({"name", "namespace", "labels", "annotations"})
_SPEC_KEYS = frozenset(
    {
        "restartPolicy",
        "automountServiceAccountToken",
        "enableServiceLinks",
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "shareProcessNamespace",
        "hostname",
        "securityContext",
        "containers",
        "volumes",
        "activeDeadlineSeconds",
        "terminationGracePeriodSeconds",
        "runtimeClassName",
    }
)
"""Every Pod spec field the assembler may set; the guard refuses any other (nodeName, initContainers,
ephemeralContainers, hostAliases, serviceAccountName, ...)."""
_CONTAINER_KEYS = frozenset(
    {
        "name",
        "image",
        "imagePullPolicy",
        "command",
        "args",
        "workingDir",
        "stdin",
        "stdinOnce",
        "tty",
        "resources",
        "securityContext",
        "volumeMounts",
        "terminationMessagePolicy",
    }
)
_RESOURCES = ("memory", "cpu", "ephemeral-storage")


def label_value(text: str) -> str:
    """``text`` as a valid label value: at most 63 characters of ``[A-Za-z0-9_.-]``, alphanumeric at both ends."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")
    return cleaned or "unknown"


def pod_name(decision_id: str) -> str:
    """The Pod's name: one per decision, so a create retried after a lost answer meets its own Pod (409)."""
    return f"gateway-sandbox-{label_value(decision_id).lower()[:40]}".rstrip("-")


def pod_digest(pod: Mapping[str, Any]) -> str:
    """sha256 of the Pod manifest in the canonical options format (sorted keys, compact)."""
    return hashlib.sha256(options_bytes(dict(pod))).hexdigest()


def _cpu(cpus: float) -> str:
    return f"{max(round(cpus * 1000), 1)}m"


EPHEMERAL_STORAGE = 512 * _MI
"""Node disk one sandbox Pod may use. Its root is read-only and its volumes are memory, so this bounds the
container log, which the kubelet fills with the attached stdout too. The runner stops reading (and kills) at the
run's output cap long before; past this the kubelet evicts the Pod, which the run reports as an eviction. One
value for every Pod: it is part of the profile (a warm pool's Pod is made before any request says its caps)."""


def _profile_pod(
    profile: SandboxProfile, *, namespace: str, instance: str, name: str, deadline_s: int
) -> dict[str, Any]:
    """The Pod of ``profile``: everything but the labels that name one run."""
    p = profile
    if p.network == EGRESS:
        raise EgressUnavailableError(
            "the decision allows network egress, but this version's Kubernetes sandbox cannot provide it yet (the "
            "egress proxy is not wired into runs); nothing ran"
        )
    if p.network != "none":
        raise UnsafeOptionsError(
            f"network {p.network!r} is not available on the Kubernetes backend: sandboxes have no network "
            "(the deny-all NetworkPolicy of `gateway kubernetes manifests`)",
            hint="ask for network none on the Kubernetes backend",
        )
    if p.runtime not in ("runc", "runsc"):
        raise UnsafeOptionsError(f"unknown runtime {p.runtime!r}: expected runc or runsc")
    amounts = {"memory": str(p.memory), "cpu": _cpu(p.cpus), "ephemeral-storage": str(EPHEMERAL_STORAGE)}
    seccomp = {"type": "RuntimeDefault"}
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": p.image,
        # Never a silent pull: a missing image is a start failure the runner reports (ErrImageNeverPull).
        "imagePullPolicy": "IfNotPresent" if p.pull == "if-missing" else "Never",
        "command": list(POD_COMMAND),
        "workingDir": WORKSPACE,
        # The payload reaches the supervisor (PID 1) through attach; stdinOnce: when the gateway's attach
        # session ends (the gateway is gone), the supervisor's stdin closes and it ends the run itself.
        "stdin": True,
        "stdinOnce": True,
        "tty": False,
        "resources": {"limits": dict(amounts), "requests": dict(amounts)},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": p.uid,
            "runAsGroup": p.gid,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": dict(seccomp),
        },
        "volumeMounts": [{"name": vol, "mountPath": path} for vol, path in _VOLUMES],
        "terminationMessagePolicy": "File",
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "shareProcessNamespace": False,
        "hostname": SANDBOX_HOSTNAME,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": p.uid,
            "runAsGroup": p.gid,
            "fsGroup": p.gid,
            "seccompProfile": dict(seccomp),
        },
        "containers": [container],
        "volumes": [{"name": vol, "emptyDir": {"medium": "Memory", "sizeLimit": str(p.tmpfs)}} for vol, _ in _VOLUMES],
        "activeDeadlineSeconds": deadline_s,
        "terminationGracePeriodSeconds": 1,
    }
    if p.runtime == "runsc":
        spec["runtimeClassName"] = GVISOR_RUNTIME_CLASS
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MANAGED_LABEL: "true", INSTANCE_LABEL: label_value(instance)},
            "annotations": {ANNOTATION_POLICY: p.policy.split("@", 1)[0][:63], ANNOTATION_PIDS: str(p.pids)},
        },
        "spec": spec,
    }


def build_pod(
    settings: SandboxSettings, *, decision_id: str, request_id: str, namespace: str = DEFAULT_NAMESPACE,
    instance: str = "unknown",
) -> dict[str, Any]:  # fmt: skip
    """The complete Pod manifest for ``settings`` (what the runner submits, unchanged): the profile's Pod, named
    after the decision, labelled with it and the request, with the run's backstop deadline."""
    if settings.mounts:
        raise UnsafeOptionsError(
            "host mounts are not available on the Kubernetes backend (a Pod never gets a hostPath volume)",
            hint="run requests with mounts on the Docker backend, or drop the mounts",
        )
    pod = _profile_pod(
        settings.profile, namespace=namespace, instance=instance, name=pod_name(decision_id),
        deadline_s=math.ceil(settings.timeout_s) + START_MARGIN_S,
    )  # fmt: skip
    pod["metadata"]["labels"].update({DECISION_LABEL: label_value(decision_id), REQUEST_LABEL: label_value(request_id)})
    return pod


def pooled_pod(
    profile: SandboxProfile, *, ttl_s: float, namespace: str = DEFAULT_NAMESPACE, instance: str = "unknown"
) -> dict[str, Any]:
    """A warm pool's Pod of ``profile``: nothing of a request (no decision or request label, no environment), the
    pool label, a random name, and ``activeDeadlineSeconds`` = the pool's ``ttl_s`` (idle expiry plus the
    policy's longest timeout): the backstop holds whenever it is claimed."""
    key = pool_key(profile, namespace=namespace, instance=instance)
    name = f"gateway-pool-{key[:12]}-{secrets.token_hex(6)}"
    pod = _profile_pod(profile, namespace=namespace, instance=instance, name=name, deadline_s=math.ceil(ttl_s))
    pod["metadata"]["labels"][POOL_LABEL] = key[:32]
    return pod


_RUN_LABELS = (DECISION_LABEL, REQUEST_LABEL, POOL_LABEL)


def profile_part(pod: Mapping[str, Any]) -> dict[str, Any]:
    """``pod`` without what names one run or one pooled Pod (its name, the decision / request / pool labels,
    ``activeDeadlineSeconds``): a pooled Pod and a decision's Pod of the same profile have equal parts."""
    out = copy.deepcopy(dict(pod))
    meta = out.get("metadata") or {}
    meta.pop("name", None)
    meta["labels"] = {k: v for k, v in (meta.get("labels") or {}).items() if k not in _RUN_LABELS}
    (out.get("spec") or {}).pop("activeDeadlineSeconds", None)
    return out


def pool_key(profile: SandboxProfile, *, namespace: str = DEFAULT_NAMESPACE, instance: str = "unknown") -> str:
    """The sha256 of ``profile``'s Pod without what names a run (canonical JSON): names a warm pool."""
    part = profile_part(_profile_pod(profile, namespace=namespace, instance=instance, name="x", deadline_s=1))
    return hashlib.sha256(options_bytes(part)).hexdigest()


def build_options(
    settings: SandboxSettings, *, decision_id: str, request_id: str, namespace: str = DEFAULT_NAMESPACE,
    instance: str = "unknown",
) -> dict[str, Any]:  # fmt: skip
    """The Kubernetes decision's options: the Pod manifest, its digest, and what travels in the payload."""
    pod = build_pod(settings, decision_id=decision_id, request_id=request_id, namespace=namespace, instance=instance)
    return {
        "image": settings.profile.image,
        "namespace": namespace,
        "environment": dict(settings.env),
        "pod": pod,
        "pod_sha256": pod_digest(pod),
    }


class KubernetesAssembler:
    """The Kubernetes backend's assembler (see ``gateway.decision.Assembler``): Pods in ``namespace``, labelled
    with the runner's ``instance`` so that the manifest in the decision is exactly the one submitted."""

    backend = "kubernetes"

    def __init__(self, *, namespace: str = DEFAULT_NAMESPACE, instance: str = "unknown") -> None:
        self.namespace = namespace
        self.instance = instance

    @property
    def limits(self) -> BackendLimits:
        """Unknown: the node a Pod lands on is chosen by the scheduler, which refuses what no node can give."""
        return BackendLimits()

    def build(self, settings: SandboxSettings, *, decision_id: str, request_id: str) -> dict[str, Any]:
        return build_options(
            settings, decision_id=decision_id, request_id=request_id, namespace=self.namespace, instance=self.instance
        )

    def guard(self, options: Mapping[str, Any], *, denied_paths: Sequence[str] = ()) -> None:
        guard(options)

    def recorded(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options unchanged (a copy): the Pod manifest names nothing by digest."""
        return copy.deepcopy(dict(options))


# --- the Pod guard ---------------------------------------------------------------------------------------
#
# One small generator per invariant, yielding (path, message); the guard runs them all and reports every problem.

_Issues = Iterable[tuple[str, str]]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _check_options(options: Mapping[str, Any]) -> _Issues:
    for key in sorted(set(options) - OPTION_KEYS):
        yield f"$.{key}", f"{key!r} is not a Kubernetes decision option (only {sorted(OPTION_KEYS)})"
    pod = options.get("pod")
    if not isinstance(pod, Mapping):
        yield "$.pod", "the Pod manifest is missing"
        return
    if options.get("pod_sha256") != pod_digest(pod):
        yield "$.pod_sha256", "pod_sha256 is not the digest of this Pod manifest (changed after assembly)"
    env = options.get("environment", {})
    if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        yield "$.environment", "environment must map names to strings"
    namespace = options.get("namespace")
    if not isinstance(namespace, str) or not _DNS_LABEL.match(namespace):
        yield "$.namespace", f"namespace {namespace!r} is not a DNS label"
    elif _mapping(pod.get("metadata")).get("namespace") != namespace:
        yield "$.pod.metadata.namespace", f"the Pod must be in the namespace {namespace!r}"


def _check_shape(pod: Mapping[str, Any]) -> _Issues:
    if pod.get("apiVersion") != "v1" or pod.get("kind") != "Pod":
        yield "$.pod", "the manifest must be apiVersion v1, kind Pod"
    for key in sorted(set(pod) - _POD_KEYS):
        yield f"$.pod.{key}", f"{key!r} is not allowed in the manifest"
    meta = _mapping(pod.get("metadata"))
    for key in sorted(set(meta) - _METADATA_KEYS):
        yield f"$.pod.metadata.{key}", f"metadata.{key} is never set (no owner, no finalizer, no generateName)"
    name = meta.get("name")
    if not isinstance(name, str) or not _DNS_LABEL.match(name):
        yield "$.pod.metadata.name", f"the Pod name {name!r} is not a DNS label"
    labels = _mapping(meta.get("labels"))
    if labels.get(MANAGED_LABEL) != "true":
        yield "$.pod.metadata.labels", f"the {MANAGED_LABEL} label is missing"
    pooled = POOL_LABEL in labels
    needed = (INSTANCE_LABEL, POOL_LABEL) if pooled else (INSTANCE_LABEL, DECISION_LABEL, REQUEST_LABEL)
    for key in needed:
        if not isinstance(labels.get(key), str) or not labels[key]:
            yield "$.pod.metadata.labels", f"the {key} label is missing"
    if pooled and (DECISION_LABEL in labels or REQUEST_LABEL in labels):
        yield "$.pod.metadata.labels", "a pooled Pod is made before any request: it names none"
    for key, value in labels.items():
        if not isinstance(value, str) or not _LABEL_VALUE.match(value) or len(value) > 63:
            yield f"$.pod.metadata.labels[{key!r}]", f"{value!r} is not a valid label value"
    spec = _mapping(pod.get("spec"))
    for key in sorted(set(spec) - _SPEC_KEYS):
        yield f"$.pod.spec.{key}", f"spec.{key} is not allowed in a sandbox Pod"


def _check_pod_spec(spec: Mapping[str, Any]) -> _Issues:
    if spec.get("restartPolicy") != "Never":
        yield "$.pod.spec.restartPolicy", "restartPolicy must be Never (a sandbox runs once)"
    for key in ("automountServiceAccountToken", "enableServiceLinks"):
        if spec.get(key) is not False:
            yield f"$.pod.spec.{key}", f"{key} must be false"
    for key in ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace"):
        if spec.get(key, False) is not False:
            yield f"$.pod.spec.{key}", f"{key} must be false (no shared namespaces)"
    deadline: Any = spec.get("activeDeadlineSeconds")
    if not _is_int(deadline) or deadline <= 0:
        yield "$.pod.spec.activeDeadlineSeconds", "activeDeadlineSeconds must be a positive integer (the backstop)"
    runtime = spec.get("runtimeClassName")
    if runtime is not None and runtime != GVISOR_RUNTIME_CLASS:
        yield "$.pod.spec.runtimeClassName", f"runtimeClassName {runtime!r} is not {GVISOR_RUNTIME_CLASS!r}"
    ctx = _mapping(spec.get("securityContext"))
    if ctx.get("runAsNonRoot") is not True:
        yield "$.pod.spec.securityContext.runAsNonRoot", "runAsNonRoot must be true"
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        if not _is_int(ctx.get(key)) or ctx[key] <= 0:
            yield f"$.pod.spec.securityContext.{key}", f"{key} must be a non-root id"
    if _mapping(ctx.get("seccompProfile")).get("type") != "RuntimeDefault":
        yield "$.pod.spec.securityContext.seccompProfile", "seccompProfile must be RuntimeDefault"
    for key in sorted(set(ctx) - {"runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "seccompProfile"}):
        yield f"$.pod.spec.securityContext.{key}", f"securityContext.{key} is never set (sysctls, SELinux, ...)"
    volumes = spec.get("volumes")
    if not isinstance(volumes, list):
        yield "$.pod.spec.volumes", "volumes must be the two memory-backed emptyDirs"
        return
    names = []
    for index, volume in enumerate(volumes):
        where = f"$.pod.spec.volumes[{index}]"
        vol = _mapping(volume)
        names.append(vol.get("name"))
        if set(vol) != {"name", "emptyDir"}:
            yield where, "a volume must be an emptyDir (never hostPath or any other source)"
            continue
        empty = _mapping(vol["emptyDir"])
        if empty.get("medium") != "Memory":
            yield where, "an emptyDir must be memory-backed (medium: Memory)"
        size = empty.get("sizeLimit")
        if not isinstance(size, str) or not size.isdigit() or int(size) <= 0:
            yield where, "an emptyDir needs a positive sizeLimit in bytes"
    if sorted(str(n) for n in names) != sorted(name for name, _ in _VOLUMES):
        yield "$.pod.spec.volumes", f"the volumes must be exactly {[name for name, _ in _VOLUMES]}"


def _check_container(spec: Mapping[str, Any]) -> _Issues:
    containers = spec.get("containers")
    if not isinstance(containers, list) or len(containers) != 1:
        yield "$.pod.spec.containers", "a sandbox Pod has exactly one container"
        return
    c = _mapping(containers[0])
    at = "$.pod.spec.containers[0]"
    for key in sorted(set(c) - _CONTAINER_KEYS):
        yield f"{at}.{key}", f"{key} is never set on the sandbox container (ports, env, probes, ...)"
    if not isinstance(c.get("image"), str) or not c.get("image"):
        yield f"{at}.image", "image is missing"
    if c.get("imagePullPolicy") not in ("Never", "IfNotPresent"):
        yield f"{at}.imagePullPolicy", "imagePullPolicy must be Never (or IfNotPresent when the policy allows pulls)"
    if c.get("command") != list(POD_COMMAND) or "args" in c:
        yield f"{at}.command", "the command must be the fixed supervisor and nothing else"
    if c.get("stdin") is not True or c.get("stdinOnce") is not True or c.get("tty") is not False:
        yield f"{at}.stdin", "stdin and stdinOnce must be true and tty false (the payload goes through attach)"
    ctx = _mapping(c.get("securityContext"))
    sc = f"{at}.securityContext"
    if ctx.get("runAsNonRoot") is not True:
        yield f"{sc}.runAsNonRoot", "runAsNonRoot must be true"
    for key in ("runAsUser", "runAsGroup"):
        if not _is_int(ctx.get(key)) or ctx[key] <= 0:
            yield f"{sc}.{key}", f"{key} must be a non-root id"
    if ctx.get("allowPrivilegeEscalation") is not False:
        yield f"{sc}.allowPrivilegeEscalation", "allowPrivilegeEscalation must be false"
    if ctx.get("privileged", False) is not False:
        yield f"{sc}.privileged", "privileged containers are never allowed"
    if ctx.get("readOnlyRootFilesystem") is not True:
        yield f"{sc}.readOnlyRootFilesystem", "the root filesystem must be read-only"
    caps = _mapping(ctx.get("capabilities"))
    if caps.get("drop") != ["ALL"] or caps.get("add"):
        yield f"{sc}.capabilities", "capabilities must drop ALL and add none"
    if _mapping(ctx.get("seccompProfile")).get("type") != "RuntimeDefault":
        yield f"{sc}.seccompProfile", "seccompProfile must be RuntimeDefault"
    allowed = {"runAsNonRoot", "runAsUser", "runAsGroup", "allowPrivilegeEscalation", "privileged",
               "readOnlyRootFilesystem", "capabilities", "seccompProfile"}  # fmt: skip
    for key in sorted(set(ctx) - allowed):
        yield f"{sc}.{key}", f"securityContext.{key} is never set (procMount, SELinux, AppArmor overrides, ...)"
    pod_ctx = _mapping(spec.get("securityContext"))
    for key in ("runAsUser", "runAsGroup"):
        if key in ctx and key in pod_ctx and ctx[key] != pod_ctx[key]:
            yield f"{sc}.{key}", f"{key} differs from the Pod's"
    resources = _mapping(c.get("resources"))
    limits, requests = _mapping(resources.get("limits")), _mapping(resources.get("requests"))
    for name in _RESOURCES:
        if name not in limits:
            yield f"{at}.resources.limits", f"a {name} limit is required"
        elif limits.get(name) != requests.get(name):
            yield f"{at}.resources.requests", f"the {name} request must equal its limit (Guaranteed QoS)"
    mounts = c.get("volumeMounts")
    wanted = [{"name": name, "mountPath": path} for name, path in _VOLUMES]
    if mounts != wanted:
        yield f"{at}.volumeMounts", f"the volume mounts must be exactly {wanted} (writable, size-capped)"


def _check_image(options: Mapping[str, Any]) -> _Issues:
    containers = _mapping(options.get("pod")).get("spec", {}).get("containers") or [{}]
    if _mapping(containers[0]).get("image") != options.get("image"):
        yield "$.image", "the container's image must be the decision's image"


def guard(options: Mapping[str, Any]) -> None:
    """Refuse ``options`` (raise :class:`UnsafeOptionsError` listing every problem) unless all Pod invariants hold."""
    issues = list(_check_options(options))
    pod = options.get("pod")
    if isinstance(pod, Mapping):
        spec = _mapping(pod.get("spec"))
        issues.extend(_check_shape(pod))
        issues.extend(_check_pod_spec(spec))
        issues.extend(_check_container(spec))
        issues.extend(_check_image(options))
    if issues:
        problems = [Problem(message, path=path, code="decision.unsafe_options") for path, message in issues]
        raise UnsafeOptionsError(f"refused unsafe Pod ({len(problems)} problem(s))", problems=problems)

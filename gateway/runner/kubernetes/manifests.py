"""The cluster-side objects an operator applies once (``gateway kubernetes manifests``), as plain manifests.

- ``gateway-system``: the gateway itself (Deployment with at least two replicas, Service, ServiceAccount, its
  configuration and policies as ConfigMaps); ``gateway-sandboxes``: the sandbox Pods. Both namespaces enforce
  Pod Security Admission ``restricted`` (pinned to the validated Kubernetes version).
- RBAC: a Role in ``gateway-sandboxes`` with exactly the verbs the backend uses (``pods``: create, get, list,
  watch, delete; ``pods/attach``: create, get; ``pods/log``: get), bound to the gateway's ServiceAccount. No
  wildcard, no Secret, no ``escalate`` / ``bind`` / ``impersonate`` (a unit test checks).
- A deny-all NetworkPolicy for every Pod of ``gateway-sandboxes``: both policy types, no rules (enforced by
  CNIs that implement NetworkPolicy; the README names the ones that do not).
- The RuntimeClass ``gvisor`` (handler ``runsc``) when one of the given policies can run under gVisor.

Each replica keeps its own audit chain (``GATEWAY_INSTANCE`` is its Pod's name, which is also the instance label
of its sandboxes); the Reports issue merges chains.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from gateway._version import __version__
from gateway.policy import Policy
from gateway.runner.kubernetes.pod import DEFAULT_NAMESPACE, GVISOR_RUNTIME_CLASS

__all__ = [
    "GATEWAY_IMAGE",
    "GATEWAY_NAMESPACE",
    "KUBERNETES_VERSION",
    "ROLE_RULES",
    "SANDBOX_NAMESPACE",
    "cluster_manifests",
    "dump_all",
]

KUBERNETES_VERSION = "1.33"
"""The Kubernetes version the manifests and Pods are validated against (``kubernetes-validate``, strict)."""

GATEWAY_IMAGE = f"agent-exec-gateway:{__version__}"
"""The gateway's own image, tagged with this gateway's version: the Deployment's image unless one is given."""

GATEWAY_NAMESPACE = "gateway-system"
SANDBOX_NAMESPACE = DEFAULT_NAMESPACE
SERVICE_ACCOUNT = "gateway"
GATEWAY_PORT = 8787
GATEWAY_UID = 10001
ROLE_RULES: tuple[dict[str, Any], ...] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},
    # attach is a WebSocket upgrade: a GET that the API server authorizes as "create" since 1.30 (KEP-4006),
    # and as "get" before; both are listed so the Role works on either side of that change.
    {"apiGroups": [""], "resources": ["pods/attach"], "verbs": ["create", "get"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
)
"""The backend's API calls, one rule per resource: nothing else is granted."""
_APP = {"app.kubernetes.io/name": "agent-exec-gateway"}


def _namespace(name: str) -> dict[str, Any]:
    version = f"v{KUBERNETES_VERSION}"
    labels = {"kubernetes.io/metadata.name": name}
    for mode in ("enforce", "audit", "warn"):
        labels[f"pod-security.kubernetes.io/{mode}"] = "restricted"
        labels[f"pod-security.kubernetes.io/{mode}-version"] = version
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def _server_config(policy_file: str | None) -> str:
    config: dict[str, Any] = {
        "apiVersion": "gateway.agent-exec/v1",
        "kind": "ServerConfig",
        "host": "0.0.0.0",  # noqa: S104 - the Service's port; the Pod network is the boundary
        "port": GATEWAY_PORT,
        "principals": "/etc/gateway/principals/principals.yaml",
        "audit_dir": "/var/lib/gateway/audit",
        "backend": "kubernetes",
        "kubernetes": {"namespace": SANDBOX_NAMESPACE, "in_cluster": True},
    }
    if policy_file is not None:
        config["policy"] = f"/etc/gateway/policies/{policy_file}"
    return yaml.safe_dump(config, sort_keys=False)


def _deployment(image: str, replicas: int, has_policies: bool) -> dict[str, Any]:
    restricted = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": GATEWAY_UID,
        "runAsGroup": GATEWAY_UID,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    mounts = [
        {"name": "config", "mountPath": "/etc/gateway/config", "readOnly": True},
        {"name": "principals", "mountPath": "/etc/gateway/principals", "readOnly": True},
        {"name": "audit", "mountPath": "/var/lib/gateway/audit"},
        {"name": "tmp", "mountPath": "/tmp"},  # noqa: S108 - the container's own
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": "gateway-config"}},
        {"name": "principals", "configMap": {"name": "gateway-principals"}},
        # One chain per replica; replace with a PersistentVolume (or a StatefulSet's claim) to keep it.
        {"name": "audit", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
    ]
    if has_policies:
        mounts.append({"name": "policies", "mountPath": "/etc/gateway/policies", "readOnly": True})
        volumes.append({"name": "policies", "configMap": {"name": "gateway-policies"}})
    container = {
        "name": "gateway",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["gateway", "serve", "--config", "/etc/gateway/config/server.yaml"],
        "env": [
            {"name": "GATEWAY_INSTANCE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "GATEWAY_RUNTIME_DIR", "value": "/tmp/gateway"},  # noqa: S108
        ],
        "ports": [{"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 20},
        "resources": {
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"cpu": "1", "memory": "512Mi", "ephemeral-storage": "1Gi"},
        },
        "securityContext": restricted,
        "volumeMounts": mounts,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gateway", "namespace": GATEWAY_NAMESPACE, "labels": dict(_APP)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(_APP)},
            "template": {
                "metadata": {"labels": dict(_APP)},
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "automountServiceAccountToken": True,  # in-cluster configuration: the only Pod that has it
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": GATEWAY_UID,
                        "runAsGroup": GATEWAY_UID,
                        "fsGroup": GATEWAY_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def cluster_manifests(
    policies: Sequence[Policy] = (), *, image: str = GATEWAY_IMAGE, replicas: int = 2
) -> list[dict[str, Any]]:
    """Every object, in the order to apply them. ``policies``: what the gateway will serve (their files go
    into the ``gateway-policies`` ConfigMap; a RuntimeClass is added when one can use gVisor)."""
    if replicas < 2:
        raise ValueError(f"replicas must be at least 2 (got {replicas}): one gateway is a single point of failure")
    docs: list[dict[str, Any]] = [_namespace(GATEWAY_NAMESPACE), _namespace(SANDBOX_NAMESPACE)]
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": GATEWAY_NAMESPACE, "labels": dict(_APP)},
            "automountServiceAccountToken": False,  # only the gateway's own Pods mount it (their spec says so)
        }
    )
    docs.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "gateway-sandboxes", "namespace": SANDBOX_NAMESPACE, "labels": dict(_APP)},
            "rules": [json.loads(json.dumps(rule)) for rule in ROLE_RULES],
        }
    )
    docs.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "gateway-sandboxes", "namespace": SANDBOX_NAMESPACE, "labels": dict(_APP)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gateway-sandboxes"},
            "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": GATEWAY_NAMESPACE}],
        }
    )
    docs.append(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "deny-all", "namespace": SANDBOX_NAMESPACE, "labels": dict(_APP)},
            # Every Pod of the namespace (only sandboxes live there): no ingress, no egress, not even DNS.
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
        }
    )
    if any("runsc" in p.runtime.allowed or p.runtime.required == "runsc" for p in policies):
        docs.append(
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": GVISOR_RUNTIME_CLASS, "labels": dict(_APP)},
                "handler": "runsc",
            }
        )
    files = {posixpath.basename(p.source): Path(p.source).read_text(encoding="utf-8") for p in policies}
    if len(files) != len(policies):
        raise ValueError("two policies share a file name; the ConfigMap keys would collide")
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "gateway-config", "namespace": GATEWAY_NAMESPACE, "labels": dict(_APP)},
            "data": {"server.yaml": _server_config(next(iter(files), None))},
        }
    )
    if files:
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "gateway-policies", "namespace": GATEWAY_NAMESPACE, "labels": dict(_APP)},
                "data": files,
            }
        )
    docs.append(_deployment(image, replicas, bool(files)))
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "gateway", "namespace": GATEWAY_NAMESPACE, "labels": dict(_APP)},
            "spec": {
                "selector": dict(_APP),
                "ports": [{"name": "http", "port": GATEWAY_PORT, "targetPort": "http", "protocol": "TCP"}],
            },
        }
    )
    return docs


def dump_all(docs: Sequence[dict[str, Any]]) -> str:
    """One multi-document YAML stream."""
    return yaml.safe_dump_all(list(docs), sort_keys=False, explicit_start=True)

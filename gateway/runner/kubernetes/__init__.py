"""The Kubernetes backend: every Kubernetes word of the gateway lives here.

``pod`` (the assembler that builds the hardened Pod manifest from resolved settings, and the Pod guard),
``manifests`` (the cluster-side objects an operator applies once: namespaces, RBAC, NetworkPolicy,
RuntimeClass, the gateway's Deployment and Service), ``client`` (the API calls, through the official
``kubernetes`` client, imported lazily), ``runner`` (``KubernetesRunner``: create → watch → attach → payload →
read → delete) and ``errors`` (the client's exceptions mapped to the gateway's). The in-Pod supervisor and its
framed protocol are every backend's (``runner/supervisor.py``, ``runner/frames.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.runner.kubernetes.pod import KubernetesAssembler, build_options, build_pod, guard

if TYPE_CHECKING:
    from gateway.runner.kubernetes.runner import KubernetesRunner

__all__ = ["KubernetesAssembler", "KubernetesRunner", "build_options", "build_pod", "guard"]


def __getattr__(name: str) -> Any:
    if name == "KubernetesRunner":
        from gateway.runner.kubernetes.runner import KubernetesRunner  # noqa: PLC0415

        return KubernetesRunner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

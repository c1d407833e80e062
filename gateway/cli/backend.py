"""``--backend docker|kubernetes`` and the Kubernetes connection flags, shared by ``run``, ``check`` and ``reap``.

The Kubernetes runner is built without contacting a cluster (its client connects on first use), so ``gateway
check --backend kubernetes`` prints the Pod a run would submit with no API server anywhere.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from gateway.errors import RequestError
from gateway.runner import Runner

__all__ = ["BACKENDS", "add_backend_args", "make_runner"]

BACKENDS = ("docker", "kubernetes")


def add_backend_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="sandbox backend (default: $GATEWAY_BACKEND, then docker)",
    )
    p.add_argument("--namespace", help="Kubernetes: the sandbox namespace (default gateway-sandboxes)")
    p.add_argument("--kubeconfig", metavar="FILE", help="Kubernetes: kubeconfig file (default: $KUBECONFIG)")
    p.add_argument("--context", help="Kubernetes: kubeconfig context")
    p.add_argument("--in-cluster", action="store_true", help="Kubernetes: use the Pod's service account")


def make_runner(args: argparse.Namespace) -> Runner | None:
    """The runner the flags ask for; None for Docker (``Gateway.from_env`` makes and owns that one)."""
    backend = getattr(args, "backend", None) or os.environ.get("GATEWAY_BACKEND") or "docker"
    if backend not in BACKENDS:
        raise RequestError(f"GATEWAY_BACKEND={backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend == "docker":
        return None
    from gateway.runner.kubernetes.client import KubeClient, KubeConfig  # noqa: PLC0415
    from gateway.runner.kubernetes.runner import KubernetesRunner  # noqa: PLC0415

    settings: dict[str, Any] = {
        "kubeconfig": getattr(args, "kubeconfig", None),
        "context": getattr(args, "context", None),
        "in_cluster": bool(getattr(args, "in_cluster", False)),
    }
    if getattr(args, "namespace", None):
        settings["namespace"] = args.namespace
    return KubernetesRunner(KubeClient(KubeConfig(**settings)))

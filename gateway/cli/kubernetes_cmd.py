"""``gateway kubernetes manifests``: the cluster-side objects for the Kubernetes backend, one YAML stream on stdout.

Nothing contacts a cluster: the operator reviews the stream and applies it (``kubectl apply -f -``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.errors import EXIT_USAGE
from gateway.policy import load_policy

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    kube = sub.add_parser("kubernetes", help="the Kubernetes backend's cluster-side objects")
    kube_sub = kube.add_subparsers(dest="kubernetes_command", metavar="COMMAND")
    kube_sub.required = True
    m = kube_sub.add_parser(
        "manifests",
        help="print the namespaces, RBAC, NetworkPolicy, RuntimeClass, Deployment and Service to apply once",
        description="Write one multi-document YAML stream to stdout: namespaces gateway-system and "
        "gateway-sandboxes (Pod Security restricted enforced), the gateway's ServiceAccount, a Role with only the "
        "verbs the backend uses and its RoleBinding, a deny-all NetworkPolicy for the sandboxes, the gvisor "
        "RuntimeClass (handler runsc) when a policy can use gVisor, the gateway's configuration and policies, "
        "a Deployment (at least two replicas) and a Service. Validated against Kubernetes 1.33.",
    )
    m.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="FILE",
        help="a policy the gateway serves (repeatable; the first is its default; none: the built-in default)",
    )
    m.add_argument(
        "--image", help="the gateway's own container image (default: agent-exec-gateway tagged with this version)"
    )
    m.add_argument("--replicas", type=int, default=2, help="gateway replicas (at least 2)")
    m.set_defaults(func=_manifests)


def _manifests(args: argparse.Namespace) -> int:
    from gateway.runner.kubernetes.manifests import GATEWAY_IMAGE, cluster_manifests, dump_all  # noqa: PLC0415

    if args.replicas < 2:
        print(f"gateway: --replicas must be at least 2 (got {args.replicas})", file=sys.stderr)
        return EXIT_USAGE
    policies = [load_policy(path) for path in args.policy]
    image = GATEWAY_IMAGE if args.image is None else args.image
    sys.stdout.write(dump_all(cluster_manifests(policies, image=image, replicas=args.replicas)))
    return 0

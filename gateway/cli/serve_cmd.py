"""``gateway serve``: the HTTP service on uvicorn (see :mod:`gateway.service.app`).

Embedded defaults (127.0.0.1, port 8787, ``./principals.yaml``, the default policy, ``./audit``) make
``gateway principals add me --policy policies/default.yaml && gateway serve`` a working service. It refuses
to start when no principal holds a token: there is no unauthenticated mode.
"""

from __future__ import annotations

import argparse
import functools
import math
import signal
import sys
from collections.abc import Callable
from typing import Any

from gateway.runner import Runner
from gateway.service.config import ServerConfig, load_server_config

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the gateway over HTTP to principals holding a token",
        description="Serve the gateway's HTTP API (/v1/executions, /v1/decisions, /v1/policy, /v1/tools, /healthz, "
        "/readyz). Every /v1 call needs `Authorization: Bearer TOKEN` (tokens: `gateway principals add`); each "
        "principal's requests are decided under its own policy. A flag overrides the configuration file's key.",
    )
    p.add_argument("--config", metavar="FILE", help="server configuration (YAML, schemas/server.schema.json)")
    p.add_argument(
        "--principals", metavar="FILE", help="principals file (default: $GATEWAY_PRINCIPALS, then ./principals.yaml)"
    )
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (default 8787; 0 picks a free one)")
    p.add_argument("--audit-dir", help="audit trail directory (default: $GATEWAY_AUDIT_DIR, then ./audit)")
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this PEM certificate (needs --tls-key)")
    p.add_argument(
        "--grace", type=float, metavar="S", help="SIGTERM: seconds in-flight runs may take to finish (default 30)"
    )
    p.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert (needs --tls-cert)")
    p.add_argument(
        "--pool",
        action="store_true",
        default=None,
        help="keep a warm pool of single-use sandboxes, sized by each policy's spec.pool (config key `pool`)",
    )
    p.set_defaults(func=_serve)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The configuration file (or the embedded defaults) with the flags applied."""
    base = load_server_config(args.config) if args.config else ServerConfig()
    return base.with_overrides(
        host=args.host,
        port=args.port,
        principals=args.principals,
        audit_dir=args.audit_dir,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        grace_s=getattr(args, "grace", None),
        pool=getattr(args, "pool", None),
    )


def tls_args(config: ServerConfig) -> dict[str, Any]:
    """uvicorn's ``ssl_certfile`` / ``ssl_keyfile`` when the configuration serves TLS."""
    if config.tls_cert is None or config.tls_key is None:
        return {}
    return {"ssl_certfile": str(config.tls_cert), "ssl_keyfile": str(config.tls_key)}


def _server_class(base: type[Any]) -> type[Any]:
    """uvicorn's server, except that SIGTERM is a clean stop: uvicorn re-raises the signal it handled after
    shutting down (the process would end by it, status -15); after our stop record, ``gateway serve`` exits 0."""

    class Server(base):  # type: ignore[misc]
        def handle_exit(self, sig: int, frame: Any) -> None:
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:
                captured: list[int] = getattr(self, "_captured_signals", [])
                self._captured_signals = [s for s in captured if s != signal.SIGTERM]

    return Server


def _kubernetes_runner(config: ServerConfig) -> Callable[[], Runner]:
    """The Kubernetes runner of the configuration's ``kubernetes:`` section (it connects on first use)."""
    from gateway.runner.kubernetes.client import KubeConfig  # noqa: PLC0415

    kube = config.kubernetes
    settings = KubeConfig(
        namespace=kube.namespace,
        kubeconfig=str(kube.kubeconfig) if kube.kubeconfig is not None else None,
        context=kube.context,
        in_cluster=kube.in_cluster,
    )
    return functools.partial(_kube_runner, settings)


def _kube_runner(settings: Any) -> Runner:
    """A Kubernetes runner on ``settings`` (module level: the decision workers receive the factory pickled)."""
    from gateway.runner.kubernetes.client import KubeClient  # noqa: PLC0415
    from gateway.runner.kubernetes.runner import KubernetesRunner  # noqa: PLC0415

    return KubernetesRunner(KubeClient(settings))


def _serve(args: argparse.Namespace) -> int:
    import uvicorn  # noqa: PLC0415 - the server only when serving

    from gateway.runner.docker.runner import DockerRunner  # noqa: PLC0415 - docker-py only when serving
    from gateway.service.app import build_app  # noqa: PLC0415 - Starlette only when serving
    from gateway.service.service import Service  # noqa: PLC0415 - the service only when serving
    from gateway.service.deadlines import http_protocol  # noqa: PLC0415 - uvicorn only when serving

    config = config_from_args(args)
    runner: Callable[[], Runner] = DockerRunner
    if config.backend == "kubernetes":
        runner = _kubernetes_runner(config)
    service = Service.from_config(config, runner=runner)  # refuses to start without principals with a token
    server = _server_class(uvicorn.Server)(
        uvicorn.Config(
            build_app(service),
            host=config.host,
            port=config.port,
            http=http_protocol(
                config.header_read_s, max_connections=config.max_connections, on_refused=service.connection_refused
            ),
            lifespan="on",
            proxy_headers=False,
            server_header=False,
            timeout_graceful_shutdown=max(1, math.ceil(config.grace_s)),
            log_level="info",
            **tls_args(config),
        )
    )
    names = ", ".join(sorted(p.name for p in service.principals if p.tokens))
    print(
        f"gateway: serving principals {names} on {'https' if config.tls_cert else 'http'}://{config.host}:{config.port}",
        file=sys.stderr,
    )
    server.run()
    return 0

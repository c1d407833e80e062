"""``gateway serve``: the HTTP service on uvicorn (see :mod:`gateway.service.app`).

Embedded defaults (127.0.0.1, port 8787, ``./principals.yaml``, the default policy, ``./audit``) make
``gateway principals add me --policy policies/default.yaml && gateway serve`` a working service. It refuses
to start when no principal holds a token: there is no unauthenticated mode.

Start-up binds the listener and checks the audit trail before anything else, and says "serving" only once the
application has started; a port in use or a trail that refuses its key is one line on stderr and an exit status
of its own (:data:`EXIT_STATUSES`). SIGTERM first drains (``drain_s``: ``/readyz`` answers 503 while everything
is still served), then stops as uvicorn does (``grace_s`` for what is in flight, then the runs are cancelled).
"""

from __future__ import annotations

import argparse
import copy
import errno
import functools
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, Final

from gateway.errors import EXIT_GATEWAY_FAILURE, EXIT_USAGE, AuditError, ServerConfigError
from gateway.runner import Runner
from gateway.service.accesslog import ACCESS_LOGGER, FORMATS
from gateway.service.config import ServerConfig, load_server_config

__all__ = ["EXIT_ADDRESS_UNAVAILABLE", "EXIT_AUDIT_REFUSED", "EXIT_STARTUP_FAILED", "EXIT_STATUSES", "register"]

EXIT_AUDIT_REFUSED: Final = 74
"""The audit trail refuses to be extended: it does not match the configured key, or its end is broken
(sysexits ``EX_IOERR``)."""
EXIT_ADDRESS_UNAVAILABLE: Final = 75
"""The listener cannot be bound: the port is in use, or the address is not this host's or not allowed
(sysexits ``EX_TEMPFAIL``: a port still held by a stopping instance is free again soon)."""
EXIT_STARTUP_FAILED: Final = 3
"""The application failed while starting (uvicorn's own status; the log says why)."""
EXIT_STATUSES: Final = (
    (0, "stopped by SIGTERM or SIGINT"),
    (EXIT_USAGE, "usage error"),
    (EXIT_STARTUP_FAILED, "the application failed while starting (the log above says why)"),
    (EXIT_AUDIT_REFUSED, "the audit trail refuses the configured key, or its end is broken"),
    (EXIT_ADDRESS_UNAVAILABLE, "cannot listen on the address (port in use, address not this host's)"),
    (EXIT_GATEWAY_FAILURE, "any other reason not to start: configuration, principals, a policy"),
)
"""Every exit status of ``gateway serve`` (``--help`` and the README list them)."""
_BACKLOG: Final = 2048
"""Connections the kernel queues for the listener (uvicorn's default)."""

_log = logging.getLogger("gateway.service")


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the gateway over HTTP to principals holding a token",
        description="Serve the gateway's HTTP API (/v1/executions, /v1/decisions, /v1/policy, /v1/tools, /healthz, "
        "/readyz). Every /v1 call needs `Authorization: Bearer TOKEN` (tokens: `gateway principals add`); each "
        "principal's requests are decided under its own policy. A flag overrides the configuration file's key "
        "(deploy/server.yaml is an example with every key). One access-log line per request goes to stdout.",
        epilog="exit status: " + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_STATUSES) + ".",
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
        "--drain",
        type=float,
        metavar="S",
        help="SIGTERM: seconds /readyz answers 503 while everything is still served, before the listener closes "
        "(default 5; 0 closes it at once)",
    )
    p.add_argument(
        "--grace", type=float, metavar="S", help="SIGTERM: seconds in-flight runs may take to finish (default 30)"
    )
    p.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert (needs --tls-cert)")
    p.add_argument(
        "--access-log-format", choices=FORMATS, help="access log lines: text (default) or json (one object a line)"
    )
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
        drain_s=getattr(args, "drain", None),
        grace_s=getattr(args, "grace", None),
        access_log_format=getattr(args, "access_log_format", None),
        pool=getattr(args, "pool", None),
    )


def tls_args(config: ServerConfig) -> dict[str, Any]:
    """uvicorn's ``ssl_certfile`` / ``ssl_keyfile`` when the configuration serves TLS."""
    if config.tls_cert is None or config.tls_key is None:
        return {}
    return {"ssl_certfile": str(config.tls_cert), "ssl_keyfile": str(config.tls_key)}


_WHAT_TO_DO: Final = {
    errno.EADDRINUSE: "another process listens there: stop it, or choose another port (--port, config key port)",
    errno.EACCES: "this user may not bind that port: choose one above 1023, or grant CAP_NET_BIND_SERVICE",
    errno.EADDRNOTAVAIL: "no interface of this host has that address: fix --host (config key host)",
}
"""What to do when binding the listener fails with that errno."""


class AddressUnavailableError(Exception):
    """The listener could not be bound; ``str()`` is the one line ``gateway serve`` prints."""


def listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to, as asyncio's ``create_server`` would bind them
    (``SO_REUSEADDR``; IPv6 sockets IPv6 only), so that a port in use is known before anything starts."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    sockets: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(_BACKLOG)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        todo = _WHAT_TO_DO.get(exc.errno or 0, "fix --host / --port (config keys host, port)")
        if isinstance(exc, socket.gaierror):
            todo = "the host name does not resolve: fix --host (config key host)"
        line = f"error[service.address_unavailable]: cannot listen on {where}: {exc.strerror or exc}; {todo}"
        raise AddressUnavailableError(line) from exc
    return sockets


def _one_line(error: AuditError) -> str:
    """The error's diagnostics (message, problems, hint) as one line."""
    return " ".join(line.strip() for line in error.diagnostics().splitlines())


def log_config() -> dict[str, Any]:
    """uvicorn's logging configuration plus the gateway's loggers: ``gateway.access`` to stdout, one bare line
    per request; the rest of ``gateway`` (warnings, reloads, the drain) to stderr like uvicorn's own lines."""
    from uvicorn.config import LOGGING_CONFIG  # noqa: PLC0415 - uvicorn only when serving

    config: dict[str, Any] = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["gateway_access"] = {"format": "%(message)s"}
    config["handlers"]["gateway_access"] = {
        "class": "logging.StreamHandler", "formatter": "gateway_access", "stream": "ext://sys.stdout",
    }  # fmt: skip
    config["loggers"]["gateway"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    config["loggers"][ACCESS_LOGGER] = {"handlers": ["gateway_access"], "level": "INFO", "propagate": False}
    return config


def _server_class(
    base: type[Any],
    *,
    drain_s: float = 0.0,
    on_drain: Callable[[], None] = lambda: None,
    on_started: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
) -> type[Any]:
    """uvicorn's server, with three changes:

    * SIGTERM is a clean stop: uvicorn re-raises the signal it handled after shutting down (the process would
      end by it, status -15); after our stop record, ``gateway serve`` exits 0.
    * SIGTERM first drains for ``drain_s`` (``on_drain``: the service's ``/readyz`` answers 503) while every
      request, new ones too, is still served; then uvicorn's shutdown. A second SIGTERM, or SIGINT, stops now.
    * ``on_started`` once the application has started and the listeners serve (the "serving" line).
    """

    class Server(base):  # type: ignore[misc]
        _drain_until: float | None = None
        _drain_logged = False

        should_exit: bool

        def handle_exit(self, sig: int, frame: Any) -> None:
            if sig == signal.SIGTERM and drain_s > 0 and self._drain_until is None and not self.should_exit:
                self._drain_until = clock() + drain_s  # in a signal handler: set flags only, log on the next tick
                on_drain()
                return
            super().handle_exit(sig, frame)
            if sig == signal.SIGTERM:
                captured: list[int] = getattr(self, "_captured_signals", [])
                self._captured_signals = [s for s in captured if s != signal.SIGTERM]

        async def on_tick(self, counter: int) -> bool:
            if self._drain_until is not None and not self.should_exit:
                if not self._drain_logged:
                    self._drain_logged = True
                    _log.info("SIGTERM: draining for %g s (/readyz answers 503), then stopping", drain_s)
                if clock() >= self._drain_until:
                    self.should_exit = True
            stop: bool = await super().on_tick(counter)
            return stop

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                on_started()

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


def _docker_runner(config: ServerConfig) -> Callable[[], Runner]:
    """The Docker runner, with the secrets of ``secrets_file`` (else ``GATEWAY_SECRETS_FILE``) and the
    ``GATEWAY_SECRET_*`` variables read now: a secrets file others may read stops the service from starting."""
    from gateway.egress.secrets import SecretStore, SecretStoreError  # noqa: PLC0415 - only when serving
    from gateway.runner.docker.runner import DockerRunner  # noqa: PLC0415 - docker-py only when serving

    path = config.secrets_file or os.environ.get("GATEWAY_SECRETS_FILE")
    try:
        store = SecretStore.load(os.environ, str(path) if path else None)
    except SecretStoreError as exc:
        raise ServerConfigError(f"secrets_file: {exc}") from exc
    return functools.partial(DockerRunner, secrets=store)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn  # noqa: PLC0415 - the server only when serving

    from gateway.service.accesslog import AccessLog  # noqa: PLC0415 - Starlette only when serving
    from gateway.service.app import build_app  # noqa: PLC0415 - Starlette only when serving
    from gateway.service.deadlines import http_protocol  # noqa: PLC0415 - uvicorn only when serving
    from gateway.service.service import Service  # noqa: PLC0415 - the service only when serving

    config = config_from_args(args)
    try:
        sockets = listen(config.host, config.port)
    except AddressUnavailableError as exc:
        print(f"gateway serve: {exc}", file=sys.stderr)
        return EXIT_ADDRESS_UNAVAILABLE
    try:
        runner = _kubernetes_runner(config) if config.backend == "kubernetes" else _docker_runner(config)
        try:
            service = Service.from_config(config, runner=runner)  # refuses to start without principals with a token
        except AuditError as exc:  # the trail is checked against its key before anything starts
            print(f"gateway serve: {_one_line(exc)}", file=sys.stderr)
            return EXIT_AUDIT_REFUSED
        port = sockets[0].getsockname()[1]  # the one the kernel chose for --port 0

        def drain() -> None:  # in the SIGTERM handler: a flag only
            service.draining = True

        def announce() -> None:
            names = ", ".join(sorted(p.name for p in service.principals if p.tokens))
            scheme = "https" if config.tls_cert else "http"
            host = f"[{config.host}]" if ":" in config.host else config.host
            print(f"gateway: serving principals {names} on {scheme}://{host}:{port}", file=sys.stderr, flush=True)

        server = _server_class(
            uvicorn.Server,
            drain_s=config.drain_s,
            on_drain=drain,
            on_started=announce,
        )(
            uvicorn.Config(
                AccessLog(build_app(service), format=config.access_log_format),
                host=config.host,
                port=port,
                http=http_protocol(
                    config.header_read_s,
                    max_connections=config.max_connections,
                    max_header_bytes=config.max_header_bytes,
                    max_headless_connections=config.max_headless_connections,
                    on_refused=service.connection_refused,
                ),
                lifespan="on",
                proxy_headers=False,
                server_header=False,
                timeout_graceful_shutdown=max(1, math.ceil(config.grace_s)),
                log_level="info",
                log_config=log_config(),
                access_log=False,  # ours: gateway.service.accesslog
                **tls_args(config),
            )
        )
        server.run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
    return 0

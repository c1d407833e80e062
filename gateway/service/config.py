"""The configuration of ``gateway serve``: a strict YAML file (``schemas/server.schema.json``) plus flags.

Every key has an embedded default, so no file is needed: ``gateway serve`` alone listens on 127.0.0.1:8787
with ``./principals.yaml``, the default policy and ``./audit``. Precedence, per setting: the flag, then the
file, then the environment variable the CLI already knows (``GATEWAY_PRINCIPALS``, ``GATEWAY_POLICY``,
``GATEWAY_AUDIT_DIR``), then the default. Problems are reported like a policy's, ``file:line: $.path: ...``.
A relative path in the file is taken from the file's own directory (``principals: principals.yaml`` next to
it), not from where ``gateway serve`` runs; a flag's relative path is taken from the working directory.
``deploy/server.yaml`` is the shipped example: every key, commented.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Final, Literal

from jsonschema import Draft202012Validator

from gateway.errors import Problem, ServerConfigError
from gateway.resources import load_schema
from gateway.service.principals import DEFAULT_QUOTAS, Quotas
from gateway.service.trailbudget import DEFAULT_TRAIL_BYTES_PER_MINUTE
from gateway.validation import load_yaml_checked
from gateway.yamlstrict import read_capped

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_HEADER_BYTES",
    "DEFAULT_PORT",
    "MAX_CONFIG_BYTES",
    "KubernetesSettings",
    "McpSettings",
    "ServerConfig",
    "load_server_config",
    "load_server_config_text",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
"""The default bound on a request's head: far above any real client's, far below what hurts the service."""
MAX_CONFIG_BYTES = 1024 * 1024
"""A configuration file larger than this is refused before parsing."""


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    """The ``kubernetes:`` section: where the sandbox Pods go and how to reach the API server."""

    namespace: str = "gateway-sandboxes"
    kubeconfig: Path | None = None
    context: str | None = None
    in_cluster: bool = False


@dataclass(frozen=True, slots=True)
class McpSettings:
    """The ``mcp:`` section: whether ``/mcp`` keeps state per MCP session, and its bounds
    (:mod:`gateway.service.mcp_http`)."""

    session: Literal["kernel", "workspace"] | None = None
    """None: the stateless transport (no MCP session, each call starts from nothing); ``kernel`` or
    ``workspace``: an MCP session per client, each with one gateway session of that mode for its tool calls."""
    max_sessions: int = 256
    """Live MCP sessions in the whole service; past them a new one is refused (429 ``service.over_quota``)."""
    max_sessions_per_principal: int = 8
    """Live MCP sessions of one principal; past them, the same 429."""
    idle_s: float = 900.0
    """An MCP session with no request for this long ends, and its gateway session is closed."""


_SECONDS: Final = (
    "header_read_s", "body_read_s", "queue_wait_s", "stream_stall_s", "drain_s", "grace_s",
    "auth_failure_interval_s",
)  # fmt: skip
"""The durations of :class:`ServerConfig` (seconds, as floats) that a config file may set."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """What the service runs with; the defaults are the embedded ones."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    principals: Path | None = None
    """The principals file; None: ``GATEWAY_PRINCIPALS``, then ``./principals.yaml``."""
    policy: Path | None = None
    """The default policy; None: ``GATEWAY_POLICY``, then the shipped default."""
    audit_dir: Path | None = None
    """None: ``GATEWAY_AUDIT_DIR``, then ``./audit``."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_body_bytes_in_flight: int | None = None
    """The bytes of request bodies the service holds at once, one principal at most half (past them: 429 or 503
    before the body is read; :class:`gateway.service.bodies.BodyBudget`). None:
    :func:`gateway.service.bodies.default_body_budget`."""
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    """The most bytes of a request's head (request line and headers); past it, 431 ``request.header_too_large``
    and the connection is closed (:mod:`gateway.service.deadlines`)."""
    header_read_s: float = 5.0
    """The longest a connection may take to send a request's line and headers (from its opening, or from the
    previous response); then it is closed (:mod:`gateway.service.deadlines`)."""
    body_read_s: float = 30.0
    """The longest the service waits for a request's whole body; then 408 (``request.timeout``), so a client
    that sends its body slowly cannot hold a connection and a request slot open."""
    max_connections: int | None = None
    """Client connections held at once; one more is answered 503 ``service.too_many_connections`` and closed
    (:mod:`gateway.service.deadlines`). None: :func:`gateway.service.deadlines.default_max_connections`."""
    max_headless_connections: int | None = None
    """Of those, the most without a complete request head; one more closes the oldest of them
    (:mod:`gateway.service.deadlines`). None: a quarter of ``max_connections``."""
    quotas: Quotas = DEFAULT_QUOTAS
    """Default quotas: each field a principal does not set comes from here (enforced by
    :mod:`gateway.service.quotas`)."""
    max_concurrent_executions: int | None = None
    """The global bound on running executions; None: :func:`gateway.service.quotas.default_global_bound`."""
    queue_wait_s: float = 60.0
    """The longest an execution waits in its principal's queue for a slot; then 429 (``queue_wait``)."""
    stream_stall_s: float = 30.0
    """A streaming client that takes nothing for this long is treated as gone: its run is cancelled and the
    server stops writing to it (see :mod:`gateway.service.streaming`)."""
    drain_s: float = 5.0
    """After SIGTERM, how long the service goes on serving everything while ``/readyz`` answers 503
    (``service.draining``), so that a load balancer stops sending before the listener closes; 0: close at once."""
    grace_s: float = 30.0
    """How long shutting down waits for in-flight requests (uvicorn's graceful shutdown timeout), after the drain."""
    access_log_format: str = "text"
    """``text`` or ``json``: the lines of the access log (:mod:`gateway.service.accesslog`)."""
    decision_workers: int | None = None
    """Worker processes deciding dry runs (``POST /v1/decisions``, :mod:`gateway.service.decisions`); 0: in the
    service's own process; None: :func:`gateway.service.decisions.default_decision_workers`."""
    pool: bool = False
    """Keep a warm pool, sized by each policy's ``spec.pool`` (``gateway.runner.pool``)."""
    auth_failure_interval_s: float = 60.0
    trail_bytes_per_minute: int = DEFAULT_TRAIL_BYTES_PER_MINUTE
    """The bytes each principal's requests may add to the trail in a sliding minute; past them, 429
    (``trail_bytes``) until enough leave the window (:mod:`gateway.service.trailbudget`)."""
    tls_cert: Path | None = None
    """PEM certificate (chain) to serve HTTPS with; requires ``tls_key``."""
    tls_key: Path | None = None
    """PEM private key of ``tls_cert``; requires ``tls_cert``."""
    anchor_dir: Path | None = None
    """Where the service writes the trail's head (``audit_anchor.directory``); None: no anchors."""
    anchor_every_records: int | None = None
    anchor_every_seconds: float | None = None
    backend: str = "docker"
    """``docker`` or ``kubernetes``: which runner ``gateway serve`` builds."""
    secrets_file: Path | None = None
    """The secrets the egress proxy injects (``spec.network.egress.secrets``): a YAML or JSON mapping of names to
    values, mode 0600; None: ``GATEWAY_SECRETS_FILE``, if set. ``GATEWAY_SECRET_<NAME>`` variables override it."""
    kubernetes: KubernetesSettings = KubernetesSettings()
    """The Kubernetes backend's connection (``backend: kubernetes``)."""
    mcp: McpSettings = McpSettings()
    """``/mcp``: stateless, or an MCP session per client with its gateway session (``mcp.session``)."""
    source: str | None = field(default=None, compare=False)
    """The file it was read from, if any."""

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = ("tls_cert", "tls_key") if self.tls_key is None else ("tls_key", "tls_cert")
            raise ServerConfigError(
                f"{given} is set but {missing} is not: TLS needs both the certificate and its private key",
                hint="pass both --tls-cert FILE and --tls-key FILE (or both config keys), or neither",
            )
        if self.max_body_bytes_in_flight is not None and self.max_body_bytes_in_flight < self.max_body_bytes:
            raise ServerConfigError(
                f"max_body_bytes_in_flight {self.max_body_bytes_in_flight} is below max_body_bytes "
                f"{self.max_body_bytes}: a body of the largest size would always be refused",
                hint="set max_body_bytes_in_flight to a few times max_body_bytes, or leave it unset (the default)",
            )

    def with_overrides(self, **flags: Any) -> ServerConfig:
        """This configuration with every flag that was given (not None) replacing its key."""
        given = {name: value for name, value in flags.items() if value is not None}
        for name in ("principals", "policy", "audit_dir", "tls_cert", "tls_key"):
            if name in given:
                given[name] = Path(given[name])
        return replace(self, **given)


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(load_schema("server"), format_checker=Draft202012Validator.FORMAT_CHECKER)


def _invalid(source: str, problems: list[Problem]) -> ServerConfigError:
    problems.sort(key=lambda p: (p.line or 0, p.path or ""))
    return ServerConfigError(
        f"{source} is not a valid server configuration: {len(problems)} problem(s)", problems=problems
    )


def load_server_config_text(text: str, *, source: str = "<string>", base: Path | None = None) -> ServerConfig:
    """The configuration in ``text``; relative paths are taken from ``base`` (the file's directory)."""
    loaded, problems = load_yaml_checked(text, source=source, validator=_validator(), domain="server", invalid=_invalid)
    if problems:
        raise _invalid(source, problems)
    data: dict[str, Any] = loaded.data
    where = base if base is not None else Path.cwd()

    def path(key: str) -> Path | None:
        return where / data[key] if key in data else None

    quotas = data.get("quotas", {})
    access_log = data.get("access_log", {})
    anchor = data.get("audit_anchor", {})
    kube = data.get("kubernetes", {})
    mcp = data.get("mcp", {})
    return ServerConfig(
        host=data.get("host", DEFAULT_HOST),
        port=data.get("port", DEFAULT_PORT),
        principals=path("principals"),
        policy=path("policy"),
        audit_dir=path("audit_dir"),
        max_body_bytes=data.get("max_body_bytes", DEFAULT_MAX_BODY_BYTES),
        max_body_bytes_in_flight=data.get("max_body_bytes_in_flight"),
        max_header_bytes=data.get("max_header_bytes", DEFAULT_MAX_HEADER_BYTES),
        max_connections=data.get("max_connections"),
        max_headless_connections=data.get("max_headless_connections"),
        quotas=Quotas(**{**DEFAULT_QUOTAS.to_dict(), **quotas}),  # the schema admits only Quotas' fields
        max_concurrent_executions=data.get("max_concurrent_executions"),
        trail_bytes_per_minute=data.get("trail_bytes_per_minute", DEFAULT_TRAIL_BYTES_PER_MINUTE),
        decision_workers=data.get("decision_workers"),
        pool=bool(data.get("pool", False)),
        tls_cert=path("tls_cert"),
        tls_key=path("tls_key"),
        anchor_dir=where / anchor["directory"] if "directory" in anchor else None,
        anchor_every_records=anchor.get("every_records"),
        anchor_every_seconds=None if "every_seconds" not in anchor else float(anchor["every_seconds"]),
        backend=data.get("backend", "docker"),
        secrets_file=path("secrets_file"),
        access_log_format=access_log.get("format", "text"),
        **{key: float(data[key]) for key in _SECONDS if key in data},  # absent: the field's default
        kubernetes=KubernetesSettings(
            namespace=kube.get("namespace", "gateway-sandboxes"),
            kubeconfig=where / kube["kubeconfig"] if "kubeconfig" in kube else None,
            context=kube.get("context"),
            in_cluster=bool(kube.get("in_cluster", False)),
        ),
        mcp=McpSettings(**{**mcp, **({"idle_s": float(mcp["idle_s"])} if "idle_s" in mcp else {})}),
        source=source,
    )


def load_server_config(path: str | os.PathLike[str]) -> ServerConfig:
    """The configuration file at ``path``; :class:`ServerConfigError` with every problem as file:line: $.path."""
    source = os.fspath(path)
    raw = read_capped(
        source,
        MAX_CONFIG_BYTES,
        missing=lambda: ServerConfigError(f"server configuration {source} does not exist"),
        unreadable=lambda reason: ServerConfigError(f"server configuration {source} cannot be read: {reason}"),
    )
    if len(raw) > MAX_CONFIG_BYTES:
        raise _invalid(source, [Problem(f"larger than the {MAX_CONFIG_BYTES} byte cap", source=source)])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(source, [Problem(f"not valid UTF-8 at byte {exc.start}", source=source)]) from exc
    return load_server_config_text(text, source=source, base=Path(source).resolve().parent)

"""The one place where the Kubernetes client's exceptions become the gateway's errors.

An API answer is classified by its HTTP status (the API server's ``Status.code``): the rows of
``STATUS_TABLE``; transport failures (no API server, TLS, a lost connection) by their base classes in
``TRANSPORT_TABLE``. The original exception is always chained (``raise map_api_error(exc, ...) from exc``).
The ``kubernetes`` package is imported lazily: the assembler and the manifests need none of it.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from gateway.errors import EngineUnavailableError, GatewayError, RunnerError, SandboxError

__all__ = ["RETRYABLE", "STATUS_TABLE", "ApiStatus", "api_status", "map_api_error"]

RETRYABLE = frozenset({429, 500, 502, 503, 504})
"""Statuses worth another try after a pause (``Retry-After`` when the server gave one)."""

STATUS_TABLE: dict[int, tuple[type[RunnerError], str]] = {
    0: (EngineUnavailableError, "check the kubeconfig (or in-cluster configuration) and that the API server answers"),
    400: (SandboxError, "the API server refused the request as malformed: a gateway bug, please report it"),
    401: (EngineUnavailableError, "the credentials of the kubeconfig / service account were refused"),
    403: (
        EngineUnavailableError,
        "the gateway's ServiceAccount lacks a verb in the sandbox namespace: apply `gateway kubernetes manifests`",
    ),
    404: (SandboxError, ""),
    409: (SandboxError, ""),
    410: (SandboxError, ""),
    422: (SandboxError, "the API server (or an admission controller such as Pod Security) refused the Pod"),
    429: (EngineUnavailableError, "the API server is throttling the gateway; retry later"),
    500: (EngineUnavailableError, "the API server failed; retry later"),
    502: (EngineUnavailableError, "the API server failed; retry later"),
    503: (EngineUnavailableError, "the API server is unavailable; retry later"),
    504: (EngineUnavailableError, "the API server timed out; retry later"),
}
"""HTTP status → (gateway error class, hint). A status not listed: 4xx → SandboxError, 5xx → unavailable."""

TRANSPORT_TABLE: tuple[tuple[type[BaseException], type[RunnerError]], ...] = (
    (ConnectionRefusedError, EngineUnavailableError),
    (ConnectionError, EngineUnavailableError),
    (socket.timeout, SandboxError),
    (OSError, EngineUnavailableError),
)
"""Base class → gateway error for what is not an API answer (first match wins); urllib3's and websocket-client's
exceptions are recognised by their module (see ``_transport``)."""


class ApiStatus:
    """The parts of an API error the runner branches on: status, reason, message, and ``Retry-After``."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


def api_status(exc: BaseException) -> ApiStatus | None:
    """The API answer inside ``exc`` (a ``kubernetes.client.ApiException`` or one of its per-status subclasses,
    ``NotFoundException`` ...), or None for anything else."""
    status = getattr(exc, "status", None)
    if "ApiException" not in {k.__name__ for k in type(exc).__mro__} or not isinstance(status, int):
        return None
    body: Any = getattr(exc, "body", None)
    message = str(getattr(exc, "reason", "") or "")
    reason = ""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body:
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            message = str(parsed.get("message") or message)
            reason = str(parsed.get("reason") or "")
    headers = getattr(exc, "headers", None) or {}
    retry_after: float | None = None
    try:
        value = headers.get("Retry-After") if hasattr(headers, "get") else None
        retry_after = float(value) if value is not None else None
    except (TypeError, ValueError):
        retry_after = None
    return ApiStatus(status, reason, message, retry_after)


def _transport(exc: BaseException) -> type[RunnerError] | None:
    module = type(exc).__module__
    if module.startswith("urllib3"):
        return SandboxError if "Timeout" in type(exc).__name__ else EngineUnavailableError
    if module.startswith("websocket"):
        return SandboxError
    for klass, target in TRANSPORT_TABLE:
        if isinstance(exc, klass):
            return target
    return None


def map_api_error(exc: BaseException, action: str) -> GatewayError:
    """The gateway error for a failure while ``action`` (e.g. ``"creating the Pod"``). A ``GatewayError`` is
    returned unchanged. Raise the result ``from exc``."""
    if isinstance(exc, GatewayError):
        return exc
    found = api_status(exc)
    if found is not None:
        target, hint = STATUS_TABLE.get(
            found.status, (EngineUnavailableError if found.status >= 500 else SandboxError, "")
        )
        detail = f"{found.message} (HTTP {found.status}{', ' + found.reason if found.reason else ''})"
        if found.status == 0:
            return EngineUnavailableError(
                f"the Kubernetes API server is unreachable while {action}: {detail}", hint=hint
            )
        return target(f"{action} failed: {detail}", hint=hint)
    transport = _transport(exc)
    text = f"{type(exc).__name__}: {exc}".strip()
    if transport is EngineUnavailableError:
        return EngineUnavailableError(
            f"the Kubernetes API server is unreachable while {action}: {text}", hint=STATUS_TABLE[0][1]
        )
    if transport is not None:
        return transport(f"{action} failed: {text}")
    if isinstance(exc, ImportError):
        return EngineUnavailableError(
            f"the Kubernetes backend needs the kubernetes client: {exc}",
            hint="pip install 'agent-exec-gateway[kubernetes]'",
        )
    return RunnerError(f"{action} failed: {text}")

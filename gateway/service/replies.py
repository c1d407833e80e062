"""What the service answers, as plain data: a status, a JSON body and headers (no Starlette here).

Built wherever the answer is made: an endpoint (:mod:`gateway.service.endpoints`) turns a :class:`Reply` into its
HTTP response, and a decision worker (:mod:`gateway.service.decision_worker`) renders one itself and sends the bytes.
Every error body is ``{"code", "message", "request_id"}`` plus the fields of its kind (``errors`` for a
request error, ``violations`` for a denial), its status from :func:`gateway.errors.http_status_for`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gateway import ExecutionResult
from gateway.errors import (
    BodiesInFlightError,
    GatewayError,
    MalformedRequestError,
    OverQuotaError,
    RequestError,
    http_status_for,
)

__all__ = [
    "MESSAGE_MAX_VALUES",
    "Reply",
    "check_json_body",
    "decision_reply",
    "error_reply",
    "gateway_error_reply",
    "render_json",
]


try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - the service extra installs it
    _orjson = None  # type: ignore[assignment]


def _as_json(value: Any) -> Any:
    """What a body holds besides plain JSON values: read-only mappings (a decision's shared options)."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def render_json(body: Any) -> bytes:
    """A body as the service sends JSON (compact UTF-8, as Starlette's ``JSONResponse`` renders it), read-only
    mappings as objects: with ``orjson`` when installed (the service extra; several times faster on a
    decision), else, and for what it refuses (an integer beyond 64 bits), with :mod:`json`."""
    if _orjson is not None:
        try:
            return _orjson.dumps(body, default=_as_json)
        except TypeError:
            pass
    text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"), default=_as_json)
    return text.encode("utf-8")


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer: its status, JSON body and headers (``X-Request-Id`` added by :meth:`header_map`)."""

    status: int
    body: dict[str, Any]
    request_id: str
    headers: dict[str, str] = field(default_factory=dict)

    def header_map(self) -> dict[str, str]:
        return {"X-Request-Id": self.request_id, **self.headers}


MESSAGE_MAX_VALUES: Final = 4096
"""The most JSON values (objects, arrays, members and elements, each counted) an MCP message's body may hold:
an ``initialize`` or a ``tools/call`` holds a few dozen (the code is one string). More is refused before the MCP
SDK parses the body in the event loop that every principal shares."""


def check_json_body(body: bytes, *, max_values: int | None = None) -> None:
    """Raise :class:`MalformedRequestError` (400 ``request.malformed``) for a body that is not JSON, or that
    holds more than ``max_values`` JSON values when given."""
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise MalformedRequestError(f"the body is not JSON: {exc}") from exc
    if max_values is not None and _more_values_than(value, max_values):
        raise MalformedRequestError(
            f"the body holds more than {max_values} JSON values; an MCP message holds a few dozen"
        )


def _more_values_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON holds more than ``limit`` values, looking at no more than ``limit`` + 1 of them."""
    count, stack = 0, [value]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, (dict, list)):
            if count + len(item) > limit:  # before its members are looked at: a hostile body stops here
                return True
            stack.extend(item.values() if isinstance(item, dict) else item)
    return count > limit


def error_reply(
    status: int, code: str, message: str, request_id: str, *, headers: dict[str, str] | None = None, **extra: Any
) -> Reply:
    body = {"code": code, "message": message, "request_id": request_id, **extra}
    return Reply(status, body, request_id, headers or {})


def _problems(exc: GatewayError) -> list[dict[str, Any]]:
    return [{"path": p.path or "$", "message": p.message} for p in exc.problems] or [
        {"path": "$", "message": exc.message}
    ]


BODIES_RETRY_AFTER_S: Final = 1
"""``Retry-After`` of a 503 ``service.bodies_in_flight``: room comes back as soon as other requests end."""


def gateway_error_reply(exc: GatewayError, request_id: str, **extra: Any) -> Reply:
    """The error body of ``exc`` (401 with ``WWW-Authenticate``, 429 and a full body budget's 503 with
    ``Retry-After``, 422 with ``errors``)."""
    status = http_status_for(exc)
    if isinstance(exc, RequestError):
        extra["errors"] = _problems(exc)
    headers = {"WWW-Authenticate": 'Bearer realm="gateway"'} if status == 401 else None
    if isinstance(exc, OverQuotaError):
        headers = {"Retry-After": str(exc.retry_after_s)}
        extra = {"quota": exc.quota, "retry_after_s": exc.retry_after_s, **extra}
    elif isinstance(exc, BodiesInFlightError):  # the budget frees as bodies finish: shortly
        headers = {"Retry-After": str(BODIES_RETRY_AFTER_S)}
    return error_reply(status, exc.code, exc.message, request_id, headers=headers, **extra)


def decision_reply(result: ExecutionResult) -> Reply:
    """``POST /v1/decisions``: 200 with the decision whether allowed or denied, or the error that stopped it."""
    if result.error is not None or result.decision is None:
        error = result.error or GatewayError("the gateway decided nothing")
        return gateway_error_reply(error, result.request_id)
    # Shared, not copied: the body is only rendered (``render_json``, which takes its read-only mappings).
    decision = result.decision.to_dict(shared=True)
    body = {"request_id": result.request_id, "allowed": result.decision.allowed, "decision": decision}
    return Reply(200, body, result.request_id)

"""Request bodies, bounded before anything parses them: the media type (415), the size from ``Content-Length``
and while reading (413), the bytes all bodies hold at once (:class:`BodyBudget`: 429 or 503), the time to arrive
(408 ``request.timeout``), then, unless a decision worker is to check it, JSON (400 ``request.malformed``).

Each body is bounded alone by ``max_body_bytes``; without a bound on all of them, one principal within its rate
(600 requests a minute) had the service read 600 bodies of 4 MiB at once: 0.12 GB grew to 2.37 GB, and 1.96 GB
stayed resident after. :class:`BodyBudget` bounds the bytes of the bodies the service holds at once
(``max_body_bytes_in_flight``) and one principal's part of them (half): a body is counted from the moment its
head has arrived (its ``Content-Length``, or ``max_body_bytes`` for a body without one, so a read never needs
more room and never waits) until its request no longer holds it (the run ended, the answer was made).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
from starlette.requests import Request

from gateway.errors import (
    BodiesInFlightError,
    BodyTimeoutError,
    BodyTooLargeError,
    MalformedRequestError,
    OverQuotaError,
    UnsupportedMediaTypeError,
)
from gateway.service.replies import check_json_body

__all__ = [
    "JSON_MEDIA_TYPE",
    "OCTET_MEDIA_TYPE",
    "BodyBudget",
    "BodyHold",
    "default_body_budget",
    "media_type",
    "read_json_body",
    "read_octet_body",
]

JSON_MEDIA_TYPE = "application/json"
OCTET_MEDIA_TYPE = "application/octet-stream"
BUDGET_RETRY_AFTER_S = 1
"""The ``Retry-After`` of a body refused for its principal's part of the budget: bodies leave within seconds."""


def default_body_budget(max_body_bytes: int, global_bound: int) -> int:
    """Room for a body of the largest size for each execution the service may run at once and as many again
    (waiting for a slot or a decision worker, or arriving): ``2 * global_bound * max_body_bytes``."""
    return 2 * global_bound * max_body_bytes


@dataclass(eq=False, slots=True)
class BodyHold:
    """The bytes one request's body holds in its :class:`BodyBudget`, given back by :meth:`release` (once;
    again is nothing)."""

    budget: BodyBudget
    principal: str
    size: int

    def shrink(self, size: int) -> None:
        """Hold ``size`` bytes instead (a body without ``Content-Length`` was held at the most it could be)."""
        if 0 <= size < self.size:
            self.budget._give_back(self.principal, self.size - size)
            self.size = size

    def release(self) -> None:
        """The request no longer holds its body: its bytes go back to the budget."""
        self.shrink(0)


@dataclass(slots=True)
class BodyBudget:
    """The bytes of request bodies the service holds at once: at most :attr:`total`, of which one principal at
    most :attr:`per_principal`. Runs on the event loop's thread: no locks."""

    total: int
    per_principal: int = 0
    """0: half of :attr:`total` (at least the largest body), so that one principal never holds it all."""
    largest: int = 0
    """The largest body (``max_body_bytes``), named in the refusals."""
    held: int = 0
    """Bytes held now, every principal (the ``gateway_body_bytes_in_flight`` gauge)."""
    _by_principal: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.total < 1:
            raise ValueError(f"the body budget must be at least 1 byte, got {self.total}")
        if not self.per_principal:
            self.per_principal = min(self.total, max(self.total // 2, self.largest))

    def held_by(self, principal: str) -> int:
        return self._by_principal.get(principal, 0)

    def take(self, principal: str, size: int) -> BodyHold:
        """Hold ``size`` bytes for a body of ``principal``: :class:`OverQuotaError` (429, quota ``body_bytes``)
        past its part, :class:`BodiesInFlightError` (503) past the total; nothing is held then."""
        mine = self.held_by(principal)
        if mine + size > self.per_principal:
            raise OverQuotaError(
                f"{principal!r} has {mine} bytes of request bodies in flight; with this one ({size} bytes) it would "
                f"pass its part of the service's bound, {self.per_principal} bytes (max_body_bytes_in_flight "
                f"{self.total}, at most half of it for one principal)",
                retry_after_s=BUDGET_RETRY_AFTER_S,
                quota="body_bytes",
                hint="retry after the Retry-After seconds; send fewer large bodies at once",
            )
        if self.held + size > self.total:
            raise BodiesInFlightError(
                f"the service holds {self.held} bytes of request bodies in flight; with this one ({size} bytes) it "
                f"would pass its bound, max_body_bytes_in_flight {self.total}; nothing of this request was read"
            )
        self.held += size
        self._by_principal[principal] = mine + size
        return BodyHold(self, principal, size)

    def _give_back(self, principal: str, size: int) -> None:
        self.held -= size
        left = self._by_principal[principal] - size
        if left:
            self._by_principal[principal] = left
        else:
            del self._by_principal[principal]


def media_type(header: str | None) -> tuple[str, dict[str, str]]:
    """``type/subtype`` (lowercase) and the parameters of a Content-Type header (RFC 9110 media-type)."""
    if not header:
        return "", {}
    kind, *params = header.split(";")
    parsed: dict[str, str] = {}
    for param in params:
        name, sep, value = param.strip().partition("=")
        if sep:
            parsed[name.strip().lower()] = value.strip().strip('"')
    return kind.strip().lower(), parsed


async def read_json_body(
    request: Request, limit: int, deadline_s: float, *, hold: Callable[[int], BodyHold], check_json: bool = True
) -> tuple[bytes, BodyHold]:
    """The body, checked for media type, size, arrival within ``deadline_s`` and JSON (the Gateway's intake
    validates it), and what it holds of the budget: ``hold(size)`` (:meth:`BodyBudget.take` for the caller)
    before anything of it is read. The caller releases the hold once the request no longer holds the body; a
    refusal here releases it."""
    kind, params = media_type(request.headers.get("content-type"))
    if kind != JSON_MEDIA_TYPE:
        got = repr(kind) if kind else "no Content-Type"
        raise UnsupportedMediaTypeError(f"the body must be {JSON_MEDIA_TYPE}; got {got}")
    charset = params.get("charset", "utf-8").lower()
    if charset not in ("utf-8", "utf8"):
        raise UnsupportedMediaTypeError(f"the body must be UTF-8 JSON; got charset {charset!r}")
    data, held = await _bounded(request, limit, deadline_s, hold)
    if check_json:
        try:
            check_json_body(data)
        except BaseException:
            held.release()
            raise
    return data, held


async def read_octet_body(
    request: Request, limit: int, deadline_s: float, *, hold: Callable[[int], BodyHold]
) -> tuple[bytes, BodyHold]:
    """A raw body (``PUT /v1/sessions/{id}/files/{path}``): ``application/octet-stream`` (415 otherwise), bounded
    and held exactly as :func:`read_json_body`'s."""
    kind, _params = media_type(request.headers.get("content-type"))
    if kind != OCTET_MEDIA_TYPE:
        got = repr(kind) if kind else "no Content-Type"
        raise UnsupportedMediaTypeError(f"the body must be {OCTET_MEDIA_TYPE} (the file's raw bytes); got {got}")
    return await _bounded(request, limit, deadline_s, hold)


async def _bounded(
    request: Request, limit: int, deadline_s: float, hold: Callable[[int], BodyHold]
) -> tuple[bytes, BodyHold]:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise MalformedRequestError(f"Content-Length {declared!r} is not a number of bytes")
        if int(declared) > limit:
            raise BodyTooLargeError(f"the body is {int(declared)} bytes; this server accepts at most {limit}")
    held = hold(limit if declared is None else int(declared))
    try:
        data = await _read(request, held.size, deadline_s)
        held.shrink(len(data))
    except BaseException:
        held.release()
        raise
    return data, held


async def _read(request: Request, limit: int, deadline_s: float) -> bytes:
    # One bytearray, not a list of the server's chunks: a large one is its own mapping, given back to the
    # system when freed, where thousands of 64 KiB chunks stayed resident (benchmarks/request_bodies.py).
    body = bytearray()
    try:
        with anyio.fail_after(deadline_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:  # only without Content-Length (h11/httptools frame a body by it)
                    raise BodyTooLargeError(f"the body is more than {limit} bytes, the most this server accepts")
    except TimeoutError:
        raise BodyTimeoutError(
            f"the body did not arrive within {deadline_s:g} s ({len(body)} bytes received)"
        ) from None
    return bytes(body)

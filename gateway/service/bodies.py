"""Request bodies, bounded before anything parses them: the media type (415), the size from ``Content-Length``
and while reading (413), the time to arrive (408 ``request.timeout``), then, unless a decision worker is to
check it, JSON (400 ``request.malformed``)."""

from __future__ import annotations

import anyio
from starlette.requests import Request

from gateway.errors import BodyTimeoutError, BodyTooLargeError, MalformedRequestError, UnsupportedMediaTypeError
from gateway.service.replies import check_json_body

__all__ = ["JSON_MEDIA_TYPE", "media_type", "read_json_body"]

JSON_MEDIA_TYPE = "application/json"


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


async def read_json_body(request: Request, limit: int, deadline_s: float, *, check_json: bool = True) -> bytes:
    """The body, checked for media type, size, arrival within ``deadline_s`` and JSON; the Gateway's intake
    validates it."""
    kind, params = media_type(request.headers.get("content-type"))
    if kind != JSON_MEDIA_TYPE:
        got = repr(kind) if kind else "no Content-Type"
        raise UnsupportedMediaTypeError(f"the body must be {JSON_MEDIA_TYPE}; got {got}")
    charset = params.get("charset", "utf-8").lower()
    if charset not in ("utf-8", "utf8"):
        raise UnsupportedMediaTypeError(f"the body must be UTF-8 JSON; got charset {charset!r}")
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise MalformedRequestError(f"Content-Length {declared!r} is not a number of bytes")
        if int(declared) > limit:
            raise BodyTooLargeError(f"the body is {int(declared)} bytes; this server accepts at most {limit}")
    body = bytearray()
    try:
        with anyio.fail_after(deadline_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise BodyTooLargeError(f"the body is more than {limit} bytes, the most this server accepts")
    except TimeoutError:
        raise BodyTimeoutError(
            f"the body did not arrive within {deadline_s:g} s ({len(body)} bytes received)"
        ) from None
    data = bytes(body)
    if check_json:
        check_json_body(data)
    return data

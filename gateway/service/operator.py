"""The operator-only endpoints: ``GET /metrics``, ``GET /v1/audit/records`` and ``POST /v1/reload``; and the
operator's reach over sessions (:func:`is_operator`: every principal's, by id, and ``GET /v1/sessions?all=true``).

Only principals with role ``operator`` may call them; an agent's call is refused with 403 ``auth.forbidden``
and recorded as ``auth.forbidden`` (naming the principal and its token's public id; summarised per principal
and path, :class:`~gateway.service.authlog.ForbiddenCalls`), a call without a valid token gets the 401 of every
other endpoint.

``GET /v1/audit/records`` takes the filters of ``gateway audit query`` as query parameters named like its
flags (``since``, ``until``, ``principal``, ``decision``, ``rule``, ``image``, ``event_type`` (repeatable),
``request_id``, ``policy``, ``dry_run`` = ``true``/``false``), checks every one before answering (a bad value or an
unknown parameter: 422 ``request.invalid`` whose ``errors`` name each parameter as ``$.query.<name>``), and streams
the matching records as JSON lines (``application/x-ndjson``), each line exactly as stored in the trail, so that
its hash can be checked. The trail is read a line at a time and sent in bounded chunks: memory does not grow
with the trail.

``POST /v1/reload`` reloads the principals and policies as SIGHUP does and answers what came of it
(:func:`reload_answer`): whether the new ones are active, and the ids of the tokens the service now accepts, so
that ``gateway principals revoke --service`` can confirm a revocation applied rather than assume it.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.datastructures import QueryParams

from gateway import Caller
from gateway.audit import EVENT_TYPES
from gateway.audit.query import QueryFilters, parse_time, query_trail_lines
from gateway.errors import AuditError, ForbiddenError, GatewayError, Problem, RequestError
from gateway.service.service import Service

__all__ = [
    "NDJSON", "QUERY_PARAMETERS", "audit_filters", "audit_lines", "is_operator", "reload_answer", "require_operator",
]  # fmt: skip

NDJSON = "application/x-ndjson"
QUERY_PARAMETERS = (
    "since", "until", "principal", "decision", "rule", "image", "event_type", "request_id", "policy", "dry_run",
)  # fmt: skip
"""The filters of ``gateway audit query``, named like its flags (``--event-type`` is ``event_type``)."""
_CHUNK = 64 * 1024


def is_operator(service: Service, caller: Caller) -> bool:
    """Whether ``caller``'s principal has role ``operator`` (it may see and close every principal's sessions)."""
    principal = service.principals.by_name.get(caller.principal)
    return principal is not None and principal.is_operator


def require_operator(service: Service, caller: Caller, path: str, request_id: str) -> None:
    """Raise :class:`ForbiddenError` (after noting ``auth.forbidden``) unless ``caller`` is an operator.
    Blocking (the record is durable before the answer): call it in a worker thread."""
    principal = service.principals.by_name.get(caller.principal)
    if principal is not None and principal.is_operator:
        return
    role = principal.role if principal is not None else "unknown"
    service.forbidden.note(
        principal=caller.principal, role=role, token_id=caller.token_id, path=path, request_id=request_id
    )
    raise ForbiddenError(f"{path} is for operators; principal {caller.principal!r} has role {role!r}")


def audit_filters(params: QueryParams) -> QueryFilters:
    """The query's filters; :class:`RequestError` (422) naming every bad parameter."""
    problems: list[Problem] = []

    def bad(name: str, message: str) -> None:
        problems.append(Problem(message, path=f"$.query.{name}"))

    for name in sorted(set(params.keys()) - set(QUERY_PARAMETERS)):
        bad(name, f"unknown parameter; the filters are {', '.join(QUERY_PARAMETERS)}")
    single: dict[str, str] = {}
    for name in QUERY_PARAMETERS:
        values = params.getlist(name)
        if len(values) > 1 and name != "event_type":
            bad(name, "given more than once")
        elif values:
            single[name] = values[0]
    times: dict[str, str | None] = {"since": None, "until": None}
    for name in times:
        if name in single:
            try:
                times[name] = parse_time(single[name])
            except AuditError:
                bad(name, f"not an RFC 3339 time (or a date): {single[name]!r}")
    if single.get("decision", "allow") not in ("allow", "deny"):
        bad("decision", f"must be 'allow' or 'deny', got {single['decision']!r}")
    dry_run: bool | None = None
    if "dry_run" in single:
        choice = {"true": True, "false": False}.get(single["dry_run"].lower())
        if choice is None:
            bad("dry_run", f"must be 'true' or 'false', got {single['dry_run']!r}")
        dry_run = choice
    types = params.getlist("event_type")
    for kind in sorted(set(types) - EVENT_TYPES):
        bad("event_type", f"unknown event type {kind!r}; known: {', '.join(sorted(EVENT_TYPES))}")
    for name in ("principal", "rule", "image", "request_id", "policy"):
        if name in single and not single[name]:
            bad(name, "must not be empty")
    if problems:
        names = ", ".join(sorted({p.path.removeprefix("$.query.") for p in problems}))
        raise RequestError(f"invalid query parameter(s): {names}", problems=problems)
    return QueryFilters(
        since=times["since"],
        until=times["until"],
        principal=single.get("principal"),
        decision=single.get("decision"),
        rule=single.get("rule"),
        image=single.get("image"),
        event_types=frozenset(types) if types else None,
        request_id=single.get("request_id"),
        policy=single.get("policy"),
        dry_run=dry_run,
    )


def audit_lines(service: Service, filters: QueryFilters) -> Iterator[bytes]:
    """The matching lines of the service's trail in chunks of about 64 KiB. Opens the trail now (an error here
    is still an error response); reads it as the response is sent."""
    directory = getattr(service.gateway.audit, "directory", None)
    if directory is None:
        raise GatewayError("this service's audit trail is not a directory that can be queried")
    lines = query_trail_lines(Path(directory), filters)
    return _chunks(lines)


def _chunks(lines: Iterator[tuple[bytes, object]]) -> Iterator[bytes]:
    buffer = bytearray()
    for raw, _record in lines:
        buffer += raw if raw.endswith(b"\n") else raw + b"\n"
        if len(buffer) >= _CHUNK:
            yield bytes(buffer)
            buffer.clear()
    if buffer:
        yield bytes(buffer)


def reload_answer(service: Service) -> dict[str, Any]:
    """``POST /v1/reload``: reload (:meth:`Service.reload_report`), then ``applied`` (the new principals and
    policies are active), ``reloaded_at``, the principals file read (``source``), the ids of every token the
    service accepts now (``token_ids``: public ids, never a token or a digest), and ``problems`` (rejected: the
    last good ones stay active) or ``kept`` (policy files that failed, whose last good policies stay). Blocking:
    call it in a worker thread."""
    report = service.reload_report()
    answer: dict[str, Any] = {
        "applied": report["ok"],
        "reloaded_at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "source": report["source"],
        "token_ids": sorted(service.principals.by_token_id),
    }
    for key in ("problems", "kept"):
        if key in report:
            answer[key] = report[key]
    return answer

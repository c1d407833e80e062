"""The trail as OCSF events: each audit record's view mapped to one event, for a SIEM that speaks OCSF
(``docs/ocsf.md``).

:func:`to_ocsf` maps one record, read through its typed view (:func:`~gateway.audit.records.view_record`), to
one event of the Open Cybersecurity Schema Framework, version :data:`OCSF_VERSION` (the version the maintained
``py-ocsf-models`` library implements, so the tests validate against the same version). Which class, activity
and status each event type becomes is the table :data:`MAPPING` (and ``docs/ocsf.md``, which a unit test
keeps in step with it):

* the request path (received, invalid, refused, decision, image pulled, outcome, reaped, forbidden) is
  **API Activity** (6003): an agent (the actor, its principal) calls the gateway's API to have code run; the
  decision's outcome is the Security Control profile's ``action_id`` / ``disposition_id`` and the policy its
  ``policy``; the image and the container are ``resources``. One class for the whole path keeps received,
  decision and outcome of one request side by side, correlated by ``metadata.correlation_uid`` (the request
  id). Process Activity (1007) was not chosen: it requires a ``process`` (pid, executable) and a ``device``
  an EDR observed, and the trail records neither the sandbox's processes nor its pids, only the container;
* a failed bearer-token check is **Authentication** (3002, Logon, Failure): what a SIEM's failed-logon content
  looks for;
* the gateway's start and stop and its policy being loaded, reloaded or rejected are **Application
  Lifecycle** (6002);
* a recovery record (a torn tail sealed by ``gateway audit repair``) is **Application Error** (6008);
* a connection a run made through its egress proxy (``network.connection``) is **Network Activity** (4001), its
  activity how it ended (Close, Reset by a limit or the run's end, Fail, Refuse when denied), or **HTTP Activity**
  (4002) for a plain-HTTP request, its activity the method: the sandbox (named by the principal) is the source,
  the host asked for (with the address connected to) the destination, the bytes each way the traffic.

Every event carries the record's ``event_id`` (``metadata.uid``), ``seq`` (``metadata.sequence``), event type
(``metadata.event_code``), original timestamp and, under ``unmapped.audit``, the trail id (the ``event_id`` of
its first record), ``seq``, ``hash`` and ``prev_hash``, so an event can be traced back to the exact record and
the chain re-checked with ``gateway audit verify``. Code, output and environment values are never exported
(the trail holds only their digests anyway).

The export (verify first, then the verified records only) is :mod:`gateway.audit.ocsf_export`.
"""

from __future__ import annotations

import calendar
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from gateway.audit.interrupted import INTERRUPTED
from gateway.audit.records import (
    AuditRecordView,
    ExecutionOutcomeView,
    FileDigestView,
    GatewayIdentityView,
    ImagePulledView,
    NetworkConnectionView,
    PolicyDecisionView,
    RequestInvalidView,
    RequestReceivedView,
    view_record,
)

__all__ = [
    "MAPPING",
    "OCSF_VERSION",
    "PRODUCT_NAME",
    "OcsfClass",
    "OcsfMapper",
    "to_ocsf",
]

OCSF_VERSION: Final = "1.5.0"
"""``metadata.version`` of every event."""

PRODUCT_NAME: Final = "agent-exec-gateway"
"""``metadata.product.name`` and ``vendor_name`` (the package's name); its ``version`` is the writer's."""


@dataclass(frozen=True, slots=True)
class OcsfClass:
    """One OCSF event class: its uid, name and category."""

    uid: int
    name: str
    category_uid: int
    category_name: str


API_ACTIVITY: Final = OcsfClass(6003, "API Activity", 6, "Application Activity")
APPLICATION_LIFECYCLE: Final = OcsfClass(6002, "Application Lifecycle", 6, "Application Activity")
APPLICATION_ERROR: Final = OcsfClass(6008, "Application Error", 6, "Application Activity")
AUTHENTICATION: Final = OcsfClass(3002, "Authentication", 3, "Identity & Access Management")
NETWORK_ACTIVITY: Final = OcsfClass(4001, "Network Activity", 4, "Network Activity")
HTTP_ACTIVITY: Final = OcsfClass(4002, "HTTP Activity", 4, "Network Activity")

_HTTP_METHODS: Final[Mapping[str, int]] = MappingProxyType(
    {"CONNECT": 1, "DELETE": 2, "GET": 3, "HEAD": 4, "OPTIONS": 5, "POST": 6, "PUT": 7, "TRACE": 8}
)
"""HTTP Activity's activity ids by method (OCSF 1.5.0); another method is Other (99), named by its method."""
_CLOSED: Final[Mapping[str, int]] = MappingProxyType({"closed": 2, "limit": 3, "run-ended": 3, "error": 4})
"""Network Activity's activity by how an allowed connection ended: Close, Reset (the proxy cut it: a limit or the
run's end), Fail; a denied one is Refuse (5)."""

_ACTIVITIES: Final[Mapping[tuple[int, int], str]] = MappingProxyType(
    {
        (6003, 1): "Create",
        (6003, 2): "Read",
        (6003, 3): "Update",
        (6003, 4): "Delete",
        (6003, 99): "Other",
        (6002, 3): "Start",
        (6002, 4): "Stop",
        (6002, 8): "Update",
        (6008, 1): "General Error",
        (3002, 1): "Logon",
        (4001, 2): "Close",
        (4001, 3): "Reset",
        (4001, 4): "Fail",
        (4001, 5): "Refuse",
        **{(4002, n): method.title() for method, n in _HTTP_METHODS.items()},
    }
)

MAPPING: Final[Mapping[str, tuple[OcsfClass, int]]] = MappingProxyType(
    {
        "request.received": (API_ACTIVITY, 1),
        "request.invalid": (API_ACTIVITY, 1),
        "request.refused": (API_ACTIVITY, 1),
        "policy.decision": (API_ACTIVITY, 1),  # a dry run (`gateway check`) is Read (2): nothing is created
        "image.pulled": (API_ACTIVITY, 99),
        "execution.outcome": (API_ACTIVITY, 1),
        "containers.reaped": (API_ACTIVITY, 4),
        "container.left": (API_ACTIVITY, 4),
        "auth.forbidden": (API_ACTIVITY, 99),
        "auth.failed": (AUTHENTICATION, 1),
        "gateway.start": (APPLICATION_LIFECYCLE, 3),
        "gateway.stop": (APPLICATION_LIFECYCLE, 4),
        "policy.loaded": (APPLICATION_LIFECYCLE, 8),
        "policy.reloaded": (APPLICATION_LIFECYCLE, 8),
        "policy.rejected": (APPLICATION_LIFECYCLE, 8),
        "recovery": (APPLICATION_ERROR, 1),
        "session.created": (API_ACTIVITY, 1),
        "session.expired": (API_ACTIVITY, 4),
        "session.closed": (API_ACTIVITY, 4),
        "session.killed": (API_ACTIVITY, 4),
        "session.file.put": (API_ACTIVITY, 3),
        "session.file.get": (API_ACTIVITY, 2),
        "network.connection": (NETWORK_ACTIVITY, 2),
        "approval.requested": (API_ACTIVITY, 1),
        "approval.granted": (API_ACTIVITY, 3),
        "approval.denied": (API_ACTIVITY, 3),
        "approval.used": (API_ACTIVITY, 3),
        "approval.refused": (API_ACTIVITY, 99),
    }
)
"""``event_type`` -> (class, activity id); the activity of a dry-run decision is Read (2); a connection's depends on
how it ended, and a plain-HTTP one is HTTP Activity, by its method."""

_OTHER_ACTIVITY: Final = {"image.pulled": "Pull", "auth.forbidden": "Forbidden", "approval.refused": "Refused"}
"""``activity_name`` of the events whose activity is Other (99)."""

# status_id (base event), action_id and disposition_id (Security Control profile), severity_id
_UNKNOWN, _SUCCESS, _FAILURE = 0, 1, 2
_STATUS: Final = {_UNKNOWN: "Unknown", _SUCCESS: "Success", _FAILURE: "Failure"}
_ALLOWED, _DENIED = 1, 2
_ACTION: Final = {_ALLOWED: "Allowed", _DENIED: "Denied"}
_D_ALLOWED, _D_BLOCKED, _D_REJECTED, _D_UNAUTHORIZED = 1, 2, 25, 26
_DISPOSITION: Final = {
    _D_ALLOWED: "Allowed",
    _D_BLOCKED: "Blocked",
    _D_REJECTED: "Rejected",
    _D_UNAUTHORIZED: "Unauthorized",
}
_INFO, _LOW, _MEDIUM, _HIGH = 1, 2, 3, 4
_SEVERITY: Final = {_INFO: "Informational", _LOW: "Low", _MEDIUM: "Medium", _HIGH: "High"}

_ACCOUNT_TYPE: Final = f"{PRODUCT_NAME} principal"
_LOG_PROVIDER: Final = f"{PRODUCT_NAME} audit trail"
_MAX_DETAIL: Final = 8
"""Rule ids (or problems) named in ``status_detail``; ``unmapped`` carries every one."""


# --- time -----------------------------------------------------------------------------------------------


class _Clock:
    """The trail's timestamp text (``2026-12-01T12:15:13.368314Z``) to OCSF time (ms since the epoch).

    A minute's start is computed once and cached (a trail's records come many to a minute), the rest is one
    integer conversion: ``SSuuuuuu // 1000`` is the milliseconds within the minute. The text was checked by
    the record's view.
    """

    __slots__ = ("_minutes",)

    def __init__(self) -> None:
        self._minutes: dict[str, int] = {}

    def ms(self, ts: str) -> int:
        minute = ts[:16]
        start = self._minutes.get(minute)
        if start is None:
            seconds = calendar.timegm(
                (int(ts[:4]), int(ts[5:7]), int(ts[8:10]), int(ts[11:13]), int(ts[14:16]), 0, 0, 0, 0)
            )
            if len(self._minutes) > 4096:
                self._minutes.clear()
            start = self._minutes[minute] = seconds * 1000
        return start + int(ts[17:19] + ts[20:26]) // 1000


# --- one record -----------------------------------------------------------------------------------------


def _user(name: str, token_id: str | None = None) -> dict[str, Any]:
    """A principal as an OCSF user (and its account in the gateway); the token's public id as credential."""
    user: dict[str, Any] = {
        "name": name,
        "uid": name,
        "type_id": 99,
        "type": "Other",
        "account": {"name": name, "uid": name, "type_id": 99, "type": _ACCOUNT_TYPE},
    }
    if token_id is not None:
        user["credential_uid"] = token_id
    return user


def _caller_token(data: Mapping[str, Any]) -> str | None:
    """The token id of ``data.caller`` (service requests) or ``data.token_id`` (auth records)."""
    caller = data.get("caller")
    token = caller.get("token_id") if isinstance(caller, dict) else data.get("token_id")  # parsed JSON: dicts
    return token if isinstance(token, str) else None


def _rules(rules: list[str]) -> str:
    """``rules`` (sorted, distinct) as ``status_detail`` text: the first :data:`_MAX_DETAIL`, then how many more."""
    shown = ", ".join(rules[:_MAX_DETAIL])
    return shown + (f" (+{len(rules) - _MAX_DETAIL} more)" if len(rules) > _MAX_DETAIL else "")


@dataclass(slots=True)
class _Event:
    """What the per-type mappers fill in; :func:`to_ocsf` assembles the event from it."""

    activity_id: int
    cls: OcsfClass | None = None
    """Another class than :data:`MAPPING`'s (a plain-HTTP connection's)."""
    activity_name: str | None = None
    """The name of an Other (99) activity that :data:`_OTHER_ACTIVITY` does not name (an HTTP method)."""
    status_id: int = _SUCCESS
    severity_id: int = _INFO
    message: str = ""
    status_detail: str | None = None
    status_code: str | None = None
    action_id: int | None = None
    disposition_id: int | None = None
    resources: list[dict[str, Any]] | None = None
    response: dict[str, Any] | None = None
    operation: str = "execute"
    extra: dict[str, Any] | None = None
    """Class-specific attributes (``duration``, ``count``, ``user``, ``app``...)."""
    unmapped: dict[str, Any] | None = None
    """Gateway fields with no OCSF attribute, under ``unmapped.gateway``."""


def _file(f: FileDigestView) -> dict[str, Any]:
    return {"name": f.name, "sha256": f.sha256, "bytes": f.bytes}


def _image_resource(image: str, image_id: str | None = None) -> dict[str, Any]:
    resource: dict[str, Any] = {"type": "Container Image", "name": image}
    if image_id is not None:
        resource["uid"] = image_id
    return resource


def _received(view: RequestReceivedView, ev: _Event) -> None:
    ev.message = f"request {view.request_id} received (valid; sent to the policy)"
    if view.image is not None:
        ev.resources = [_image_resource(view.image)]
    ev.unmapped = {
        "language": view.language,
        "runtime": view.runtime,
        "network": view.network,
        "code_sha256": view.code_sha256,
        "code_bytes": view.code_bytes,
        "env_names": list(view.env_names),
        "files": [_file(f) for f in view.files],
    }


def _invalid(view: RequestInvalidView, ev: _Event) -> None:
    ev.status_id, ev.severity_id = _FAILURE, _LOW
    ev.action_id, ev.disposition_id = _DENIED, _D_REJECTED
    shown = "; ".join(f"{p.path}: {p.message}" for p in view.problems[:_MAX_DETAIL])
    ev.message = f"invalid request rejected: {len(view.problems)} problem(s)"
    ev.status_detail = shown or None
    ev.unmapped = {
        "problems": [{"path": p.path, "message": p.message} for p in view.problems],
        "raw_sha256": view.raw_sha256,
        "raw_bytes": view.raw_bytes,
    }


def _decision(view: PolicyDecisionView, ev: _Event) -> None:
    if view.dry_run:
        ev.activity_id, ev.operation = 2, "check"
    violations, warnings = sorted(set(view.violations)), sorted(set(view.warnings))
    verb = "allowed" if view.allowed else "denied"
    ev.message = f"{'dry run ' if view.dry_run else ''}request {view.request_id} {verb} by policy " + (
        view.policy.name if view.policy is not None else "(none)"
    )
    if view.allowed:
        ev.action_id, ev.disposition_id = _ALLOWED, _D_ALLOWED
        if warnings:
            ev.severity_id = _LOW
            ev.status_detail = "warnings: " + _rules(warnings)
    else:
        ev.status_id, ev.severity_id = _FAILURE, _MEDIUM
        ev.action_id, ev.disposition_id = _DENIED, _D_BLOCKED
        ev.status_detail = "denied by " + (_rules(violations) or "(no rule named)")
    images = sorted(view.images)
    if images:
        ev.resources = [_image_resource(image) for image in images]
    ev.unmapped = {
        "decision_id": view.decision_id,
        "allowed": view.allowed,
        "dry_run": view.dry_run,
        "violations": violations,
        "warnings": warnings,
        "not_passed": sorted(view.not_passed),
        "runtime": view.runtime,
        "options_sha256": view.options_sha256,
    }


def _outcome(view: ExecutionOutcomeView, ev: _Event) -> None:
    kills = [
        name
        for name, on in (
            ("timed_out", view.timed_out),
            ("oom_killed", view.oom_killed),
            ("output_limit_killed", view.output_limit_killed),
            ("resource_killed", view.resource_killed),
        )
        if on
    ]
    if view.error_code is not None:
        ev.status_id, ev.severity_id = _FAILURE, _MEDIUM
        ev.status_detail = f"{view.error_code}: {view.error_message or ''}".rstrip(": ")
    elif kills:
        ev.status_id, ev.severity_id = _FAILURE, _LOW
        ev.status_detail = ", ".join(kills)
    elif view.exit_code != 0:
        ev.status_id = _FAILURE
        ev.status_detail = f"exit code {view.exit_code}"
    if view.exit_code is not None:
        ev.status_code = str(view.exit_code)
    ev.message = f"request {view.request_id} ran: exit {view.exit_code}" + (f" ({', '.join(kills)})" if kills else "")
    response: dict[str, Any] = {"message": "ran" if view.error_code is None else "failed"}
    interrupted = view.data.get("interrupted") if view.error_code == INTERRUPTED else None
    if interrupted is not None:  # its gateway died mid-run: a later start wrote this outcome
        ev.message = f"request {view.request_id} was interrupted: its gateway ended before recording the outcome"
        response["message"] = "interrupted"
    if view.exit_code is not None:
        response["code"] = view.exit_code
    if view.error_code is not None:
        response["error"] = view.error_code
        if view.error_message:
            response["error_message"] = view.error_message
    ev.response = response
    resources: list[dict[str, Any]] = []
    if view.image is not None:
        resources.append(_image_resource(view.image, view.image_id))
    if view.container_id is not None:
        container: dict[str, Any] = {"type": "Container", "uid": view.container_id}
        if view.image is not None:
            container["data"] = {"image": view.image, "image_id": view.image_id}
        resources.append(container)
    ev.resources = resources or None
    ev.extra = {"duration": view.duration_ms} if interrupted is None else {}  # an interrupted run's is unknown
    ev.unmapped = {
        "kills": kills,
        "files": [_file(f) for f in view.files],
    }
    if interrupted is not None:
        ev.unmapped["interrupted"] = interrupted  # the decision left open (seq, event_id, hash), the dead instance


def _pulled(view: ImagePulledView, ev: _Event) -> None:
    ev.operation = "pull"
    ev.message = f"image {view.image} pulled ({view.image_id})"
    ev.resources = [_image_resource(view.image, view.image_id)]


def _connection(view: NetworkConnectionView, ev: _Event) -> None:
    where = f"{view.host}:{view.port}"
    destination: dict[str, Any] = {"hostname": view.host, "port": view.port}
    if view.address is not None:
        destination["ip"] = view.address
    http = view.method not in ("", "CONNECT")
    if view.allowed:
        ev.activity_id = _CLOSED.get(view.ended, 99)
        ev.action_id, ev.disposition_id = _ALLOWED, _D_ALLOWED
        ev.message = f"request {view.request_id} connected to {where} ({view.ended})"
        if view.ended in ("limit", "error"):
            ev.status_id, ev.severity_id = _FAILURE, _LOW
            ev.status_detail = view.message or view.ended
    else:
        ev.activity_id = 5
        ev.status_id, ev.severity_id = _FAILURE, _MEDIUM
        ev.action_id, ev.disposition_id = _DENIED, _D_BLOCKED
        ev.status_detail = f"denied by {view.rule}" + (f": {view.message}" if view.message else "")
        ev.message = f"request {view.request_id}: connection to {where} denied by {view.rule}"
    if ev.activity_id == 99:
        ev.activity_name = view.ended
    ev.extra = {
        # the trail does not record the sandbox's address: the source is named by the principal, as for API calls
        "src_endpoint": {"name": view.principal if view.principal is not None else "unknown"},
        "dst_endpoint": destination,
        "connection_info": {"direction_id": 2, "direction": "Outbound", "protocol_name": "tcp"},
        "traffic": {"bytes_out": view.bytes_out, "bytes_in": view.bytes_in, "bytes": view.bytes_out + view.bytes_in},
        "duration": view.duration_ms,
    }
    if http:
        ev.cls = HTTP_ACTIVITY
        ev.activity_id = _HTTP_METHODS.get(view.method, 99)
        ev.activity_name = view.method if ev.activity_id == 99 else None
        url = {"hostname": view.host, "port": view.port, "scheme": "http", "url_string": f"http://{where}"}
        ev.extra["http_request"] = {"http_method": view.method, "url": url}  # the path is not recorded
    ev.unmapped = {"rule": view.rule, "ended": view.ended, "method": view.method}
    token = _caller_token(view.data)
    if token is not None:  # an API call's actor carries it; a network event has no actor
        ev.unmapped["token_id"] = token


def _generic(view: AuditRecordView, ev: _Event) -> None:
    """The events without a typed view: read from ``data`` with type checks, since the view checked only the
    envelope. What a mapper does not name stays in the trail."""
    data, kind = view.data, view.event_type

    def text(key: str) -> str | None:
        value = data.get(key)
        return value if isinstance(value, str) else None

    def count() -> int | None:
        value = data.get("count")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    if kind == "request.refused":
        ev.status_id, ev.severity_id = _FAILURE, _LOW
        ev.action_id, ev.disposition_id = _DENIED, _D_BLOCKED
        ev.status_code = text("code")
        ev.status_detail = text("summary")
        ev.message = f"request refused: {text('summary') or text('code') or 'quota'}"
        ev.extra = {"count": count()}
        ev.unmapped = {k: data.get(k) for k in ("quota", "retry_after_s", "path") if k in data}
    elif kind == "containers.reaped":
        ids = data.get("container_ids")
        ids = [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []
        ev.operation = "reap"
        ev.message = f"{len(ids)} leftover container(s) removed"
        ev.resources = [{"type": "Container", "uid": i} for i in ids] or None
    elif kind == "container.left":
        error = data.get("error")
        error = error if isinstance(error, dict) else {}
        code, message = error.get("code"), error.get("message")
        ev.status_id, ev.severity_id = _FAILURE, _MEDIUM
        ev.operation = "remove"
        ev.status_code = code if isinstance(code, str) else None
        ev.message = "a finished sandbox could not be removed (it ends at its deadline; `gateway reap` removes it)"
        if isinstance(message, str):
            ev.status_detail = message
    elif kind == "auth.forbidden":
        ev.status_id, ev.severity_id = _FAILURE, _MEDIUM
        ev.action_id, ev.disposition_id = _DENIED, _D_UNAUTHORIZED
        ev.operation = text("path") or "operator endpoint"
        ev.message = f"forbidden: role {text('role')} called {text('path')} (needs {text('required_role')})"
        ev.status_detail = f"needs role {text('required_role')}"
        ev.extra = {"count": count()}  # summarised per principal and path: a summary stands for many calls
    elif kind == "auth.failed":
        ev.status_id, ev.severity_id = _FAILURE, _MEDIUM
        ev.action_id, ev.disposition_id = _DENIED, _D_UNAUTHORIZED
        ev.status_detail = text("reason") or text("summary")
        ev.message = f"authentication failed: {text('summary')}"
        user = _user("unknown", text("token_id"))
        user["type_id"], user["type"] = 0, "Unknown"
        ev.extra = {"user": user, "count": count(), "logon_type_id": 3, "logon_type": "Network"}
        client = text("client")
        if client is not None:
            ev.extra["src_endpoint"] = {"name": client}
        ev.unmapped = {"path": text("path")}
    elif kind in ("gateway.start", "gateway.stop"):
        ev.message = f"gateway {'started' if kind == 'gateway.start' else 'stopped'} (policy {text('policy_source')})"
    elif kind in ("policy.loaded", "policy.reloaded", "policy.rejected"):
        ok = kind == "policy.loaded" or (kind == "policy.reloaded" and data.get("ok") is not False)
        problems = data.get("problems")
        n = len(problems) if isinstance(problems, list) else 0
        if not ok:
            ev.status_id, ev.severity_id = _FAILURE, _MEDIUM
            ev.status_detail = f"{n} problem(s) in {text('source')}"
        ev.message = f"{kind}: {text('name') or ''} {text('source') or ''}".strip()
        ev.unmapped = {"source": text("source"), "sha256": text("sha256"), "problems": n}
    elif kind in ("session.file.put", "session.file.get"):
        error = data.get("error")
        error = error if isinstance(error, dict) else None
        ev.operation = kind
        moved = f"{text('path')} ({data.get('bytes')} bytes)" if error is None else text("path")
        ev.message = f"{kind}: {moved} in session {text('session_id')}"
        if error is not None:
            ev.status_id, ev.severity_id = _FAILURE, _MEDIUM
            code = error.get("code")
            ev.status_code = code if isinstance(code, str) else None
            message = error.get("message")
            ev.status_detail = message if isinstance(message, str) else None
        file: dict[str, Any] = {"type": "File", "name": text("path")}
        if (sha256 := text("sha256")) is not None:
            file["uid"] = sha256
        ev.resources = [file]
        ev.unmapped = {k: data.get(k) for k in ("session_id", "path", "bytes", "sha256") if k in data}
    elif kind.startswith("session."):
        ev.operation = "session"
        if kind == "session.killed":
            ev.status_id, ev.severity_id = _FAILURE, _MEDIUM
            ev.status_detail = text("reason")
        ev.message = f"{kind}: {text('session_id')} ({text('mode')}{', ' + r if (r := text('reason')) else ''})"
        container = text("container_id")
        ev.resources = [{"type": "Container", "uid": container}] if container is not None else None
        ev.unmapped = {k: data.get(k) for k in ("session_id", "mode", "reason", "expires_at") if k in data}
    elif kind.startswith("approval."):
        ev.operation = kind
        approver = f" by {a}" if (a := text("approver")) else ""
        ev.message = f"{kind}: {text('approval_id')}{approver}"
        if kind == "approval.refused":
            ev.status_id, ev.severity_id = _FAILURE, _MEDIUM
            ev.status_code, ev.status_detail = text("code"), text("message")
        keys = ("approval_id", "request_digest", "approver", "reason", "uses_allowed", "use", "rules", "expires_at")
        ev.unmapped = {k: data.get(k) for k in keys if k in data}
    elif kind == "recovery":
        ev.status_id, ev.severity_id = _FAILURE, _HIGH
        ev.message = f"trail repaired: {text('reason')}"
        ev.status_detail = text("reason")
        ev.unmapped = {k: data.get(k) for k in ("dropped_bytes", "last_good_seq", "last_good_hash") if k in data}


_MAPPERS: Final[Mapping[type[AuditRecordView], Callable[[Any, _Event], None]]] = MappingProxyType(
    {
        RequestReceivedView: _received,
        RequestInvalidView: _invalid,
        PolicyDecisionView: _decision,
        ExecutionOutcomeView: _outcome,
        ImagePulledView: _pulled,
        NetworkConnectionView: _connection,
    }
)


class OcsfMapper:
    """Maps views to OCSF events; holds only caches of constant parts (the clock's days, the products)."""

    def __init__(self) -> None:
        self._clock = _Clock()
        self._products: dict[str, dict[str, Any]] = {}

    def _product(self, writer: GatewayIdentityView | None) -> dict[str, Any]:
        version = writer.version if writer is not None else "unknown"
        product = self._products.get(version)
        if product is None:
            product = {"name": PRODUCT_NAME, "vendor_name": PRODUCT_NAME, "version": version}
            self._products[version] = product
        return product

    def event(self, view: AuditRecordView, trail: str) -> dict[str, Any]:
        """The OCSF event of one record of the trail whose id is ``trail``."""
        cls, activity = MAPPING[view.event_type]
        ev = _Event(activity)
        _MAPPERS.get(type(view), _generic)(view, ev)
        activity = ev.activity_id
        cls = ev.cls or cls
        writer = view.gateway
        product = self._product(writer)
        metadata: dict[str, Any] = {
            "version": OCSF_VERSION,
            "product": product,
            "uid": view.event_id,
            "event_code": view.event_type,
            "sequence": view.seq,
            "original_time": view.timestamp,
            "log_name": trail,
            "log_provider": _LOG_PROVIDER,
            "log_version": view.schema,
            "profiles": ["security_control"],
        }
        if view.request_id is not None:
            metadata["correlation_uid"] = view.request_id
        event: dict[str, Any] = {
            "category_uid": cls.category_uid,
            "category_name": cls.category_name,
            "class_uid": cls.uid,
            "class_name": cls.name,
            "activity_id": activity,
            "activity_name": ev.activity_name or _OTHER_ACTIVITY.get(view.event_type, "Other")
            if activity == 99
            else _ACTIVITIES[(cls.uid, activity)],
            "type_uid": cls.uid * 100 + activity,
            "time": self._clock.ms(view.timestamp),
            "severity_id": ev.severity_id,
            "severity": _SEVERITY[ev.severity_id],
            "status_id": ev.status_id,
            "status": _STATUS[ev.status_id],
            "message": ev.message,
            "metadata": metadata,
        }
        event["type_name"] = f"{cls.name}: {event['activity_name']}"
        if ev.status_detail is not None:
            event["status_detail"] = ev.status_detail
        if ev.status_code is not None:
            event["status_code"] = ev.status_code
        if ev.action_id is not None:
            event["action_id"], event["action"] = ev.action_id, _ACTION[ev.action_id]
        if ev.disposition_id is not None:
            event["disposition_id"], event["disposition"] = ev.disposition_id, _DISPOSITION[ev.disposition_id]
        if view.policy is not None:
            event["policy"] = {"name": view.policy.name, "uid": view.policy.sha256, "is_applied": True}
        token = _caller_token(view.data)
        principal = view.principal
        if cls is API_ACTIVITY:
            actor: dict[str, Any] = {"app_name": PRODUCT_NAME}
            if principal is not None:
                actor["user"] = _user(principal, token)
            event["actor"] = actor
            api: dict[str, Any] = {"operation": ev.operation}
            if view.request_id is not None:
                api["request"] = {"uid": view.request_id}
            if ev.response is not None:
                api["response"] = ev.response
            event["api"] = api
            # the trail does not record the client's address: the source is named by the principal
            event["src_endpoint"] = {"name": principal if principal is not None else "unknown"}
            if writer is not None:
                event["dst_endpoint"] = {"hostname": writer.host, "svc_name": PRODUCT_NAME}
        elif cls is APPLICATION_LIFECYCLE:
            event["app"] = product
        elif cls is AUTHENTICATION and writer is not None:
            event["dst_endpoint"] = {"hostname": writer.host, "svc_name": PRODUCT_NAME}
        if ev.resources is not None:
            event["resources"] = ev.resources
        if ev.extra is not None:
            for name, value in ev.extra.items():
                if value is not None:
                    event[name] = value
        audit: dict[str, Any] = {"trail": trail, "seq": view.seq, "hash": view.hash, "prev_hash": view.prev_hash}
        hmac = view.hmac  # a property: read and checked each time it is asked for, so asked once
        if hmac is not None:
            audit["hmac"] = hmac
        unmapped: dict[str, Any] = {"audit": audit}
        if writer is not None:
            unmapped["gateway_pid"] = writer.pid
        redacted = view.redacted
        if redacted:
            unmapped["redacted"] = list(redacted)
        if ev.unmapped is not None:
            unmapped["gateway"] = ev.unmapped
        event["unmapped"] = unmapped
        return event


def to_ocsf(record: Mapping[str, Any], *, trail: str) -> dict[str, Any]:
    """The OCSF event of one parsed record of the trail whose id is ``trail`` (see :data:`MAPPING`).

    Raises :class:`~gateway.errors.AuditIntegrityError` when the record does not have the schema's shape.
    """
    return OcsfMapper().event(view_record(record), trail)

"""``GET /openapi.json``: the service's OpenAPI 3.1 document, built from the JSON Schemas in ``schemas/``.

The schemas stay the single source of truth: each file (request, decision, result, error, api) is embedded
once under ``components.schemas`` with its ``$ref`` pointers rewritten to point inside the document
(``#/$defs/x`` of ``decision.schema.json`` becomes ``#/components/schemas/Decision/$defs/x``), and every
operation's bodies reference them. No shape is restated here; this module only says which body goes with
which endpoint and status. The document is served without authentication: it names no principal, policy or
token, only the public contract (the same schemas ship in the package), and a client needs it before it has
learnt how to authenticate.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from gateway import __version__
from gateway.resources import load_schema

__all__ = ["COMPONENTS", "openapi_document"]

COMPONENTS = {
    "request": "ExecutionRequest",
    "decision": "Decision",
    "result": "ExecutionResult",
    "error": "Error",
    "api": "Api",
    "audit-record": "AuditRecord",
    "session-request": "SessionRequest",
}
"""schemas/<file>.schema.json -> the component it becomes."""

_JSON = "application/json"
_NDJSON = "application/x-ndjson"
_TEXT = "text/plain"


def _rewrite(node: Any, own: str) -> Any:
    """``node`` with every ``$ref`` pointing into the document instead of at a schema file."""
    if isinstance(node, list):
        return [_rewrite(item, own) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            file, _, fragment = value.partition("#")
            target = COMPONENTS[file.removesuffix(".schema.json")] if file else own
            out[key] = f"#/components/schemas/{target}{fragment}"
        elif key in ("$id", "$schema") and isinstance(value, str):
            continue
        else:
            out[key] = _rewrite(value, own)
    return out


def _ref(component: str, pointer: str = "") -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{component}{pointer}"}


def _body(schema: dict[str, Any], description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": {_JSON: {"schema": schema}}}
    out["headers"] = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}, **(headers or {})}
    return out


def _stream(media_type: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    """A 200 that is not one JSON document: Prometheus text or JSON lines (``schema``: each line's)."""
    headers = {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}}
    return {"description": description, "content": {media_type: {"schema": schema}}, "headers": headers}


_YEAR = "(19|2[0-9])[0-9]{2}"
_LEAP_YEAR = "((19|2[0-9])(0[48]|[2468][048]|[13579][26])|(20|24|28)00)"
_DAY = (
    f"({_YEAR}-((0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"
    f"|{_LEAP_YEAR}-02-29)"
)
_TIME = "T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]([.][0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?"
_MOMENT = {"type": "string", "pattern": f"^{_DAY}({_TIME})?$"}
"""``since`` and ``until``: a day that exists (years 1900-2999), with a time or not. The service reads more forms
(gateway/audit/query.py ``parse_time``); the pattern states a part that it always reads, so that no value the
document allows is refused (schemathesis' positive data checks it)."""
_MOMENT_TEXT = (
    "an RFC 3339 date-time (2024-05-01T12:00:00Z: seconds, at most 6 digits of fraction, Z or +hh:mm/-hh:mm, "
    "UTC when none is given) or a date (2024-05-01: its midnight UTC), of a day that exists in 1900-2999."
)


def _audit_parameters() -> list[dict[str, Any]]:
    """The filters of ``gateway audit query`` (gateway/service/operator.py), named like its flags."""

    def query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}

    text = {"type": "string", "minLength": 1}
    return [
        query("since", _MOMENT, f"Records at or after this time: {_MOMENT_TEXT}"),
        query("until", _MOMENT, f"Records before this time: {_MOMENT_TEXT}"),
        query("principal", text, "Records of this principal."),
        query("decision", {"type": "string", "enum": ["allow", "deny"]}, "Decisions that allowed or denied."),
        query("rule", text, "Decisions in which this rule did not pass."),
        query("image", text, "Records naming this image."),
        {
            **query(
                "event_type",
                {"type": "array", "items": _ref("AuditRecord", "/properties/event_type")},
                "Records of these event types (repeat the parameter).",
            ),
            "style": "form",
            "explode": True,
        },
        query("request_id", text, "Records of this request."),
        query("policy", text, "Records made under the policy of this name."),
        query("dry_run", {"type": "string", "enum": ["true", "false"]}, "true: dry-run decisions; false: real runs."),
    ]


def _error(description: str) -> dict[str, Any]:
    return {"$ref": f"#/components/responses/{description}"}


_ERRORS: dict[str, tuple[str, str]] = {
    # status: (component response name, description)
    "400": ("Malformed", "The body is not JSON (request.malformed), or Content-Length is not a number."),
    "401": ("Unauthenticated", "No bearer token, or one that is unknown, rotated or revoked (auth.failed)."),
    "403": (
        "Forbidden",
        "Denied by policy (policy.denied, with every violation), the body names another principal "
        "(auth.principal_mismatch), or an operator-only endpoint called by an agent (auth.forbidden).",
    ),
    "404": (
        "NotFound",
        "No such endpoint (http.not_found), or no session of the caller with this id (session.not_found: unknown "
        "and another principal's alike), or no approval of the caller with this id (approval.not_found).",
    ),
    "405": ("MethodNotAllowed", "The endpoint does not take this method (http.method_not_allowed)."),
    "408": ("BodyTimeout", "The body did not arrive within body_read_s (request.timeout)."),
    "409": (
        "Busy",
        "An execution already runs in this session (session.busy): send the next when it has returned; or an "
        "approval that cannot be decided (approval.conflict: not pending, or another digest).",
    ),
    "410": ("Gone", "The session has ended: closed, expired or killed (session.gone, the message says which)."),
    "413": (
        "TooLarge",
        "The body is larger than max_body_bytes (request.too_large), or an execution's code larger than any policy "
        "of the service accepts (request.code_too_large, at $.code: refused before it waits for a slot).",
    ),
    "415": ("MediaType", "The body is not application/json in UTF-8 (request.media_type)."),
    "422": (
        "Invalid",
        "The request does not validate (request.invalid, with every JSON path; a query parameter is $.query.NAME).",
    ),
    "429": (
        "OverQuota",
        "Over a quota of the principal (service.over_quota, the quota named): its executions and dry runs per "
        "minute (rpm) or its authenticated requests per minute (all_rpm) spent, its queue of waiting executions "
        "full or its wait in it over (queue_wait), its audit bytes per minute spent (trail_bytes), or its request "
        "bodies in flight at its half of max_body_bytes_in_flight (body_bytes, before the body is read); nothing "
        "ran. Retry-After says when to retry.",
    ),
    "500": ("Internal", "An unexpected server failure (gateway.internal); never a traceback."),
    "501": ("NotImplemented", "This gateway's backend cannot keep the session mode asked for (session.unavailable)."),
    "502": ("Sandbox", "The sandbox failed under the run (runner errors)."),
    "503": (
        "Unavailable",
        "The engine is down, the image missing, no capacity, or the audit trail unwritable: fail closed. Also the "
        "answer to a connection beyond the service's max_connections (service.too_many_connections, Retry-After), "
        "sent before its request is read, and to a body the service's max_body_bytes_in_flight has no room for "
        "(service.bodies_in_flight, Retry-After), before the body is read.",
    ),
    "507": ("AuditLowSpace", "The trail's file system is below its free-space watermark (audit.low_space)."),
}


def _responses(ok: dict[str, Any], *statuses: str) -> dict[str, Any]:
    out = {"200": ok}
    for status in statuses:
        out[status] = _error(_ERRORS[status][0])
    return out


_EVENT_STREAM = "text/event-stream"
_EXECUTION_EVENTS: dict[str, Any] = {
    # The description sits in the schema: an OpenAPI 3.1 Media Type Object has no description of its own.
    "schema": {
        "type": "string",
        "description": "With `Accept: text/event-stream`: server-sent events as the program writes. `event: stdout` "
        "and `event: stderr`, each with `data:` a JSON string (the chunk decoded as UTF-8, invalid bytes replaced; "
        "joined, they equal the result's stdout and stderr), then one `event: result` whose data is the body the "
        "JSON response would have had (the result object, or the error body of a run that failed once started). "
        "The stream starts at the first chunk or the result: what is refused before the run (401, 403, 408, 413, 415, "
        "422) is the JSON error response. A stream has no X-Request-Id header (the result carries request_id). "
        "A client that disconnects cancels its run (gateway.cancelled).",
    }
}


def _session_paths(auth: list[dict[str, list[str]]]) -> dict[str, Any]:
    """``/v1/sessions`` and below (``gateway/service/endpoints.py``): create, list, get, execute in, close."""
    v1 = ("401", "405", "429")
    body = ("400", "408", "413", "415", "422")
    session_id = {
        "name": "session_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "minLength": 1},
        "description": "The session's id (POST /v1/sessions' session_id). Another principal's id answers exactly as an "
        "unknown one (404 session.not_found); an operator may name any session.",
    }
    created = _body(_ref("Api", "/$defs/sessionCreated"), "Created: the session and its decision.")
    executed = _body(_ref("ExecutionResult"), "It ran in the session: the result object, with session_id (and value).")
    executed["content"][_EVENT_STREAM] = _EXECUTION_EVENTS
    return {
        "/v1/sessions": {
            "post": {
                "operationId": "createSession",
                "summary": "Create a session (state that lasts across executions) under the caller's policy; its "
                "profile is fixed now. Counts against the caller's rpm. 403 policy.denied with the sessions.* rule "
                "ids (the policy allows no sessions, this mode, or more of them) or the profile's; 501 "
                "session.unavailable when this gateway's backend cannot keep the mode.",
                "security": auth,
                "requestBody": {"required": True, "content": {_JSON: {"schema": _ref("SessionRequest")}}},
                "responses": {
                    "201": created,
                    **{s: _error(_ERRORS[s][0]) for s in (*body, *v1, "403", "500", "501", "502", "503", "507")},
                },
            },
            "get": {
                "operationId": "listSessions",
                "summary": "The caller's live sessions, oldest first; all=true: every principal's (operators only, "
                "403 auth.forbidden for an agent).",
                "security": auth,
                "parameters": [
                    {
                        "name": "all",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "enum": ["true", "false"]},
                        "description": "true: every principal's sessions (operators only).",
                    }
                ],
                "responses": _responses(_body(_ref("Api", "/$defs/sessionList"), "The sessions."), *v1, "403", "422"),
            },
        },
        "/v1/sessions/{session_id}": {
            "get": {
                "operationId": "getSession",
                "parameters": [session_id],
                "summary": "One session of the caller (an operator: any).",
                "security": auth,
                "responses": _responses(_body(_ref("Api", "/$defs/session"), "The session."), *v1, "404", "410"),
            },
            "delete": {
                "operationId": "closeSession",
                "parameters": [session_id],
                "summary": "Close a session of the caller (an operator: any): its sandbox is removed before the "
                "answer, and session.closed recorded.",
                "security": auth,
                "responses": {
                    "204": {
                        "description": "Closed.",
                        "headers": {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}},
                    },
                    **{s: _error(_ERRORS[s][0]) for s in (*v1, "404", "410", "500")},
                },
            },
        },
        "/v1/sessions/{session_id}/executions": {
            "post": {
                "operationId": "executeInSession",
                "parameters": [session_id],
                "summary": "Run a request in the caller's session, as POST /v1/executions (rpm, an execution slot, "
                "server-sent events): a kernel session's cell (with value) or a fresh container over the session's "
                "workspace. Decided again under the current policy, within the session's profile (rule "
                "sessions.profile). 409 session.busy while another execution runs in it (refused, not queued).",
                "security": auth,
                "requestBody": {"required": True, "content": {_JSON: {"schema": _ref("ExecutionRequest")}}},
                "responses": _responses(
                    executed, *body, *v1, "403", "404", "409", "410", "500", "501", "502", "503", "507"
                ),
            },
        },
    }


def _approval_paths(auth: list[dict[str, list[str]]]) -> dict[str, Any]:
    """``/v1/approvals`` and below (``gateway/service/endpoints.py``): list, poll, approve, deny."""
    v1 = ("401", "405", "429")
    approval_id = {"name": "approval_id", "in": "path", "required": True, "schema": {"type": "string"}}
    one = _body({"type": "object", "description": "One approval: approval_id, state (pending, granted, denied, "
                 "used, expired), request_digest, principal, rules, requested_at, expires_at, request_id, request, "
                 "approver, reason, uses_allowed, uses."}, "The approval.")  # fmt: skip
    verdict_body = {
        "required": True,
        "content": {
            _JSON: {
                "schema": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["reason"],
                    "properties": {
                        "reason": {"type": "string", "minLength": 1, "description": "Why (recorded in the trail)."},
                        "uses": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 1000,
                            "description": "Approve only: how many runs of exactly that request it allows (default 1).",
                        },
                        "digest": {
                            "type": "string",
                            "pattern": "^[0-9a-f]{64}$",
                            "description": "The request "
                            "digest the operator checked; another one is refused (approval.conflict).",
                        },
                    },
                }
            }
        },
    }

    def verdict(verb: str, record: str) -> dict[str, Any]:
        return {
            "post": {
                "operationId": f"{verb}Approval",
                "parameters": [approval_id],
                "summary": f"Operators only: {verb} a pending approval ({record}; the approver is the caller). 404 "
                "approval.not_found for an unknown id; 409 approval.conflict when it is not pending (decided, "
                "expired) or the digest is not the request's; each refusal is recorded (approval.refused).",
                "security": auth,
                "requestBody": verdict_body,
                "responses": _responses(one, "400", "403", "404", "409", "413", "415", "422", *v1, "503"),
            }
        }

    return {
        "/v1/approvals": {
            "get": {
                "operationId": "listApprovals",
                "summary": "Operators only: the approvals in ?state= (pending by default; granted, denied, used, "
                "expired, or all), each with the request it holds and the rules that asked.",
                "security": auth,
                "responses": _responses(
                    _body(
                        {
                            "type": "object",
                            "required": ["approvals"],
                            "properties": {"approvals": {"type": "array", "items": {"type": "object"}}},
                        },
                        "The approvals.",
                    ),
                    "403",
                    "422",
                    *v1,
                    "503",
                ),
            }
        },
        "/v1/approvals/{approval_id}": {
            "get": {
                "operationId": "getApproval",
                "parameters": [approval_id],
                "summary": "One approval, for the principal whose request it holds (to poll it) or an operator; "
                "another principal's id is approval.not_found, like an unknown one.",
                "security": auth,
                "responses": _responses(one, "404", *v1, "503"),
            }
        },
        "/v1/approvals/{approval_id}/approve": verdict("approve", "approval.granted"),
        "/v1/approvals/{approval_id}/deny": verdict("deny", "approval.denied"),
    }


def _mcp_path(auth: list[dict[str, list[str]]], sessions: bool) -> dict[str, Any]:
    """``/mcp``: the Model Context Protocol's streamable HTTP transport, not a REST resource; stateless, or with
    MCP sessions (``mcp.session`` in the server configuration)."""
    common = (
        "JSON-RPC messages of the MCP specification in, answers as application/json or text/event-stream; the tools "
        "are one per language of the token's principal's policy (execute_python, execute_shell, "
        "execute_javascript), run as that principal under its policy. Unauthenticated requests get the 401 "
        "error body; a body the gateway cannot take gets its error body before the MCP layer sees it (the /v1 "
        "bounds, and at most 4096 JSON values, checked by a decision worker: 400 request.malformed; 503 when no "
        "worker answered); a tool call over the principal's quotas is a tool error; what the MCP layer refuses is "
        "answered by the MCP SDK (JSON-RPC errors, 4xx)."
    )
    ok = {
        "description": "An MCP answer (JSON-RPC).",
        "content": {_JSON: {"schema": {"type": "object"}}, _EVENT_STREAM: {"schema": {"type": "string"}}},
    }

    def post(described: str, responses: dict[str, Any]) -> dict[str, Any]:
        return {
            "operationId": "mcp_post",
            "summary": "Send MCP JSON-RPC messages (initialize, tools/list, tools/call, ...).",
            "description": described,
            "security": auth,
            "responses": responses,
        }

    if not sessions:
        described = (
            "The Model Context Protocol's streamable HTTP transport (stateless: no session; every request carries "
            f"the bearer token). {common} POST only: GET (a server-to-client stream) and DELETE (session "
            "termination) have nothing to offer without sessions and get 405 with Allow: POST."
        )
        return {"post": post(described, _responses(ok, "400", "401", "405", "408", "413", "415", "503"))}
    described = (
        "The Model Context Protocol's streamable HTTP transport with MCP sessions: initialize opens one (its id in "
        "the Mcp-Session-Id answer header), owned by the token that sent it; every later request carries that "
        "header and is authenticated on its own. The tool calls of an MCP session share one gateway session (the "
        "server's mcp.session mode), opened at the first call under the principal's policy. A live MCP session "
        f"past the server's bounds (mcp.max_sessions, mcp.max_sessions_per_principal) gets 429. {common} GET (a "
        "server-to-client stream) gets 405."
    )
    unknown = {
        "description": "No live MCP session with this Mcp-Session-Id for this token: unknown, ended, or another "
        "token's (another principal's, or another token of the same principal), answered alike with the MCP "
        "SDK's JSON-RPC error (Session not found).",
        "content": {_JSON: {"schema": {"type": "object"}}},
    }
    posted = _responses(ok, "400", "401", "405", "408", "413", "415", "429", "503")
    delete = _responses(
        {"description": "The MCP session has ended, and its gateway session is closed."},
        "400", "401", "405", "429",
    )  # fmt: skip
    return {
        "post": post(described, {**posted, "404": unknown}),
        "delete": {
            "operationId": "mcp_delete",
            "summary": "End the MCP session named by Mcp-Session-Id, and close its gateway session.",
            "security": auth,
            "responses": {**delete, "404": unknown},
        },
    }


_OCTETS = "application/octet-stream"


def _session_file_paths(auth: list[dict[str, list[str]]]) -> dict[str, Any]:
    """The file API of a workspace session (``gateway/service/session_files.py``): upload, download, list."""

    def refused(status: str, text: str) -> dict[str, Any]:
        return _body(_ref("Error"), f"{status}: {text}")

    session_id = {
        "name": "session_id", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1},
        "description": "The session's id; another principal's answers exactly as an unknown one (404).",
    }  # fmt: skip
    path = {
        "name": "path", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1},
        "description": "The file's path below the workspace's root (/workspace in the sandbox), e.g. data/in.csv; a "
        "nested path's slashes as they are or percent-encoded (%2F): the path is percent-decoded once, then checked "
        "(no .. segment, no absolute path, no NUL, no backslash; a symlink on the way is never followed).",
    }  # fmt: skip
    common = {
        "401": _error(_ERRORS["401"][0]), "405": _error(_ERRORS["405"][0]), "429": _error(_ERRORS["429"][0]),
        "404": refused("404", "No session of the caller with this id (session.not_found), or no file at this path "
                       "(request.workspace_not_found)."),
        "409": refused("409", "An execution or another file transfer runs in this session (session.busy)."),
        "410": refused("410", "The session has ended (session.gone)."),
        "422": refused("422", "The path is refused (request.workspace_path: its name, a symlink on the way, not a "
                       "regular file); the message names it."),
        "501": refused("501", "A kernel-mode session: the file API serves workspace-mode sessions only "
                       "(session.unavailable)."),
        "500": _error(_ERRORS["500"][0]), "503": _error(_ERRORS["503"][0]),
    }  # fmt: skip
    octets = {_OCTETS: {"schema": {"type": "string", "contentMediaType": _OCTETS}}}
    stored = _body(_ref("Api", "/$defs/sessionFile"), "Written (replacing a file at the path): its size and sha256.")
    listed = _body(_ref("Api", "/$defs/sessionFiles"), "The workspace's regular files, sorted by path.")
    downloaded = {
        "description": "The file's raw bytes.", "content": octets,
        "headers": {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}},
    }  # fmt: skip
    return {
        "/v1/sessions/{session_id}/files": {
            "get": {
                "operationId": "listSessionFiles",
                "summary": "The regular files of the caller's workspace session (not recorded in the trail).",
                "security": auth,
                "parameters": [session_id],
                "responses": {"200": listed, **{s: common[s] for s in ("401", "404", "405", "410", "429", "501")}},
            }
        },
        "/v1/sessions/{session_id}/files/{path}": {
            "put": {
                "operationId": "putSessionFile",
                "summary": "Upload the body's raw bytes to the path in the caller's workspace session, at most the "
                "policy's limits.files_size ceiling; recorded as session.file.put (path, bytes, sha256). Counts "
                "against the caller's rpm.",
                "security": auth,
                "parameters": [session_id, path],
                "requestBody": {"required": True, "content": octets},
                "responses": {
                    "200": stored,
                    **{s: common[s] for s in ("401", "404", "405", "409", "410", "422", "429", "501", "503")},
                    "400": _error(_ERRORS["400"][0]),
                    "408": _error(_ERRORS["408"][0]),
                    "413": refused(
                        "413",
                        "The body is larger than max_body_bytes (request.too_large) or the policy's "
                        "limits.files_size ceiling (request.file_too_large); nothing was written.",
                    ),
                    "415": refused("415", "The body is not application/octet-stream (request.media_type)."),
                    "507": refused(
                        "507",
                        "The workspace is full (request.workspace_full: its size is the session's "
                        "bound), or the trail's file system is low (audit.low_space).",
                    ),
                },
            },
            "get": {
                "operationId": "getSessionFile",
                "summary": "Download the regular file at the path in the caller's workspace session, at most the "
                "policy's limits.output_files_bytes ceiling; recorded as session.file.get (path, bytes, sha256) "
                "before the bytes are sent.",
                "security": auth,
                "parameters": [session_id, path],
                "responses": {
                    "200": downloaded,
                    **{s: common[s] for s in ("401", "404", "405", "409", "410", "422", "429", "501", "503")},
                    "413": refused(
                        "413",
                        "The file is larger than the policy's limits.output_files_bytes ceiling "
                        "(request.file_too_large); nothing of it was sent.",
                    ),
                },
            },
        },
    }


@cache
def _document(mcp_sessions: bool) -> dict[str, Any]:
    schemas = {name: _rewrite(load_schema(file), name) for file, name in COMPONENTS.items()}
    auth: list[dict[str, list[str]]] = [{"bearer": []}]
    v1 = ("401", "405", "429")  # every authenticated request counts against its all_rpm
    body = ("400", "408", "413", "415", "422")
    request_body = {"required": True, "content": {_JSON: {"schema": _ref("ExecutionRequest")}}}
    paths: dict[str, Any] = {
        "/v1/executions": {
            "post": {
                "operationId": "execute",
                "summary": "Run a request in a single-use sandbox (200 whatever the program's exit code).",
                "security": auth,
                "requestBody": request_body,
                "responses": _responses(
                    _body(_ref("ExecutionResult"), "It ran: the result object (`--json`)."),
                    *body,
                    *v1,
                    "403",
                    "429",
                    "500",
                    "502",
                    "503",
                    "507",
                ),
            }
        },
        "/v1/decisions": {
            "post": {
                "operationId": "decide",
                "summary": "Dry run: the decision and the assembled options; nothing runs.",
                "security": auth,
                "requestBody": request_body,
                "responses": _responses(
                    _body(_ref("Api", "/$defs/decisionResponse"), "Decided (allowed or denied: the body says)."),
                    *body,
                    *v1,
                    "403",
                    "429",
                    "500",
                    "503",
                    "507",
                ),
            }
        },
        "/v1/policy": {
            "get": {
                "operationId": "policy",
                "summary": "The caller's effective policy: name, sha256, defaults and ceilings.",
                "security": auth,
                "responses": _responses(_body(_ref("Api", "/$defs/policySummary"), "The policy."), *v1),
            }
        },
        "/v1/tools": {
            "get": {
                "operationId": "tools",
                "summary": "Function-calling tool definitions for this caller, with its ceilings.",
                "security": auth,
                "responses": _responses(_body(_ref("Api", "/$defs/tools"), "The tools."), *v1),
            }
        },
        "/v1/audit/records": {
            "get": {
                "operationId": "auditRecords",
                "summary": "Operators only: the trail's records matching the filters of `gateway audit query`, "
                "streamed as JSON lines, each exactly as stored (its hash can be checked).",
                "security": auth,
                "parameters": _audit_parameters(),
                "responses": _responses(
                    _stream(
                        _NDJSON, _ref("AuditRecord"), "The matching records in trail order, one JSON object a line."
                    ),
                    *v1,
                    "403",
                    "422",
                    "500",
                    "503",
                ),
            }
        },
        "/v1/reload": {
            "post": {
                "operationId": "reload",
                "summary": "Operators only: reload the principals and policies as SIGHUP does; the answer says whether "
                "they applied and which token ids the service now accepts (`gateway principals revoke --service`).",
                "security": auth,
                "responses": _responses(
                    _body(_ref("Api", "/$defs/reloadAnswer"), "Reloaded, or rejected (applied false)."),
                    *v1,
                    "403",
                    "503",
                ),
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Operators only: Prometheus metrics (requests by endpoint and outcome, decision and "
                "execution latency, running executions, queue depth, denials by rule).",
                "security": auth,
                "responses": _responses(
                    _stream(_TEXT, {"type": "string"}, "The Prometheus text exposition format 0.0.4."),
                    *v1,
                    "403",
                    "503",
                ),
            }
        },
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness: the process answers.",
                "security": [],
                "responses": _responses(_body(_ref("Api", "/$defs/health"), "Alive."), "405"),
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Readiness: the engine answers, every default image is present, the trail is writable.",
                "security": [],
                "responses": _responses(_body(_ref("Api", "/$defs/readiness"), "Ready."), "405", "503"),
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document (no authentication: it holds only the public contract).",
                "security": [],
                "responses": _responses(
                    {"description": "The OpenAPI 3.1 document.", "content": {_JSON: {"schema": {"type": "object"}}}},
                    "405",
                ),
            }
        },
    }
    paths["/v1/executions"]["post"]["responses"]["200"]["content"][_EVENT_STREAM] = _EXECUTION_EVENTS
    paths.update(_session_paths(auth))
    paths.update(_approval_paths(auth))
    paths["/v1/executions"]["post"]["responses"]["202"] = _body(
        _ref("ExecutionResult"),
        "Held for an operator's approval (a rule in mode approve): nothing ran; the result carries approval_id and "
        "pending true. Poll GET /v1/approvals/{approval_id}; once approved, submit the identical request again.",
    )
    paths["/mcp"] = _mcp_path(auth, mcp_sessions)
    responses: dict[str, Any] = {}
    paths.update(_session_file_paths(auth))
    for status, (name, description) in _ERRORS.items():
        headers = {}
        if status == "401":
            headers["WWW-Authenticate"] = {
                "description": 'Always `Bearer realm="gateway"`.',
                "required": True,
                "schema": {"type": "string", "pattern": "^Bearer"},
            }
        if status == "429":
            headers["Retry-After"] = {
                "description": "Whole seconds until a retry can succeed (rpm: until the window frees).",
                "required": True,
                "schema": {"type": "string", "pattern": "^[1-9][0-9]*$"},
            }
        if status == "405":
            headers["Allow"] = {"description": "The methods the endpoint takes.", "schema": {"type": "string"}}
        responses[name] = _body(_ref("Error"), f"{status}: {description}", headers)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "agent-exec-gateway",
            "version": __version__,
            "description": "The policy-enforcing gateway's HTTP API (`gateway serve`). Every /v1 call needs "
            "`Authorization: Bearer TOKEN`; each principal is decided under its own policy. The bodies are the "
            "JSON Schemas shipped in schemas/. A path that is not listed here answers 404 with the error body "
            "(http.not_found).",
        },
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "paths": paths,
        "components": {
            "schemas": schemas,
            "responses": responses,
            "headers": {
                "X-Request-Id": {
                    "description": "Id of this request (the gateway's request id, also in its audit records).",
                    "required": True,
                    "schema": {"type": "string", "minLength": 1},
                }
            },
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A principal's token (`gateway principals add`); only its SHA-256 is stored.",
                }
            },
        },
    }


def openapi_document(*, mcp_sessions: bool = False) -> dict[str, Any]:
    """A fresh copy of the document (callers may not alter the cached one); ``mcp_sessions``: the service keeps
    MCP sessions (``mcp.session``), so ``/mcp`` takes ``DELETE`` too."""
    return copy.deepcopy(_document(mcp_sessions))

"""A Python client for ``gateway serve`` (on ``httpx``): :class:`Client` and :class:`AsyncClient`.

``Client(base_url, token)`` calls the service as the token's principal. The methods mirror the library, so a
caller can swap a local :class:`gateway.Gateway` for a remote client (a request's ``files`` may hold ``bytes``
in both: they travel as ``{"content": "<base64>", "encoding": "base64"}``):

- :meth:`Client.execute` / :meth:`Client.decide` return a :class:`RemoteResult`, shaped like the
  :class:`gateway.ExecutionResult` that ``Gateway.execute`` / ``Gateway.decide`` return: ``to_dict()`` has the
  same keys, and ``allowed``, ``ran``, ``error``, ``exit_status`` mean the same. Like the library, they do not
  raise for what the gateway decided or failed at: a policy denial (HTTP 403 ``policy.denied``) is a result
  with ``allowed`` False and its ``violations``; an invalid request (422), an engine or trail that is down
  (503), capacity, a refused principal... are a result whose ``error`` is the library's exception, rebuilt
  from the error body.
- They raise only for what is about the client itself: :class:`~gateway.errors.AuthenticationError` for a
  token the service does not accept (401), :class:`~gateway.errors.ServiceUnreachableError` when no HTTP
  answer came (connection, TLS, timeout), and a success answer that is not the service's contract.
- :meth:`Client.policy` and :meth:`Client.tools` return the JSON of ``GET /v1/policy`` / ``GET /v1/tools``
  and raise the mapped exception for any error.
- Sessions: :attr:`Client.sessions` (a :class:`RemoteSessions`; :class:`AsyncRemoteSessions` awaited) has
  the methods of :attr:`gateway.Gateway.sessions` (:class:`gateway.sessions.SessionManager`), with the same
  names and arguments, so ``gw.sessions.execute(sid, request)`` and ``client.sessions.execute(sid, request)``
  are one call. ``create`` returns a :class:`RemoteSessionResult` (shaped like
  :class:`gateway.sessions.SessionResult`: a denial or an error is a result, not an exception), ``execute`` a
  :class:`RemoteResult` (with ``value`` for a kernel cell, and ``session_id``; ``session.not_found``,
  ``session.gone`` and ``session.busy`` are its ``error``); ``list`` and ``get`` return :class:`RemoteSession`
  (the :class:`gateway.sessions.SessionInfo` attributes) and ``close`` returns None once the sandbox is gone;
  these raise the mapped exception (:class:`~gateway.errors.SessionNotFoundError` for an unknown id and
  another principal's alike, :class:`~gateway.errors.SessionGoneError` for an ended one).
- A workspace session's files: ``put_file`` returns the :class:`gateway.sessions.SessionFile` written,
  ``get_file`` the bytes, ``list_files`` a :class:`gateway.runner.workspace.WorkspaceListing`; they raise the
  mapped exception. The path travels percent-encoded (``..`` too, which httpx would otherwise resolve away):
  the service alone judges it.

Error bodies (``code``, ``message``, ``request_id``, ``violations`` / ``errors``) become the class of
:mod:`gateway.errors` with that stable ``code``; an unknown code becomes a subclass (keeping the code) of
the base class of its status family (401: ``AuthenticationError``, other 4xx: ``RequestError``, 5xx:
``GatewayError``). ``errors`` become the exception's ``problems`` (with their JSON paths); the service's
``request_id`` is kept on the exception (``exc.request_id``).

The token is sent only in the ``Authorization`` header: it is never logged, and appears in no exception,
``repr`` or result. The client's ``timeout`` must exceed the longest run the policy allows (the server's
deadline bounds every run whatever the client does); the default is :data:`DEFAULT_TIMEOUT`.
"""

from __future__ import annotations

import builtins
import copy
import json
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, cast
from urllib.parse import quote

import httpx

from gateway import errors as _errors
from gateway.errors import (
    EXIT_DENIED,
    EXIT_GATEWAY_FAILURE,
    AuthenticationError,
    GatewayError,
    OverQuotaError,
    Problem,
    RequestError,
    ServiceUnreachableError,
    exit_code_for,
)
from gateway.payload import request_file
from gateway.runner.workspace import WorkspaceFile, WorkspaceListing
from gateway.sessions.files import SessionFile

__all__ = [
    "DEFAULT_TIMEOUT",
    "AsyncClient",
    "AsyncRemoteSessions",
    "Client",
    "RemoteResult",
    "RemoteSession",
    "RemoteSessionResult",
    "RemoteSessions",
    "error_from_response",
]

DEFAULT_TIMEOUT = 90.0
"""Seconds the client waits for an answer: above the default policy's 60 s ceiling plus start-up."""
DENIED_CODE = "policy.denied"

RequestBody = Mapping[str, Any] | str | bytes


# --- results --------------------------------------------------------------------------------------------


class RemoteResult:
    """What one remote request came to, read like :class:`gateway.ExecutionResult`.

    ``to_dict()`` is the ``--json`` result object with the library's keys; ``decision`` is the decision record
    (``schemas/decision.schema.json``) as JSON when the service sent one (``decide``), else None."""

    __slots__ = ("_data", "decision", "error", "status")

    def __init__(
        self, data: dict[str, Any], *, status: int, error: GatewayError | None = None,
        decision: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self._data = data
        self.status = status
        """The HTTP status of the answer."""
        self.error = error
        """The library's exception for a gateway-side failure (``exc.request_id`` set); None otherwise."""
        self.decision = decision

    @property
    def request_id(self) -> str:
        return str(self._data["request_id"])

    @property
    def allowed(self) -> bool:
        return bool(self._data["allowed"]) and self.error is None

    @property
    def ran(self) -> bool:
        """True when a sandbox ran (the service reported an outcome)."""
        return self._data["duration_ms"] is not None

    @property
    def exit_status(self) -> int:
        return int(self._data["exit_status"])

    @property
    def exit_code(self) -> int | None:
        code = self._data["exit_code"]
        return None if code is None else int(code)

    @property
    def stdout(self) -> str:
        return str(self._data["stdout"])

    @property
    def stderr(self) -> str:
        return str(self._data["stderr"])

    @property
    def violations(self) -> list[dict[str, Any]]:
        return list(self._data["violations"])

    @property
    def audit_ok(self) -> bool:
        """False when a record of this request could not be made durable on the service's trail."""
        return bool(self._data.get("audit_ok", True))

    @property
    def session_id(self) -> str | None:
        """The session it ran in (``sessions.execute``); None for a single-use run."""
        sid = self._data.get("session_id")
        return None if sid is None else str(sid)

    @property
    def value(self) -> str | None:
        """A kernel cell's value: the repr of its last expression (bounded), None when it has none."""
        value = self._data.get("value")
        return None if value is None else str(value)

    @property
    def value_truncated(self) -> bool:
        return bool(self._data.get("value_truncated"))

    @property
    def interrupted(self) -> bool:
        """A kernel cell was interrupted (its deadline, an output flood) and the kernel lives on."""
        return bool(self._data.get("interrupted"))

    @property
    def approval_id(self) -> str | None:
        """The approval the request waits for (:attr:`pending`) or the one its run used; None for other requests."""
        found = self._data.get("approval_id")
        return None if found is None else str(found)

    @property
    def pending(self) -> bool:
        """Waiting for an operator's approval: nothing ran."""
        return bool(self._data.get("pending"))

    @property
    def session_ended(self) -> str | None:
        """Why the session ended during this execution (its kernel was killed); None while it lives."""
        ended = self._data.get("session_ended")
        return None if ended is None else str(ended)

    def to_dict(self) -> dict[str, Any]:
        """A fresh copy of the result object (the keys of :meth:`gateway.ExecutionResult.to_dict`)."""
        return copy.deepcopy(self._data)

    def __repr__(self) -> str:
        error = f", error={self.error.code!r}" if self.error is not None else ""
        return (
            f"RemoteResult(request_id={self.request_id!r}, allowed={self.allowed}, ran={self.ran}, "
            f"exit_status={self.exit_status}{error})"
        )


class RemoteSession:
    """A session as the service describes it (``GET /v1/sessions/{id}``), read like
    :class:`gateway.sessions.SessionInfo`: the same attributes, times as unix time (the service sends RFC 3339
    UTC to the second), ``settings`` as JSON. Not told remotely: the kernel's ``container_id``."""

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    @property
    def session_id(self) -> str:
        return str(self._data["session_id"])

    @property
    def principal(self) -> str | None:
        principal = self._data.get("principal")
        return None if principal is None else str(principal)

    @property
    def mode(self) -> str:
        return str(self._data["mode"])

    @property
    def state(self) -> str:
        return str(self._data["state"])

    @property
    def ready_at(self) -> float:
        return _unix(self._data["ready_at"])

    @property
    def last_used_at(self) -> float:
        return _unix(self._data["last_used_at"])

    @property
    def expires_at(self) -> float:
        """Unix time it ends unless used (``to_dict()["expires_at"]`` is the service's RFC 3339 text)."""
        return _unix(self._data["expires_at"])

    @property
    def lifetime_ends_at(self) -> float:
        return _unix(self._data["lifetime_ends_at"])

    @property
    def executions(self) -> int:
        return int(self._data["executions"])

    @property
    def settings(self) -> dict[str, Any]:
        """The resolved settings (:meth:`gateway.decision.sessions.SessionSettings.to_dict`'s JSON)."""
        return copy.deepcopy(dict(self._data["settings"]))

    @property
    def ended(self) -> str | None:
        ended = self._data.get("ended")
        return None if ended is None else str(ended)

    def to_dict(self) -> dict[str, Any]:
        """A fresh copy of the session object (the keys of :meth:`gateway.sessions.SessionInfo.to_dict`)."""
        return copy.deepcopy(self._data)

    def __repr__(self) -> str:
        return f"RemoteSession(session_id={self.session_id!r}, mode={self.mode!r}, state={self.state!r})"


def _unix(text: Any) -> float:
    """An RFC 3339 UTC time of the service (``2026-01-02T03:04:05Z``) as unix time."""
    return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


class RemoteSessionResult:
    """What a request to create a session came to, read like :class:`gateway.sessions.SessionResult`: the
    session, or a denial (``allowed`` False, ``violations``) or an ``error`` (the library's exception)."""

    __slots__ = ("_data", "error", "status")

    def __init__(self, data: dict[str, Any], *, status: int, error: GatewayError | None = None) -> None:
        self._data = data
        self.status = status
        """The HTTP status of the answer (201 created)."""
        self.error = error

    @property
    def request_id(self) -> str:
        return str(self._data.get("request_id") or "")

    @property
    def allowed(self) -> bool:
        return bool(self._data.get("allowed")) and self.error is None

    @property
    def violations(self) -> list[dict[str, Any]]:
        return list(self._data.get("violations") or [])

    @property
    def decision(self) -> dict[str, Any] | None:
        """None: the service answers with the decision's id and violations (``to_dict()``), not its record."""
        return None

    @property
    def audit_ok(self) -> bool:
        return bool(self._data.get("audit_ok", True))

    @property
    def exit_status(self) -> int:
        """0 created; 77 denied by policy; else the error's exit status (as ``gateway session create``)."""
        if self.error is not None:
            return exit_code_for(self.error)
        return 0 if self.allowed else EXIT_DENIED

    @property
    def session(self) -> RemoteSession | None:
        """The new session; None unless it was created."""
        return RemoteSession(self._data) if self.allowed and "session_id" in self._data else None

    @property
    def session_id(self) -> str | None:
        return self.session.session_id if self.session is not None else None

    def to_dict(self) -> dict[str, Any]:
        """A fresh copy of the answer (the keys of :meth:`gateway.sessions.SessionResult.to_dict`)."""
        return copy.deepcopy(self._data)

    def __repr__(self) -> str:
        error = f", error={self.error.code!r}" if self.error is not None else ""
        return f"RemoteSessionResult(request_id={self.request_id!r}, allowed={self.allowed}{error})"


def _session_result(response: httpx.Response) -> RemoteSessionResult:
    """``sessions.create``: the answer as a result; raises only for what is about the client (401)."""
    status = response.status_code
    if status == 401:
        raise error_from_response(response)
    body = _body(response)
    if 200 <= status < 300:
        if body is None or not isinstance(body.get("session_id"), str):
            raise GatewayError(f"HTTP {status} from the service is not a session object: {response.text[:200]!r}")
        return RemoteSessionResult(body, status=status)
    if status == 403 and body is not None and body.get("code") == DENIED_CODE:
        data = {key: body.get(key) for key in ("request_id", "decision_id", "violations", "warnings", "policy")}
        return RemoteSessionResult(data | {"allowed": False, "error": None, "audit_ok": True}, status=status)
    err = error_from_response(response)
    data = {"request_id": err.request_id, "allowed": False, "violations": [], "error": err.to_dict()}
    return RemoteSessionResult(data, status=status, error=err)


def _sessions(response: httpx.Response) -> list[RemoteSession]:
    return [RemoteSession(item) for item in _json_answer(response)["sessions"]]


def _list_path(operator: bool) -> str:
    return "/v1/sessions?all=true" if operator else "/v1/sessions"


def _closed(response: httpx.Response) -> None:
    if response.status_code != 204:
        raise error_from_response(response)


def _session_path(session_id: str, tail: str = "") -> str:
    """``/v1/sessions/<id><tail>``; an id that is not one (empty, or with a character outside the URL-safe
    alphabet the gateway's ids use) is a :class:`ValueError`, never a request for another path."""
    if not session_id or not all(c.isascii() and (c.isalnum() or c in "-_") for c in session_id):
        raise ValueError(f"{session_id!r} is not a session id (URL-safe base64, as sessions.create returns)")
    return f"/v1/sessions/{session_id}{tail}"


def _file_path(session_id: str, path: str) -> str:
    """``/v1/sessions/<id>/files/<path>`` with every segment of ``path`` percent-encoded, dots of ``.`` and ``..``
    segments too: the service gets the path exactly as given and judges it (httpx would resolve ``..``)."""
    segments = [quote(s, safe="") if s not in (".", "..") else s.replace(".", "%2E") for s in path.split("/")]
    return _session_path(session_id, "/files/" + "/".join(segments))


def _stored(response: httpx.Response) -> SessionFile:
    body = _json_answer(response)
    return SessionFile(str(body["path"]), int(body["bytes"]), str(body["sha256"]))


def _downloaded(response: httpx.Response) -> bytes:
    if response.status_code != 200:
        raise error_from_response(response)
    return response.content


def _listing(response: httpx.Response) -> WorkspaceListing:
    body = _json_answer(response)
    files = tuple(WorkspaceFile(str(f["path"]), int(f["bytes"])) for f in body["files"])
    return WorkspaceListing(files, truncated=bool(body["truncated"]))


def _result_data(
    request_id: str, *, allowed: bool, decision: Mapping[str, Any] | None, error: GatewayError | None
) -> dict[str, Any]:
    """The result object of a request that ran nothing, as ``ExecutionResult.to_dict`` builds it."""
    if error is not None:
        exit_status = exit_code_for(error)
    elif decision is not None and not allowed:
        exit_status = EXIT_DENIED
    else:
        exit_status = EXIT_GATEWAY_FAILURE  # nothing ran: what the library says of a dry run
    policy = decision.get("policy") if decision is not None else None
    return {
        "request_id": request_id,
        "allowed": allowed and error is None,
        "decision_id": decision.get("decision_id") if decision is not None else None,
        "violations": list(decision.get("violations") or []) if decision is not None else [],
        "warnings": list(decision.get("warnings") or []) if decision is not None else [],
        "policy": {"name": policy["name"], "sha256": policy["sha256"]} if isinstance(policy, Mapping) else None,
        "exit_code": None,
        "stdout": "",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "timed_out": False,
        "oom_killed": False,
        "output_limit_killed": False,
        "resource_killed": False,
        "duration_ms": None,
        "files": [],
        "files_truncated": False,
        "pool": None,
        "error": error.to_dict() if error is not None else None,
        "audit_ok": True,
        "exit_status": exit_status,
    }


# --- error bodies -----------------------------------------------------------------------------------------


def _classes_by_code() -> dict[str, type[GatewayError]]:
    found: dict[str, type[GatewayError]] = {}
    for name in _errors.__all__:
        cls = getattr(_errors, name)
        if isinstance(cls, type) and issubclass(cls, GatewayError):
            found.setdefault(cls.code, cls)
    return found


_BY_CODE = _classes_by_code()


_UNKNOWN: dict[tuple[str, str], type[GatewayError]] = {}


def _unknown_code_class(base: type[GatewayError], code: str) -> type[GatewayError]:
    """A subclass of ``base`` carrying a code this library does not know (a newer server), so that ``exc.code``
    is the server's and ``except base`` still catches it."""
    key = (base.__name__, code)
    if key not in _UNKNOWN:
        made = type(base.__name__, (base,), {"code": code, "__module__": __name__, "__qualname__": base.__qualname__})
        _UNKNOWN[key] = cast("type[GatewayError]", made)
    return _UNKNOWN[key]


def _family(status: int) -> type[GatewayError]:
    if status == 401:
        return AuthenticationError
    if 400 <= status < 500:
        return RequestError
    return GatewayError


def _body(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def error_from_response(response: httpx.Response) -> GatewayError:
    """The library's exception for an error answer of the service (see the module's docstring)."""
    body = _body(response)
    status = response.status_code
    if body is None or not isinstance(body.get("code"), str):
        excerpt = response.text[:200].strip()
        err = _family(status)(
            f"HTTP {status} from {response.request.url.copy_with(query=None)} is not the gateway's error format: "
            f"{excerpt or '(empty body)'}"
        )
        err.request_id = response.headers.get("x-request-id")
        return err
    code: str = body["code"]
    cls = _BY_CODE.get(code) or _unknown_code_class(_family(status), code)
    message = str(body.get("message") or f"HTTP {status}")
    problems = [
        Problem(message=str(e.get("message", "")), path=str(e.get("path") or "$"), source="<request>")
        for e in body.get("errors") or []
        if isinstance(e, Mapping)
    ]
    err = cls.__new__(cls)  # the constructors of a few classes take other arguments (a signal number)
    GatewayError.__init__(err, message, problems=problems)
    request_id = body.get("request_id") or response.headers.get("x-request-id")
    err.request_id = str(request_id) if request_id is not None else None
    if isinstance(err, OverQuotaError):  # 429: when to retry, and which quota
        retry_after = response.headers.get("retry-after", "")
        err.retry_after_s = int(retry_after) if retry_after.isdigit() else 1
        err.quota = str(body.get("quota") or "")
    return err


def _result(response: httpx.Response, *, dry_run: bool) -> RemoteResult:
    """``execute`` / ``decide``: the answer as a result; raises only for what is about the client."""
    status = response.status_code
    if status == 401:
        raise error_from_response(response)
    body = _body(response)
    if 200 <= status < 300:
        if body is None or not isinstance(body.get("request_id"), str):
            raise GatewayError(f"HTTP {status} from the service is not a result object: {response.text[:200]!r}")
        if not dry_run:
            return RemoteResult(body, status=status)
        decision = body.get("decision")
        decision = decision if isinstance(decision, dict) else None
        data = _result_data(body["request_id"], allowed=bool(body.get("allowed")), decision=decision, error=None)
        return RemoteResult(data, status=status, decision=decision)
    if status == 403 and body is not None and body.get("code") == DENIED_CODE:
        request_id = str(body.get("request_id"))
        return RemoteResult(_result_data(request_id, allowed=False, decision=body, error=None), status=status)
    err = error_from_response(response)
    request_id = err.request_id or ""
    ran = body.get("result") if body is not None else None
    if isinstance(ran, dict) and isinstance(ran.get("request_id"), str):  # the run ended in a gateway failure
        return RemoteResult(ran, status=status, error=err)
    return RemoteResult(_result_data(request_id, allowed=False, decision=None, error=err), status=status, error=err)


def _json_answer(response: httpx.Response) -> dict[str, Any]:
    """``policy`` / ``tools``: the JSON body, or the mapped exception."""
    if not 200 <= response.status_code < 300:
        raise error_from_response(response)
    body = _body(response)
    if body is None:
        raise GatewayError(f"HTTP {response.status_code} from the service is not a JSON object")
    return body


def _content(request: RequestBody) -> bytes:
    if isinstance(request, bytes):
        return request
    if isinstance(request, str):
        return request.encode("utf-8")
    body = dict(request)
    files = body.get("files")
    if isinstance(files, Mapping):  # bytes travel as base64, as the library takes them (Gateway.execute)
        body["files"] = {name: request_file(c) if isinstance(c, bytes | bytearray) else c for name, c in files.items()}
    return json.dumps(body).encode("utf-8")


def _unreachable(base_url: str, exc: httpx.HTTPError) -> ServiceUnreachableError:
    return ServiceUnreachableError(f"no answer from the gateway service at {base_url}: {type(exc).__name__}: {exc}")


def _headers(token: str) -> dict[str, str]:
    if not token or any(c.isspace() for c in token):
        raise ValueError("the token must be a non-empty string without whitespace (as `gateway principals add` prints)")
    return {"Authorization": f"Bearer {token}", "Accept": "application/json"}


_JSON = {"Content-Type": "application/json"}
_OCTETS = {"Content-Type": "application/octet-stream"}


# --- the clients -------------------------------------------------------------------------------------------


class Client:
    """A synchronous client of ``gateway serve``; use it as a context manager (or call :meth:`close`).

    ``verify`` is httpx's: True (system CAs), a CA bundle path or an ``ssl.SSLContext``, or False."""

    def __init__(
        self, base_url: str, token: str, *, timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        verify: Any = True,
    ) -> None:  # fmt: skip
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, headers=_headers(token), timeout=timeout, verify=verify)
        self.sessions = RemoteSessions(self._send)
        """The caller's sessions, with the methods of :attr:`gateway.Gateway.sessions`."""

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(
        self, method: str, path: str, content: bytes | None = None, headers: dict[str, str] = _JSON
    ) -> httpx.Response:
        try:
            return self._http.request(method, path, content=content, headers=headers if content is not None else None)
        except httpx.HTTPError as exc:
            raise _unreachable(self.base_url, exc) from exc

    def execute(self, request: RequestBody) -> RemoteResult:
        """``POST /v1/executions``: decide, run if allowed; a denial is a result (see the module's docstring)."""
        return _result(self._send("POST", "/v1/executions", _content(request)), dry_run=False)

    def decide(self, request: RequestBody) -> RemoteResult:
        """``POST /v1/decisions``: the decision (``result.decision``), nothing runs."""
        return _result(self._send("POST", "/v1/decisions", _content(request)), dry_run=True)

    def policy(self) -> dict[str, Any]:
        """``GET /v1/policy``: the caller's policy name and sha256, its defaults and ceilings."""
        return _json_answer(self._send("GET", "/v1/policy"))

    def tools(self) -> list[dict[str, Any]]:
        """``GET /v1/tools``: the function-calling definitions for this caller, one per language its policy
        allows (``execute_python``, ``execute_shell``, ``execute_javascript``), its ceilings in them."""
        return list(_json_answer(self._send("GET", "/v1/tools"))["tools"])


class AsyncClient:
    """:class:`Client` for asyncio: the same methods, awaited; ``async with AsyncClient(...) as client``."""

    def __init__(
        self, base_url: str, token: str, *, timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        verify: Any = True,
    ) -> None:  # fmt: skip
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=_headers(token), timeout=timeout, verify=verify)
        self.sessions = AsyncRemoteSessions(self._send)
        """:attr:`Client.sessions`, awaited."""

    def __repr__(self) -> str:
        return f"AsyncClient({self.base_url!r})"

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(
        self, method: str, path: str, content: bytes | None = None, headers: dict[str, str] = _JSON
    ) -> httpx.Response:
        try:
            return await self._http.request(
                method, path, content=content, headers=headers if content is not None else None
            )
        except httpx.HTTPError as exc:
            raise _unreachable(self.base_url, exc) from exc

    async def execute(self, request: RequestBody) -> RemoteResult:
        return _result(await self._send("POST", "/v1/executions", _content(request)), dry_run=False)

    async def decide(self, request: RequestBody) -> RemoteResult:
        return _result(await self._send("POST", "/v1/decisions", _content(request)), dry_run=True)

    async def policy(self) -> dict[str, Any]:
        return _json_answer(await self._send("GET", "/v1/policy"))

    async def tools(self) -> list[dict[str, Any]]:
        return list(_json_answer(await self._send("GET", "/v1/tools"))["tools"])


# --- sessions -----------------------------------------------------------------------------------------------

Send = Callable[..., httpx.Response]
"""``Client._send``: ``(method, path, content=None, headers=...)`` -> the answer (no answer: raised)."""
AsyncSend = Callable[..., Awaitable[httpx.Response]]


class RemoteSessions:
    """``Client.sessions``: :class:`gateway.sessions.SessionManager`'s methods over ``/v1/sessions``, with its
    names and arguments (what only the library takes is left out: ``principal``, the token's; ``caller``;
    ``on_output``; ``cancel``; the lifecycle ``sweep`` and ``close_all``). The results are read like the
    library's (see the module's docstring)."""

    __slots__ = ("_send",)

    def __init__(self, send: Send) -> None:
        self._send = send

    def create(self, request: RequestBody) -> RemoteSessionResult:
        """``POST /v1/sessions`` (``mode``, optional ``idle_s``, ``lifetime_s``, ``workspace_size`` and the
        profile's request fields): the session, or a denial or error as a result."""
        return _session_result(self._send("POST", "/v1/sessions", _content(request)))

    def list(self, *, operator: bool = False) -> builtins.list[RemoteSession]:
        """``GET /v1/sessions``: the caller's live sessions, oldest first; ``operator`` (the operator role only,
        else :class:`~gateway.errors.ForbiddenError`): every principal's."""
        return _sessions(self._send("GET", _list_path(operator)))

    def get(self, session_id: str) -> RemoteSession:
        """``GET /v1/sessions/{id}``."""
        return RemoteSession(_json_answer(self._send("GET", _session_path(session_id))))

    def execute(self, session_id: str, request: RequestBody) -> RemoteResult:
        """``POST /v1/sessions/{id}/executions`` (``code``, optional ``limits.timeout_s``, ``files``, ``env``):
        as :meth:`Client.execute`, plus ``value`` for a kernel cell."""
        return _result(self._send("POST", _session_path(session_id, "/executions"), _content(request)), dry_run=False)

    def close(self, session_id: str) -> None:
        """``DELETE /v1/sessions/{id}``: its sandbox is gone when this returns."""
        _closed(self._send("DELETE", _session_path(session_id)))

    def put_file(self, session_id: str, path: str, data: bytes) -> SessionFile:
        """``PUT /v1/sessions/{id}/files/{path}``: write ``data`` at ``path`` in a workspace session (at most the
        policy's ``limits.files_size`` ceiling); what was written, with its sha256."""
        return _stored(self._send("PUT", _file_path(session_id, path), bytes(data), _OCTETS))

    def get_file(self, session_id: str, path: str) -> bytes:
        """``GET /v1/sessions/{id}/files/{path}``: the file's bytes (at most ``limits.output_files_bytes``)."""
        return _downloaded(self._send("GET", _file_path(session_id, path)))

    def list_files(self, session_id: str) -> WorkspaceListing:
        """``GET /v1/sessions/{id}/files``: the regular files of a workspace session."""
        return _listing(self._send("GET", _session_path(session_id, "/files")))


class AsyncRemoteSessions:
    """``AsyncClient.sessions``: :class:`RemoteSessions`' methods, awaited."""

    __slots__ = ("_send",)

    def __init__(self, send: AsyncSend) -> None:
        self._send = send

    async def create(self, request: RequestBody) -> RemoteSessionResult:
        return _session_result(await self._send("POST", "/v1/sessions", _content(request)))

    async def list(self, *, operator: bool = False) -> builtins.list[RemoteSession]:
        return _sessions(await self._send("GET", _list_path(operator)))

    async def get(self, session_id: str) -> RemoteSession:
        return RemoteSession(_json_answer(await self._send("GET", _session_path(session_id))))

    async def execute(self, session_id: str, request: RequestBody) -> RemoteResult:
        path = _session_path(session_id, "/executions")
        return _result(await self._send("POST", path, _content(request)), dry_run=False)

    async def close(self, session_id: str) -> None:
        _closed(await self._send("DELETE", _session_path(session_id)))

    async def put_file(self, session_id: str, path: str, data: bytes) -> SessionFile:
        return _stored(await self._send("PUT", _file_path(session_id, path), bytes(data), _OCTETS))

    async def get_file(self, session_id: str, path: str) -> bytes:
        return _downloaded(await self._send("GET", _file_path(session_id, path)))

    async def list_files(self, session_id: str) -> WorkspaceListing:
        return _listing(await self._send("GET", _session_path(session_id, "/files")))

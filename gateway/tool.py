"""The function-calling tools for LLMs, one per language the policy allows (``execute_python``,
``execute_shell``, ``execute_javascript``), routed through the gateway.

The model sets ``code``, a ``timeout`` (up to the policy's ceiling) and, where the policy allows installs for the
tool's language, ``packages`` (from the operator's index, within its allow list); the tool's name sets the
language: image, mounts, network, limits and env stay the operator's. Every call is decided, audited and
contained like any other request, and the model gets a JSON-serialisable answer it can read, denials included
with their reasons, and the files the program wrote under ``./out`` with their contents (text as text, binary as
base64), all within fixed bounds (:data:`MAX_TOOL_OUTPUT_CHARS` per stream, :data:`MAX_TOOL_FILES_CHARS` for
the files): what is cut is marked.

State between calls is the host's choice, never the model's: ``ToolHandler(gateway, session="kernel")`` (a
local Gateway or a ``gateway.client.Client``) keeps one gateway session per handler (opened at the first call,
or by :meth:`ToolHandler.open`; closed by :meth:`ToolHandler.close`), so the model's consecutive
``execute_python`` calls share variables, imports and files; the model sets only ``code`` and ``timeout`` there
(no ``packages``: an execution in a session may not list any, rule ``sessions.profile``) and never sees or names
a session id. A session that ended (idle, lifetime, killed) is replaced by a new one at the next call, and that
answer says the state is gone (``state_lost``). The session is Python's
(:data:`SESSION_LANGUAGES`): in a session handler, the other languages' tools still run each call in a fresh
sandbox, and their descriptions say so.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

from gateway import Caller, Gateway
from gateway.errors import CancelledRunError, SessionGoneError, SessionNotFoundError
from gateway.executor import Executor, ResultLike
from gateway.policy.model import EGRESS, NpmRule, PackagesRule, Policy
from gateway.policy.npm import MAX_SPEC_LENGTH
from gateway.policy.packages import MAX_REQUIREMENT_LENGTH
from gateway.result import ExecutionResult
from gateway.sessions.model import SessionResult
from gateway.sizes import format_size

if TYPE_CHECKING:
    from gateway.client import Client, RemoteResult, RemoteSessionResult

__all__ = [
    "DEFAULT_TOOL_PRINCIPAL",
    "EXECUTE_PYTHON_TOOL",
    "MAX_TOOL_FILES_CHARS",
    "MAX_TOOL_OUTPUT_CHARS",
    "SESSION_LANGUAGES",
    "TOOL_NAME",
    "ToolHandler",
    "ToolSession",
    "ceilings_text",
    "handle_tool_call",
    "tool_definition",
    "tool_definitions",
    "tool_name",
]

TOOL_NAME = "execute_python"
"""The Python tool's name; each language's tool is ``execute_<language>`` (:func:`tool_name`)."""
MAX_TOOL_OUTPUT_CHARS = 16_000
"""What the model is shown of each stream; the full capped output stays in the result and the audit digest."""
MAX_TOOL_FILES_CHARS = 16_000
"""What the model is shown of the returned files, their names and contents together (base64 characters for a
binary file), in name order: a file cut short says ``truncated``, files left out are counted (``files_omitted``).
The whole files stay in the result (``Gateway.execute``)."""
DEFAULT_TOOL_PRINCIPAL = "llm-tool"
"""The principal a :class:`ToolHandler` names in its requests when it is given none."""
ToolSession = Literal["kernel", "workspace"]
"""A handler's session mode (see :class:`ToolHandler`): ``kernel`` keeps one live interpreter (variables,
imports and files persist), ``workspace`` one persistent working directory under fresh containers (files
persist, variables do not)."""

_LANGUAGES: dict[str, tuple[str, str]] = {
    "python": ("Execute Python 3 code", "Complete Python 3 program to run."),
    "shell": ("Run a bash script", "Complete bash script to run (bash, not sh)."),
    "javascript": ("Run a Node.js program", "Complete Node.js program to run."),
}
"""Each language with a tool: what its description opens with, and what its ``code`` is."""
SESSION_LANGUAGES = ("python",)
"""The languages whose tool a session handler runs in its session (kernel mode is Python's for now); the other
tools of such a handler run each call in a fresh sandbox."""

_STATELESS = "State does not persist between calls."
_PERSISTS: dict[str, str] = {
    "kernel": (
        "State persists between calls: one live interpreter runs every call, so variables, imports and files "
        "carry over, and the repr of the last expression is returned as value. If the session ends (idle, "
        "lifetime, killed), the answer says state_lost and the call runs in a new, empty session."
    ),
    "workspace": (
        "Files in the working directory persist between calls; variables and imports do not (each call is a "
        "fresh process). If the session ends (idle, lifetime, killed), the answer says state_lost and the call "
        "runs in a new, empty workspace."
    ),
}


def ceilings_text(policy: Policy) -> str:
    """One sentence with the policy's ceilings, for the tool description: the model sees what it may ask for."""
    limits = policy.limits
    timeout = limits.timeout_s
    return (
        f"Policy {policy.name}: timeout up to {timeout.max:g} s (default {timeout.default:g} s); "
        f"memory {format_size(int(limits.memory.max))}, {limits.cpus.max:g} CPUs, {int(limits.pids.max)} "
        f"processes, output capped at {format_size(int(limits.output_bytes.max))} per stream."
    )


_MAX_LISTED = 8
"""Hosts or package names a description lists before it says how many more there are."""


def _listed(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    return shown if len(items) <= _MAX_LISTED else f"{shown} and {len(items) - _MAX_LISTED} more"


def _network_text(policy: Policy) -> str:
    """Where the policy's default network puts a run, for the tool description: ``network-less``, ``with network
    access only to <hosts>`` (egress), or the network's name."""
    network = policy.network
    if network.default == "none":
        return "network-less"
    if network.default == EGRESS and network.egress is not None:
        hosts = [
            f"{d.host}:{d.ports[0]}" if len(d.ports) == 1 else f"{d.host} (ports {', '.join(map(str, d.ports))})"
            for d in network.egress.allow
        ]
        return f"with network access only to {_listed(hosts)}"
    return f"on the network {network.default!r}"


def _packages_parameter(language: str, rule: PackagesRule | NpmRule) -> dict[str, Any]:
    """The ``packages`` parameter of ``language``'s tool under ``rule`` (``spec.packages`` or its ``npm``)."""
    what, length = {
        "python": ("index: pip requirement strings such as 'requests>=2'", MAX_REQUIREMENT_LENGTH),
        "javascript": ("registry: npm specs such as 'left-pad@^1.3'", MAX_SPEC_LENGTH),
    }[language]
    return {
        "type": "array",
        "minItems": 1,
        "maxItems": rule.max,
        "items": {"type": "string", "minLength": 1, "maxLength": length},
        "description": f"Packages to install before running, from the operator's {what}; only "
        f"{_listed(list(rule.allow))} are allowed (dependencies too).",
    }


def _packages_rule(policy: Policy, language: str) -> PackagesRule | NpmRule | None:
    """What ``language``'s requests may install under ``policy``: Python's ``spec.packages``, JavaScript's
    ``spec.packages.npm``; None for another language, or when the policy allows no installs for it."""
    return {"python": policy.packages, "javascript": policy.npm}.get(language)


def tool_name(language: str) -> str:
    """The name of ``language``'s tool: ``execute_<language>``."""
    return f"execute_{language}"


def _language_of(name: str) -> str | None:
    """The language a tool name runs, or None for a name no tool has."""
    return next((language for language in _LANGUAGES if tool_name(language) == name), None)


def tool_definition(
    max_timeout_s: float = 60,
    *,
    ceilings: str | None = None,
    session: ToolSession | None = None,
    language: str = "python",
    network: str = "network-less",
    packages: PackagesRule | NpmRule | None = None,
) -> dict[str, Any]:
    """The OpenAI-style function-calling definition of ``language``'s tool (also what Anthropic's tool
    ``input_schema`` takes).

    ``ceilings`` (see :func:`ceilings_text`) is appended to the description. ``session``: the description says
    what persists between calls in that mode (a :class:`ToolHandler` built with the same ``session``), for a
    language of :data:`SESSION_LANGUAGES`; another language's tool says nothing persists, as it runs each call
    afresh. ``network`` says where a run is (see :func:`_network_text`). The parameters are ``code`` and
    ``timeout``, and ``packages`` bounded by ``packages`` (``spec.packages``, or ``spec.packages.npm`` for
    JavaScript) when it is given; without it the schema refuses any other parameter."""
    if session is not None and session not in _PERSISTS:
        raise ValueError(f"session {session!r} is not one of {sorted(_PERSISTS)}")
    if language not in _LANGUAGES:
        raise ValueError(f"language {language!r} has no tool; the tools' languages are {sorted(_LANGUAGES)}")
    if packages is not None and language not in ("python", "javascript"):
        raise ValueError(f"language {language!r} has no packages; only python and javascript tools take them")
    opening, code = _LANGUAGES[language]
    where = "in an isolated, network-less sandbox" if network == "network-less" else f"in an isolated sandbox {network}"
    description = (
        f"{opening} {where} and return stdout, stderr and the exit code. Files "
        "written under ./out are returned with their contents (UTF-8 text as text, other bytes as base64); long "
        "contents are cut and marked truncated. "
    ) + (_PERSISTS[session] if session is not None and language in SESSION_LANGUAGES else _STATELESS)
    properties: dict[str, Any] = {
        "code": {"type": "string", "description": code},
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": max_timeout_s,
            "description": "Wall-clock limit in seconds (optional; the policy default applies).",
        },
    }
    if packages is not None:
        properties["packages"] = _packages_parameter(language, packages)
    return {
        "type": "function",
        "function": {
            "name": tool_name(language),
            "description": f"{description} {ceilings}" if ceilings else description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": ["code"],
                "additionalProperties": False,
            },
        },
    }


EXECUTE_PYTHON_TOOL: dict[str, Any] = tool_definition()
"""``execute_python``'s definition with no policy's ceilings (kept for callers of the one-language tool)."""


def tool_definitions(policy: Policy, *, session: ToolSession | None = None) -> list[dict[str, Any]]:
    """The tools a caller under ``policy`` is offered: one per language it allows, in the policy's order, each
    with the policy's timeout ceiling as its schema's maximum, its default network and ceilings in the
    description, and a ``packages`` parameter when the policy allows installs for its language (Python:
    ``spec.packages``; JavaScript: ``spec.packages.npm``). With ``session``, the session-bound tool
    (:data:`SESSION_LANGUAGES`) has no ``packages``: an execution in a session may not list any (rule
    ``sessions.profile``)."""
    ceilings = ceilings_text(policy)
    network = _network_text(policy)
    return [
        tool_definition(
            float(policy.limits.timeout_s.max),
            ceilings=ceilings,
            session=session,
            language=language,
            network=network,
            packages=None
            if session is not None and language in SESSION_LANGUAGES
            else _packages_rule(policy, language),
        )
        for language in policy.languages.allowed
    ]


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"type": kind, "message": message}}


def _clip(text: str) -> tuple[str, bool]:
    if len(text) <= MAX_TOOL_OUTPUT_CHARS:
        return text, False
    return text[:MAX_TOOL_OUTPUT_CHARS], True


def _files(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The result's files as the model sees them, and how many were left out, within :data:`MAX_TOOL_FILES_CHARS`:
    first as many names as fit, then their contents in name order with what is left (a base64 content is cut at
    a multiple of 4, so what is shown decodes)."""
    budget = MAX_TOOL_FILES_CHARS
    named: list[dict[str, Any]] = []
    for entry in entries:
        if len(entry["path"]) > budget:
            break
        budget -= len(entry["path"])
        named.append(entry)
    shown = []
    for entry in named:
        content: str = entry["content"]
        keep = min(len(content), budget)
        if entry["encoding"] == "base64":
            keep -= keep % 4
        budget -= keep
        shown.append({**entry, "content": content[:keep], "truncated": keep < len(content)})
    return shown, len(entries) - len(shown)


class ToolHandler:
    """Dispatches tool calls to one gateway (keep one per agent session or service).

    ``gateway`` is a local :class:`Gateway` or a remote :class:`gateway.client.Client` (anything with the
    :class:`~gateway.executor.Executor` protocol); the model's answers are the same. With a local gateway every
    request names ``principal`` (default :data:`DEFAULT_TOOL_PRINCIPAL`), so the gateway decides it under that
    principal's policy and the audit trail says who asked. With a remote client the token *is* the principal:
    the requests name none (the service refuses a body naming another), and ``principal`` may not be given.

    The handler serves every tool of :func:`tool_definitions` (:meth:`definitions`: those the policy offers);
    a call's tool name sets its request's ``language``, and the policy decides it like any request (a language
    it does not allow is denied with the rule). A name no tool has is refused (``unknown_tool``), and so is an
    argument the tool does not offer (``invalid_arguments``): ``packages`` only where the definition has it
    (the policy allows installs for the language, and it is not the session-bound tool). The policy decides
    the packages like any request's (a denial names its rule, ``packages.allowed``).

    ``session``: every ``execute_python`` call (:data:`SESSION_LANGUAGES`) runs in one gateway session of that
    mode (``gateway.sessions``, local or remote: the answers are the same), created under the principal's
    policy at the first call (or :meth:`open`) and closed by :meth:`close` (or the ``with`` block's end). Calls
    run one at a time, in order (a model's parallel calls queue). The session may let each call ask for a
    timeout up to the policy's ceiling; a call that names none gets the policy's default (both as they were when
    the session was created). The other languages' calls run as without a session.
    A session that ended is replaced at the next call, whose answer says ``state_lost``: the model must not
    rely on what the old one held."""

    def __init__(
        self,
        gateway: Executor,
        *,
        principal: str | None = None,
        caller: Caller | None = None,
        session: ToolSession | None = None,
    ) -> None:
        self.gateway = gateway
        self.local = isinstance(gateway, Gateway)
        if (principal is not None or caller is not None) and not self.local:
            raise ValueError("a remote client acts as its token's principal; do not pass `principal`")
        if caller is not None:  # an authenticated caller (the service's MCP endpoint): its principal, audited
            if principal is not None and principal != caller.principal:
                raise ValueError(f"principal {principal!r} is not the caller's ({caller.principal!r})")
            principal = caller.principal
        if session is not None:
            if session not in _PERSISTS:
                raise ValueError(f"session {session!r} is not one of {sorted(_PERSISTS)}")
            if not self.local and not hasattr(gateway, "sessions"):
                raise ValueError(
                    f"a session-keeping tool handler needs gateway sessions: {type(gateway).__name__} has none; pass "
                    "a local Gateway or a gateway.client.Client"
                )
        self.caller = caller
        self.principal = (principal or DEFAULT_TOOL_PRINCIPAL) if self.local else None
        self.session: ToolSession | None = session
        self._session_id: str | None = None
        self._killed: str | None = None
        """Why the last session was killed during a call, told again by the next call's answer (the answer of
        the call that killed it may never have reached the model: a cancelled MCP call's does not)."""
        self._lock = threading.Lock()
        """Held by a session call from before it opens a session to its answer: one cell at a time, in order."""
        self._default_timeout: float | None = None
        """The timeout of a call that names none: the policy's default when the session was created."""

    @property
    def policy(self) -> Policy:
        """The policy this handler's requests are decided under (local gateway only; remotely, ask
        ``client.policy()``)."""
        if not isinstance(self.gateway, Gateway) or self.principal is None:
            raise TypeError("the policy object is known only to a local Gateway; use client.policy() remotely")
        return self.gateway.policies.for_principal(self.principal).policy

    @property
    def session_id(self) -> str | None:
        """The live session's id (for the host and its logs; the model never sees it); None before the first
        call, after :meth:`close`, and once the session has ended."""
        return self._session_id

    def definitions(self) -> list[dict[str, Any]]:
        """The tools offered to the principal, one per language its policy allows (:func:`tool_definitions`):
        each with the timeout bounded by the policy's ceiling, which the description states with the other
        ceilings, and what persists between calls (remotely: the service's ``GET /v1/tools``)."""
        if not self.local:
            tools = getattr(self.gateway, "tools", None)
            if not callable(tools):
                raise TypeError(f"{type(self.gateway).__name__} has no tools() to read the tool definitions from")
            return [self._persisting(dict(tool)) for tool in tools()]
        return tool_definitions(self.policy, session=self.session)

    def definition(self) -> dict[str, Any]:
        """The ``execute_python`` tool of :meth:`definitions`; :class:`LookupError` when the policy does not
        allow Python."""
        tools = self.definitions()
        for tool in tools:
            if tool.get("function", {}).get("name") == TOOL_NAME:
                return tool
        offered = ", ".join(str(tool.get("function", {}).get("name")) for tool in tools) or "none"
        raise LookupError(f"the policy does not offer the {TOOL_NAME} tool (offered: {offered})")

    def _persisting(self, tool: dict[str, Any]) -> dict[str, Any]:
        """The service's definition (which says nothing persists), saying what this handler's session keeps, and
        without ``packages`` (an execution in a session may not list any: rule ``sessions.profile``)."""
        if self.session is None or tool.get("function", {}).get("name") not in map(tool_name, SESSION_LANGUAGES):
            return tool
        function = dict(tool["function"])
        function["description"] = str(function["description"]).replace(_STATELESS, _PERSISTS[self.session])
        parameters = dict(function["parameters"])
        parameters["properties"] = {k: v for k, v in parameters["properties"].items() if k != "packages"}
        function["parameters"] = parameters
        return {**tool, "function": function}

    def _parameters(self, name: str) -> list[str]:
        """The parameters ``name``'s tool offers (``code`` and ``timeout`` when the policy offers no such tool, or
        the remote gateway cannot say which it offers)."""
        if not self.local and not callable(getattr(self.gateway, "tools", None)):
            return ["code", "timeout"]
        for tool in self.definitions():
            if tool.get("function", {}).get("name") == name:
                return list(tool["function"]["parameters"]["properties"])
        return ["code", "timeout"]

    # -- the session -----------------------------------------------------------------------------------

    def open(self) -> SessionResult | RemoteSessionResult | None:
        """Create the handler's session now rather than at the first call (``gateway mcp --session`` does, to
        refuse at start what the policy denies). The result says why there is none (a denial with its rule
        ids, an error); None when one is already open."""
        with self._lock:
            return None if self._session_id is not None else self._create()

    def close(self) -> None:
        """Close the handler's session, if one is open (its sandbox is removed, ``session.closed``); the next
        call would open a new one. A session that already ended is left as it is."""
        with self._lock:
            session_id, self._session_id = self._session_id, None
        if session_id is None:
            return
        with contextlib.suppress(SessionGoneError, SessionNotFoundError):
            if isinstance(self.gateway, Gateway):
                self.gateway.sessions.close(session_id, principal=self.principal)
            else:
                self._client.sessions.close(session_id)

    def __enter__(self) -> ToolHandler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def _client(self) -> Client:
        """The remote gateway (``__init__`` checked that it has sessions)."""
        return cast("Client", self.gateway)

    def _timeouts(self) -> tuple[float, float]:
        """The principal's timeout default and ceiling: its policy's, or remotely ``GET /v1/policy``'s."""
        if self.local:
            limit = self.policy.limits.timeout_s
            return float(limit.default), float(limit.max)
        summary = self._client.policy()
        return float(summary["defaults"]["limits"]["timeout_s"]), float(summary["ceilings"]["limits"]["timeout_s"])

    def _create(self) -> SessionResult | RemoteSessionResult:
        """Under the lock."""
        assert self.session is not None  # noqa: S101 - __init__ checked
        self._default_timeout, ceiling = self._timeouts()
        body: dict[str, Any] = {
            "mode": self.session,
            "language": "python",
            "limits": {"timeout_s": ceiling},  # each call may ask up to the policy's ceiling
        }
        created: SessionResult | RemoteSessionResult
        if isinstance(self.gateway, Gateway):
            body["principal"] = self.principal
            created = self.gateway.sessions.create(body, caller=self.caller)
        else:
            created = self._client.sessions.create(body)
        if created.allowed and created.session is not None:
            self._session_id = created.session.session_id
        return created

    def _execute(
        self, session_id: str, request: dict[str, Any], cancel: threading.Event | None
    ) -> ExecutionResult | RemoteResult:
        """One execution in the session (``cancel``: a local Gateway only, :meth:`__call__` checked)."""
        if isinstance(self.gateway, Gateway):
            return self.gateway.sessions.execute(session_id, request, caller=self.caller, cancel=cancel)
        return self._client.sessions.execute(session_id, request)

    def _in_session(self, request: dict[str, Any], cancel: threading.Event | None) -> dict[str, Any]:
        """One call in the handler's session, opened (or replaced) first when there is none."""
        assert self.session is not None  # noqa: S101 - __init__ checked
        with self._lock:
            if cancel is not None and cancel.is_set():  # queued behind another call, then cancelled
                return _error(CancelledRunError.code, "the call was cancelled before it ran; nothing ran")
            lost: str | None = None
            for _attempt in range(2):
                new = self._session_id is None
                if new:
                    if self._killed is not None:
                        lost, self._killed = self._killed, None
                    created = self._create()
                    if self._session_id is None:
                        return _answer(created.to_dict())  # denied (rule ids sessions.*) or failed
                assert self._session_id is not None  # noqa: S101 - just created
                request.setdefault("limits", {"timeout_s": self._default_timeout})
                result = self._execute(self._session_id, request, cancel)
                if new or not isinstance(result.error, SessionGoneError | SessionNotFoundError):
                    break
                lost = (
                    "the previous session has ended (idle, past its lifetime, or killed); this call ran in a new "
                    "session: earlier variables, imports and files are gone"
                )
                self._session_id = None
            answer = _answer(result.to_dict())
            answer["session"] = {"mode": self.session, "new": new}
            if result.session_ended is not None:
                self._session_id = None
                lost = (
                    f"the session was killed during this call ({result.session_ended}); its state is gone and the "
                    "next call starts a new, empty session"
                )
                self._killed = (
                    f"the previous session was killed ({result.session_ended}); this call ran in a new session: "
                    "earlier variables, imports and files are gone"
                )
            if lost is not None:
                answer["state_lost"] = lost
            return answer

    # -- a call ----------------------------------------------------------------------------------------

    def _unknown(self, name: str, language: str, unknown: list[str], parameters: list[str]) -> str:
        """Why a call naming ``unknown`` arguments is refused, and what ``name`` accepts."""
        message = f"unknown argument(s) {unknown}; {name} accepts only {', '.join(map(repr, parameters))}"
        if "packages" not in unknown:
            return message
        if self.session is not None and language in SESSION_LANGUAGES:
            return f"{message}: an execution in the handler's session cannot install packages (sessions.profile)"
        return f"{message}: the policy allows no package installs for {language}"

    def __call__(
        self, name: str, args: Mapping[str, Any] | str, *, cancel: threading.Event | None = None
    ) -> dict[str, Any]:
        """The model's answer to one call; ``cancel`` (set from any thread) abandons the run, as for
        :meth:`Gateway.execute` (in a kernel session it ends the session: a kernel cannot be rolled back)."""
        language = _language_of(name)
        if language is None:
            return _error(
                "unknown_tool",
                f"no tool named {name!r}; the tools are {', '.join(map(tool_name, _LANGUAGES))}, each offered "
                "when the policy allows its language: call one of those listed",
            )
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (ValueError, RecursionError) as exc:
                return _error("invalid_arguments", f"arguments are not valid JSON: {exc}")
        if not isinstance(args, Mapping):
            return _error("invalid_arguments", "arguments must be a JSON object with 'code'")
        unknown = sorted(set(args) - {"code", "timeout"})
        if unknown:  # read the definitions only now: remotely, that is a request to the service
            parameters = self._parameters(name)
            unknown = sorted(set(args) - set(parameters))
            if unknown:
                return _error("invalid_arguments", self._unknown(name, language, unknown, parameters))
        code = args.get("code")
        if not isinstance(code, str):
            return _error("invalid_arguments", "'code' must be a string")
        request: dict[str, Any] = {"code": code, "language": language}
        if self.principal is not None:
            request["principal"] = self.principal
        timeout = args.get("timeout")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
                return _error("invalid_arguments", "'timeout' must be a positive number of seconds")
            request["limits"] = {"timeout_s": timeout}
        packages = args.get("packages")
        if packages is not None:
            if not isinstance(packages, list) or not all(isinstance(p, str) for p in packages):
                return _error("invalid_arguments", "'packages' must be an array of strings (requirements or npm specs)")
            request["packages"] = packages  # bounds and allow list: the request schema and the policy decide
        if cancel is not None and not self.local:
            raise TypeError("cancel needs a local Gateway; a remote run is bounded by the server's deadline")
        if self.session is not None and language in SESSION_LANGUAGES:
            return self._in_session(request, cancel)
        outcome: ResultLike
        if isinstance(self.gateway, Gateway):
            outcome = self.gateway.execute(request, cancel=cancel, caller=self.caller)
        else:
            outcome = self.gateway.execute(request)
        return _answer(outcome.to_dict())


def _answer(result: Mapping[str, Any]) -> dict[str, Any]:
    """The model's view of a result's JSON object (an execution's, or a session's that could not be created):
    whether it ran, why not (each rule and reason, or the error), and what it printed and wrote, within the
    tool's bounds."""
    answer: dict[str, Any] = {
        "ok": result["allowed"] and result["error"] is None and result.get("exit_code") == 0,
        "request_id": result["request_id"],
        "allowed": result["allowed"],
    }
    if result.get("pending"):  # held by approve-mode rules: neither ran nor denied
        approval_id = result["approval_id"]
        answer["waiting_for_approval"] = {
            "approval_id": approval_id,
            "message": f"waiting for approval {approval_id}: an operator must approve this exact request; nothing "
            "ran. Call the tool again with the identical arguments once it is approved.",
        }
    elif not result["allowed"]:
        answer["denied_because"] = [{"rule": v["rule"], "message": v["message"]} for v in result["violations"]]
    if result["error"] is not None:
        error = result["error"]
        answer["error"] = {"type": error["code"], "message": error["message"]}
        if error.get("problems"):  # an invalid request: what was wrong and where
            answer["error"]["problems"] = [
                {"path": p.get("path", "$"), "message": p["message"]} for p in error["problems"]
            ]
    if result.get("exit_code") is not None or result.get("timed_out") or result.get("oom_killed"):
        stdout, out_clipped = _clip(result["stdout"])
        stderr, err_clipped = _clip(result["stderr"])
        answer.update(
            exit_code=result["exit_code"],
            stdout=stdout,
            stderr=stderr,
            truncated=result["stdout_truncated"] or result["stderr_truncated"] or out_clipped or err_clipped,
            timed_out=result["timed_out"],
            oom_killed=result["oom_killed"],
        )
        if result.get("value") is not None:  # a kernel cell's last expression
            answer.update(value=result["value"], value_truncated=result["value_truncated"])
        if result.get("interrupted"):
            answer["interrupted"] = True
        files, omitted = _files(result["files"])
        # Cut by the policy (limits.output_files, limits.output_files_bytes) or here, for the model.
        cut = result["files_truncated"] or omitted > 0 or any(f["truncated"] for f in files)
        answer.update(files=files, files_truncated=cut)
        if omitted:
            answer["files_omitted"] = omitted
    return answer


def handle_tool_call(name: str, args: Mapping[str, Any] | str, *, gateway: Executor | None = None) -> dict[str, Any]:
    """Route one tool call to ``gateway`` (a local :class:`Gateway` or a remote :class:`gateway.client.Client`);
    with none, a default local one (embedded policy, ./audit) serves just this call."""
    if gateway is not None:
        return ToolHandler(gateway)(name, args)
    with Gateway.from_env() as gw:
        return ToolHandler(gw)(name, args)

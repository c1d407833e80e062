"""The ``execute_python`` function-calling tool for LLMs, routed through the gateway.

The model may set only ``code`` and a ``timeout`` (up to the policy's ceiling): image, mounts, network, limits
and env stay the operator's. Every call is decided, audited and contained like any other request, and the
model gets a JSON-serialisable answer it can read, denials included with their reasons, and the files the
program wrote under ``./out`` with their contents (text as text, binary as base64), all within fixed bounds
(:data:`MAX_TOOL_OUTPUT_CHARS` per stream, :data:`MAX_TOOL_FILES_CHARS` for the files): what is cut is marked.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from gateway import Caller, Gateway
from gateway.executor import Executor, ResultLike
from gateway.policy.model import Policy
from gateway.sizes import format_size

__all__ = [
    "DEFAULT_TOOL_PRINCIPAL",
    "EXECUTE_PYTHON_TOOL",
    "MAX_TOOL_FILES_CHARS",
    "MAX_TOOL_OUTPUT_CHARS",
    "TOOL_NAME",
    "ToolHandler",
    "ceilings_text",
    "handle_tool_call",
    "tool_definition",
]

TOOL_NAME = "execute_python"
MAX_TOOL_OUTPUT_CHARS = 16_000
"""What the model is shown of each stream; the full capped output stays in the result and the audit digest."""
MAX_TOOL_FILES_CHARS = 16_000
"""What the model is shown of the returned files, their names and contents together (base64 characters for a
binary file), in name order: a file cut short says ``truncated``, files left out are counted (``files_omitted``).
The whole files stay in the result (``Gateway.execute``)."""
DEFAULT_TOOL_PRINCIPAL = "llm-tool"
"""The principal a :class:`ToolHandler` names in its requests when it is given none."""


def ceilings_text(policy: Policy) -> str:
    """One sentence with the policy's ceilings, for the tool description: the model sees what it may ask for."""
    limits = policy.limits
    timeout = limits.timeout_s
    return (
        f"Policy {policy.name}: timeout up to {timeout.max:g} s (default {timeout.default:g} s); "
        f"memory {format_size(int(limits.memory.max))}, {limits.cpus.max:g} CPUs, {int(limits.pids.max)} "
        f"processes, output capped at {format_size(int(limits.output_bytes.max))} per stream; "
        f"network {policy.network.default}."
    )


def tool_definition(max_timeout_s: float = 60, *, ceilings: str | None = None) -> dict[str, Any]:
    """The OpenAI-style function-calling definition (also what Anthropic's tool ``input_schema`` takes).

    ``ceilings`` (see :func:`ceilings_text`) is appended to the description."""
    description = (
        "Execute Python 3 code in an isolated, network-less sandbox and return stdout, stderr and the "
        "exit code. Files written under ./out are returned with their contents (UTF-8 text as text, other bytes as "
        "base64); long contents are cut and marked truncated. State does not persist between calls."
    )
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": f"{description} {ceilings}" if ceilings else description,
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "Complete Python 3 program to run."},
                    "timeout": {
                        "type": "number",
                        "exclusiveMinimum": 0,
                        "maximum": max_timeout_s,
                        "description": "Wall-clock limit in seconds (optional; the policy default applies).",
                    },
                },
                "required": ["code"],
                "additionalProperties": False,
            },
        },
    }


EXECUTE_PYTHON_TOOL: dict[str, Any] = tool_definition()


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
    the requests name none (the service refuses a body naming another), and ``principal`` may not be given."""

    def __init__(self, gateway: Executor, *, principal: str | None = None, caller: Caller | None = None) -> None:
        self.gateway = gateway
        self.local = isinstance(gateway, Gateway)
        if (principal is not None or caller is not None) and not self.local:
            raise ValueError("a remote client acts as its token's principal; do not pass `principal`")
        if caller is not None:  # an authenticated caller (the service's MCP endpoint): its principal, audited
            if principal is not None and principal != caller.principal:
                raise ValueError(f"principal {principal!r} is not the caller's ({caller.principal!r})")
            principal = caller.principal
        self.caller = caller
        self.principal = (principal or DEFAULT_TOOL_PRINCIPAL) if self.local else None

    @property
    def policy(self) -> Policy:
        """The policy this handler's requests are decided under (local gateway only; remotely, ask
        ``client.policy()``)."""
        if not isinstance(self.gateway, Gateway) or self.principal is None:
            raise TypeError("the policy object is known only to a local Gateway; use client.policy() remotely")
        return self.gateway.policies.for_principal(self.principal).policy

    def definition(self) -> dict[str, Any]:
        """The tool definition with the timeout bounded by the principal's policy ceiling, which the
        description states with the other ceilings (remotely: the service's ``GET /v1/tools``)."""
        if not self.local:
            tools = getattr(self.gateway, "tools", None)
            if not callable(tools):
                raise TypeError(f"{type(self.gateway).__name__} has no tools() to read the tool definition from")
            for tool in tools():
                if tool.get("function", {}).get("name") == TOOL_NAME:
                    return dict(tool)
            raise LookupError(f"the service does not offer the {TOOL_NAME} tool")
        policy = self.policy
        return tool_definition(float(policy.limits.timeout_s.max), ceilings=ceilings_text(policy))

    def __call__(
        self, name: str, args: Mapping[str, Any] | str, *, cancel: threading.Event | None = None
    ) -> dict[str, Any]:
        """The model's answer to one call; ``cancel`` (set from any thread) abandons the run, as for
        :meth:`Gateway.execute`."""
        if name != TOOL_NAME:
            return _error("unknown_tool", f"no tool named {name!r}; available: {TOOL_NAME}")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (ValueError, RecursionError) as exc:
                return _error("invalid_arguments", f"arguments are not valid JSON: {exc}")
        if not isinstance(args, Mapping):
            return _error("invalid_arguments", "arguments must be a JSON object with 'code'")
        unknown = sorted(set(args) - {"code", "timeout"})
        if unknown:
            return _error("invalid_arguments", f"unknown argument(s) {unknown}; only 'code' and 'timeout' are accepted")
        code = args.get("code")
        if not isinstance(code, str):
            return _error("invalid_arguments", "'code' must be a string")
        request: dict[str, Any] = {"code": code, "language": "python"}
        if self.principal is not None:
            request["principal"] = self.principal
        timeout = args.get("timeout")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
                return _error("invalid_arguments", "'timeout' must be a positive number of seconds")
            request["limits"] = {"timeout_s": timeout}
        outcome: ResultLike
        if isinstance(self.gateway, Gateway):
            outcome = self.gateway.execute(request, cancel=cancel, caller=self.caller)
        elif cancel is None:
            outcome = self.gateway.execute(request)
        else:
            raise TypeError("cancel needs a local Gateway; a remote run is bounded by the server's deadline")
        result = outcome.to_dict()
        stdout, out_clipped = _clip(result["stdout"])
        stderr, err_clipped = _clip(result["stderr"])
        answer: dict[str, Any] = {
            "ok": result["allowed"] and result["error"] is None and result["exit_code"] == 0,
            "request_id": result["request_id"],
            "allowed": result["allowed"],
        }
        if not result["allowed"]:
            answer["denied_because"] = [{"rule": v["rule"], "message": v["message"]} for v in result["violations"]]
        if result["error"] is not None:
            error = result["error"]
            answer["error"] = {"type": error["code"], "message": error["message"]}
            if error.get("problems"):  # an invalid request: what was wrong and where
                answer["error"]["problems"] = [
                    {"path": p.get("path", "$"), "message": p["message"]} for p in error["problems"]
                ]
        if result["exit_code"] is not None or result["timed_out"] or result["oom_killed"]:
            answer.update(
                exit_code=result["exit_code"],
                stdout=stdout,
                stderr=stderr,
                truncated=result["stdout_truncated"] or result["stderr_truncated"] or out_clipped or err_clipped,
                timed_out=result["timed_out"],
                oom_killed=result["oom_killed"],
            )
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

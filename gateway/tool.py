"""The ``execute_python`` function-calling tool for LLMs, routed through the gateway.

The model may set only ``code`` and a ``timeout`` (up to the policy's ceiling): image, mounts, network, limits
and env stay the operator's. Every call is decided, audited and contained like any other request, and the
model gets a JSON-serialisable answer it can read, denials included with their reasons.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gateway import Gateway

__all__ = ["EXECUTE_PYTHON_TOOL", "TOOL_NAME", "ToolHandler", "handle_tool_call", "tool_definition"]

TOOL_NAME = "execute_python"
MAX_TOOL_OUTPUT_CHARS = 16_000
"""What the model is shown of each stream; the full capped output stays in the result and the audit digest."""


def tool_definition(max_timeout_s: float = 60) -> dict[str, Any]:
    """The OpenAI-style function-calling definition (also what Anthropic's tool ``input_schema`` takes)."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": (
                "Execute Python 3 code in an isolated, network-less sandbox and return stdout, stderr and the "
                "exit code. Files written under ./out are returned. State does not persist between calls."
            ),
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


class ToolHandler:
    """Dispatches tool calls to one gateway (keep one per agent session or service)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def definition(self) -> dict[str, Any]:
        """The tool definition with the timeout bounded by this gateway's policy ceiling."""
        return tool_definition(float(self.gateway.policy.limits.timeout_s.max))

    def __call__(self, name: str, args: Mapping[str, Any] | str) -> dict[str, Any]:
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
        request: dict[str, Any] = {"code": code, "language": "python", "principal": "llm-tool"}
        timeout = args.get("timeout")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
                return _error("invalid_arguments", "'timeout' must be a positive number of seconds")
            request["limits"] = {"timeout_s": timeout}
        result = self.gateway.execute(request).to_dict()
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
            answer["error"] = {"type": result["error"]["code"], "message": result["error"]["message"]}
        if result["exit_code"] is not None or result["timed_out"] or result["oom_killed"]:
            answer.update(
                exit_code=result["exit_code"],
                stdout=stdout,
                stderr=stderr,
                truncated=result["stdout_truncated"] or result["stderr_truncated"] or out_clipped or err_clipped,
                timed_out=result["timed_out"],
                oom_killed=result["oom_killed"],
                files=[{"path": f["path"], "bytes": f["bytes"]} for f in result["files"]],
            )
        return answer


def handle_tool_call(name: str, args: Mapping[str, Any] | str, *, gateway: Gateway | None = None) -> dict[str, Any]:
    """Route one tool call; with no ``gateway`` a default one (embedded policy, ./audit) serves just this call."""
    if gateway is not None:
        return ToolHandler(gateway)(name, args)
    with Gateway.from_env() as gw:
        return ToolHandler(gw)(name, args)

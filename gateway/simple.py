"""The simplest possible entry point, in the shape agents' tutorials use: ``run_in_sandbox(code)``.

It is a thin shell over :class:`gateway.Gateway` with the embedded defaults, so the code still passes
the policy, is audited, and runs hardened. Only the timeout can be asked for; the policy caps it.
"""

from __future__ import annotations

import os
from typing import Any

from gateway import Gateway
from gateway.executor import Executor, ResultLike

__all__ = ["result_summary", "run_in_sandbox"]


def result_summary(result: ResultLike) -> dict[str, Any]:
    """``{'success': bool, 'output' | 'error': str}`` for a result (local or remote): success means allowed,
    ran, exit 0."""
    data = result.to_dict()
    if result.error is not None and not result.ran:
        details = "; ".join(str(p) for p in result.error.problems)
        return {
            "success": False,
            "error": f"{result.error.code}: {result.error.message}" + (f": {details}" if details else ""),
        }
    if not result.allowed:
        reasons = "; ".join(f"{v['rule']}: {v['message']}" for v in data["violations"])
        return {"success": False, "error": f"denied by policy: {reasons}"}
    if data["timed_out"]:
        return {"success": False, "error": "killed at the deadline\n" + data["stderr"]}
    if data["oom_killed"]:
        return {"success": False, "error": "killed for exceeding the memory limit\n" + data["stderr"]}
    if data["exit_code"] != 0:
        return {"success": False, "error": data["stderr"] or f"exit code {data['exit_code']}"}
    return {"success": True, "output": data["stdout"]}


def run_in_sandbox(
    code: str,
    timeout: float = 30,
    *,
    policy: str | os.PathLike[str] | None = None,
    audit_dir: str | os.PathLike[str] | None = None,
    gateway: Executor | None = None,
) -> dict[str, Any]:
    """Run Python ``code`` through the gateway; a timeout above the policy's ceiling is denied, not clamped.

    ``gateway``: a local :class:`Gateway` or a remote :class:`gateway.client.Client` to run it with (its
    policy applies; ``policy`` and ``audit_dir`` are then not given); with none, a default local gateway
    (``policy``, ``audit_dir``) serves just this call."""
    request = {"code": code, "limits": {"timeout_s": timeout}}
    if gateway is not None:
        if policy is not None or audit_dir is not None:
            raise ValueError("pass either `gateway` or `policy`/`audit_dir`: a given gateway has its own")
        return result_summary(gateway.execute(request))
    with Gateway.from_env(policy, audit_dir) as gw:
        return result_summary(gw.execute(request))

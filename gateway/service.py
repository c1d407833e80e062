"""The one ``Gateway`` object that every interface (CLI, Python API, LLM tool, later HTTP and MCP) shells over.

Request path: intake → policy evaluation (+ assembly and guard, inside ``evaluate``) → audit of the decision
(fail closed) → runner → audit of the outcome → result. The runner and the audit sink come in through the
constructor; nothing here is global.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace

from gateway.audit import AuditSink, JsonlAuditTrail
from gateway.decision import Decision, evaluate
from gateway.errors import (
    EXIT_DENIED,
    EXIT_GATEWAY_FAILURE,
    EXIT_MEMORY,
    EXIT_TIMEOUT,
    GatewayError,
    PolicyError,
    RequestError,
    SandboxError,
    exit_code_for,
)
from gateway.policy import Policy, load_policy
from gateway.request import ExecutionRequest, parse_request
from gateway.resources import policy_path_from_env
from gateway.runner import NOTHING_RAN, DockerRunner, Outcome, Payload, Runner, RunSpec
from gateway.telemetry import SPAN_AUDIT, SPAN_EXECUTE, SPAN_POLICY, SPAN_SANDBOX, get_tracer

__all__ = ["ExecutionResult", "Gateway"]


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _file_entry(name: str, content: bytes) -> dict[str, Any]:
    try:
        return {"path": name, "bytes": len(content), "encoding": "utf-8", "content": content.decode("utf-8")}
    except UnicodeDecodeError:
        return {
            "path": name,
            "bytes": len(content),
            "encoding": "base64",
            "content": base64.b64encode(content).decode("ascii"),
        }


def _digest(data: bytes, size: int | None = None) -> dict[str, Any]:
    """sha256 of ``data``; ``size`` when more bytes were produced than kept (a capped stream)."""
    return {"bytes": len(data) if size is None else size, "sha256": hashlib.sha256(data).hexdigest()}


@dataclass(frozen=True)
class ExecutionResult:
    """What one request came to. Serialised by every interface; none rebuilds it."""

    request_id: str
    """Gateway-assigned id, also in every audit record of this request."""
    decision: Decision | None
    """The policy decision; None when the request was invalid or the gateway failed before deciding."""
    outcome: Outcome | None = None
    """What the sandbox reported; None when nothing ran."""
    error: GatewayError | None = None
    """A gateway-side failure (invalid request, audit unavailable, engine down); the program's own failure is not
    an error."""
    audit_ok: bool = True
    """False when a record of this request could not be made durable (the run, if any, already happened)."""

    @property
    def allowed(self) -> bool:
        return self.decision is not None and self.decision.allowed and self.error is None

    @property
    def exit_status(self) -> int:
        """CLI exit status following ``docker run`` / ``timeout(1)`` (see DESIGN.md)."""
        if self.error is not None and self.outcome is None:
            return exit_code_for(self.error)
        if self.decision is not None and not self.decision.allowed:
            return EXIT_DENIED
        if self.outcome is None:
            return EXIT_GATEWAY_FAILURE
        if self.outcome.timed_out:
            return EXIT_TIMEOUT
        if self.outcome.oom_killed or self.outcome.resource_killed:
            return EXIT_MEMORY  # 128 + SIGKILL: killed for memory or another resource limit
        if not self.audit_ok:
            return EXIT_GATEWAY_FAILURE
        if self.outcome.exit_code is None:
            return EXIT_GATEWAY_FAILURE
        return self.outcome.exit_code

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` result object (keys are a contract: add, never rename)."""
        d = self.decision.to_dict() if self.decision is not None else None
        o = self.outcome or NOTHING_RAN
        out: dict[str, Any] = {
            "request_id": self.request_id,
            "allowed": self.allowed,
            "decision_id": d["decision_id"] if d else None,
            "violations": d["violations"] if d else [],
            "warnings": d["warnings"] if d else [],
            "policy": {"name": d["policy"]["name"], "sha256": d["policy"]["sha256"]} if d else None,
            "exit_code": o.exit_code,
            "stdout": _text(o.stdout),
            "stderr": _text(o.stderr),
            "stdout_truncated": o.stdout_truncated,
            "stderr_truncated": o.stderr_truncated,
            "timed_out": o.timed_out,
            "oom_killed": o.oom_killed,
            "output_limit_killed": o.output_limit_killed,
            "resource_killed": o.resource_killed,
            "duration_ms": o.duration_ms if self.outcome is not None else None,
            "files": [_file_entry(k, v) for k, v in sorted(o.files.items())],
            "files_truncated": o.files_truncated,
            "error": self.error.to_dict() if self.error is not None else None,
            "audit_ok": self.audit_ok,
            "exit_status": self.exit_status,
        }
        return out


class Gateway:
    """Decides and executes requests under one compiled policy, auditing every step.

    Construct it with :meth:`from_env` for the embedded defaults, or pass a policy, runner and audit sink
    (tests pass a fake runner and an in-memory sink). Use it as a context manager so that the trail records
    the gateway's start and stop.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        runner: Runner,
        audit: AuditSink,
        audit_dir: Path | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.policy = policy
        self.runner = runner
        self.audit = audit
        self.audit_dir = audit_dir
        self._tracer = tracer or get_tracer()

    # -- construction ----------------------------------------------------------------------------------

    @classmethod
    def from_env(
        cls,
        policy_path: str | os.PathLike[str] | None = None,
        audit_dir: str | os.PathLike[str] | None = None,
        *,
        runner: Runner | None = None,
        tracer: trace.Tracer | None = None,
    ) -> Gateway:
        """Policy from ``--policy``/``GATEWAY_POLICY``/default; trail from ``audit_dir``/``GATEWAY_AUDIT_DIR``/
        ``./audit``; the Docker engine from ``DOCKER_HOST`` as docker-py reads it.

        A policy that fails to load is recorded as ``policy.rejected`` and raised: nothing can run without one.
        """
        sink = JsonlAuditTrail.from_env(Path(audit_dir) if audit_dir is not None else None)
        path = policy_path_from_env(policy_path)
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            try:
                sink.append(
                    "policy.rejected",
                    {"source": str(path), "problems": [str(p) for p in exc.problems] or [exc.message]},
                )
            finally:
                sink.close()
            raise
        return cls(
            policy,
            runner=runner if runner is not None else DockerRunner(),
            audit=sink,
            audit_dir=Path(sink.directory),
            tracer=tracer,
        )

    def __enter__(self) -> Gateway:
        ref = self._policy_ref()
        self._append("gateway.start", {"policy_source": self.policy.source}, policy=ref)
        self._append("policy.loaded", {**ref, "source": self.policy.source}, policy=ref)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._append("gateway.stop", {"policy_source": self.policy.source}, policy=self._policy_ref())
        except GatewayError:
            pass  # the stop record is best effort; every request already failed closed on its own
        finally:
            try:
                close_runner = getattr(self.runner, "close", None)
                if callable(close_runner):
                    close_runner()
            finally:
                self.audit.close()

    # -- the request path ------------------------------------------------------------------------------

    def decide(self, request: Mapping[str, Any] | str | bytes | ExecutionRequest) -> ExecutionResult:
        """Decide without running anything (``gateway check``). The decision is audited as a dry run."""
        return self._handle(request, run=False)

    def execute(self, request: Mapping[str, Any] | str | bytes | ExecutionRequest) -> ExecutionResult:
        """Decide, audit, run if allowed, audit the outcome. Never raises for gateway failures: the result
        carries the error (and ``exit_status``) so that every interface reports it the same way."""
        return self._handle(request, run=True)

    def reap(self) -> list[str]:
        """Remove containers left behind by a crashed gateway; audited."""
        ids = self.runner.reap()
        self._append("containers.reaped", {"container_ids": ids})
        return ids

    # -- internals -------------------------------------------------------------------------------------

    def _policy_ref(self) -> dict[str, str]:
        return {"name": self.policy.name, "sha256": self.policy.sha256}

    def _append(self, event_type: str, data: Mapping[str, Any], **kw: Any) -> None:
        with self._tracer.start_as_current_span(SPAN_AUDIT, attributes={"gateway.audit.event_type": event_type}):
            self.audit.append(event_type, data, **kw)

    def _handle(self, raw: Mapping[str, Any] | str | bytes | ExecutionRequest, *, run: bool) -> ExecutionResult:
        request_id = uuid.uuid4().hex
        with self._tracer.start_as_current_span(SPAN_EXECUTE) as span:
            span.set_attribute("gateway.request.id", request_id)
            span.set_attribute("gateway.dry_run", not run)
            result = self._handle_in_span(raw, request_id, run=run, span=span)
            span.set_attribute("gateway.decision.allowed", result.allowed)
            if result.error is not None:
                span.set_attribute("error.type", result.error.code)
                span.set_status(trace.Status(trace.StatusCode.ERROR, result.error.message))
            return result

    def _handle_in_span(
        self, raw: Mapping[str, Any] | str | bytes | ExecutionRequest, request_id: str, *, run: bool, span: trace.Span
    ) -> ExecutionResult:
        policy_ref = self._policy_ref()
        # 1. intake
        try:
            request = raw if isinstance(raw, ExecutionRequest) else parse_request(raw)
        except RequestError as exc:
            raw_bytes = _raw_bytes(raw)
            try:
                self._append(
                    "request.invalid",
                    {
                        "problems": [{"path": p.path, "message": p.message} for p in exc.problems]
                        or [{"path": "$", "message": exc.message}],
                        "raw_sha256": hashlib.sha256(raw_bytes).hexdigest(),
                        "raw_bytes": len(raw_bytes),
                    },
                    request_id=request_id,
                    policy=policy_ref,
                )
            except GatewayError:
                return ExecutionResult(request_id, None, error=exc, audit_ok=False)
            return ExecutionResult(request_id, None, error=exc)
        principal = request.principal
        if principal:
            span.set_attribute("enduser.id", principal)
        try:
            self._append(
                "request.received",
                {"request": request.to_dict()},
                request_id=request_id,
                principal=principal,
                policy=policy_ref,
            )
        except GatewayError as exc:
            return ExecutionResult(request_id, None, error=exc, audit_ok=False)

        # 2. policy evaluation, assembly and guard
        with self._tracer.start_as_current_span(SPAN_POLICY) as pspan:
            decision = evaluate(self.policy, request, request_id=request_id, audit_dir=self.audit_dir)
            pspan.set_attribute("gateway.policy.name", self.policy.name)
            pspan.set_attribute("gateway.policy.sha256", self.policy.sha256)
            pspan.set_attribute("gateway.decision.allowed", decision.allowed)
            failed = [v.rule for v in decision.violations]
            if failed:
                pspan.set_attribute("security_rule.name", failed)
                span.add_event("gateway.denied", {"security_rule.name": failed})
        options = decision.options
        options_sha = decision.options_sha256
        # 3. the decision is durable before anything runs (fail closed)
        try:
            self._append(
                "policy.decision",
                {"decision": decision.to_dict(), "options_sha256": options_sha, "dry_run": not run},
                request_id=request_id,
                principal=principal,
                policy=policy_ref,
            )
        except GatewayError as exc:
            return ExecutionResult(request_id, decision, error=exc, audit_ok=False)
        if not run or not decision.allowed or decision.plan is None or options is None:
            return ExecutionResult(request_id, decision)

        # 4. run
        plan = decision.plan
        outcome: Outcome | None = None
        error: GatewayError | None = None
        with self._tracer.start_as_current_span(SPAN_SANDBOX) as sspan:
            sspan.set_attribute("container.image.name", plan.image)
            sspan.set_attribute("container.runtime", plan.runtime)
            try:
                spec = RunSpec(
                    options=options,
                    timeout_s=float(plan.timeout_s),
                    output_bytes=plan.output_bytes,
                    output_files_bytes=plan.output_files_bytes,
                    pull=plan.pull,
                )
                payload = Payload(
                    code=request.code,
                    language=plan.language,
                    files={name: content.encode("utf-8", "surrogatepass") for name, content in request.files.items()},
                )
                outcome = self.runner.execute(spec, payload)
            except GatewayError as exc:
                error = exc
            except Exception as exc:  # noqa: BLE001 - a runner bug must come back as an audited failure, not a crash
                error = SandboxError(f"the runner failed unexpectedly: {type(exc).__name__}: {exc}")
                error.__cause__ = exc
            if error is not None:
                sspan.set_attribute("error.type", error.code)
                sspan.set_status(trace.Status(trace.StatusCode.ERROR, error.message))
            if outcome is not None:
                if outcome.container_id:
                    sspan.set_attribute("container.id", outcome.container_id)
                if outcome.exit_code is not None:
                    sspan.set_attribute("process.exit.code", outcome.exit_code)
                sspan.set_attribute("gateway.sandbox.timed_out", outcome.timed_out)
                sspan.set_attribute("gateway.sandbox.oom_killed", outcome.oom_killed)

        # 5. outcome record
        audit_ok = True
        try:
            if outcome is not None and outcome.pulled:
                self._append(
                    "image.pulled",
                    {"image": plan.image, "image_id": outcome.image_id},
                    request_id=request_id,
                    principal=principal,
                    policy=policy_ref,
                )
            self._append(
                "execution.outcome",
                _outcome_data(plan.image, outcome, error),
                request_id=request_id,
                principal=principal,
                policy=policy_ref,
            )
        except GatewayError as exc:
            audit_ok = False
            if error is None:
                error = exc
        return ExecutionResult(request_id, decision, outcome=outcome, error=error, audit_ok=audit_ok)


def _raw_bytes(raw: object) -> bytes:
    if isinstance(raw, bytes):
        return raw
    if isinstance(raw, str):
        return raw.encode("utf-8", errors="surrogatepass")
    try:
        return json.dumps(raw, sort_keys=True, default=repr).encode()
    except (TypeError, ValueError, RecursionError):
        return repr(raw).encode("utf-8", errors="replace")


def _outcome_data(image: str, outcome: Outcome | None, error: GatewayError | None) -> dict[str, Any]:
    o = outcome or NOTHING_RAN
    return {
        "exit_code": o.exit_code,
        "timed_out": o.timed_out,
        "oom_killed": o.oom_killed,
        "output_limit_killed": o.output_limit_killed,
        "resource_killed": o.resource_killed,
        "duration_ms": int(o.duration_ms),
        "container_id": o.container_id,
        "image": image,
        "image_id": o.image_id,
        "stdout": {**_digest(o.stdout, o.stdout_bytes), "truncated": o.stdout_truncated},
        "stderr": {**_digest(o.stderr, o.stderr_bytes), "truncated": o.stderr_truncated},
        "files": [{"name": k, **_digest(v)} for k, v in sorted(o.files.items())],
        "error": {"code": error.code, "message": error.message} if error else None,
    }

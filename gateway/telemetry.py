"""Tracing through the OpenTelemetry *API* only, and the span annotations of the request path.

The library never installs an SDK or exporter: without one, every span is a no-op and costs almost nothing.
Entry points (the CLI's ``--otel``, a service) wire the SDK from the optional ``otel`` extra. Telemetry
observes the request path; it never decides anything. Span names are generic; details go in attributes
(``container.*``, ``process.exit.code``, ``security_rule.*``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry import trace

from gateway._version import __version__

if TYPE_CHECKING:
    from gateway.decision import Decision
    from gateway.errors import GatewayError
    from gateway.runner.interface import Outcome

__all__ = [
    "SPAN_AUDIT",
    "SPAN_EXECUTE",
    "SPAN_POLICY",
    "SPAN_SANDBOX",
    "annotate_decision",
    "annotate_error",
    "annotate_outcome",
    "get_tracer",
]

SPAN_EXECUTE = "gateway.execute"
SPAN_POLICY = "policy.evaluate"
SPAN_AUDIT = "audit.append"
SPAN_SANDBOX = "sandbox.run"


def get_tracer(provider: trace.TracerProvider | None = None) -> trace.Tracer:
    """The gateway's tracer from ``provider`` or the API's global provider (a no-op unless an SDK is wired)."""
    return trace.get_tracer("gateway", __version__, tracer_provider=provider)


def annotate_decision(span: trace.Span, request_span: trace.Span, decision: Decision) -> None:
    """The policy span's attributes; a denial is also an event on the request's span, naming the rules."""
    span.set_attribute("gateway.policy.name", decision.policy.name)
    span.set_attribute("gateway.policy.sha256", decision.policy.sha256)
    span.set_attribute("gateway.decision.allowed", decision.allowed)
    failed = [v.rule for v in decision.violations]
    if failed:
        span.set_attribute("security_rule.name", failed)
        request_span.add_event("gateway.denied", {"security_rule.name": failed})


def annotate_error(span: trace.Span, error: GatewayError) -> None:
    span.set_attribute("error.type", error.code)
    span.set_status(trace.Status(trace.StatusCode.ERROR, error.message))


def annotate_outcome(span: trace.Span, outcome: Outcome) -> None:
    if outcome.container_id:
        span.set_attribute("container.id", outcome.container_id)
    if outcome.exit_code is not None:
        span.set_attribute("process.exit.code", outcome.exit_code)
    span.set_attribute("gateway.sandbox.timed_out", outcome.timed_out)
    span.set_attribute("gateway.sandbox.oom_killed", outcome.oom_killed)

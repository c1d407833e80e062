"""Tracing through the OpenTelemetry *API* only.

The library never installs an SDK or exporter: without one, every span is a no-op and costs almost nothing.
Entry points (the CLI's ``--otel``, a service) wire the SDK from the optional ``otel`` extra. Telemetry
observes the request path; it never decides anything.
"""

from __future__ import annotations

from opentelemetry import trace

from gateway import __version__

__all__ = ["SPAN_AUDIT", "SPAN_EXECUTE", "SPAN_POLICY", "SPAN_SANDBOX", "current_ids", "get_tracer"]

SPAN_EXECUTE = "gateway.execute"
SPAN_POLICY = "policy.evaluate"
SPAN_AUDIT = "audit.append"
SPAN_SANDBOX = "sandbox.run"


def get_tracer(provider: trace.TracerProvider | None = None) -> trace.Tracer:
    """The gateway's tracer from ``provider`` or the API's global provider (a no-op unless an SDK is wired)."""
    return trace.get_tracer("gateway", __version__, tracer_provider=provider)


def current_ids() -> tuple[str, str] | None:
    """The active span's (trace_id, span_id) as hex, or None when no valid span is active."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"

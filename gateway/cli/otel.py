"""Wire the OpenTelemetry SDK for a CLI invocation (``--otel console`` or ``--otel otlp[=ENDPOINT]``).

Only entry points do this; the library uses the API alone. The SDK comes from the ``otel`` extra.
"""

# ruff: noqa: PLC0415 - the SDK and exporters are optional extras, imported only when --otel asks for them
from __future__ import annotations

import sys
from collections.abc import Callable

from opentelemetry import trace

from gateway.errors import GatewayError

__all__ = ["OTEL_HELP", "setup_otel"]

OTEL_HELP = "export spans: 'console' (stderr) or 'otlp[=http://127.0.0.1:4318/v1/traces]' (needs the otel extra)"


class TelemetrySetupError(GatewayError):
    code = "telemetry.setup_failed"
    hint = "install the extra: pip install 'agent-exec-gateway[otel]'"


def setup_otel(spec: str | None) -> Callable[[], None]:
    """Install an SDK tracer provider for this process; returns a flush-and-shutdown function."""
    if not spec:
        return lambda: None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
    except ImportError as exc:
        raise TelemetrySetupError("--otel needs the OpenTelemetry SDK, which is not installed") from exc
    exporter: SpanExporter
    if spec == "console":
        exporter = ConsoleSpanExporter(out=sys.stderr)
    elif spec == "otlp" or spec.startswith("otlp="):
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise TelemetrySetupError("--otel otlp needs opentelemetry-exporter-otlp-proto-http") from exc
        endpoint = spec.partition("=")[2] or None
        exporter = OTLPSpanExporter(endpoint=endpoint)
    else:
        raise TelemetrySetupError(f"unknown --otel value {spec!r}; use 'console' or 'otlp[=ENDPOINT]'")
    provider = TracerProvider(resource=Resource.create({"service.name": "agent-exec-gateway"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider.shutdown

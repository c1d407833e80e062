"""``GET /metrics``: the service's Prometheus metrics, in a registry of its own.

Each :class:`ServiceMetrics` owns a :class:`prometheus_client.CollectorRegistry` (never the process-wide
default one: several services may run in one process, as the tests do). What it counts:

- ``gateway_http_requests_total{endpoint, status_class, status}``: every answered request, by route
  (``other`` for a path or method no route takes) and outcome (``2xx``/``4xx``/``5xx`` and the status code);
- ``gateway_decision_seconds`` / ``gateway_execution_seconds``: latency of ``POST /v1/decisions`` and of
  ``POST /v1/executions`` (the whole call: decision, sandbox, audit), by outcome status;
- ``gateway_running_executions``: executions this service is running now;
- ``gateway_queue_depth``: requests waiting for an execution slot, read from the service's quota gate
  (``QuotaGate.waiting``) at each scrape;
- ``gateway_body_bytes_in_flight``: bytes of request bodies the service holds now, read from its body budget
  (``BodyBudget.held``) at each scrape;
- ``gateway_denials_total{rule, dry_run}``: policy denials, one count per violated rule;
- ``gateway_audit_low_space_refused_total{event_type}``: records the service's trail refused below its
  free-space watermark (new work answered 507, refusal records dropped);
- ``gateway_egress_connections_total{decision}`` (``allowed``, ``denied``) and
  ``gateway_egress_bytes_total{direction}`` (``out``, ``in``): what the egress proxies of finished runs saw (the
  totals of their results; no host label: which hosts is the audit trail's ``network.connection`` records);
- with a warm pool (``pool: true``): ``gateway_pool_ready`` (containers ready now), ``gateway_pool_target``
  (how many the profiles aim for), ``gateway_pool_claims_total{result}`` (``hit``, ``miss``, ``cold``) and
  ``gateway_pool_claim_seconds`` (how long taking a container from the pool took, guard and claim included).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

if TYPE_CHECKING:
    from gateway.result import ExecutionResult as _Result

__all__ = ["CLAIM_BUCKETS", "CONTENT_TYPE", "LATENCY_BUCKETS", "ServiceMetrics"]

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The Prometheus text exposition format that :func:`prometheus_client.generate_latest` writes."""

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds: from a cached decision (milliseconds) to a run at a generous policy's deadline (minutes)."""

CLAIM_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Seconds: a claim is a lock and a guard (well under a millisecond) unless a burst response waits."""


class _Pool(Protocol):
    """What the metrics read of a warm pool (``gateway.runner.pool.WarmPool``; the service imports no runner)."""

    observer: Any

    def stats(self) -> Any: ...


class ServiceMetrics:
    """The metrics of one service; thread-safe (prometheus_client's metrics are)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gateway_http_requests",
            "HTTP requests answered, by endpoint and outcome.",
            ("endpoint", "status_class", "status"),
            registry=self.registry,
        )
        self.decision_seconds = Histogram(
            "gateway_decision_seconds",
            "Latency of POST /v1/decisions (dry-run decisions), by response status.",
            ("status",),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.execution_seconds = Histogram(
            "gateway_execution_seconds",
            "Latency of POST /v1/executions (decision, sandbox and audit), by response status.",
            ("status",),
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.running_executions = Gauge(
            "gateway_running_executions", "Executions this service is running now.", registry=self.registry
        )
        self.queue_depth = Gauge(
            "gateway_queue_depth",
            "Requests waiting for an execution slot (0 while the service has no queue).",
            registry=self.registry,
        )
        """Read from the service's quota gate at each scrape (``set_function``)."""
        self.body_bytes_in_flight = Gauge(
            "gateway_body_bytes_in_flight",
            "Bytes of request bodies the service holds now (bounded by max_body_bytes_in_flight).",
            registry=self.registry,
        )
        """Read from the service's body budget at each scrape (``set_function``)."""
        self.denials = Counter(
            "gateway_denials",
            "Policy denials, one count per violated rule (dry_run: from POST /v1/decisions).",
            ("rule", "dry_run"),
            registry=self.registry,
        )
        self.egress_connections = Counter(
            "gateway_egress_connections",
            "Connections of runs with network egress, by the proxy's decision (allowed: opened upstream).",
            ("decision",),
            registry=self.registry,
        )
        self.egress_bytes = Counter(
            "gateway_egress_bytes",
            "Bytes runs with network egress sent (out) and received (in) through their proxy.",
            ("direction",),
            registry=self.registry,
        )
        self.low_space_refused = Counter(
            "gateway_audit_low_space_refused",
            "Records the trail refused below its free-space watermark, by event type (new work, refusals).",
            ("event_type",),
            registry=self.registry,
        )

        self.pool_ready = Gauge(
            "gateway_pool_ready", "Warm pooled containers ready now, over every profile.", registry=self.registry
        )
        self.pool_target = Gauge(
            "gateway_pool_target", "Warm pooled containers the profiles aim for.", registry=self.registry
        )
        self.pool_claims = Counter(
            "gateway_pool_claims",
            "Executions by how they found their sandbox: hit (a pooled one), miss (pool empty), cold (no pool).",
            ("result",),
            registry=self.registry,
        )
        self.pool_claim_seconds = Histogram(
            "gateway_pool_claim_seconds",
            "Time to take a sandbox from the warm pool (the claim's guard included; a miss's burst wait too).",
            buckets=CLAIM_BUCKETS,
            registry=self.registry,
        )

    def watch_pool(self, pool: _Pool) -> None:
        """Count ``pool``'s claims and read its size at each scrape."""
        self.pool_ready.set_function(lambda: pool.stats().ready)
        self.pool_target.set_function(lambda: pool.stats().target)
        pool.observer = self.pool_claimed

    def pool_claimed(self, status: str, seconds: float) -> None:
        self.pool_claims.labels(result=status).inc()
        if status != "cold":
            self.pool_claim_seconds.observe(seconds)

    def low_space(self, event_type: str) -> None:
        """The trail refused a record of ``event_type`` below its watermark (``JsonlAuditTrail.on_low_space``)."""
        self.low_space_refused.labels(event_type=event_type).inc()

    def request(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint=endpoint, status_class=f"{status // 100}xx", status=str(status)).inc()

    def denied(self, violations: Iterable[Mapping[str, Any]], *, dry_run: bool) -> None:
        """Count a denial under each distinct rule it names (``unknown`` for a violation without a rule)."""
        rules = {str(v.get("rule") or "unknown") for v in violations} or {"unknown"}
        for rule in sorted(rules):
            self.denials.labels(rule=rule, dry_run=str(dry_run).lower()).inc()

    def ran(self, result: _Result) -> None:
        """Count a finished execution's egress (nothing for a run without it)."""
        egress = result.outcome.egress if result.outcome is not None else None
        if egress is None:
            return
        self.egress_connections.labels(decision="allowed").inc(egress.connections)
        self.egress_connections.labels(decision="denied").inc(egress.denied)
        self.egress_bytes.labels(direction="out").inc(egress.bytes_out)
        self.egress_bytes.labels(direction="in").inc(egress.bytes_in)

    def render(self) -> bytes:
        """The registry in the Prometheus text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

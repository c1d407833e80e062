"""``/metrics`` counts the egress of finished runs: connections by the proxy's decision and bytes each way, with
labels of two values each (no host label: which hosts is the audit trail's ``network.connection`` records)."""

from __future__ import annotations

from datetime import UTC, datetime

from gateway import Caller, Gateway
from gateway.audit import MemoryAuditSink
from gateway.egress import ConnectionRecord, EgressReport
from gateway.policy import load_policy
from gateway.resources import policies_dir
from gateway.runner import FakeRunner
from gateway.runner.fake import make_outcome
from gateway.service.authlog import AuthFailures
from gateway.service.config import ServerConfig
from gateway.service.metrics import ServiceMetrics
from gateway.service.principals import Principal, Principals, TokenRecord
from gateway.service.service import Service

POLICY = policies_dir() / "examples" / "egress-mirror.yaml"
DENIED = ConnectionRecord(
    method="CONNECT", host="evil.example", port=443, address=None, allowed=False, rule="network.egress.host",
    message="not allowed", bytes_out=0, bytes_in=0, duration=0.0, ended="denied",
)  # fmt: skip
REPORT = EgressReport(records=(DENIED,), connections=3, denied=1, bytes_out=700, bytes_in=9000)


def _lines(metrics: ServiceMetrics) -> set[str]:
    return {line for line in metrics.render().decode().splitlines() if line.startswith("gateway_egress_")}


def _gateway(report: EgressReport | None) -> Gateway:
    runner = FakeRunner(outcome=make_outcome(egress=report))
    return Gateway(load_policy(POLICY), runner=runner, audit=MemoryAuditSink())


def test_the_totals_of_each_run_with_egress_add_up() -> None:
    metrics = ServiceMetrics()
    with _gateway(REPORT) as gw:
        for _ in range(2):
            metrics.ran(gw.execute({"code": "1", "network": "egress"}))
    with _gateway(None) as gw:
        metrics.ran(gw.execute({"code": "1"}))  # no egress: counts nothing
    assert _lines(metrics) >= {
        'gateway_egress_connections_total{decision="allowed"} 6.0',
        'gateway_egress_connections_total{decision="denied"} 2.0',
        'gateway_egress_bytes_total{direction="out"} 1400.0',
        'gateway_egress_bytes_total{direction="in"} 18000.0',
    }


def test_a_run_without_egress_adds_no_series() -> None:
    metrics = ServiceMetrics()
    with _gateway(None) as gw:
        metrics.ran(gw.execute({"code": "1"}))
        metrics.ran(gw.decide({"code": "1"}))
    assert not any("{" in line for line in _lines(metrics))  # only the HELP and TYPE lines


def test_the_service_counts_what_its_runs_saw() -> None:
    gw = _gateway(REPORT)
    token = TokenRecord("0123abcd", "0" * 64, datetime(2026, 12, 1, tzinfo=UTC))
    principals = Principals.of([Principal("agent-1", "agent", POLICY, tokens=(token,))])
    service = Service(
        ServerConfig(decision_workers=0), principals=principals, gateway=gw, auth_failures=AuthFailures(gw.audit)
    )
    with gw:
        result = service.execute(b'{"code": "1", "network": "egress"}', Caller("agent-1", "0123abcd"))
    assert result.to_dict()["egress"]["connections"] == 3
    assert 'gateway_egress_connections_total{decision="denied"} 1.0' in _lines(service.metrics)

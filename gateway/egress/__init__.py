"""Egress by policy: a per-run proxy that lets sandboxed code reach named hosts only, and records every connection.

`proxy.EgressProxy` is the proxy, `addresses` the rules it applies, `tls` its ClientHello reader, `host` the
event-loop thread a runner hosts its runs' proxies on (each on a unix socket in a private directory bound into the
sandbox). It needs only the base layer: the policy builds its `Destination` entries, the decision a run's
`EgressPlan`, the runner returns the `EgressReport` with the run's outcome.
"""

from gateway.egress.addresses import Destination, EgressRules, Verdict, parse_ip_literal, refused_class
from gateway.egress.host import MAX_EGRESS_RECORDS, EgressHost, EgressRun
from gateway.egress.proxy import (
    ConnectionRecord,
    EgressLimits,
    EgressPlan,
    EgressProxy,
    EgressReport,
    EgressStats,
    Resolver,
    SystemResolver,
)

__all__ = [
    "MAX_EGRESS_RECORDS",
    "ConnectionRecord",
    "Destination",
    "EgressHost",
    "EgressLimits",
    "EgressPlan",
    "EgressProxy",
    "EgressReport",
    "EgressRules",
    "EgressRun",
    "EgressStats",
    "Resolver",
    "SystemResolver",
    "Verdict",
    "parse_ip_literal",
    "refused_class",
]

"""Egress by policy: a per-run proxy that lets sandboxed code reach named hosts only, and records every connection.

`proxy.EgressProxy` is the proxy, `addresses` the rules it applies, `tls` its ClientHello reader. It needs only the
base layer: the policy will build its `Destination` entries, the runner will start one proxy per run on a unix socket
bound into the sandbox, and the Gateway will hand its records to the audit trail.
"""

from gateway.egress.addresses import Destination, EgressRules, Verdict, parse_ip_literal, refused_class
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
    "ConnectionRecord",
    "Destination",
    "EgressLimits",
    "EgressPlan",
    "EgressProxy",
    "EgressReport",
    "EgressRules",
    "EgressStats",
    "Resolver",
    "SystemResolver",
    "Verdict",
    "parse_ip_literal",
    "refused_class",
]

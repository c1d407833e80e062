"""Network egress in the decision: a request narrows the policy's list, never widens it; the plan names the hosts."""

from __future__ import annotations

import ipaddress

import pytest

from gateway.decision.settings import covering_entry
from gateway.egress import Destination, EgressLimits
from gateway.policy import Policy, load_policy, load_policy_text
from gateway.policy.model import EgressRule
from gateway.request import EgressAsk, parse_request
from gateway.resources import policies_dir
from gateway.testing import decide

MIRROR = ipaddress.ip_network("127.0.0.0/8")


@pytest.fixture(scope="module")
def mirror() -> Policy:
    return load_policy(policies_dir() / "examples" / "egress-mirror.yaml")


def rule(*entries: Destination) -> EgressRule:
    return EgressRule(allow=entries)


def test_an_entry_covers_its_name_the_names_below_a_wildcard_and_literals_in_its_network() -> None:
    wildcard = Destination("*.example.com", (443, 80))
    network = Destination("192.0.2.0/24", (8080,))
    policy = rule(Destination("pypi.org"), wildcard, network)
    assert covering_entry(policy, EgressAsk("PyPI.org.")) == Destination("pypi.org")
    assert covering_entry(policy, EgressAsk("api.example.com", (80,))) == wildcard
    assert covering_entry(policy, EgressAsk("*.api.example.com")) == wildcard
    assert covering_entry(policy, EgressAsk("192.0.2.7", (8080,))) == network
    for widening in (
        EgressAsk("example.com"),  # a wildcard never covers the name itself
        EgressAsk("*.com"),
        EgressAsk("*.pypi.org"),
        EgressAsk("192.0.2.0/23", (8080,)),
        EgressAsk("files.pythonhosted.org"),
    ):
        assert isinstance(covering_entry(policy, widening), str), widening


def test_every_asked_port_must_be_on_one_entry() -> None:
    why = covering_entry(rule(Destination("pypi.org", (443,))), EgressAsk("pypi.org", (443, 80)))
    assert why == "host 'pypi.org' ports [443, 80] are not all allowed; the policy allows [443] for it"


def test_the_plan_lists_exactly_the_narrowed_destinations_with_the_policys_cidrs(mirror: Policy) -> None:
    whole = decide(mirror, parse_request({"code": "x", "network": "egress"}))
    assert whole.allowed
    assert whole.settings is not None
    assert whole.settings.egress is not None
    assert whole.settings.egress.destinations == mirror.network.egress.allow  # type: ignore[union-attr]
    narrowed = decide(
        mirror,
        parse_request({"code": "x", "network": "egress", "egress": [{"host": "mirror.internal", "ports": [18443]}]}),
    )
    assert narrowed.allowed
    assert narrowed.settings is not None
    assert narrowed.settings.plan()["egress"] == {
        "destinations": [{"host": "mirror.internal", "ports": [18443], "cidrs": ["127.0.0.0/8"]}],
        "limits": {"connections": 64, "bytes_out": 64 * 1024**2, "bytes_in": 512 * 1024**2, "rate": 16},
    }
    assert narrowed.settings.egress is not None
    assert narrowed.settings.egress.proxy_limits() == EgressLimits(
        connections=64, bytes_out=64 * 1024**2, bytes_in=512 * 1024**2, rate=16
    )
    plain = decide(mirror, parse_request({"code": "x"})).settings
    assert plain is not None
    assert plain.egress is None
    assert "egress" not in plain.plan()


AUDIT = """
apiVersion: gateway.agent-exec/v1
kind: Policy
extends: {base}
metadata: {{name: egress-audit}}
spec:
  network:
    mode: audit
{egress}"""


def test_audit_mode_never_widens_and_never_allows_egress_without_destinations() -> None:
    base = str(policies_dir() / "default.yaml")
    bare = load_policy_text(AUDIT.format(base=base, egress=""))
    denied = decide(bare, parse_request({"code": "x", "network": "egress"}))
    assert not denied.allowed
    assert [r.rule for r in denied.violations] == ["network.mode"]

    listed = load_policy_text(
        AUDIT.format(base=base, egress="    egress:\n      mode: audit\n      allow: [{host: pypi.org}]\n")
    )
    asked = {"code": "x", "network": "egress", "egress": [{"host": "pypi.org"}, {"host": "evil.example"}]}
    warned = decide(listed, parse_request(asked))
    assert warned.allowed
    assert [r.rule for r in warned.warnings] == ["network.egress"]
    assert warned.settings is not None
    assert warned.settings.egress is not None
    assert [d.host for d in warned.settings.egress.destinations] == ["pypi.org"]


def test_a_requests_egress_limits_are_the_runs_and_audit_mode_clamps_them_to_the_ceiling() -> None:
    base = str(policies_dir() / "default.yaml")
    egress = (
        "    egress:\n      allow: [{host: pypi.org}]\n      limits:\n"
        "        connections: {default: 8, max: 16, mode: audit, hard_max: 64}\n"
    )
    policy = load_policy_text(AUDIT.format(base=base, egress=egress))
    asked = decide(policy, parse_request({"code": "x", "network": "egress", "limits": {"egress_connections": 12}}))
    assert asked.settings is not None
    assert asked.settings.egress is not None
    assert asked.settings.egress.connections == 12
    clamped = decide(policy, parse_request({"code": "x", "network": "egress", "limits": {"egress_connections": 40}}))
    assert clamped.allowed
    assert [r.rule for r in clamped.warnings] == ["limits.egress_connections"]
    assert clamped.settings is not None
    assert clamped.settings.egress is not None
    assert clamped.settings.egress.connections == 16
    above = decide(policy, parse_request({"code": "x", "network": "egress", "limits": {"egress_connections": 65}}))
    assert [r.rule for r in above.violations] == ["limits.egress_connections"]

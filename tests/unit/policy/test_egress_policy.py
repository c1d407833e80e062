"""spec.network.egress: entries compiled into the proxy's own Destination objects, limits with default and ceiling."""

from __future__ import annotations

import ipaddress

import pytest

from gateway.egress import Destination, EgressLimits
from gateway.errors import PolicyError
from gateway.policy import Policy, load_policy, load_policy_text
from gateway.resources import policies_dir

BASE = """
apiVersion: gateway.agent-exec/v1
kind: Policy
metadata: {name: egress-unit}
spec:
  images:
    default: gateway/sandbox-python:3.11-bookworm
    allow: [{repository: gateway/sandbox-python, tags: [3.11-bookworm]}]
  limits:
    memory: {default: 256m, max: 512m}
    cpus: {default: 1, max: 2}
    pids: {default: 128, max: 256}
    timeout_s: {default: 10, max: 60}
    output_bytes: {default: 1m, max: 4m}
    output_files_bytes: {default: 1m, max: 4m}
    tmpfs: {default: 64m, max: 128m}
    code_size: {max: 256k}
    files_size: {max: 1m}
  user: {uid: 10001, gid: 10001}
"""


def load(network: str) -> Policy:
    return load_policy_text(BASE + "  network:\n" + network)


def problems(network: str) -> list[tuple[str, int | None, str]]:
    with pytest.raises(PolicyError) as info:
        load(network)
    return [(p.path, p.line, p.message) for p in info.value.problems]


def test_the_example_compiles_to_the_proxys_destinations() -> None:
    policy = load_policy(policies_dir() / "examples" / "egress-mirror.yaml")
    egress = policy.network.egress
    assert egress is not None
    assert egress.allow == (Destination("mirror.internal", (18089, 18443), (ipaddress.ip_network("127.0.0.0/8"),)),)
    assert (egress.connections.default, egress.connections.max) == (64, 256)
    assert (egress.bytes_in.default, egress.bytes_in.max) == (512 * 1024**2, 1024**3)
    assert policy.network.allowed == ("none",)  # egress is its own section, not a Docker network


def test_without_the_section_there_is_no_egress_and_omitted_limits_are_the_proxys_defaults() -> None:
    assert load_policy_text(BASE).network.egress is None
    policy = load("    egress:\n      allow: [{host: '*.example.com'}]\n")
    egress = policy.network.egress
    assert egress is not None
    assert egress.allow[0].kind == "wildcard"
    assert egress.allow[0].ports == (443,)
    proxy = EgressLimits()
    assert (egress.connections.default, egress.bytes_out.default, egress.bytes_in.default, egress.rate.default) == (
        proxy.connections,
        proxy.bytes_out,
        proxy.bytes_in,
        proxy.rate,
    )


def test_a_literal_in_a_refused_class_loads_only_with_a_cidr_naming_it() -> None:
    found = problems("    egress:\n      allow:\n        - {host: 169.254.169.254, ports: [80]}\n")
    assert found == [
        (
            "$.spec.network.egress.allow[0].host",
            23,
            "'169.254.169.254' holds link-local addresses; list a network holding it under cidrs too, to show it "
            "is meant, or name the host instead",
        )
    ]
    meant = load("    egress:\n      allow:\n        - {host: 10.1.0.0/16, cidrs: [10.0.0.0/8]}\n")
    assert meant.network.egress is not None
    assert meant.network.egress.allow[0].kind == "network"
    listed = load(
        "    egress:\n      allow:\n        - {host: 192.0.2.0/31, cidrs: [192.0.2.0/24]}\n        - {host: 8.8.8.8}\n"
    )
    assert listed.network.egress is not None
    assert [d.key for d in listed.network.egress.allow] == ["192.0.2.0/31", "8.8.8.8/32"]


def test_a_network_whose_last_address_is_refused_needs_a_cidr_too() -> None:
    found = problems("    egress:\n      allow:\n        - {host: 126.0.0.0/7}\n")
    assert [(path, "loopback" in message) for path, _line, message in found] == [
        ("$.spec.network.egress.allow[0].host", True)
    ]


def test_egress_may_not_be_listed_as_a_docker_network() -> None:
    found = problems("    default: egress\n    allowed: [egress]\n")
    assert [path for path, _line, _message in found] == ["$.spec.network.allowed[0]"]
    assert "list the destinations under spec.network.egress.allow" in found[0][2]

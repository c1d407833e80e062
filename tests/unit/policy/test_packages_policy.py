"""spec.packages compiled: the index's egress entry (with its CIDRs), canonical patterns and hashes, defaults."""

from __future__ import annotations

import pytest

from gateway.errors import PolicyError
from gateway.policy import load_policy_text
from gateway.resources import policies_dir

BASE = policies_dir() / "default.yaml"


def _policy(packages: str, egress: str = "        - {host: 10.1.2.0/24, ports: [8080], cidrs: [10.1.2.0/24]}\n") -> str:
    return (
        f"apiVersion: gateway.agent-exec/v1\nkind: Policy\nextends: {BASE}\nmetadata: {{name: p}}\nspec:\n"
        f"  network:\n    egress:\n      allow:\n{egress}  packages:\n{packages}"
    )


def test_an_ip_literal_index_inside_an_allowed_network_keeps_the_entrys_cidrs() -> None:
    policy = load_policy_text(
        _policy(
            "    index: http://10.1.2.3:8080/simple/\n    allow: [Gw_Pkg.*]\n    hashes:\n"
            f"      Gw.Pkg==1.0: ['{'a' * 64}', '{'b' * 64}']\n"
        )
    )
    rule = policy.packages
    assert rule is not None
    assert (rule.index_egress.host, rule.index_egress.ports) == ("10.1.2.3", (8080,))
    assert [str(c) for c in rule.index_egress.cidrs] == ["10.1.2.0/24"]
    assert rule.allow == ("gw-pkg-*",)
    assert (rule.binary_only, rule.max, rule.size) == (True, 16, 256 * 1024 * 1024)
    assert rule.allowed_hashes("gw-pkg", "1.0") == ("a" * 64, "b" * 64)
    assert rule.allowed_hashes("gw-pkg", "2.0") == ()


def test_without_hashes_none_are_required() -> None:
    rule = load_policy_text(_policy("    index: http://10.1.2.3:8080/\n    allow: [x]\n")).packages
    assert rule is not None
    assert rule.allowed_hashes("x", "1") is None


@pytest.mark.parametrize(
    ("index", "found"),
    [
        ("http://10.1.3.1:8080/simple/", "is not on the egress list"),
        ("http://10.1.2.3:8081/simple/", "is not on the egress list"),
        ("https://10.1.2.3/simple/", "10.1.2.3:443 is not on the egress list"),
        ("ftp://10.1.2.3:8080/simple/", "does not match"),
        ("http://user@10.1.2.3:8080/simple/", "does not match"),
    ],
)
def test_an_index_the_egress_list_does_not_cover_is_a_load_error(index: str, found: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy_text(_policy(f"    index: {index}\n    allow: [x]\n"))
    assert [p.path for p in caught.value.problems] == ["$.spec.packages.index"]
    assert found in caught.value.problems[0].message

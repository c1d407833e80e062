"""Egress destination rules: IP literals in every encoding, refused address classes, name normalisation, matching."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.egress.addresses import Destination, EgressRules, HostError, Match, parse_ip_literal, refused_class

LOOPBACK = ipaddress.IPv4Address("127.0.0.1")


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),  # decimal
        ("0177.0.0.1", "127.0.0.1"),  # octal
        ("0x7f.1", "127.0.0.1"),  # hex, short form
        ("0x7F000001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),  # short form
        ("127.0.1", "127.0.0.1"),
        ("0", "0.0.0.0"),  # noqa: S104 -- an address under test, nothing binds it
        ("169.254.169.254", "169.254.169.254"),
        ("0xa9.0xfe.0xa9.0xfe", "169.254.169.254"),
        ("127.0.0.1.", "127.0.0.1"),  # trailing dot
        ("::1", "::1"),
        ("[::1]", "::1"),
        ("::ffff:127.0.0.1", "::ffff:127.0.0.1"),
        ("[fe80::1%eth0]", "fe80::1"),  # zone id
        ("fe80::1%25eth0", "fe80::1"),
    ],
)
def test_ip_literals_are_recognised_in_every_encoding(host: str, address: str) -> None:
    assert parse_ip_literal(host) == ipaddress.ip_address(address)


@pytest.mark.parametrize("host", ["example.com", "1e100.net", "0x7f.example", "localhost", "metadata"])
def test_names_are_not_literals(host: str) -> None:
    assert parse_ip_literal(host) is None


@pytest.mark.parametrize("host", ["1.2.3.4.5", "256.1.1.1", "4294967296", "09.1.1.1", "[::zz]", "1.0x100.1.1"])
def test_malformed_numeric_hosts_are_errors_not_names(host: str) -> None:
    with pytest.raises(HostError):
        parse_ip_literal(host)


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "shared"),
        ("169.254.169.254", "link-local"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),  # noqa: S104 -- as above
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "reserved"),
        ("192.0.2.1", "non-global"),  # TEST-NET-1
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("fd00::1", "unique-local"),
        ("fc00::1", "unique-local"),
        ("fe80::1", "link-local"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("::ffff:169.254.169.254", "link-local"),
        ("::127.0.0.1", "loopback"),  # IPv4-compatible
        ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::", "link-local"),
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64
        ("64:ff9b::7f00:1", "loopback"),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),  # Teredo carrying 127.0.0.1
    ],
)
def test_refused_classes(address: str, refused: str) -> None:
    assert refused_class(ipaddress.ip_address(address)) == refused


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "::ffff:93.184.216.34"])
def test_public_addresses_are_in_no_refused_class(address: str) -> None:
    assert refused_class(ipaddress.ip_address(address)) is None


def test_names_are_normalised_before_matching() -> None:
    rules = EgressRules([Destination("pypi.org"), Destination("bücher.de"), Destination("*.example.com")])
    for host in ("PyPI.org.", "pypi.org"):
        match = rules.match(host, 443)
        assert isinstance(match, Match)
        assert match.host == "pypi.org"
    match = rules.match("BÜCHER.de", 443)
    assert isinstance(match, Match)
    assert match.host == "xn--bcher-kva.de"


def test_a_wildcard_covers_names_below_it_not_itself_nor_lookalikes() -> None:
    rules = EgressRules([Destination("*.example.com")])
    assert isinstance(rules.match("a.example.com", 443), Match)
    assert isinstance(rules.match("a.b.example.com", 443), Match)
    for host in ("example.com", "badexample.com", "example.com.evil.net"):
        verdict = rules.match(host, 443)
        assert not isinstance(verdict, Match)
        assert verdict.rule == "network.egress.host"


def test_ports_default_to_443_and_another_port_is_refused() -> None:
    rules = EgressRules([Destination("pypi.org"), Destination("mirror.internal", ports=(18089, 18443))])
    assert isinstance(rules.match("pypi.org", 443), Match)
    verdict = rules.match("pypi.org", 80)
    assert not isinstance(verdict, Match)
    assert verdict.rule == "network.egress.port"
    assert isinstance(rules.match("mirror.internal", 18089), Match)
    assert not isinstance(rules.match("mirror.internal", 443), Match)


@pytest.mark.parametrize("host", ["127.0.0.1", "2130706433", "0x7f.1", "::ffff:127.0.0.1", "[::1]", "169.254.169.254"])
def test_a_literal_is_refused_even_when_a_named_host_has_a_cidr_holding_it(host: str) -> None:
    rules = EgressRules([Destination("mirror.internal", cidrs=(ipaddress.ip_network("127.0.0.0/8"),))])
    verdict = rules.match(host, 443)
    assert not isinstance(verdict, Match)
    assert verdict.rule == "network.egress.literal"


def test_a_literal_named_as_its_own_host_is_allowed_in_any_encoding() -> None:
    rules = EgressRules([Destination("127.0.0.1", ports=(8080,)), Destination("10.1.0.0/16")])
    for host in ("127.0.0.1", "2130706433", "0177.1"):
        match = rules.match(host, 8080)
        assert isinstance(match, Match)
        assert match.literal == LOOPBACK
        assert rules.check_addresses(match, [LOOPBACK]).allowed
    assert isinstance(rules.match("10.1.200.3", 443), Match)
    assert not isinstance(rules.match("10.2.0.1", 443), Match)
    assert not isinstance(rules.match("::ffff:127.0.0.1", 8080), Match)  # an IPv6 literal is another host


def test_a_named_host_may_resolve_only_to_public_addresses_or_its_cidrs() -> None:
    rules = EgressRules(
        [Destination("pypi.org"), Destination("mirror.internal", cidrs=(ipaddress.ip_network("127.0.0.0/8"),))]
    )
    pypi, mirror = rules.match("pypi.org", 443), rules.match("mirror.internal", 443)
    assert isinstance(pypi, Match)
    assert isinstance(mirror, Match)
    public, metadata = ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address("169.254.169.254")
    assert rules.check_addresses(pypi, [public]).allowed
    assert rules.check_addresses(pypi, [LOOPBACK]).rule == "network.egress.address.loopback"
    assert rules.check_addresses(pypi, [public, metadata]).rule == "network.egress.address.link-local"
    assert rules.check_addresses(pypi, []).rule == "network.egress.host"
    assert rules.check_addresses(mirror, [LOOPBACK]).allowed
    assert rules.check_addresses(mirror, [ipaddress.ip_address("10.0.0.1")]).rule == "network.egress.address.private"


@pytest.mark.parametrize("host", ["", "exa mple.com", "-bad.com", "a..b", "x" * 64 + ".com", "ex_ample.com"])
def test_malformed_names_are_refused(host: str) -> None:
    verdict = EgressRules([Destination("example.com")]).match(host, 443)
    assert not isinstance(verdict, Match)
    assert verdict.rule == "network.egress.host"


def test_entries_reject_bad_ports_and_networks() -> None:
    with pytest.raises(ValueError, match="ports"):
        Destination("pypi.org", ports=(0,))
    with pytest.raises(ValueError, match="CIDR"):
        Destination("10.0.0.1/8")


_PART = st.integers(min_value=0, max_value=2**32 + 1).flatmap(
    lambda n: st.sampled_from([str(n), f"0{n:o}", f"0x{n:x}", f"0X{n:X}"])
)


@given(st.lists(_PART, min_size=1, max_size=4))
def test_numeric_hosts_read_as_the_c_library_reads_them(parts: list[str]) -> None:
    """Every dotted-number spelling means to the proxy what it means to inet_aton (curl, wget, glibc's resolver)."""
    host = ".".join(parts)
    try:
        expected: ipaddress.IPv4Address | None = ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        expected = None
    try:
        found = parse_ip_literal(host)
    except HostError:
        found = None
    assert found == expected

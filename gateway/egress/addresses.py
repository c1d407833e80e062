"""Destination rules for egress: allowed host entries, IP literals in every encoding, always-refused address classes.

Pure data and functions, no I/O: the proxy asks `EgressRules.match` about a requested host and port before it resolves
anything, then `EgressRules.check_addresses` about every address the name resolved to, and connects only to those.

Why each piece exists:
- An IP literal is recognised however it is spelled (``2130706433``, ``0177.0.0.1``, ``0x7f.1``, ``127.1``,
  ``::ffff:127.0.0.1``, ``[fe80::1%eth0]``), the way C resolvers and curl read them, so a literal can never pass for a
  name. It is allowed only when an entry names that address (or a network holding it) as its own host.
- A name is compared after lower-casing, dropping one trailing dot and IDNA encoding, so ``Example.COM.`` and
  ``bücher.de`` match their entries and nothing else.
- Every resolved address is checked against the refused classes (loopback, private, shared, link-local and the cloud
  metadata address, multicast, unspecified, reserved, their IPv6 equivalents, and IPv4 carried inside IPv6), unless the
  matching entry names an explicit CIDR holding it: that is how an operator allows an internal mirror.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

__all__ = [
    "DEFAULT_PORT",
    "Destination",
    "EgressRules",
    "HostError",
    "IPAddress",
    "IPNetwork",
    "Match",
    "Verdict",
    "normalise_name",
    "parse_ip_literal",
    "refused_class",
]

DEFAULT_PORT = 443
"""The port an entry allows when it names none (HTTPS)."""

# Rule ids: stable, the proxy writes them into denials and records; callers branch on them, never on messages.
RULE_ALLOWED = "network.egress.allowed"
RULE_HOST = "network.egress.host"
RULE_PORT = "network.egress.port"
RULE_LITERAL = "network.egress.literal"
RULE_ADDRESS = "network.egress.address"  # + "." + the refused class

# The refused classes, most specific first; anything else that is not globally routable is "non-global".
_REFUSED: tuple[tuple[str, IPNetwork], ...] = tuple(
    (name, ipaddress.ip_network(net))
    for name, net in (
        ("unspecified", "0.0.0.0/8"),
        ("loopback", "127.0.0.0/8"),
        ("private", "10.0.0.0/8"),
        ("private", "172.16.0.0/12"),
        ("private", "192.168.0.0/16"),
        ("shared", "100.64.0.0/10"),
        ("link-local", "169.254.0.0/16"),  # 169.254.169.254: cloud metadata
        ("multicast", "224.0.0.0/4"),
        ("reserved", "240.0.0.0/4"),  # includes 255.255.255.255
        ("unspecified", "::/128"),
        ("loopback", "::1/128"),
        ("unique-local", "fc00::/7"),
        ("link-local", "fe80::/10"),
        ("site-local", "fec0::/10"),
        ("multicast", "ff00::/8"),
    )
)
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")

_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_NUMERIC_PART = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")


class HostError(ValueError):
    """A requested host that is neither a well-formed name nor an IP literal (the proxy refuses it)."""


def parse_ip_literal(host: str) -> IPAddress | None:
    """The address a host spells as an IP literal in any encoding, or None when it is not a literal.

    Accepts brackets and IPv6 zone ids (``[fe80::1%eth0]``), and IPv4 the way ``inet_aton`` reads it: one to four
    dot-separated parts, each decimal, octal (leading 0) or hexadecimal (0x), the last part filling the remaining
    bytes (``127.1``, ``2130706433``, ``0x7f.1``). A host made only of such parts but out of range raises HostError:
    it is neither a literal nor a name, and refusing it is the only safe reading.
    """
    text = host.strip().lower()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if ":" in text:
        text = text.split("%", 1)[0]  # a zone id names an interface, not another address
        try:
            return ipaddress.IPv6Address(text)
        except ValueError as exc:
            raise HostError(f"host {host!r} looks like an IPv6 literal but is not one; name the host exactly") from exc
    text = text.removesuffix(".")
    parts = text.split(".")
    if not text or not all(_NUMERIC_PART.match(part) for part in parts):
        return None
    if len(parts) > 4:
        raise HostError(f"host {host!r} has {len(parts)} numeric parts; an IPv4 literal has at most 4")
    try:
        values = [_ipv4_part(part) for part in parts]
    except ValueError as exc:
        raise HostError(f"host {host!r} is a malformed IPv4 literal ({exc})") from exc
    *head, last = values
    if any(value > 0xFF for value in head) or last >= 1 << (8 * (5 - len(values))):
        raise HostError(f"host {host!r} is an IPv4 literal out of range")
    number = last
    for index, value in enumerate(head):
        number |= value << (8 * (3 - index))
    return ipaddress.IPv4Address(number)


def _ipv4_part(part: str) -> int:
    if part.startswith("0x"):
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        return int(part, 8)  # raises on 8 and 9: "09" is no number in inet_aton either
    return int(part, 10)


def normalise_name(host: str) -> str:
    """A host name lower-cased, without one trailing dot, IDNA (punycode) encoded; HostError when it is no name."""
    text = host.strip().removesuffix(".").lower()
    if not text:
        raise HostError("the host is empty; name the destination host")
    try:
        text = text.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise HostError(f"host {host!r} is not a valid internationalised name ({exc})") from exc
    labels = text.split(".")
    if len(text) > 253 or not all(_LABEL.match(label) for label in labels):
        raise HostError(f"host {host!r} is not a valid host name (letters, digits, hyphens; labels of 1 to 63)")
    return text


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, 6to4, NAT64, Teredo), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if any(address in net for net in _NAT64) or (address in _IPV4_COMPATIBLE and int(address) > 1):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def refused_class(address: IPAddress) -> str | None:
    """The always-refused class an address belongs to (``loopback``, ``link-local``...), or None when it is public.

    IPv4 carried inside IPv6 is judged by the IPv4 address it carries, so ``::ffff:127.0.0.1`` is loopback.
    """
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None:
            return refused_class(inner)
    for name, network in _REFUSED:
        if address.version == network.version and address in network:
            return name
    return None if address.is_global else "non-global"


@dataclass(frozen=True)
class Destination:
    """One allowed destination: a host (name, ``*.`` wildcard, IP literal or CIDR), its ports, its explicit CIDRs."""

    host: str
    """A host name (``pypi.org``), a wildcard (``*.example.com``: any name below it, not the name itself), an IP
    literal or a network (``10.1.0.0/16``) allowed as literals."""
    ports: tuple[int, ...] = (DEFAULT_PORT,)
    """The ports allowed for this host."""
    cidrs: tuple[IPNetwork, ...] = ()
    """Networks this *named* host may resolve into although they are in a refused class (an internal mirror).
    They never allow a literal: a literal is allowed only by an entry naming it as its host."""
    rule: str = ""
    """The id records and denials cite when this entry allows a connection; empty means ``network.egress.allowed``."""

    kind: str = field(init=False)
    """``name``, ``wildcard`` or ``network`` (an IP literal is a network of one address)."""
    key: str = field(init=False)
    """The normalised host (name, or the suffix after ``*.``)."""
    network: IPNetwork | None = field(init=False)
    """The network a literal or CIDR host names."""

    def __post_init__(self) -> None:
        if not self.ports or any(not 0 < port < 65536 for port in self.ports):
            raise ValueError(f"egress entry {self.host!r}: ports must be 1 to 65535 and at least one; got {self.ports}")
        network = _host_network(self.host)
        if network is not None:
            kind, key = "network", str(network)
        elif self.host.startswith("*."):
            kind, key = "wildcard", normalise_name(self.host[2:])
        else:
            kind, key = "name", normalise_name(self.host)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "network", network)

    def names(self, host: str) -> bool:
        """Whether this entry's host covers a normalised host name (never a literal)."""
        if self.kind == "name":
            return host == self.key
        return self.kind == "wildcard" and host.endswith("." + self.key)

    @property
    def rule_id(self) -> str:
        return self.rule or RULE_ALLOWED


def _host_network(host: str) -> IPNetwork | None:
    if "/" in host:
        try:
            return ipaddress.ip_network(host.strip("[]"), strict=True)
        except ValueError as exc:
            raise ValueError(f"egress entry {host!r} is not a valid network (CIDR); write e.g. 10.1.0.0/16") from exc
    literal = parse_ip_literal(host)
    return None if literal is None else ipaddress.ip_network(literal)


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check: allowed or not, the rule id deciding it, and a message for people."""

    allowed: bool
    rule: str
    message: str


@dataclass(frozen=True)
class Match:
    """A requested host and port an entry allows: what the proxy resolves (or, for a literal, connects to)."""

    host: str
    """The normalised host name, or the literal address as text."""
    port: int
    destination: Destination
    literal: IPAddress | None
    """The address when the host was an IP literal (the proxy connects to it without resolving)."""


class EgressRules:
    """The allowed destinations of one run; every question the proxy asks about a host or an address goes here."""

    def __init__(self, destinations: Iterable[Destination]) -> None:
        self.destinations = tuple(destinations)

    def match(self, host: str, port: int) -> Match | Verdict:
        """The entry allowing ``host:port`` as requested, or the denial (unknown host, port, literal, bad host)."""
        try:
            literal = parse_ip_literal(host)
            name = None if literal is not None else normalise_name(host)
        except HostError as exc:
            return Verdict(False, RULE_HOST, str(exc))
        if literal is not None:
            candidates = [d for d in self.destinations if d.network is not None and literal in d.network]
            if not candidates:
                return Verdict(
                    False, RULE_LITERAL, f"{literal} is an IP literal no entry names; ask for the host by its name"
                )
            shown = str(literal)
        else:
            assert name is not None  # noqa: S101 -- parse_ip_literal returned None, so normalise_name ran
            candidates = [d for d in self.destinations if d.names(name)]
            if not candidates:
                return Verdict(False, RULE_HOST, f"host {name!r} is not on the run's egress list")
            shown = name
        for destination in candidates:
            if port in destination.ports:
                return Match(shown, port, destination, literal)
        allowed = sorted({p for d in candidates for p in d.ports})
        return Verdict(False, RULE_PORT, f"{shown} port {port} is not allowed; the egress list allows {allowed}")

    def check_addresses(self, match: Match, addresses: Iterable[IPAddress]) -> Verdict:
        """Whether every address the matched name resolved to may be reached; one refused address refuses all.

        A literal was allowed by its own entry already. A named host's address passes when the entry lists a CIDR
        holding it, or when it is in no refused class.
        """
        listed = list(addresses)
        if not listed:
            return Verdict(False, RULE_HOST, f"host {match.host!r} resolved to no address")
        if match.literal is not None:
            return Verdict(True, match.destination.rule_id, f"{match.host} is named by an egress entry")
        for address in listed:
            if any(address.version == net.version and address in net for net in match.destination.cidrs):
                continue
            refused = refused_class(address)
            if refused is not None:
                return Verdict(
                    False,
                    f"{RULE_ADDRESS}.{refused}",
                    f"host {match.host!r} resolved to {address}, a {refused} address; only an explicit CIDR on the "
                    "host's entry allows that",
                )
        return Verdict(True, match.destination.rule_id, f"{match.host} port {match.port} is on the egress list")

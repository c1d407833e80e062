"""What the egress tests share, unit and integration alike: a name service from a table (nothing outside is ever
looked up) and two connections as a run's proxy records them, one allowed and one denied."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from gateway.egress import ConnectionRecord
from gateway.egress.addresses import IPAddress


class TableResolver:
    """Answers from a table: a name's answers in turn (the last one repeats); every name asked is noted, and a name
    not in the table does not resolve."""

    def __init__(self, answers: dict[str, Sequence[Sequence[str]]]) -> None:
        self.answers = answers
        self.calls: list[str] = []

    async def resolve(self, host: str, port: int) -> Sequence[IPAddress]:
        self.calls.append(host)
        answers = self.answers.get(host)
        if answers is None:
            raise OSError(f"test resolver: no such name {host}")
        return [ipaddress.ip_address(a) for a in answers[min(self.calls.count(host), len(answers)) - 1]]


def loopback_resolver(host: str) -> TableResolver:
    """Only ``host`` resolves, to 127.0.0.1."""
    return TableResolver({host: [["127.0.0.1"]]})


ALLOWED = ConnectionRecord(
    method="CONNECT", host="mirror.internal", port=18443, address="127.0.0.1", allowed=True,
    rule="network.egress.allowed", message="", bytes_out=517, bytes_in=4096, duration=0.0504, ended="closed",
)  # fmt: skip
"""A tunnel to the mirror: 50 ms once rounded."""
DENIED = ConnectionRecord(
    method="GET", host="evil.example", port=80, address=None, allowed=False, rule="network.egress.host",
    message="evil.example is not an allowed destination", bytes_out=0, bytes_in=0, duration=0.0002, ended="denied",
)  # fmt: skip
"""A plain-HTTP request to a host the policy does not name, refused before any lookup."""

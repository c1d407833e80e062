"""An agent must not fill the trail's disk (issue 28, M2 and M3), on a real server on loopback.

Forbidden calls to the operator-only endpoints are summarised per principal and path; below the trail's
free-space watermark the records that start nothing are not written and ``/readyz`` fails; a request whose code
is the worst case for JSON escaping costs a bounded line; a principal's trail bytes are budgeted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from gateway.audit.records import view_record

if TYPE_CHECKING:
    from conftest import Server

pytestmark = pytest.mark.usefixtures("engine")


def test_forbidden_calls_write_at_most_two_records_per_principal_and_path_and_count_every_one(
    serve: Callable[..., Server],
) -> None:
    """Before: every 403 wrote its own ``auth.forbidden`` record (2,283 records/s from one agent); here 2 x 2 x 150
    calls wrote 600 records."""
    server = serve()
    calls = 150
    paths = ("/metrics", "/v1/audit/records")
    for name in ("alice", "bob"):
        with server.client(server.tokens[name]) as client:
            for _ in range(calls):
                for path in paths:
                    assert client.get(path).status_code == 403
    server.stop()  # the last summaries are written at stop
    records = server.records("auth.forbidden")
    for record in records:
        view_record(record)  # the shape of schemas/audit-record.schema.json, summaries too
    per_key = Counter((r["principal"], r["data"]["path"]) for r in records)
    assert set(per_key) == {(name, path) for name in ("alice", "bob") for path in paths}
    assert max(per_key.values()) <= 2, per_key
    counted = Counter[tuple[str, str]]()
    for record in records:
        counted[(record["principal"], record["data"]["path"])] += record["data"]["count"]
    assert set(counted.values()) == {calls}  # nothing lost: the counts add up to the calls made

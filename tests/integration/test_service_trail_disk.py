"""An agent must not fill the trail's disk (issue 28, M2 and M3), on a real server on loopback.

Forbidden calls to the operator-only endpoints are summarised per principal and path; below the trail's
free-space watermark the records that start nothing are not written and ``/readyz`` fails; a request whose code
is the worst case for JSON escaping costs a bounded line; a principal's trail bytes are budgeted.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.audit.records import view_record
from gateway.resources import policies_dir
from gateway.service.principals import PrincipalsStore

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


def _free(path: Path) -> int:
    fs = os.statvfs(path)
    return fs.f_bavail * fs.f_frsize


def _fill(path: Path, leave: int) -> None:
    """Write ballast until about ``leave`` bytes are free."""
    (path / "ballast").write_bytes(b"\0" * max(_free(path) - leave, 0))


@pytest.fixture
def low_space(
    serve: Callable[..., Server],
    tiny_fs: Callable[[str], Path],
    principals_file: tuple[Path, dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Server, Path, str]:
    """A server whose trail lives on a 2 MiB tmpfs with a 1 MiB watermark, filled to 512 KiB free after the start
    (below the watermark, with room for many records); and olga's token (an operator)."""
    olga = PrincipalsStore(principals_file[0]).add("olga", policy=str(policies_dir() / "default.yaml"), role="operator")
    fs = tiny_fs("size=2m")
    monkeypatch.setenv("GATEWAY_AUDIT_MIN_FREE", "1m")
    server = serve(audit_dir=fs / "audit")
    _fill(fs, 512 * 1024)
    return server, fs, olga


def test_below_the_watermark_refusals_leave_the_reserve_alone_and_are_counted(
    low_space: tuple[Server, Path, str],
) -> None:
    """Before: below the watermark only records of new work were refused; an agent's 403s and bad tokens went
    on writing ``auth.forbidden`` and ``auth.failed`` records into the space kept for the outcomes of runs in
    flight (here one of each, then their summaries at stop)."""
    server, _fs, olga = low_space
    written = len(server.records())
    with server.client(server.tokens["alice"]) as alice:
        for _ in range(20):
            assert alice.get("/metrics").status_code == 403
        assert alice.post("/v1/executions", json={"code": "print(1)"}).status_code == 507  # new work: refused
    with server.client("agw_0123abcd_" + "A" * 43) as stranger:
        for _ in range(20):
            assert stranger.get("/v1/policy").status_code == 401
    assert [r["event_type"] for r in server.records()[written:]] == []
    with server.client(olga) as operator:
        scraped = operator.get("/metrics")
    assert scraped.status_code == 200
    refused = {
        sample.labels["event_type"]: sample.value
        for family in text_string_to_metric_families(scraped.text)
        for sample in family.samples
        if sample.name == "gateway_audit_low_space_refused_total"
    }
    assert refused["auth.forbidden"] >= 1, refused
    assert refused["auth.failed"] >= 1, refused
    assert refused["request.received"] == 1
    server.stop()
    new = [r["event_type"] for r in server.records()[written:]]
    assert new == ["gateway.stop"]  # the stop record, from the reserve; no refusal or summary


def test_readyz_fails_while_the_trail_is_below_its_watermark(
    low_space: tuple[Server, Path, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Before: /readyz said 200 while every principal got 507 (the trail could still create a file)."""
    server, fs, _olga = low_space
    with server.client() as anonymous:
        response = anonymous.get("/readyz")
        assert response.status_code == 503, response.text
        body = response.json()
        assert body["code"] == "service.not_ready"
        assert body["checks"]["audit"] == "failed"
        assert "watermark" in caplog.text  # the reason, in the server log
        (fs / "ballast").unlink()
        assert anonymous.get("/readyz").status_code == 200  # ready again once there is room

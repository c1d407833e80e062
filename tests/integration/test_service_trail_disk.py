"""An agent must not fill the trail's disk (issue 28, M2 and M3), on a real server on loopback.

Forbidden calls to the operator-only endpoints are summarised per principal and path; below the trail's
free-space watermark the records that start nothing are not written and ``/readyz`` fails; a request whose code
is the worst case for JSON escaping costs a bounded line; a principal's trail bytes are budgeted.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.audit.pipeline import LIST_MAX_BYTES
from gateway.audit.records import view_record
from gateway.resources import policies_dir
from gateway.service.principals import PrincipalsStore, Quotas

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


CODE_CAP = 4096
"""``GATEWAY_AUDIT_CODE_MAX_BYTES`` of the escaping tests: small, so that the worst case fits a small body."""
RECEIVED_BOUND = 4 * LIST_MAX_BYTES
"""A request without code costs at most this: its lists (files, mounts) are bounded in bytes, each string of it
is cut to a prefix (STRING_MAX_BYTES), and the paths of what was erased are listed only while they are short."""


def _line_sizes(server: Server, event_type: str) -> list[int]:
    """The stored length in bytes of each line of ``event_type`` in the trail."""
    sizes = []
    for segment in sorted(server.audit_dir.glob("trail-*.jsonl")):
        for line in segment.read_bytes().splitlines():
            if json.loads(line)["event_type"] == event_type:
                sizes.append(len(line) + 1)
    return sizes


def test_code_that_is_the_worst_case_for_escaping_is_stored_within_the_cap(
    serve: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: code was capped in UTF-8 bytes but stored JSON-escaped: 4,096 control characters (one byte each)
    made a 25,300-byte ``request.received`` line under a 4,096-byte cap, six times the cap."""
    monkeypatch.setenv("GATEWAY_AUDIT_CODE_MAX_BYTES", str(CODE_CAP))
    server = serve(max_body_bytes=1 << 20)
    worst = "\x01" * CODE_CAP
    astral = "\U0001f600" * (CODE_CAP // 4)  # 4 UTF-8 bytes, 12 escaped (a surrogate pair)
    with server.client(server.tokens["alice"]) as alice:
        for code in (worst, astral, "x" * (4 * CODE_CAP)):
            assert alice.post("/v1/decisions", json={"code": code}).status_code == 200
    server.stop()
    sizes = _line_sizes(server, "request.received")
    assert len(sizes) == 3
    assert max(sizes) <= CODE_CAP + 2048, sizes  # the cap, plus the envelope and the code's digest
    stored = [r["data"]["request"] for r in server.records("request.received")]
    assert [(r["code_truncated"], r["code_bytes"]) for r in stored] == [
        (True, CODE_CAP), (True, CODE_CAP), (True, 4 * CODE_CAP)
    ]  # fmt: skip
    assert stored[0]["code_sha256"] == hashlib.sha256(worst.encode()).hexdigest()
    assert worst.startswith(stored[0]["code"])
    assert astral.startswith(stored[1]["code"])


def test_long_names_in_files_and_mounts_cost_a_bounded_record(
    serve: Callable[..., Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: 32 files named with 4,000 control characters each made a 794 KB ``request.received`` (each
    name listed, escaped, in ``redacted``), and a mount's 4,096-character source was kept whole."""
    monkeypatch.setenv("GATEWAY_AUDIT_CODE_MAX_BYTES", str(CODE_CAP))
    server = serve(max_body_bytes=1 << 20)
    files = {"\x01" * 4000 + str(i): "" for i in range(32)}
    mounts = [{"source": "/" + "\x01" * 4000, "target": "/" + "\x02" * 4000}]
    with server.client(server.tokens["alice"]) as alice:
        for request in ({"code": "x", "files": files}, {"code": "x", "mounts": mounts}):
            assert alice.post("/v1/decisions", json=request).status_code == 200
    server.stop()
    sizes = _line_sizes(server, "request.received")
    assert len(sizes) == 2
    assert max(sizes) <= RECEIVED_BOUND, sizes


def _bytes_of(server: Server, principal: str) -> int:
    total = 0
    for segment in sorted(server.audit_dir.glob("trail-*.jsonl")):
        for line in segment.read_bytes().splitlines(keepends=True):
            if json.loads(line)["principal"] == principal:
                total += len(line)
    return total


def test_past_its_trail_byte_budget_a_principal_is_refused_and_the_refusals_are_summarised(
    serve: Callable[..., Server],
) -> None:
    """Before: nothing bounded the bytes a principal's requests wrote (dry runs of escaped code: 122 MB/min);
    here 300 dry runs of 4,096 control characters went through (about 32 KB each), never a 429."""
    budget = 128 * 1024
    server = serve(max_body_bytes=1 << 20, trail_bytes_per_minute=budget, quotas=Quotas(rpm=10_000))
    request = {"code": "\x01" * 4096}
    refused = None
    with server.client(server.tokens["alice"]) as alice:
        for _ in range(300):  # the meter charges every half second: a bounded, self-stopping flood
            response = alice.post("/v1/decisions", json=request)
            if response.status_code == 429:
                refused = response
                break
            assert response.status_code == 200, response.text
            time.sleep(0.01)
        assert refused is not None, "no 429 after 300 dry runs"
        body = refused.json()
        assert (body["code"], body["quota"]) == ("service.over_quota", "trail_bytes")
        assert int(refused.headers["Retry-After"]) >= 1
        written = _bytes_of(server, "alice")
        assert written >= budget
        for _ in range(50):
            assert alice.post("/v1/decisions", json=request).status_code == 429
    with server.client(server.tokens["bob"]) as bob:
        assert bob.post("/v1/decisions", json=request).status_code == 200  # a budget of its own
    server.stop()
    assert _bytes_of(server, "alice") - written <= 2048  # the refusals wrote one summarised record, not 50
    over = [r for r in server.records("request.refused") if r["data"].get("quota") == "trail_bytes"]
    assert len(over) == 1, over
    for record in server.records("request.refused"):
        view_record(record)

"""Anchors: ``gateway audit anchor`` and ``verify --anchor`` catch what a hash chain alone cannot (records
deleted from the end, truncation, an older copy put back), the report names the anchor, the service writes
anchors on its own."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.audit import JsonlAuditTrail, verify_trail
from gateway.audit.anchor import Anchor, AnchorWriter, check_anchor, hash_at, load_anchor, trail_id
from gateway.cli import main
from gateway.errors import AuditError
from gateway.report import build_report
from tests.unit.report_support import START, FixedClock, write_scenario

KEY = bytes(range(32))


@pytest.fixture
def trail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("GATEWAY_AUDIT_KEY", "GATEWAY_AUDIT_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    return write_scenario(Path("trail"))


def _anchor(trail: Path, out: str = "anchor.json") -> Path:
    assert main(["audit", "anchor", "--trail", str(trail), "-o", out]) == 0
    return Path(out)


def _lines(trail: Path) -> list[bytes]:
    return (trail / "trail-000001.jsonl").read_bytes().splitlines(keepends=True)


def _keep(trail: Path, lines: list[bytes]) -> None:
    (trail / "trail-000001.jsonl").write_bytes(b"".join(lines))


def _verify(trail: Path, anchor: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    rc = main(["audit", "verify", str(trail), "--anchor", str(anchor), "--json"])
    return rc, json.loads(capsys.readouterr().out)


def test_the_anchor_is_the_verified_head(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    anchor = load_anchor(_anchor(trail))
    report = verify_trail(trail)
    first = json.loads(_lines(trail)[0])
    assert (anchor.trail, anchor.seq, anchor.hash) == (first["event_id"], report.last_seq, report.last_hash)
    assert anchor.hmac is None
    assert main(["audit", "anchor", "--trail", str(trail)]) == 0  # stdout
    assert json.loads(capsys.readouterr().out)["seq"] == report.last_seq
    rc, out = _verify(trail, Path("anchor.json"), capsys)
    assert rc == 0
    assert out["anchors"][0]["ok"] is True


def test_tail_deletion_is_caught(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    anchor = _anchor(trail)
    _keep(trail, _lines(trail)[:-3])  # whole records removed from the end: the chain alone still verifies
    assert verify_trail(trail).ok
    rc, out = _verify(trail, anchor, capsys)
    assert rc == 1
    check = out["anchors"][0]  # type: ignore[index]
    assert check["ok"] is False
    assert check["reason"] == "tail_deleted"
    assert main(["audit", "verify", str(trail), "--anchor", str(anchor)]) == 1
    assert capsys.readouterr().out.startswith(f"BROKEN: {trail}: anchor {anchor} not reached: tail_deleted")


def test_truncation_is_caught(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    anchor = _anchor(trail)
    lines = _lines(trail)
    _keep(trail, [*lines[:-1], lines[-1][:40]])  # a torn last record
    rc, out = _verify(trail, anchor, capsys)
    assert rc == 1
    assert out["ok"] is False
    assert out["anchors"][0]["reason"] == "tail_deleted"  # type: ignore[index]


def test_a_rolled_back_copy_is_caught_extended_or_not(
    trail: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(trail, tmp_path / "old")  # a backup taken now
    with JsonlAuditTrail(trail) as sink:  # the real trail goes on...
        for _ in range(3):
            sink.append("gateway.stop", {"policy_source": "x"})
    anchor = _anchor(trail)  # ...and is anchored
    shutil.rmtree(trail)
    shutil.copytree(tmp_path / "old", trail)  # the old copy is put back
    rc, out = _verify(trail, anchor, capsys)
    assert rc == 1
    assert out["ok"] is True
    assert out["anchors"][0]["reason"] == "tail_deleted"
    with JsonlAuditTrail(trail) as sink:  # and extended past the anchored seq: another chain from there on
        for _ in range(5):
            sink.append("gateway.start", {"policy_source": "y"})
    rc, out = _verify(trail, anchor, capsys)
    assert rc == 1
    assert out["ok"] is True
    assert out["anchors"][0]["reason"] == "forked"  # type: ignore[index]


def test_an_anchor_of_another_trail_is_refused(trail: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = write_scenario(tmp_path / "other", prefix=0xC)
    anchor = _anchor(other, "other.json")
    rc, out = _verify(trail, anchor, capsys)
    assert rc == 1
    assert out["anchors"][0]["reason"] == "other_trail"
    with pytest.raises(AuditError, match="none of the trails given"):
        build_report([trail], anchors=[load_anchor(anchor)])


def test_keyed_trail_anchors_carry_an_hmac_that_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "key").write_text(KEY.hex())
    keyed = write_scenario(tmp_path / "keyed", key=KEY)
    key_args = ["--key-file", str(tmp_path / "key")]
    assert main(["audit", "anchor", "--trail", str(keyed), "-o", str(tmp_path / "a.json"), *key_args]) == 0
    anchor = load_anchor(tmp_path / "a.json")
    assert anchor.hmac is not None
    assert anchor.hmac_ok(KEY)
    report = verify_trail(keyed, key=KEY)
    assert check_anchor(keyed, anchor, report, key=KEY).ok
    forged = Anchor(anchor.trail, anchor.seq - 2, hash_at(keyed, anchor.seq - 2) or "", anchor.time, anchor.hmac)
    verdict = check_anchor(keyed, forged, report, key=KEY)
    assert not verdict.ok
    assert verdict.reason == "bad_hmac"
    unsigned = Anchor(anchor.trail, anchor.seq, anchor.hash, anchor.time)
    assert check_anchor(keyed, unsigned, report, key=KEY).reason == "bad_hmac"


def test_the_report_names_the_anchor_and_breaks_on_it(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    anchor = _anchor(trail)
    assert main(["report", "--trail", str(trail), "--anchor", str(anchor), "--format", "json", "-o", "r.json"]) == 0
    v = json.loads(Path("r.json").read_text())["verification"][0]
    assert v["anchor"]["file"] == str(anchor)
    assert v["anchor"]["ok"] is True
    assert v["intact"] is True
    head = v["head"]["seq"]
    _keep(trail, _lines(trail)[:-2])
    capsys.readouterr()
    assert main(["report", "--trail", str(trail), "--anchor", str(anchor), "--format", "md", "-o", "r.md"]) == 1
    expected = f"BROKEN: {trail}: first break at seq {head - 1} (anchor_tail_deleted)"
    assert capsys.readouterr().err.splitlines()[0] == expected
    assert Path("r.md").read_text().splitlines()[0] == expected


def test_a_broken_trail_is_not_anchored(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _lines(trail)
    lines[3] = lines[3].replace(b'"alice"', b'"eve"', 1)
    _keep(trail, lines)
    assert main(["audit", "anchor", "--trail", str(trail)]) == 125
    assert "refusing to anchor" in capsys.readouterr().err


def test_an_empty_trail_is_not_anchored_and_no_anchor_is_written(
    trail: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An anchor of an empty trail vouches for nothing (every trail reaches it): anchoring a directory without
    records, a wrong path most likely, is an error naming it, and nothing is written, not even the other
    trails' anchors of the same command."""
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "anchors"
    out.mkdir()
    assert main(["audit", "anchor", "--trail", str(trail), "--trail", str(empty), "-o", str(out)]) == 125
    err = capsys.readouterr().err
    assert f"the trail in {empty} holds no records" in err
    assert list(out.iterdir()) == []
    assert main(["audit", "anchor", "--trail", str(empty)]) == 125
    assert capsys.readouterr().out == ""


def test_a_malformed_anchor_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "gateway.audit-anchor/v1", "trail": "t", "seq": -1, "hash": "x", "time": "now"}')
    with pytest.raises(AuditError, match=r"bad.json: not an audit anchor: \$.seq"):
        load_anchor(bad)


def test_hash_at_finds_a_record_in_any_segment(tmp_path: Path) -> None:
    directory = write_scenario(tmp_path / "seg", segment_max_bytes=20_000)
    assert len(list(directory.glob("trail-*.jsonl"))) > 2
    for seq in (1, 7, 20, 37):
        line = next(
            raw for p in sorted(directory.glob("trail-*.jsonl")) for raw in p.read_text().splitlines()
            if json.loads(raw)["seq"] == seq
        )  # fmt: skip
        assert hash_at(directory, seq) == json.loads(line)["hash"]
    assert hash_at(directory, 38) is None


def test_an_anchor_whose_seq_has_no_record_is_a_fork(tmp_path: Path) -> None:
    directory = write_scenario(tmp_path / "seg", segment_max_bytes=20_000)
    report = verify_trail(directory)
    ident = trail_id(directory)
    anchor = Anchor(str(ident), 5, str(hash_at(directory, 5)), "2026-01-01T00:00:00.000000Z")
    assert check_anchor(directory, anchor, report, key=None, ident=ident).ok
    first = sorted(directory.glob("trail-*.jsonl"))[0]
    first.unlink()  # the anchored record is gone (after the verify that reached past it)
    check = check_anchor(directory, anchor, report, key=None, ident=ident)
    assert (check.ok, check.reason) == (False, "forked")
    assert check.detail.startswith("the record at seq 5 has hash None,")


def test_the_anchor_writer_anchors_every_n_records_and_at_stop(tmp_path: Path) -> None:
    directory = tmp_path / "svc"
    clock = FixedClock(START, timedelta(seconds=1))
    sink = JsonlAuditTrail(directory, clock=clock)
    writer = AnchorWriter(directory, tmp_path / "anchors", key=None, every_records=5, clock=lambda: START)
    writer.directory.mkdir()
    for _ in range(4):
        sink.append("gateway.start", {"policy_source": "x"})
    assert writer.poll() is not None  # the first head is always anchored
    for _ in range(3):
        sink.append("gateway.start", {"policy_source": "x"})
    assert writer.poll() is None  # 3 records since: not yet
    for _ in range(2):
        sink.append("gateway.start", {"policy_source": "x"})
    written = writer.poll()
    assert written is not None
    assert load_anchor(written).seq == 9
    sink.append("gateway.stop", {"policy_source": "x"})
    writer.stop()
    sink.close()
    latest = load_anchor(tmp_path / "anchors" / "latest.json")
    assert latest.seq == 10
    assert check_anchor(directory, latest, verify_trail(directory), key=None).ok
    assert [load_anchor(p).seq for p in writer.written] == [4, 9, 10]


def test_the_anchor_writer_anchors_after_t_seconds(tmp_path: Path) -> None:
    directory = tmp_path / "svc"
    now = [datetime(2026, 1, 1, tzinfo=UTC)]
    writer = AnchorWriter(directory, tmp_path / "anchors", key=None, every_seconds=60, clock=lambda: now[0])
    writer.directory.mkdir()
    with JsonlAuditTrail(directory) as sink:
        sink.append("gateway.start", {"policy_source": "x"})
        assert writer.poll() is not None
        sink.append("gateway.start", {"policy_source": "x"})
        now[0] += timedelta(seconds=30)
        assert writer.poll() is None
        now[0] += timedelta(seconds=31)
        assert writer.poll() is not None


def test_the_service_writes_anchors_as_configured(tmp_path: Path) -> None:
    """``audit_anchor`` in the server configuration: the Service anchors while it runs and once after its stop
    record, and the last anchor is reached by the trail it wrote."""
    from gateway.resources import default_policy_path
    from gateway.service.config import load_server_config_text
    from gateway.service.principals import PrincipalsStore
    from gateway.service.service import Service
    from gateway.testing import FakeRunner

    PrincipalsStore(tmp_path / "principals.yaml").add("agent", policy=default_policy_path())
    config = load_server_config_text(
        "apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\nprincipals: principals.yaml\naudit_dir: audit\n"
        "audit_anchor: {directory: anchors, every_records: 2}\n",
        base=tmp_path,
    )
    assert config.anchor_dir == tmp_path / "anchors"
    assert config.anchor_every_records == 2
    service = Service.from_config(config, runner=FakeRunner)
    service.start()
    service.gateway.execute({"code": "print(1)", "principal": "agent"})
    service.close()
    latest = load_anchor(tmp_path / "anchors" / "latest.json")
    report = verify_trail(tmp_path / "audit")
    assert latest.seq == report.last_seq  # the stop record is anchored
    assert check_anchor(tmp_path / "audit", latest, report, key=None).ok


def test_the_anchor_configuration_is_strict(tmp_path: Path) -> None:
    from gateway.errors import ServerConfigError
    from gateway.service.config import load_server_config_text

    with pytest.raises(ServerConfigError) as err:
        load_server_config_text(
            "apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\naudit_anchor: {directory: a}\n", base=tmp_path
        )
    assert "audit_anchor" in str(err.value.problems[0])

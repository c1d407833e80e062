"""Tamper tests: every kind of edit to the trail is detected, at the right seq, with the right reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.audit import JsonlAuditTrail, verify_trail
from gateway.audit.canonical import canonical_bytes, seal, split_line
from gateway.cli import main

KEY = bytes(range(32))
N = 30


def build(directory: Path, *, key: bytes | None = None, n: int = N) -> list[Path]:
    """A trail of ``n`` records over several segments (about 5 records per segment)."""
    with JsonlAuditTrail(directory, key=key, segment_max_bytes=2600, host="h") as trail:
        for i in range(n):
            trail.append("policy.loaded", {"name": f"p{i}", "sha256": "a" * 64, "source": "x.yaml"}, request_id=f"r{i}")
    segments = sorted(directory.glob("trail-*.jsonl"))
    assert n < N or len(segments) >= 4
    return segments


def all_lines(segments: list[Path]) -> list[tuple[Path, int, bytes]]:
    """(segment, index in segment, line) for every record, in seq order."""
    return [(p, i, line) for p in segments for i, line in enumerate(p.read_bytes().splitlines(keepends=True))]


def rewrite(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def locate(segments: list[Path], seq: int) -> tuple[Path, int, list[bytes]]:
    for path, index, line in all_lines(segments):
        if json.loads(line)["seq"] == seq:
            return path, index, path.read_bytes().splitlines(keepends=True)
    raise AssertionError(seq)


def check(directory: Path, seq: int, reason: str, *, key: bytes | None = None) -> None:
    report = verify_trail(directory, key=key)
    assert not report.ok
    assert report.first_break is not None
    assert (report.first_break.seq, report.first_break.reason) == (seq, reason), report.first_break
    assert report.records_checked == seq - 1


def test_an_untouched_trail_verifies(tmp_path: Path) -> None:
    build(tmp_path)
    report = verify_trail(tmp_path)
    assert (report.ok, report.records_checked, report.last_seq) == (True, N, N)


@pytest.mark.parametrize("seq", [1, 7, N])
@pytest.mark.parametrize("where", ["body", "hash"])
def test_modifying_one_byte(tmp_path: Path, seq: int, where: str) -> None:
    segments = build(tmp_path)
    path, index, lines = locate(segments, seq)
    line = bytearray(lines[index])
    at = line.index(b'"name":"p') + 9 if where == "body" else len(line) - 10
    line[at] = ord("Z") if line[at] != ord("Z") else ord("Y")
    lines[index] = bytes(line)
    rewrite(path, lines)
    check(tmp_path, seq, "modified")


@pytest.mark.parametrize("seq", [1, 8, 16])
def test_deleting_a_record(tmp_path: Path, seq: int) -> None:
    path, index, lines = locate(build(tmp_path), seq)
    del lines[index]
    rewrite(path, lines)
    check(tmp_path, seq, "deleted")


def test_deleting_a_whole_segment(tmp_path: Path) -> None:
    segments = build(tmp_path)
    first_seq = json.loads(segments[2].read_bytes().splitlines()[0])["seq"]
    segments[2].unlink()
    check(tmp_path, first_seq, "deleted")


def forge(previous: bytes, seq: int, name: str) -> bytes:
    """A well-formed record with a correct hash, chained after ``previous`` (what a keyless forger can do)."""
    record = json.loads(previous)
    del record["hash"]
    record.update(seq=seq, prev_hash=json.loads(previous)["hash"], event_id="forged")
    record["data"]["name"] = name
    return seal(canonical_bytes(record))[0]


def test_inserting_a_forged_record(tmp_path: Path) -> None:
    path, index, lines = locate(build(tmp_path), 12)
    _, prev_index, prev_lines = locate(sorted(tmp_path.glob("trail-*.jsonl")), 11)
    lines.insert(index, forge(prev_lines[prev_index], 12, "evil"))
    rewrite(path, lines)
    check(tmp_path, 12, "inserted")


def test_inserting_a_copy_of_an_older_record(tmp_path: Path) -> None:
    segments = build(tmp_path)
    _, old_index, old_lines = locate(segments, 3)
    path, index, lines = locate(segments, 14)
    lines.insert(index, old_lines[old_index])
    rewrite(path, lines)
    check(tmp_path, 14, "inserted")


@pytest.mark.parametrize("seq", [5, N])
def test_duplicating_a_record(tmp_path: Path, seq: int) -> None:
    path, index, lines = locate(build(tmp_path), seq)
    lines.insert(index, lines[index])
    rewrite(path, lines)
    check(tmp_path, seq + 1, "duplicated")


@pytest.mark.parametrize("seq", [1, 9, N - 1])
def test_reordering_two_records(tmp_path: Path, seq: int) -> None:
    segments = build(tmp_path)
    path, index, lines = locate(segments, seq)
    if index + 1 >= len(lines):  # keep both in one segment
        pytest.fail("pick a seq that is not the last of its segment")
    lines[index], lines[index + 1] = lines[index + 1], lines[index]
    rewrite(path, lines)
    check(tmp_path, seq, "reordered")


def test_swapping_two_segments(tmp_path: Path) -> None:
    segments = build(tmp_path)
    first_seq = json.loads(segments[1].read_bytes().splitlines()[0])["seq"]
    a, b = segments[1].read_bytes(), segments[2].read_bytes()
    segments[1].write_bytes(b)
    segments[2].write_bytes(a)
    check(tmp_path, first_seq, "reordered")


@pytest.mark.parametrize("cut", [1, 40, 200])
def test_truncating_the_last_record(tmp_path: Path, cut: int) -> None:
    segments = build(tmp_path)
    data = segments[-1].read_bytes()
    segments[-1].write_bytes(data[:-cut])
    check(tmp_path, N, "truncated")


def test_truncating_a_middle_segment_mid_record(tmp_path: Path) -> None:
    segments = build(tmp_path)
    lines = segments[1].read_bytes().splitlines(keepends=True)
    last_seq = json.loads(lines[-1])["seq"]
    segments[1].write_bytes(b"".join(lines[:-1]) + lines[-1][:100])
    check(tmp_path, last_seq, "truncated")


def test_a_modified_and_rehashed_record_is_found_by_its_successor(tmp_path: Path) -> None:
    segments = build(tmp_path)
    path, index, lines = locate(segments, 10)
    if index + 1 >= len(lines):
        pytest.fail("seq 10 must not end its segment")
    body, _, _ = split_line(lines[index])
    lines[index] = seal(body.replace(b'"name":"p9"', b'"name":"p0"'))[0]
    rewrite(path, lines)
    check(tmp_path, 10, "modified")


def rehash_everything_from(segments: list[Path], seq: int, change: bytes, to: bytes) -> None:
    """Edit one record and recompute the plain sha256 chain from there on: a keyless forger's best."""
    prev_hash = None
    for path in segments:
        out = []
        for original in path.read_bytes().splitlines(keepends=True):
            line = original
            record = json.loads(line)
            if record["seq"] >= seq:
                record.pop("hash")
                record.pop("hmac", None)
                if record["seq"] == seq:
                    record = json.loads(canonical_bytes(record).replace(change, to))
                if prev_hash is not None:
                    record["prev_hash"] = prev_hash
                line = seal(canonical_bytes(record))[0]
            prev_hash = json.loads(line)["hash"]
            out.append(line)
        rewrite(path, out)


def test_without_a_key_a_fully_rehashed_chain_is_undetectable(tmp_path: Path) -> None:
    segments = build(tmp_path)
    rehash_everything_from(segments, 6, b'"name":"p5"', b'"name":"XX"')
    assert verify_trail(tmp_path).ok  # the reason to configure a key


def test_with_a_key_a_rehashed_chain_fails_its_hmac(tmp_path: Path) -> None:
    segments = build(tmp_path, key=KEY)
    assert verify_trail(tmp_path, key=KEY).ok
    rehash_everything_from(segments, 6, b'"name":"p5"', b'"name":"XX"')
    check(tmp_path, 6, "bad_hmac", key=KEY)
    # Without the key too: records 1-5 carry an hmac and 6 does not, and a trail is keyed throughout or not at
    # all (item 9: before, this re-forged tail verified as intact without the key).
    check(tmp_path, 6, "bad_hmac")


def _strip_hmacs(segments: list[Path], only_seq: int | None = None) -> None:
    """Remove the hmac of every record (or only of ``only_seq``, rehashing the chain after it)."""
    prev_hash = None
    for path in segments:
        out = []
        for original in path.read_bytes().splitlines(keepends=True):
            line = original
            record = json.loads(line)
            if only_seq is None or record["seq"] >= only_seq:
                record.pop("hash")
                if only_seq is None or record["seq"] == only_seq:
                    record.pop("hmac", None)
                mac = record.pop("hmac", None)
                if prev_hash is not None:
                    record["prev_hash"] = prev_hash
                line = seal(canonical_bytes(record))[0]
                if mac is not None:  # keep the (now stale) hmac on later records, as a forger without the key would
                    line = line[:-3] + b'","hmac":"' + mac.encode() + b'"}\n'
            prev_hash = json.loads(line)["hash"]
            out.append(line)
        rewrite(path, out)


def test_a_keyed_trail_with_one_forged_record_without_hmac_fails_with_and_without_the_key(tmp_path: Path) -> None:
    segments = build(tmp_path, key=KEY)
    _strip_hmacs(segments, only_seq=7)
    check(tmp_path, 7, "bad_hmac", key=KEY)
    check(tmp_path, 7, "bad_hmac")
    brk = verify_trail(tmp_path).first_break
    assert brk is not None
    assert "no hmac but the records before it do" in brk.detail


@pytest.mark.parametrize("workers", [1, 4])
def test_a_keyed_trail_with_every_hmac_stripped_fails_with_the_key_and_says_unchecked_without(
    tmp_path: Path, workers: int
) -> None:
    segments = build(tmp_path, key=KEY)
    _strip_hmacs(segments)
    check(tmp_path, 1, "bad_hmac", key=KEY)
    report = verify_trail(tmp_path, workers=workers)
    assert report.ok  # without the key nothing can tell: the report must say so
    assert (report.hmac_checked, report.hmac_present, report.hmac_status) == (False, False, "absent")
    assert report.to_dict()["hmac_status"] == "absent"


@pytest.mark.parametrize("workers", [1, 4])
def test_the_mix_is_found_across_segments_in_parallel_too(tmp_path: Path, workers: int) -> None:
    segments = build(tmp_path, key=KEY)
    first_of_third = json.loads(segments[2].read_bytes().splitlines()[0])["seq"]
    _strip_hmacs(segments, only_seq=first_of_third)
    check_report = verify_trail(tmp_path, workers=workers)
    assert check_report.first_break is not None
    assert (check_report.first_break.seq, check_report.first_break.reason) == (first_of_third, "bad_hmac")


def test_a_wrong_key_fails_at_the_first_record(tmp_path: Path) -> None:
    build(tmp_path, key=KEY, n=6)
    check(tmp_path, 1, "bad_hmac", key=b"x" * 32)


def test_a_keyed_verify_of_an_unkeyed_trail_fails(tmp_path: Path) -> None:
    build(tmp_path, n=6)
    check(tmp_path, 1, "bad_hmac", key=KEY)


def test_cli_verify_reports_the_break_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, index, lines = locate(build(tmp_path), 4)
    del lines[index]
    rewrite(path, lines)
    assert main(["audit", "verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "records checked: 3" in out
    assert "BROKEN at seq 4" in out
    assert "deleted" in out
    assert main(["audit", "verify", str(tmp_path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["first_break"]["seq"] == 4
    assert report["first_break"]["reason"] == "deleted"

"""Parallel verify: segments checked in worker processes and stitched in order report exactly what the
in-process pass reports (the first break in trail order, same seq, segment, line and reason)."""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from gateway import _workers
from gateway._workers import WorkerPool
from gateway.audit import JsonlAuditTrail, verify_trail
from gateway.audit.canonical import seal, split_line
from tests.unit.workers_support import CountingPool

KEY = bytes(range(32))


@pytest.fixture(autouse=True)
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let ``workers=2`` start two processes even on a one-CPU runner, so the parallel path is exercised."""
    cpus = os.cpu_count() or 1
    monkeypatch.setattr(os, "cpu_count", lambda: max(2, cpus))


@pytest.fixture
def taken() -> list[int]:
    """Answers the parallel pass took from its workers, one entry per parallel run (a segment's answer that does
    not verify or stitch is the last one taken: the in-process pass takes over at that segment)."""
    return []


@pytest.fixture
def pool(taken: list[int]) -> Callable[..., WorkerPool]:
    """The worker pool that counts into ``taken``."""
    return partial(CountingPool, taken)


def build(directory: Path, n: int = 40, key: bytes | None = None) -> list[Path]:
    with JsonlAuditTrail(directory, key=key, segment_max_bytes=2600, host="h") as trail:
        for i in range(n):
            trail.append("policy.loaded", {"name": f"p{i}", "sha256": "a" * 64, "source": "x.yaml"}, request_id=f"r{i}")
    segments = sorted(directory.glob("trail-*.jsonl"))
    assert len(segments) >= 6
    return segments


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def flip(path: Path, line: int) -> None:
    """Change one byte inside the body of ``line`` (0-based) of ``path``."""
    lines = lines_of(path)
    raw = bytearray(lines[line])
    at = raw.index(b'"name":"p') + 8
    raw[at] = ord("q")
    lines[line] = bytes(raw)
    path.write_bytes(b"".join(lines))


def test_an_intact_trail_is_verified_by_the_workers(
    tmp_path: Path, pool: Callable[..., WorkerPool], taken: list[int]
) -> None:
    segments = build(tmp_path)
    parallel = verify_trail(tmp_path, workers=2, worker_pool=pool)
    assert taken == [len(segments)]  # every segment verified in a worker and stitched
    assert parallel.ok
    assert (parallel.records_checked, parallel.last_seq, parallel.segments) == (40, 40, len(segments))
    assert parallel == verify_trail(tmp_path, workers=1)


def test_the_first_break_wins_when_a_later_segment_is_broken_too(
    tmp_path: Path, pool: Callable[..., WorkerPool], taken: list[int]
) -> None:
    segments = build(tmp_path)
    middle, later = segments[2], segments[-2]
    first_seq_of_middle = sum(len(lines_of(p)) for p in segments[:2]) + 1
    flip(later, 0)  # broken first on disk order of the edits, but later in the trail
    flip(middle, 1)
    report = verify_trail(tmp_path, workers=2, worker_pool=pool)
    assert taken == [3]  # up to the middle segment's answer: there the in-process pass took over
    assert report.first_break is not None
    assert (report.first_break.seq, report.first_break.reason) == (first_seq_of_middle + 1, "modified")
    assert (report.first_break.segment, report.first_break.line) == (middle.name, 2)
    assert report.records_checked == first_seq_of_middle
    assert report == verify_trail(tmp_path, workers=1)


def test_a_break_at_a_segment_boundary_is_found_by_stitching(
    tmp_path: Path, pool: Callable[..., WorkerPool], taken: list[int]
) -> None:
    segments = build(tmp_path)
    lines = lines_of(segments[3])
    segments[3].write_bytes(b"".join(lines[1:]))  # the segment still verifies on its own
    report = verify_trail(tmp_path, workers=2, worker_pool=pool)
    assert taken == [4]  # segment 3's answer verified but did not stitch: the in-process pass took over there
    assert report.first_break is not None
    assert (report.first_break.reason, report.first_break.segment, report.first_break.line) == (
        "deleted",
        segments[3].name,
        1,
    )
    assert report == verify_trail(tmp_path, workers=1)


def test_swapped_segments_are_reordered_in_parallel_too(tmp_path: Path) -> None:
    segments = build(tmp_path)
    a, b = segments[1].read_bytes(), segments[2].read_bytes()
    segments[1].write_bytes(b)
    segments[2].write_bytes(a)
    report = verify_trail(tmp_path, workers=2)
    assert report.first_break is not None
    assert report.first_break.reason == "reordered"
    assert report == verify_trail(tmp_path, workers=1)


def test_keyed_trail_in_parallel(tmp_path: Path, pool: Callable[..., WorkerPool], taken: list[int]) -> None:
    segments = build(tmp_path, key=KEY)
    good = verify_trail(tmp_path, key=KEY, workers=2, worker_pool=pool)
    assert (good.ok, good.hmac_checked, good.hmac_present) == (True, True, True)
    wrong = verify_trail(tmp_path, key=bytes(32), workers=2, worker_pool=pool)
    assert wrong.first_break is not None
    assert (wrong.first_break.seq, wrong.first_break.reason) == (1, "bad_hmac")
    assert taken == [len(segments), 1]  # under the wrong key, the in-process pass took over at the first segment
    # re-forged without the key in a middle segment: the hash holds, the hmac does not
    lines = lines_of(segments[4])
    body, _hash, _mac = split_line(lines[2])
    lines[2] = seal(body.replace(b'"name":"p', b'"name":"q', 1), None)[0]
    segments[4].write_bytes(b"".join(lines))
    forged = verify_trail(tmp_path, key=KEY, workers=2)
    assert forged.first_break is not None
    assert (forged.first_break.reason, forged.first_break.segment, forged.first_break.line) == (
        "bad_hmac",
        segments[4].name,
        3,
    )
    assert forged == verify_trail(tmp_path, key=KEY, workers=1)


def test_a_torn_newest_segment_in_parallel(tmp_path: Path) -> None:
    segments = build(tmp_path)
    newest = segments[-1]
    newest.write_bytes(newest.read_bytes()[:-10])
    report = verify_trail(tmp_path, workers=2)
    assert report.first_break is not None
    assert (report.first_break.reason, report.first_break.segment) == ("truncated", newest.name)
    assert report == verify_trail(tmp_path, workers=1)


def tamper(segments: list[Path], rng: random.Random) -> None:
    """One random edit: flip a byte, delete, duplicate, swap or insert lines, truncate or empty a segment."""
    path = rng.choice(segments)
    lines = lines_of(path)
    op = rng.choice(["byte", "delete", "duplicate", "swap", "insert", "truncate", "empty", "move"])
    i = rng.randrange(len(lines))
    if op == "byte":
        raw = bytearray(lines[i])
        raw[rng.randrange(len(raw))] = rng.randrange(32, 127)
        lines[i] = bytes(raw)
    elif op == "delete":
        del lines[i]
    elif op == "duplicate":
        lines.insert(i, lines[i])
    elif op == "swap" and i + 1 < len(lines):
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
    elif op == "insert":
        lines.insert(i, rng.choice(lines_of(rng.choice(segments))))
    elif op == "truncate":
        lines[i] = lines[i][: rng.randrange(len(lines[i]))]
        del lines[i + 1 :]
    elif op == "empty":
        lines = []
    elif op == "move":  # a record moved to another segment
        other = rng.choice(segments)
        if other != path:
            moved = lines.pop(i)
            other_lines = lines_of(other)
            other_lines.insert(rng.randrange(len(other_lines) + 1), moved)
            other.write_bytes(b"".join(other_lines))
    path.write_bytes(b"".join(lines))


@pytest.mark.parametrize("seed", range(12))
def test_parallel_equals_sequential_on_random_tampering(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - reproducible edits, not cryptography
    key = KEY if seed % 3 == 0 else None
    segments = build(tmp_path, n=rng.randrange(30, 60), key=key)
    for _ in range(rng.choice([1, 1, 2, 3])):
        tamper(segments, rng)
    sequential = verify_trail(tmp_path, key=key, workers=1)
    assert not sequential.ok  # these seeds all break the chain (checked when they were chosen)
    assert verify_trail(tmp_path, key=key, workers=2) == sequential


def test_a_pool_that_cannot_start_falls_back_to_in_process(tmp_path: Path) -> None:
    segments = build(tmp_path)
    flip(segments[3], 0)
    expected = verify_trail(tmp_path, workers=1)

    def cannot_start(_code: str, *, stderr: int | None = None) -> subprocess.Popen[bytes]:
        raise OSError("no semaphores here")

    assert verify_trail(tmp_path, workers=2, worker_pool=partial(WorkerPool, start=cannot_start)) == expected
    assert expected.first_break is not None
    assert expected.first_break.segment == segments[3].name


def test_small_trails_are_verified_in_process_by_default(
    tmp_path: Path, pool: Callable[..., WorkerPool], taken: list[int]
) -> None:
    build(tmp_path)
    assert verify_trail(tmp_path, worker_pool=pool).ok
    assert taken == []  # below PARALLEL_MIN_BYTES: no worker started


def test_large_trails_go_parallel_by_default(
    tmp_path: Path, pool: Callable[..., WorkerPool], taken: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    segments = build(tmp_path)
    monkeypatch.setattr(_workers, "PARALLEL_MIN_BYTES", 1)
    assert verify_trail(tmp_path, worker_pool=pool).ok
    assert taken == [len(segments)]


def test_a_segment_copied_from_another_trail_does_not_stitch(
    tmp_path: Path, pool: Callable[..., WorkerPool], taken: list[int]
) -> None:
    segments = build(tmp_path / "trail")
    foreign = build(tmp_path / "other")  # the same seq numbers in each segment, another chain
    assert [len(lines_of(p)) for p in foreign] == [len(lines_of(p)) for p in segments]
    segments[3].write_bytes(foreign[3].read_bytes())  # verifies on its own; its first prev_hash is not ours
    report = verify_trail(tmp_path / "trail", workers=2, worker_pool=pool)
    assert report == verify_trail(tmp_path / "trail", workers=1)
    assert report.first_break is not None
    first_copied = sum(len(lines_of(p)) for p in segments[:3]) + 1
    assert report.first_break.seq <= first_copied  # nothing from the copied segment on is trusted
    assert taken == [4]  # segment 3 verified in its worker but did not stitch: the in-process pass took over


def test_hmacs_stripped_from_later_segments_are_found_in_parallel(
    tmp_path: Path, pool: Callable[..., WorkerPool], taken: list[int]
) -> None:
    segments = build(tmp_path, key=KEY)
    for path in segments[3:]:  # re-sealed without the key: every hash still holds, each segment verifies alone
        path.write_bytes(b"".join(seal(split_line(line)[0], None)[0] for line in lines_of(path)))
    report = verify_trail(tmp_path, workers=2, worker_pool=pool)  # no key: only the keyed/unkeyed switch tells
    assert report == verify_trail(tmp_path, workers=1)
    assert report.first_break is not None
    assert (report.first_break.reason, report.first_break.segment, report.first_break.line) == (
        "bad_hmac",
        segments[3].name,
        1,
    )
    assert taken == [4]

"""The JSONL trail writer: chaining on disk, rotation, reopening, keys, and failing closed."""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from gateway.audit import JsonlAuditTrail, repair_trail, verify_trail
from gateway.audit.canonical import GENESIS_HASH
from gateway.audit.segments import AuditIO, key_from_env, resolve_directory
from gateway.errors import AuditIntegrityError, AuditUnavailableError

START = {"policy_source": "policies/default.yaml"}
KEY = bytes(range(32))


def lines(directory: Path) -> list[dict[str, object]]:
    out = []
    for path in sorted(directory.glob("trail-*.jsonl")):
        out.extend(json.loads(line) for line in path.read_bytes().splitlines())
    return out


def test_append_writes_one_chained_line_per_record(tmp_path: Path) -> None:
    with JsonlAuditTrail(tmp_path / "audit") as trail:
        receipts = [trail.append("gateway.start", START, request_id=f"r{i}") for i in range(5)]
    records = lines(tmp_path / "audit")
    assert [r["seq"] for r in records] == [1, 2, 3, 4, 5]
    assert [r.seq for r in receipts] == [1, 2, 3, 4, 5]
    assert [r["hash"] for r in records] == [r.hash for r in receipts]
    assert records[0]["prev_hash"] == GENESIS_HASH
    assert all(b["prev_hash"] == a["hash"] for a, b in itertools.pairwise(records))
    assert receipts[0].segment == "trail-000001.jsonl"
    assert verify_trail(tmp_path / "audit").ok


def test_segments_rotate_by_size_and_chain_across(tmp_path: Path) -> None:
    with JsonlAuditTrail(tmp_path, segment_max_bytes=2000) as trail:
        receipts = [trail.append("gateway.start", START) for _ in range(20)]
    segments = sorted(tmp_path.glob("trail-*.jsonl"))
    assert len(segments) > 3
    assert all(p.stat().st_size <= 2000 for p in segments)
    assert len({r.segment for r in receipts}) == len(segments)
    first_of_second = json.loads(segments[1].read_bytes().splitlines()[0])
    last_of_first = json.loads(segments[0].read_bytes().splitlines()[-1])
    assert first_of_second["prev_hash"] == last_of_first["hash"]
    report = verify_trail(tmp_path)
    assert (report.ok, report.records_checked, report.segments) == (True, 20, len(segments))


def test_a_new_writer_continues_the_chain(tmp_path: Path) -> None:
    with JsonlAuditTrail(tmp_path) as trail:
        trail.append("gateway.start", START)
        last = trail.append("gateway.stop", START)
    with JsonlAuditTrail(tmp_path) as trail:
        receipt = trail.append("gateway.start", START)
    assert receipt.seq == 3
    assert lines(tmp_path)[2]["prev_hash"] == last.hash


def test_two_writers_in_one_process_interleave_with_contiguous_seq(tmp_path: Path) -> None:
    a, b = JsonlAuditTrail(tmp_path), JsonlAuditTrail(tmp_path, segment_max_bytes=1500)
    seqs = []
    for i in range(12):
        seqs.append((a if i % 3 else b).append("gateway.start", START).seq)
    a.close()
    b.close()
    assert seqs == list(range(1, 13))
    assert verify_trail(tmp_path).records_checked == 12


class TurnsIO(AuditIO):
    """Counts fsyncs and opens."""

    def __init__(self) -> None:
        self.fsyncs = 0
        self.opens = 0

    def open(self, path: str, flags: int, mode: int = 0o640) -> int:
        self.opens += 1
        return super().open(path, flags, mode)

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        super().fsync(fd)


def test_writers_taking_turns_in_one_segment_read_only_its_last_record(tmp_path: Path) -> None:
    """The service and its decision workers append to one trail by turns: a writer finding records of another
    one at the end of its own open segment checks the last and goes on, without closing its segment (no fsync
    and no re-open per turn)."""
    io_a, io_b = TurnsIO(), TurnsIO()
    a, b = JsonlAuditTrail(tmp_path, io=io_a), JsonlAuditTrail(tmp_path, io=io_b)
    a.append("gateway.start", START)
    b.append("gateway.start", START)
    before = (io_a.fsyncs, io_a.opens, io_b.fsyncs, io_b.opens)
    for i in range(20):
        (a if i % 2 else b).append("request.received", {"request": {"code": "x"}}, durable=False)
    assert (io_a.fsyncs, io_a.opens, io_b.fsyncs, io_b.opens) == before
    a.close()
    b.close()
    report = verify_trail(tmp_path)
    assert (report.ok, report.records_checked) == (True, 22)


class LockCountingIO(AuditIO):
    """Counts the file lock taken."""

    def __init__(self) -> None:
        self.locks = 0

    def flock(self, fd: int, operation: int) -> None:
        self.locks += operation == fcntl.LOCK_EX
        super().flock(fd, operation)


def test_records_appended_together_take_one_turn_on_the_trail(tmp_path: Path) -> None:
    """A decision worker's batch: the records built one by one, then chained and written in order in one hold
    of the file lock, between another writer's records, across a segment boundary."""
    io = LockCountingIO()
    a, b = JsonlAuditTrail(tmp_path, io=io, segment_max_bytes=3000), JsonlAuditTrail(tmp_path)
    b.append("gateway.start", START)
    for turn in range(3):
        built = [a.build("request.received", {"request": {"code": f"{turn}-{i}"}}, request_id=f"{turn}-{i}")
                 for i in range(4)]  # fmt: skip
        assert not any(r["request_id"] == f"{turn}-0" for r in lines(tmp_path))  # built, not yet written
        receipts = a.append_built(built, durable=False)
        assert [r.seq for r in receipts] == list(range(2 + 5 * turn, 6 + 5 * turn))
        b.append("gateway.stop", START)
    assert io.locks == 3
    a.close()
    b.close()
    records = lines(tmp_path)
    assert [r["request_id"] for r in records[1:5]] == [f"0-{i}" for i in range(4)]
    assert len(list(tmp_path.glob("trail-*.jsonl"))) > 1
    report = verify_trail(tmp_path)
    assert (report.ok, report.records_checked) == (True, 16)
    assert a.append_built([]) == []


def test_below_the_watermark_records_appended_together_with_new_work_are_all_refused(tmp_path: Path) -> None:
    from gateway.errors import AuditSpaceError

    fs = os.statvfs(tmp_path)
    with JsonlAuditTrail(tmp_path / "t", min_free=fs.f_blocks * fs.f_frsize) as trail:
        built = [trail.build("execution.outcome", {"exit_code": 0}), trail.build("policy.decision", {})]
        with pytest.raises(AuditSpaceError):
            trail.append_built(built)
        assert lines(tmp_path / "t") == []
        (receipt,) = trail.append_built(built[:1])
        assert receipt.seq == 1


def test_a_record_that_cannot_be_built_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    refused = pytest.raises(AuditUnavailableError, match=r"cannot build the 'gateway\.start' audit record")
    with JsonlAuditTrail(tmp_path) as trail, refused:
        trail.build("gateway.start", {"ratio": 0.5})  # floats are not part of the record format
    assert lines(tmp_path) == []


def test_another_writers_altered_record_is_refused_at_the_next_turn(tmp_path: Path) -> None:
    a, b = JsonlAuditTrail(tmp_path), JsonlAuditTrail(tmp_path)
    a.append("gateway.start", START)
    b.append("gateway.start", START)
    (segment,) = sorted(tmp_path.glob("trail-*.jsonl"))
    first, last = segment.read_text().splitlines(keepends=True)
    segment.write_text(first + last.replace("gateway.start", "gateway.stArt"))  # b's record, same size
    with pytest.raises(AuditUnavailableError, match="does not match its hash"):
        a.append("gateway.stop", START)
    a.close()
    b.close()


def test_from_env_precedence_and_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GATEWAY_AUDIT_DIR", raising=False)
    monkeypatch.delenv("GATEWAY_AUDIT_KEY", raising=False)
    monkeypatch.delenv("GATEWAY_AUDIT_KEY_FILE", raising=False)
    assert resolve_directory(None) == Path("audit")
    monkeypatch.setenv("GATEWAY_AUDIT_DIR", str(tmp_path / "env"))
    assert JsonlAuditTrail.from_env().directory == tmp_path / "env"
    assert JsonlAuditTrail.from_env(tmp_path / "arg").directory == tmp_path / "arg"
    assert JsonlAuditTrail.from_env().key is None

    monkeypatch.setenv("GATEWAY_AUDIT_KEY", KEY.hex())
    assert JsonlAuditTrail.from_env().key == KEY
    key_file = tmp_path / "key"
    key_file.write_text(KEY[::-1].hex() + "\n")
    monkeypatch.setenv("GATEWAY_AUDIT_KEY_FILE", str(key_file))
    assert key_from_env() == KEY[::-1]  # the file wins over the variable
    key_file.write_bytes(b"short")
    with pytest.raises(AuditUnavailableError, match="too short"):
        key_from_env()


class FailingIO(AuditIO):
    """Injects one failure into one system call."""

    def __init__(self, call: str, err: int, *, partial: int = 0) -> None:
        self.call, self.err, self.partial = call, err, partial
        self.armed = True

    def _maybe_fail(self, call: str) -> None:
        if self.armed and call == self.call:
            raise OSError(self.err, os.strerror(self.err))

    def open(self, path: str, flags: int, mode: int = 0o640) -> int:
        self._maybe_fail("open")
        return super().open(path, flags, mode)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.armed and self.call == "write" and self.partial:
            written = os.write(fd, data[: self.partial])  # a torn line reaches the disk first
            self.partial = 0
            return written
        self._maybe_fail("write")
        return super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self._maybe_fail("fsync")
        super().fsync(fd)

    def flock(self, fd: int, operation: int) -> None:
        self._maybe_fail("flock")
        super().flock(fd, operation)

    def mkdir(self, path: str) -> None:
        self._maybe_fail("mkdir")
        super().mkdir(path)


@pytest.mark.parametrize(
    ("call", "err"),
    [
        ("write", errno.ENOSPC),  # disk full
        ("open", errno.EROFS),  # read-only file system
        ("mkdir", errno.EACCES),  # directory cannot be created
        ("flock", errno.ENOLCK),  # lock failure
        ("fsync", errno.EIO),
    ],
)
@pytest.mark.parametrize("group_commit", [False, True])
def test_any_failure_to_make_a_record_durable_fails_closed(
    tmp_path: Path, call: str, err: int, group_commit: bool
) -> None:
    if call == "open":
        with JsonlAuditTrail(tmp_path) as healthy:  # the trail exists; now the segment cannot be opened
            healthy.append("gateway.start", START)
    io = FailingIO(call, err)
    trail = JsonlAuditTrail(tmp_path, io=io, group_commit=group_commit)
    with pytest.raises(AuditUnavailableError) as info:
        trail.append("gateway.start", START)
    assert isinstance(info.value.__cause__, OSError)
    assert info.value.__cause__.errno == err
    report = verify_trail(tmp_path)
    assert report.ok  # whatever happened, the trail on disk is still a valid chain


def test_a_partial_write_is_rolled_back_and_the_chain_continues(tmp_path: Path) -> None:
    io = FailingIO("write", errno.ENOSPC, partial=50)
    trail = JsonlAuditTrail(tmp_path, io=io)
    io.armed = False
    trail.append("gateway.start", START)
    size = (tmp_path / "trail-000001.jsonl").stat().st_size
    io.armed = True
    with pytest.raises(AuditUnavailableError, match="No space left"):
        trail.append("gateway.stop", START)
    assert (tmp_path / "trail-000001.jsonl").stat().st_size == size
    io.armed = False
    assert trail.append("gateway.stop", START).seq == 2
    trail.close()
    assert verify_trail(tmp_path).records_checked == 2


def test_after_an_fsync_failure_the_writer_refuses_everything(tmp_path: Path) -> None:
    io = FailingIO("fsync", errno.EIO)
    trail = JsonlAuditTrail(tmp_path, io=io)
    with pytest.raises(AuditUnavailableError):
        trail.append("gateway.start", START)
    io.armed = False
    with pytest.raises(AuditUnavailableError, match="refuses appends"):
        trail.append("gateway.start", START)


def test_a_read_only_directory_fails_closed(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        tmp_path.chmod(0o555)
        try:
            with pytest.raises(AuditUnavailableError):
                JsonlAuditTrail(tmp_path / "audit").append("gateway.start", START)
        finally:
            tmp_path.chmod(0o755)
        return
    # root ignores permissions: use a really read-only filesystem instead
    target = tmp_path / "ro"
    target.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(target)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        with pytest.raises(AuditUnavailableError):
            JsonlAuditTrail(target).append("gateway.start", START)
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


def test_a_closed_trail_refuses_appends(tmp_path: Path) -> None:
    trail = JsonlAuditTrail(tmp_path)
    trail.close()
    with pytest.raises(AuditUnavailableError, match="closed"):
        trail.append("gateway.start", START)


def test_a_torn_tail_is_refused_until_repaired(tmp_path: Path) -> None:
    with JsonlAuditTrail(tmp_path) as trail:
        trail.append("gateway.start", START)
        good = trail.append("gateway.stop", START)
    segment = tmp_path / "trail-000001.jsonl"
    with segment.open("ab") as fh:
        fh.write(b'{"data":{"policy_source":"x"},"event_id":')  # a crash mid-line
    trail = JsonlAuditTrail(tmp_path)
    with pytest.raises(AuditUnavailableError, match="torn") as info:
        trail.append("gateway.start", START)
    assert isinstance(info.value.__cause__, AuditIntegrityError)

    report = repair_trail(tmp_path)
    assert report.repaired
    assert (report.last_good_seq, report.last_good_hash, report.recovery_seq) == (2, good.hash, 3)
    assert report.dropped_bytes == len(b'{"data":{"policy_source":"x"},"event_id":')
    assert (tmp_path / "quarantine" / report.quarantined[0]).read_bytes().startswith(b'{"data"')
    assert trail.append("gateway.start", START).seq == 4
    trail.close()
    records = lines(tmp_path)
    assert records[2]["event_type"] == "recovery"
    assert records[2]["data"]["last_good_seq"] == 2
    assert verify_trail(tmp_path).records_checked == 4
    assert not repair_trail(tmp_path).repaired


def test_keyed_trail_records_carry_hmacs_and_refuse_keyless_writers(tmp_path: Path) -> None:
    with JsonlAuditTrail(tmp_path, key=KEY) as trail:
        trail.append("gateway.start", START)
    assert len(str(lines(tmp_path)[0]["hmac"])) == 64
    for key, message in ((None, "keyed"), (b"w" * 32, "HMAC")):
        with pytest.raises(AuditUnavailableError, match=message):
            JsonlAuditTrail(tmp_path, key=key).append("gateway.start", START)
    other = tmp_path / "plain"
    JsonlAuditTrail(other).append("gateway.start", START)
    with pytest.raises(AuditUnavailableError, match="without one"):
        JsonlAuditTrail(other, key=KEY).append("gateway.start", START)


class CountingIO(AuditIO):
    """Records how far each file is durable, and where each thread's last write ended."""

    def __init__(self) -> None:
        self.fsyncs = 0
        self.writes = 0
        self.durable: dict[int, int] = {}
        self.write_end: dict[int, tuple[int, int]] = {}
        self.lock = threading.Lock()
        self.several_written = threading.Event()

    def write(self, fd: int, data: bytes | memoryview) -> int:
        written = super().write(fd, data)
        st = os.fstat(fd)
        self.write_end[threading.get_ident()] = (st.st_ino, os.lseek(fd, 0, os.SEEK_CUR))
        self.writes += 1
        if self.writes >= 4:
            self.several_written.set()
        return written

    def fsync(self, fd: int) -> None:
        if self.fsyncs == 0:  # hold the first sync until other threads have written: they must share the next
            self.several_written.wait(timeout=30)
        st = os.fstat(fd)
        super().fsync(fd)
        with self.lock:
            self.fsyncs += 1
            self.durable[st.st_ino] = max(self.durable.get(st.st_ino, 0), st.st_size)


def test_group_commit_batches_fsyncs_and_never_acknowledges_early(tmp_path: Path) -> None:
    io = CountingIO()
    trail = JsonlAuditTrail(tmp_path, group_commit=True, io=io, segment_max_bytes=20000)
    early: list[str] = []
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        for _ in range(25):
            trail.append("gateway.start", START)
            ino, end = io.write_end[threading.get_ident()]
            if io.durable.get(ino, 0) < end:
                early.append(f"acknowledged at {end} but durable only to {io.durable.get(ino, 0)}")

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    trail.close()
    assert early == []
    report = verify_trail(tmp_path)
    assert (report.ok, report.records_checked) == (True, 200)
    assert io.fsyncs <= 200 - 3  # the records written during the first sync shared the next one


def test_the_free_space_watermark_is_a_size_a_percentage_or_the_smaller_of_both() -> None:
    from gateway.audit.jsonl import DEFAULT_MIN_FREE, min_free_bytes

    gib = 1 << 30
    assert min_free_bytes("64m", gib) == 64 << 20
    assert min_free_bytes("1%", 100 * gib) == gib
    assert min_free_bytes(DEFAULT_MIN_FREE, 1000 * gib) == 64 << 20  # a big disk: 64 MiB
    assert min_free_bytes(DEFAULT_MIN_FREE, 1 << 30) == (1 << 30) // 100  # a small one: 1 %
    assert min_free_bytes("0", gib) == 0
    assert min_free_bytes(4096, gib) == 4096
    for bad in ("lots", "101%", "-1%", "1.5m"):
        with pytest.raises(ValueError, match="percentage"):
            min_free_bytes(bad, gib)


def test_a_bad_watermark_in_the_environment_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gateway.errors import AuditUnavailableError

    monkeypatch.setenv("GATEWAY_AUDIT_MIN_FREE", "plenty")
    with pytest.raises(AuditUnavailableError, match="GATEWAY_AUDIT_MIN_FREE='plenty'"):
        JsonlAuditTrail.from_env(tmp_path)


def test_below_the_watermark_only_records_of_new_work_are_refused(tmp_path: Path) -> None:
    from gateway.errors import AuditSpaceError, exit_code_for

    fs = os.statvfs(tmp_path)
    everything = fs.f_blocks * fs.f_frsize  # a watermark no file system can meet
    with JsonlAuditTrail(tmp_path / "t", min_free=everything) as trail:
        for event in ("request.received", "request.invalid", "policy.decision"):
            with pytest.raises(AuditSpaceError) as info:
                trail.append(event, {})
            assert info.value.code == "audit.low_space"
            assert exit_code_for(info.value) == 125
        receipt = trail.append("execution.outcome", {"exit_code": 0})  # a run in flight still records its outcome
        assert receipt.seq == 1


def test_below_the_watermark_only_reserved_records_are_written_and_each_refusal_is_reported(tmp_path: Path) -> None:
    """The reserve is for what finishes work already started (and the service's own lifecycle): refusal records
    that any client can cause at will are refused there too, and reported to ``on_low_space``."""
    from gateway.audit.interface import EVENT_TYPES
    from gateway.audit.jsonl import NEW_WORK_EVENTS, RESERVE_EVENTS
    from gateway.errors import AuditSpaceError

    fs = os.statvfs(tmp_path)
    reported: list[str] = []
    with JsonlAuditTrail(tmp_path / "t", min_free=fs.f_blocks * fs.f_frsize) as trail:
        trail.on_low_space = reported.append
        for event in ("auth.failed", "auth.forbidden", "request.refused"):
            with pytest.raises(AuditSpaceError, match=rf"refusing the {event} record: .* below its watermark"):
                trail.append(event, {"count": 1, "summary": False})
        for event in sorted(RESERVE_EVENTS):
            trail.append(event, {})
    assert reported == ["auth.failed", "auth.forbidden", "request.refused"]
    assert [r["event_type"] for r in lines(tmp_path / "t")] == sorted(RESERVE_EVENTS)
    assert {"auth.failed", "auth.forbidden", "request.refused"} | NEW_WORK_EVENTS == EVENT_TYPES - RESERVE_EVENTS


class SyncLog(AuditIO):
    """Each fsync, as the size of the file it made durable."""

    def __init__(self) -> None:
        self.synced: list[int] = []

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self.synced.append(os.fstat(fd).st_size)


@pytest.mark.parametrize("group_commit", [False, True])
def test_a_record_not_waited_for_is_made_durable_by_the_next_durable_one(tmp_path: Path, group_commit: bool) -> None:
    io = SyncLog()
    trail = JsonlAuditTrail(tmp_path, group_commit=group_commit, io=io)
    trail.append("gateway.start", START)
    synced_before = len(io.synced)
    trail.append("request.received", {"request": {"code": "print(1)"}}, durable=False)
    assert len(io.synced) == synced_before  # nothing flushed for it
    trail.append("gateway.stop", {})
    size = sum(p.stat().st_size for p in tmp_path.glob("trail-*.jsonl"))
    assert io.synced[synced_before:] == [size]  # one flush, covering both records
    trail.close()
    assert verify_trail(tmp_path).records_checked == 3


@pytest.mark.parametrize("group_commit", [False, True])
def test_a_record_not_waited_for_is_made_durable_at_close_or_rotation(tmp_path: Path, group_commit: bool) -> None:
    io = SyncLog()
    trail = JsonlAuditTrail(tmp_path, group_commit=group_commit, io=io, segment_max_bytes=600)
    trail.append("request.received", {"request": {"code": "x" * 300}}, durable=False)
    first = (tmp_path / "trail-000001.jsonl").stat().st_size
    trail.append("request.received", {"request": {"code": "y" * 300}}, durable=False)  # rotates
    assert (tmp_path / "trail-000002.jsonl").exists()
    assert io.synced == [first]  # the retired segment was flushed before it was closed
    trail.close()
    assert io.synced == [first, (tmp_path / "trail-000002.jsonl").stat().st_size]


class UnwaitedIO(FailingIO):
    """Counts fsyncs; fails ``call`` once armed (it starts disarmed)."""

    def __init__(self, call: str, err: int = errno.EIO) -> None:
        super().__init__(call, err)
        self.armed = False
        self.fsyncs = 0

    def fsync(self, fd: int) -> None:
        self._maybe_fail("fsync")
        self.fsyncs += 1
        super().fsync(fd)


def test_sync_makes_every_unwaited_record_durable_with_one_fsync(tmp_path: Path) -> None:
    io = UnwaitedIO("none")
    trail = JsonlAuditTrail(tmp_path, io=io)
    for _ in range(5):
        trail.append("gateway.start", START, durable=False)
    assert io.fsyncs == 0
    trail.sync()
    assert io.fsyncs == 1
    trail.sync()  # nothing new written: nothing to flush
    assert io.fsyncs == 1
    trail.close()
    assert verify_trail(tmp_path).records_checked == 5


def test_sync_that_cannot_flush_raises_and_the_trail_refuses_appends(tmp_path: Path) -> None:
    io = UnwaitedIO("fsync")
    trail = JsonlAuditTrail(tmp_path, io=io)
    trail.append("gateway.start", START, durable=False)
    io.armed = True
    with pytest.raises(AuditUnavailableError, match="cannot fsync the audit segment"):
        trail.sync()
    io.armed = False
    with pytest.raises(AuditUnavailableError, match="refuses appends"):
        trail.append("gateway.start", START)
    with pytest.raises(AuditUnavailableError, match="refuses appends"):
        trail.sync()


def test_a_failed_write_makes_the_unwaited_records_before_it_durable(tmp_path: Path) -> None:
    """A write that fails closes the segment: what this instance wrote before it without waiting is flushed
    first, never marked durable unflushed (a later sync would otherwise vouch for it)."""
    io = UnwaitedIO("write", errno.ENOSPC)
    trail = JsonlAuditTrail(tmp_path, io=io)
    trail.append("gateway.start", START, durable=False)
    io.armed = True
    with pytest.raises(AuditUnavailableError, match="write the audit record"):
        trail.append("gateway.start", START, durable=False)
    assert io.fsyncs == 1
    io.armed = False
    trail.sync()
    trail.close()
    assert verify_trail(tmp_path).records_checked == 1

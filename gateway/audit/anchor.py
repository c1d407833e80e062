"""Anchors: the head of a trail (trail id, last ``seq``, last ``hash``, time), stored somewhere else.

A hash chain proves that nothing was changed, inserted or removed *inside* it; removing whole records from
its end leaves a valid shorter chain. An anchor closes that gap: the operator (or the service, every N
records or T seconds, :class:`AnchorWriter`) stores the head where whoever edits the trail cannot reach it
(a WORM bucket, a ticket, a second host). :func:`check_anchor` then fails when the trail no longer reaches
that head:

``tail_deleted``  the intact chain ends before the anchored ``seq`` (records removed from the end, the
                  trail truncated, or an older copy put back)
``forked``        the trail reaches the anchored ``seq`` but the record there has another hash (an older
                  copy put back and extended, or a re-forged chain)
``other_trail``   the anchor names another trail (its id is the ``event_id`` of a trail's first record)
``bad_hmac``      the anchor's HMAC does not match under the trail key (or is missing while a key is set)

An anchor is one JSON object, ``{"kind", "trail", "seq", "hash", "time"}`` plus ``hmac`` when the trail key
is set: HMAC-SHA256 over the canonical JSON (sorted keys, compact, ASCII) of the other members, so a forged
anchor is caught like a forged record.
"""

from __future__ import annotations

import hmac as _hmac
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from gateway._files import whole_file
from gateway._ticker import Ticker
from gateway.audit.canonical import LineError, extract_seq, mac, split_line
from gateway.audit.jsonl import read_tail
from gateway.audit.pipeline import utc_timestamp
from gateway.audit.segments import list_segments
from gateway.audit.verify import VerifyReport
from gateway.errors import AuditError, GatewayError

__all__ = [
    "ANCHOR_KIND",
    "Anchor",
    "AnchorCheck",
    "AnchorWriter",
    "anchor_from_report",
    "check_anchor",
    "hash_at",
    "load_anchor",
    "trail_id",
    "write_anchor",
]

ANCHOR_KIND: Final = "gateway.audit-anchor/v1"
"""Value of an anchor's ``kind`` member."""
MAX_ANCHOR_BYTES: Final = 64 * 1024
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z\Z")
_log = logging.getLogger("gateway.audit")


def _canonical(obj: Mapping[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


@dataclass(frozen=True, slots=True)
class Anchor:
    """One stored head of a trail."""

    trail: str
    """The trail's id: the ``event_id`` of its first record."""
    seq: int
    """``seq`` of the last record when the anchor was taken (0: the trail was empty)."""
    hash: str
    """``hash`` of that record."""
    time: str
    """When the anchor was taken (UTC RFC 3339 with microseconds and ``Z``)."""
    hmac: str | None = None
    """HMAC-SHA256 of the canonical body under the trail key; ``None`` when no key was set."""
    source: str | None = field(default=None, compare=False)
    """The file it was read from, if any."""

    def body(self) -> dict[str, Any]:
        """The members the HMAC covers."""
        return {"kind": ANCHOR_KIND, "trail": self.trail, "seq": self.seq, "hash": self.hash, "time": self.time}

    def to_dict(self) -> dict[str, Any]:
        out = self.body()
        if self.hmac is not None:
            out["hmac"] = self.hmac
        return out

    def to_bytes(self) -> bytes:
        """The anchor as written: canonical JSON and a newline."""
        return _canonical(self.to_dict()) + b"\n"

    def signed(self, key: bytes | None) -> Anchor:
        """This anchor with its HMAC under ``key`` (unchanged without a key)."""
        if key is None:
            return self
        return Anchor(self.trail, self.seq, self.hash, self.time, mac(key, _canonical(self.body())), self.source)

    def hmac_ok(self, key: bytes) -> bool:
        return self.hmac is not None and _hmac.compare_digest(self.hmac, mac(key, _canonical(self.body())))


def trail_id(directory: str | Path) -> str | None:
    """The ``event_id`` of the trail's first record (``None`` for an empty trail or an unreadable first line)."""
    for _index, path in list_segments(directory):
        with path.open("rb") as fh:
            first = fh.readline()
        if not first:
            continue
        try:
            record = json.loads(first)
        except ValueError:
            return None
        value = record.get("event_id") if isinstance(record, dict) else None
        return value if isinstance(value, str) else None
    return None


def anchor_from_report(
    directory: str | Path, report: VerifyReport, *, key: bytes | None, now: datetime | None = None
) -> Anchor:
    """The anchor of the head ``report`` verified up to (refused when the chain is broken: an anchor vouches
    for an intact chain only; and for an empty trail, which every trail reaches: it would vouch for nothing)."""
    if not report.ok:
        brk = report.first_break
        where = f" at seq {brk.seq} ({brk.reason})" if brk is not None else ""
        raise AuditError(
            f"the trail in {directory} is broken{where}: refusing to anchor it",
            hint="run `gateway audit verify` to locate the break and `gateway audit repair` to seal it",
        )
    if report.last_seq == 0:
        raise AuditError(
            f"the trail in {directory} holds no records: an anchor of it would vouch for nothing",
            hint="name the directory the gateway writes its trail to (--trail DIR, or GATEWAY_AUDIT_DIR)",
        )
    ident = trail_id(directory) or ""
    return Anchor(ident, report.last_seq, report.last_hash, utc_timestamp(now)).signed(key)


def write_anchor(anchor: Anchor, path: str | Path) -> Path:
    """Write ``anchor`` to ``path`` whole and durably (:func:`gateway._files.whole_file`); an :class:`OSError`
    names ``path``."""
    target = Path(path)
    with whole_file(target, sync=True) as fh:
        fh.write(anchor.to_bytes())
    return target


def _bad(path: str, problem: str) -> AuditError:
    return AuditError(
        f"{path}: not an audit anchor: {problem}",
        hint=f"an anchor is the JSON object `gateway audit anchor` writes ({ANCHOR_KIND})",
    )


def load_anchor(path: str | Path) -> Anchor:
    """Read an anchor file strictly; :class:`AuditError` names the file and the member that is wrong."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as fh:
            raw = fh.read(MAX_ANCHOR_BYTES + 1)
    except OSError as exc:
        raise AuditError(f"cannot read the anchor file {name}: {exc.strerror}") from exc
    if len(raw) > MAX_ANCHOR_BYTES:
        raise _bad(name, f"larger than {MAX_ANCHOR_BYTES} bytes")
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise _bad(name, f"not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise _bad(name, "expected a JSON object")
    if obj.get("kind") != ANCHOR_KIND:
        raise _bad(name, f"$.kind: expected {ANCHOR_KIND!r}, got {obj.get('kind')!r}")
    extra = sorted(set(obj) - {"kind", "trail", "seq", "hash", "time", "hmac"})
    if extra:
        raise _bad(name, f"unknown member(s) {', '.join(extra)}")
    trail, seq, digest, time = obj.get("trail"), obj.get("seq"), obj.get("hash"), obj.get("time")
    if not isinstance(trail, str):
        raise _bad(name, "$.trail: expected a string (the event_id of the trail's first record)")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise _bad(name, "$.seq: expected an integer >= 0")
    if not isinstance(digest, str) or _HEX64.match(digest) is None:
        raise _bad(name, "$.hash: expected 64 lowercase hex digits")
    if not isinstance(time, str) or _TIME.match(time) is None:
        raise _bad(name, "$.time: expected UTC RFC 3339 with microseconds and Z")
    tag = obj.get("hmac")
    if tag is not None and (not isinstance(tag, str) or _HEX64.match(tag) is None):
        raise _bad(name, "$.hmac: expected 64 lowercase hex digits")
    return Anchor(trail, seq, digest, time, tag, name)


def hash_at(directory: str | Path, seq: int) -> str | None:
    """The ``hash`` of the record at ``seq`` (``None`` when no sealed line carries it).

    Only the segment that must hold it is read: the one whose first record's ``seq`` is the largest not
    above ``seq`` (segments are contiguous and in order). Lines are not parsed, only split at their suffix.
    """
    candidate: Path | None = None
    for _index, path in list_segments(directory):
        with path.open("rb") as fh:
            first = fh.readline()
        try:
            start = extract_seq(split_line(first)[0])
        except LineError:
            continue
        if start > seq:
            break
        candidate = path
    if candidate is None:
        return None
    with candidate.open("rb", buffering=1 << 20) as fh:
        for line in fh:
            try:
                body, digest, _tag = split_line(line)
                if extract_seq(body) == seq:
                    return digest
            except LineError:
                return None
    return None


@dataclass(frozen=True, slots=True)
class AnchorCheck:
    """The result of checking one trail against one anchor."""

    anchor: Anchor
    ok: bool
    reason: str | None
    """``tail_deleted``, ``forked``, ``other_trail`` or ``bad_hmac`` (``None`` when ``ok``)."""
    detail: str
    hmac_checked: bool
    """Whether the anchor's HMAC was checked (a key was given)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.anchor.source,
            "trail": self.anchor.trail,
            "seq": self.anchor.seq,
            "hash": self.anchor.hash,
            "time": self.anchor.time,
            "ok": self.ok,
            "reason": self.reason,
            "detail": self.detail,
            "hmac_checked": self.hmac_checked,
        }


def check_anchor(
    directory: str | Path, anchor: Anchor, report: VerifyReport, *, key: bytes | None, ident: str | None = None
) -> AnchorCheck:
    """Whether the intact chain ``report`` found in ``directory`` still reaches ``anchor``'s head.

    ``ident``: the trail's id when the caller has it (else read from the first record).
    """
    name = anchor.source or "the anchor"

    def result(reason: str | None, detail: str) -> AnchorCheck:
        return AnchorCheck(anchor, reason is None, reason, detail, key is not None)

    if key is not None and not anchor.hmac_ok(key):
        missing = "carries no HMAC" if anchor.hmac is None else "fails its HMAC"
        return result("bad_hmac", f"{name} {missing} under the trail key (forged, or another key)")
    ident = trail_id(directory) if ident is None else ident
    if anchor.seq > 0 and ident != anchor.trail:
        return result("other_trail", f"{name} is for trail {anchor.trail}, this trail is {ident or '(empty)'}")
    if report.last_seq < anchor.seq:
        return result(
            "tail_deleted",
            f"the intact chain ends at seq {report.last_seq}, before seq {anchor.seq} anchored at {anchor.time} in "
            f"{name}: records were removed from the end, the trail was truncated, or an older copy was put back",
        )
    found = report.last_hash if report.last_seq == anchor.seq else hash_at(directory, anchor.seq)
    if anchor.seq == 0:
        found = anchor.hash  # an anchor of the empty trail is reached by every trail
    if found != anchor.hash:
        return result(
            "forked",
            f"the record at seq {anchor.seq} has hash {found}, {name} holds {anchor.hash}: the trail was replaced "
            "by another chain from there on (an older copy put back and extended, or re-forged)",
        )
    return result(None, f"reaches seq {anchor.seq} anchored at {anchor.time} ({name})")


class AnchorWriter:
    """Writes the trail's head to ``directory`` every ``every_records`` records or ``every_seconds`` seconds
    (whichever comes first), and once more at :meth:`stop`.

    A thread polls the head as the writer reads it (:func:`~gateway.audit.jsonl.read_tail`: the last record
    checked against its hash and HMAC), once a second at most, and writes ``anchor-<seq>.json`` only when the
    head moved, plus ``latest.json`` (the same anchor). A failure is logged, never raised into the service:
    anchoring is evidence kept elsewhere, not a condition for running.
    """

    def __init__(
        self,
        trail: str | Path,
        directory: str | Path,
        *,
        key: bytes | None,
        every_records: int | None = None,
        every_seconds: float | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if every_records is None and every_seconds is None:
            raise ValueError("an AnchorWriter needs every_records, every_seconds or both")
        self.trail = Path(trail)
        self.directory = Path(directory)
        self.key = key
        self.every_records = every_records
        self.every_seconds = every_seconds
        self._clock = clock or (lambda: datetime.now(UTC))
        interval = 1.0 if every_seconds is None else max(0.05, min(1.0, every_seconds / 4))
        self._ticker = Ticker("gateway-anchor", interval, self.poll, join_s=10.0)
        self._written_seq = -1
        self._written_at = 0.0
        self._ident: str | None = None
        self.written: list[Path] = []
        """Every anchor file written, in order (``latest.json`` excluded)."""

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._written_at = self._clock().timestamp()
        self._ticker.start()

    def stop(self) -> None:
        """Stop the thread and anchor the final head (call after the last record, e.g. ``gateway.stop``)."""
        self._ticker.stop()
        self.poll(force=True)

    def poll(self, *, force: bool = False) -> Path | None:
        """Write an anchor now if the head moved and a threshold is reached (or ``force``); the file or None."""
        try:
            tail = read_tail(self.trail, self.key)
        except (GatewayError, OSError) as exc:
            _log.warning("anchor skipped: cannot read the trail head: %s", getattr(exc, "message", exc))
            return None
        if tail.seq in (self._written_seq, 0):
            return None
        now = self._clock()
        due = force or self._written_seq < 0
        if self.every_records is not None and tail.seq - max(self._written_seq, 0) >= self.every_records:
            due = True
        if self.every_seconds is not None and now.timestamp() - self._written_at >= self.every_seconds:
            due = True
        if not due:
            return None
        if self._ident is None:
            self._ident = trail_id(self.trail)
        anchor = Anchor(self._ident or "", tail.seq, tail.hash, utc_timestamp(now)).signed(self.key)
        try:
            path = write_anchor(anchor, self.directory / f"anchor-{tail.seq:012d}.json")
            write_anchor(anchor, self.directory / "latest.json")
        except OSError as exc:
            _log.warning("anchor not written to %s: %s", self.directory, exc.strerror)
            return None
        self._written_seq, self._written_at = tail.seq, now.timestamp()
        self.written.append(path)
        return path

"""Name the first anomaly of a trail: read one line on its own, then look a little ahead to say what happened.

The slow, exact half of :mod:`gateway.audit.verify`: it runs only once, at the first line that does not chain
(the fast per-line check is :mod:`gateway.audit._scan`), and turns it into a :class:`BreakInfo` with one of
:data:`REASONS`.
"""

from __future__ import annotations

import hmac as _hmac
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Final

from gateway.audit.canonical import LineError, digest, extract_prev_hash, extract_seq, mac, split_line

__all__ = ["REASONS", "Anomaly", "BreakInfo", "Classifier", "Line", "Parsed", "parse_line"]

REASONS: Final = ("modified", "bad_hmac", "deleted", "inserted", "duplicated", "reordered", "truncated")


@dataclass(frozen=True, slots=True)
class BreakInfo:
    """The first place where the trail stops being trustworthy."""

    seq: int
    """First ``seq`` that cannot be trusted (the intact prefix is every ``seq`` below it)."""
    segment: str
    """Segment file holding the offending line."""
    line: int
    """1-based line number in that segment."""
    offset: int
    """Byte offset of that line in the segment (where ``repair`` cuts)."""
    reason: str
    """One of :data:`REASONS`."""
    detail: str
    """What exactly was found, for people."""
    prev_hash: str
    """``hash`` of the last trusted record (what a recovery record chains to)."""
    found_seq: int | None = None
    """``seq`` written in the offending line, when it could be read."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a segment, where it sits, and its bytes."""

    segment: str
    line: int
    offset: int
    raw: bytes


@dataclass(frozen=True, slots=True)
class Parsed:
    """What one line says on its own (``problem`` set when the line itself is bad)."""

    seq: int | None
    prev: str | None
    hash: str | None
    problem: str | None  # reason when the line itself is bad
    detail: str
    keyed: bool = False
    """The line carries an ``hmac``."""


def parse_line(raw: bytes, key: bytes | None) -> Parsed:
    """Check one line's seal (and HMAC, with a key) and read its ``seq`` and ``prev_hash``."""
    if not raw.endswith(b"\n"):
        return Parsed(None, None, None, "truncated", f"torn line: {len(raw)} bytes without a final newline")
    try:
        body, stored_hash, stored_mac = split_line(raw)
        seq = extract_seq(body)
        prev = extract_prev_hash(body)
    except LineError as exc:
        return Parsed(None, None, None, "modified", f"not a sealed record: {exc}")
    if digest(body) != stored_hash:
        return Parsed(seq, prev, stored_hash, "modified", "the record's bytes do not match its hash")
    if key is not None:
        if stored_mac is None:
            return Parsed(seq, prev, stored_hash, "bad_hmac", "the record has no hmac")
        if not _hmac.compare_digest(mac(key, body), stored_mac):
            return Parsed(seq, prev, stored_hash, "bad_hmac", "the record's hmac does not match (chain re-forged?)")
    return Parsed(seq, prev, stored_hash, None, "", stored_mac is not None)


@dataclass(frozen=True, slots=True)
class Anomaly:
    """The first line that does not chain, and the chain state it broke."""

    here: Line
    cur: Parsed
    expected: int
    prev: str
    prev_prev: str | None
    prev_at: Line | None

    def at(
        self,
        reason: str,
        detail: str,
        line: Line | None = None,
        seq: int | None = None,
        chain_to: str | None = None,
    ) -> BreakInfo:
        """The break, placed at this line (or at ``line``/``seq``/``chain_to`` when the culprit is earlier)."""
        where = self.here if line is None else line
        return BreakInfo(
            self.expected if seq is None else seq,
            where.segment,
            where.line,
            where.offset,
            reason,
            detail,
            self.prev if chain_to is None else chain_to,
            self.cur.seq,
        )

    def fits(self, p: Parsed | None) -> bool:
        """Whether ``p`` is the record the chain expected here."""
        return p is not None and p.problem is None and p.seq == self.expected and p.prev == self.prev


class Classifier:
    """Names the first anomaly using a short look-ahead over what follows it."""

    def __init__(self, rest: Iterator[Line], key: bytes | None, keyed: bool | None = None) -> None:
        self._rest = rest
        self._key = key
        self._keyed = keyed
        """Whether the records before the anomaly carry an hmac (None: it is the first record)."""

    def next(self) -> tuple[Line, Parsed] | None:
        item = next(self._rest, None)
        return None if item is None else (item, parse_line(item.raw, self._key))

    def classify(
        self,
        here: Line,
        expected: int,
        prev: str,
        prev_prev: str | None,
        prev_at: Line | None,
    ) -> BreakInfo:
        cur = parse_line(here.raw, self._key)
        found = Anomaly(here, cur, expected, prev, prev_prev, prev_at)
        if cur.problem is not None:
            return found.at(cur.problem, cur.detail)
        if self._keyed is not None and cur.keyed != self._keyed:
            detail = (
                "the record has no hmac but the records before it do (forged or stripped without the key?)"
                if self._keyed
                else "the record has an hmac but the records before it do not"
            )
            return found.at("bad_hmac", detail)
        if cur.seq is None or cur.hash is None:  # pragma: no cover - _parse sets both when problem is None
            return found.at("modified", "unreadable record")
        if cur.seq == expected:
            return self._wrong_link(found, cur.hash)
        if cur.seq < expected:
            return self._seq_behind(found, cur.seq, cur.hash)
        return self._seq_ahead(found, cur.seq, cur.hash)

    def _wrong_link(self, found: Anomaly, cur_hash: str) -> BreakInfo:
        """Right place (``seq`` as expected), wrong ``prev_hash``."""
        expected = found.expected
        following = self.next()
        nxt = None if following is None else following[1]
        if (
            nxt is not None
            and nxt.problem is None
            and nxt.seq == expected + 1
            and nxt.prev == cur_hash
            and found.prev_at is not None
            and found.prev_prev is not None
        ):
            return found.at(
                "modified",
                f"seq {expected - 1} was altered and re-hashed: seq {expected} still chains to its original hash",
                found.prev_at,
                expected - 1,
                found.prev_prev,
            )
        if found.fits(nxt):
            return found.at("inserted", f"an extra record claiming seq {expected} precedes the real one")
        return found.at("modified", f"seq {expected} does not chain to seq {expected - 1} (prev_hash differs)")

    def _seq_behind(self, found: Anomaly, seq: int, cur_hash: str) -> BreakInfo:
        """A ``seq`` lower than expected: a copy, or an extra record."""
        expected, prev_prev = found.expected, found.prev_prev
        if cur_hash == found.prev:
            return found.at("duplicated", f"seq {seq} appears twice in a row")
        if seq == expected - 1 and found.cur.prev == prev_prev and found.prev_at is not None and prev_prev is not None:
            return found.at(
                "inserted",
                f"the record before this one is not in the chain: seq {seq} chains to seq {seq - 1}",
                found.prev_at,
                expected - 1,
                prev_prev,
            )
        following = self.next()
        if following is not None and found.fits(following[1]):
            return found.at("inserted", f"an extra record (claiming seq {seq}) sits before seq {expected}")
        return found.at("duplicated", f"seq {seq} appears again where seq {expected} was expected")

    def _seq_ahead(self, found: Anomaly, seq: int, cur_hash: str) -> BreakInfo:
        """A ``seq`` higher than expected: a gap here (swapped, inserted, stored later, or deleted)."""
        expected = found.expected
        following = self.next()
        if following is not None and found.fits(following[1]):
            after = self.next()
            swapped = (
                seq == expected + 1
                and found.cur.prev == following[1].hash
                and (after is None or after[1].hash != cur_hash)
            )
            if swapped:
                return found.at("reordered", f"seq {seq} is stored before seq {expected}")
            return found.at("inserted", f"an extra record (claiming seq {seq}) sits before seq {expected}")
        while following is not None:
            if found.fits(following[1]):
                where = following[0]
                return found.at(
                    "reordered",
                    f"seq {expected} is stored later ({where.segment} line {where.line}) than seq {seq}",
                )
            following = self.next()
        missing = f"seq {expected}" if seq == expected + 1 else f"seq {expected} to {seq - 1}"
        return found.at("deleted", f"{missing} missing: seq {seq} follows seq {expected - 1}")

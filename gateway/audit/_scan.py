"""The verifier's hot loop: check the lines of one segment, reading large blocks, without a copy per line.

:func:`scan_segment` runs in the verifying process (the chain state is known: ``expected`` and ``prev``) or in
a worker process (``expected is None``: the segment's first record is checked on its own and its ``seq`` and
``prev_hash`` are returned, for the parent to stitch to the previous segment's last record).

The fast path hashes each line in place: the byte where the ``,"hash":"`` suffix starts is overwritten with the
``}`` that closes the hashed body, the body is hashed through a memoryview in one call, and the byte is put
back. ``seq`` and ``prev_hash`` are compared at the positions found with ``rfind`` in the buffer. A line the fast
path does not accept is copied and judged by :func:`_line_ok`, which is the verifier's original per-line code:
the fast path only ever says "certainly good", so both decide exactly alike.

This module imports nothing heavy: a worker process only needs it, :mod:`hashlib` and :mod:`hmac`.
"""

from __future__ import annotations

import hashlib
import hmac as _hmac
import json
import os
from collections.abc import Callable
from io import FileIO
from typing import Final, NamedTuple

from gateway._workers import serve

__all__ = ["BLOCK_BYTES", "SegmentScan", "decode_scan", "encode_scan", "scan_segment", "worker_main"]

BLOCK_BYTES: Final = 1 << 20
"""Read size; the buffer grows only for a line longer than this (memory follows the longest line)."""

_HK: Final = b',"hash":"'
_MK: Final = b'","hmac":"'
_END: Final = b'"}\n'
_SEQK: Final = b'"seq":'
_PREVK: Final = b'"prev_hash":"'
_CLOSE: Final = 0x7D  # "}"
_COMMA: Final = 0x2C  # ","
_sha256 = hashlib.sha256


class SegmentScan(NamedTuple):
    """What one pass over a segment found (picklable: it is what a worker returns)."""

    lines: int
    """Lines that verified, from the first (all of them when ``broken`` is false)."""
    broken: bool
    """Whether line ``lines + 1`` failed (in a worker: failed on its own or against its predecessor)."""
    first_seq: bytes
    """Worker mode: the ``seq`` digits of line 1 as written (empty when not read)."""
    first_prev: bytes
    """Worker mode: the ``prev_hash`` of line 1 as the verifier reads it (empty when not read)."""
    last_hash: bytes
    """``hash`` of line ``lines`` (empty when ``lines`` is 0)."""
    before_last_hash: bytes
    """``hash`` of line ``lines - 1`` (empty when ``lines`` < 2)."""
    last_offset: int
    """Byte offset of line ``lines``."""
    hmac_present: bool
    """Whether a line read (the failing one included) has the keyed suffix."""
    break_offset: int
    """Byte offset of the failing line (when ``broken``)."""
    break_raw: bytes
    """The failing line's bytes (when ``broken``)."""
    keyed: bool | None = None
    """Whether the lines that verified carry an HMAC (``None`` when none did). A trail is keyed throughout or
    not at all (the writer refuses to mix), so a line whose keyedness differs from the lines before is a break
    even without the key: a record forged, or stripped, by someone without it."""


def _line_ok(raw: bytes, key: bytes | None, expected: int | None, prev: bytes | None) -> tuple[bool, bytes, bool]:
    """The verifier's reference check of one line: ``(good, stored hash, keyed suffix seen)``.

    With ``expected``/``prev`` None the chain link is not checked (a worker's first line).
    """
    n = len(raw)
    good = False
    keyed = False
    body = stored = b""
    if raw[n - 76 : n - 67] == _HK:
        body = raw[: n - 76] + b"}"
        stored = raw[n - 67 : n - 3]
        good = key is None and raw[n - 3 :] == _END and _sha256(body).hexdigest().encode() == stored
    elif raw[n - 150 : n - 141] == _HK and raw[n - 77 : n - 67] == _MK and raw[n - 3 :] == _END:
        keyed = True
        body = raw[: n - 150] + b"}"
        stored = raw[n - 141 : n - 77]
        good = _sha256(body).hexdigest().encode() == stored and (
            key is None or _hmac.compare_digest(_hmac.new(key, body, _sha256).hexdigest().encode(), raw[n - 67 : n - 3])
        )
    if good and expected is not None and prev is not None:
        at = body.rfind(_SEQK)
        pat = body.rfind(_PREVK) + 13
        good = at >= 0 and body[at + 6 : body.find(b",", at)] == b"%d" % expected and body[pat : pat + 64] == prev
    return good, stored, keyed


def _first_link(raw: bytes) -> tuple[bytes, bytes] | None:
    """``(seq digits, prev_hash)`` of a line whose seal verified, read as :func:`_line_ok` reads them.

    None when no ``expected`` could ever match (no ``seq``, or digits that are not a positive decimal).
    """
    n = len(raw)
    cut = n - 76 if raw[n - 76 : n - 67] == _HK else n - 150
    body = raw[:cut] + b"}"
    at = body.rfind(_SEQK)
    if at < 0:
        return None
    digits = body[at + 6 : body.find(b",", at)]
    if not digits.isdigit() or b"%d" % int(digits) != digits or int(digits) < 1:
        return None
    pat = body.rfind(_PREVK) + 13
    return digits, body[pat : pat + 64]


def scan_segment(
    path: str,
    limit: int | None,
    key: bytes | None,
    expected: int | None,
    prev: bytes | None,
    *,
    keyed: bool | None = None,
) -> SegmentScan:
    """Verify the lines of one segment (up to ``limit`` bytes when given), stopping at the first bad one.

    ``expected``/``prev``: the ``seq`` and ``hash`` the first line must chain to; both None in a worker, where
    the first line is checked on its own and its link reported in ``first_seq``/``first_prev``. ``keyed``:
    whether every line must carry an HMAC (True), none may (False), or like the first line (None); with a key
    it is always True.
    """
    with FileIO(path, "rb") as fh:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return _scan(fh, limit, key, expected, prev, keyed=True if key is not None else keyed)


def _scan(
    fh: FileIO, limit: int | None, key: bytes | None, expected: int | None, prev: bytes | None, *, keyed: bool | None
) -> SegmentScan:
    # Longer than our usual 60 lines on purpose: this is the verifier's per-line loop over millions of records
    # (`gateway audit verify`, ~200k records/s), where a helper call per line is a cost a user waits for.
    readinto = fh.readinto
    sha = _sha256
    hmac_digest = _hmac.digest
    compare = _hmac.compare_digest
    buf = bytearray(BLOCK_BYTES)
    mv = memoryview(buf)
    fill = pos = base = 0  # valid bytes in buf; start of the current line in buf; file offset of buf[0]
    remaining = limit
    eof = False
    lines = 0
    first_seq = first_prev = b""
    last = before_last = b""
    last_offset = 0
    hmac_present = False
    prev_tok = b"" if prev is None else _PREVK + prev
    seq_tok = b"" if expected is None else b"%d," % expected
    while True:
        nl = buf.find(b"\n", pos, fill)
        if nl < 0:
            if not eof:
                rest = fill - pos
                if pos:
                    buf[:rest] = buf[pos:fill]
                    base += pos
                    pos, fill = 0, rest
                if fill == len(buf):  # a line longer than the buffer
                    mv.release()
                    buf.extend(bytes(len(buf)))
                    mv = memoryview(buf)
                want = len(buf) - fill if remaining is None else min(len(buf) - fill, remaining)
                got = readinto(mv[fill : fill + want]) if want > 0 else 0
                if not got:
                    eof = True
                else:
                    fill += got
                    if remaining is not None:
                        remaining -= got
                continue
            if pos == fill:
                break
            e = fill  # a torn last line: no final newline (judged below by the reference check)
        else:
            e = nl + 1
        ok = False
        if expected is not None and e - pos >= 76:
            end = e - 75  # end of the hashed body (its closing "}" is the suffix's first byte)
            if buf.startswith(_HK, e - 76):  # plain suffix: ,"hash":"<64>"}\n
                if key is None and keyed is not True:
                    buf[e - 76] = _CLOSE
                    digest = sha(mv[pos : e - 75]).hexdigest().encode()
                    buf[e - 76] = _COMMA
                    ok = buf.startswith(digest + _END, e - 67)
            elif keyed is not False and e - pos >= 150 and buf.startswith(_HK, e - 150):  # keyed suffix
                end = e - 149
                buf[e - 150] = _CLOSE
                body = mv[pos:end]
                digest = sha(body).hexdigest().encode()
                mac = b"" if key is None else hmac_digest(key, body, "sha256").hex().encode()
                buf[e - 150] = _COMMA
                ok = (
                    buf.startswith(digest + _MK, e - 141)
                    and buf.startswith(_END, e - 3)
                    and (key is None or compare(mac, mv[e - 67 : e - 3]))
                )
                hmac_present = hmac_present or ok
            if ok:  # the seal holds: now the link, at the last "seq": and "prev_hash":" of the body
                at = buf.rfind(_SEQK, pos, end)
                ok = at >= 0 and buf.startswith(seq_tok, at + 6)
                if ok:
                    pa = buf.rfind(_PREVK, pos, end)
                    ok = pa >= 0 and buf.startswith(prev_tok, pa)
                    stored = digest
        if not ok:
            raw = bytes(mv[pos:e])
            ok, stored, line_keyed = _line_ok(raw, key, expected, prev)
            hmac_present = hmac_present or line_keyed
            ok = ok and (keyed is None or keyed == line_keyed)
            if ok and expected is None:
                link = _first_link(raw)
                if link is None:
                    ok = False
                else:
                    first_seq, first_prev = link
                    expected = int(first_seq)
            if not ok:
                return SegmentScan(
                    lines, True, first_seq, first_prev, last, before_last, last_offset, hmac_present, base + pos, raw,
                    keyed,
                )  # fmt: skip
        if keyed is None:
            keyed = buf.startswith(_MK, e - 77)
        lines += 1
        before_last, last, last_offset = last, stored, base + pos
        prev = stored
        prev_tok = _PREVK + stored
        expected = (expected or 0) + 1
        seq_tok = b"%d," % expected
        pos = e
    return SegmentScan(lines, False, first_seq, first_prev, last, before_last, last_offset, hmac_present, 0, b"", keyed)


def encode_scan(scan: SegmentScan) -> bytes:
    """One result line a worker writes (bytes fields as hex: a tampered line may hold anything)."""
    return (
        json.dumps(
            [
                scan.lines,
                scan.broken,
                scan.first_seq.hex(),
                scan.first_prev.hex(),
                scan.last_hash.hex(),
                scan.before_last_hash.hex(),
                scan.last_offset,
                scan.hmac_present,
                scan.keyed,
            ]
        ).encode("ascii")
        + b"\n"
    )


def decode_scan(line: bytes) -> SegmentScan:
    """The parent's side of :func:`encode_scan` (the failing line itself is not sent: the parent re-reads it)."""
    lines, broken, first_seq, first_prev, last_hash, before_last, last_offset, hmac_present, keyed = json.loads(line)
    return SegmentScan(
        int(lines),
        bool(broken),
        bytes.fromhex(first_seq),
        bytes.fromhex(first_prev),
        bytes.fromhex(last_hash),
        bytes.fromhex(before_last),
        int(last_offset),
        bool(hmac_present),
        0,
        b"",
        None if keyed is None else bool(keyed),
    )


def worker_main() -> int:
    """A verify worker (:func:`gateway._workers.serve`): the head is ``{"key": hex|null}``, each task one
    ``{"path", "limit"}``, answered with an :func:`encode_scan` line (``null`` when the segment cannot be read)."""

    def start(head: bytes) -> Callable[[bytes], bytes]:
        hexkey = json.loads(head)["key"]
        key = None if hexkey is None else bytes.fromhex(hexkey)

        def task(data: bytes) -> bytes:
            request = json.loads(data)
            try:
                return encode_scan(scan_segment(request["path"], request["limit"], key, None, None))
            except OSError:
                return b"null"  # the parent reads this segment itself and reports the error in order

        return task

    return serve(start)

"""The on-disk line format of the audit trail, over the audit record body format.

A record is hashed over its canonical body: the record without ``hash`` and ``hmac`` in the *audit record
body* format of :mod:`gateway.canonical` (keys sorted, compact separators, ``ensure_ascii=True``, no floats).
:func:`canonical_bytes` is that format under the name this package has always used; a float, a non-string
key or any non-JSON type in a record is a programming error and raises :class:`CanonicalError`.

The line written to disk is that canonical body with the digests appended as the *last* members::

    <body without its closing brace>,"hash":"<64 hex>"}\\n
    <body without its closing brace>,"hash":"<64 hex>","hmac":"<64 hex>"}\\n

so that the suffix has a fixed length and a verifier recovers the hashed bytes by slicing the line, never by
re-serialising the record. The line is still a valid JSON object (members are unordered in JSON).
"""

from __future__ import annotations

import hashlib
import hmac as _hmac
from typing import Final

from gateway.canonical import CanonicalError, sha256_hex
from gateway.canonical import audit_body_bytes as canonical_bytes
from gateway.canonical import check_audit_value as check_json

__all__ = [
    "GENESIS_HASH",
    "CanonicalError",
    "LineError",
    "canonical_bytes",
    "check_json",
    "digest",
    "extract_prev_hash",
    "extract_seq",
    "mac",
    "seal",
    "split_line",
]

GENESIS_HASH: Final = "0" * 64
"""``prev_hash`` of the very first record of a trail."""

_HASH_KEY: Final = b',"hash":"'
_HMAC_KEY: Final = b'","hmac":"'
_PLAIN_SUFFIX: Final = len(_HASH_KEY) + 64 + 2  # ,"hash":"<64>"}
_KEYED_SUFFIX: Final = len(_HASH_KEY) + 64 + len(_HMAC_KEY) + 64 + 2  # ,"hash":"<64>","hmac":"<64>"}
_PREV_KEY: Final = b'"prev_hash":"'
_SEQ_KEY: Final = b'"seq":'
_HEX: Final = frozenset(b"0123456789abcdef")


class LineError(ValueError):
    """A line on disk is not a sealed record (torn, truncated, or not in the line format)."""


def digest(body: bytes) -> str:
    """The record hash: hex sha256 of the canonical body."""
    return sha256_hex(body)


def mac(key: bytes, body: bytes) -> str:
    """The record HMAC: hex HMAC-SHA256 of the canonical body under the trail key."""
    return _hmac.new(key, body, hashlib.sha256).hexdigest()


def seal(body: bytes, key: bytes | None = None) -> tuple[bytes, str, str | None]:
    """Turn a canonical body into the line written to disk; returns ``(line, hash, hmac)``."""
    if not (body.startswith(b"{") and body.endswith(b"}")) or len(body) < 3:
        raise CanonicalError("a record body must be a non-empty JSON object")
    h = digest(body)
    head = body[:-1]
    if key is None:
        return head + _HASH_KEY + h.encode("ascii") + b'"}\n', h, None
    m = mac(key, body)
    return head + _HASH_KEY + h.encode("ascii") + _HMAC_KEY + m.encode("ascii") + b'"}\n', h, m


def _is_hex64(raw: bytes) -> bool:
    return len(raw) == 64 and _HEX.issuperset(raw)


def split_line(line: bytes) -> tuple[bytes, str, str | None]:
    """Recover ``(body, stored hash, stored hmac)`` from one line (with or without its newline).

    Raises :class:`LineError` when the line does not end in the sealed suffix (a torn or foreign line).
    """
    if line.endswith(b"\n"):
        line = line[:-1]
    n = len(line)
    if (
        n > _KEYED_SUFFIX
        and line[n - _KEYED_SUFFIX : n - _KEYED_SUFFIX + len(_HASH_KEY)] == _HASH_KEY
        and line[n - 66 - len(_HMAC_KEY) : n - 66] == _HMAC_KEY
        and line.endswith(b'"}')
    ):
        stored_hash = line[n - _KEYED_SUFFIX + len(_HASH_KEY) : n - 66 - len(_HMAC_KEY)]
        stored_mac = line[n - 66 : n - 2]
        if _is_hex64(stored_hash) and _is_hex64(stored_mac):
            return line[: n - _KEYED_SUFFIX] + b"}", stored_hash.decode("ascii"), stored_mac.decode("ascii")
    if n > _PLAIN_SUFFIX and line[n - _PLAIN_SUFFIX : n - 66] == _HASH_KEY and line.endswith(b'"}'):
        stored_hash = line[n - 66 : n - 2]
        if _is_hex64(stored_hash):
            return line[: n - _PLAIN_SUFFIX] + b"}", stored_hash.decode("ascii"), None
    raise LineError("line does not end with a sealed hash suffix")


def extract_prev_hash(body: bytes) -> str:
    """``prev_hash`` of a canonical body, read from the bytes without parsing the JSON.

    In a canonical body the top-level members after ``prev_hash`` (``principal`` … ``trace_id``) hold only
    strings, integers, null and a list of strings, and a quote inside a JSON string is always escaped, so the
    last occurrence of ``"prev_hash":"`` is the top-level member.
    """
    at = body.rfind(_PREV_KEY)
    if at < 0:
        raise LineError("record has no prev_hash")
    start = at + len(_PREV_KEY)
    raw = body[start : start + 64]
    if not _is_hex64(raw) or body[start + 64 : start + 65] != b'"':
        raise LineError("record has a malformed prev_hash")
    return raw.decode("ascii")


def extract_seq(body: bytes) -> int:
    """``seq`` of a canonical body, read from the bytes (same argument as :func:`extract_prev_hash`)."""
    at = body.rfind(_SEQ_KEY)
    if at < 0:
        raise LineError("record has no seq")
    start = at + len(_SEQ_KEY)
    end = start
    while end < len(body) and 48 <= body[end] <= 57:
        end += 1
    if end == start or end - start > 19 or body[end : end + 1] not in (b",", b"}"):
        raise LineError("record has a malformed seq")
    return int(body[start:end])

"""The canonical JSON byte formats the gateway hashes, each by name.

A digest is only comparable with another made over the same bytes, so every place that hashes JSON names
its format here instead of spelling out ``json.dumps`` arguments. All three sort keys at every level and use
compact separators (``,`` and ``:``); they differ in how they treat non-ASCII text and numbers:

===================  =============  ==============  ====================  =============================
format               text           floats          NaN, Infinity         non-string keys
===================  =============  ==============  ====================  =============================
policy fingerprint   UTF-8          kept (``0.5``)  refused (ValueError)  converted by ``json`` (``"1"``)
audit record body    ASCII escapes  refused         refused               refused (CanonicalError)
run options          UTF-8          kept (``0.5``)  written as ``NaN``    converted by ``json`` (``"1"``)
===================  =============  ==============  ====================  =============================

* **policy fingerprint** (:func:`policy_fingerprint_bytes`): the policy document as loaded from YAML; its
  sha256 is the ``policy.sha256`` stamped into every decision and audit record.
* **audit record body** (:func:`audit_body_bytes`): a record without ``hash``/``hmac``, the bytes its hash
  and HMAC cover. ``ensure_ascii`` keeps every line pure ASCII (no Unicode normalisation or lone-surrogate
  ambiguity between writer and verifier), and there are no floats (a float has no single canonical text;
  records carry integers such as ``duration_ms``). The audit record line format built on it lives in
  :mod:`gateway.audit.canonical`.
* **run options** (:func:`options_bytes`): the assembled ``containers.create`` arguments, hashed into a
  decision's ``options_sha256``. For every value without NaN or Infinity it is byte for byte the policy
  fingerprint format; it differs only in writing NaN/Infinity as the non-JSON tokens ``NaN``/``Infinity``.

Changing any of these changes digests already on record: it is a new format, not an edit.

With ``orjson`` installed (the service, report and siem extras), the audit record body is written by it when
that gives the same bytes, which is exactly when its output is pure ASCII without DEL (``json`` escapes DEL as
``\u007f`` under ``ensure_ascii``; both escape every other character alike, and with ASCII keys both sort
alike). Anything else (non-ASCII text, an integer beyond 64 bits, a lone surrogate, very deep nesting) is
written by ``json``, as without orjson: one format, two encoders, the same bytes
(``tests/unit/core/test_canonical.py`` checks them against each other on generated values).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - the base install: json writes every format
    _orjson = None  # type: ignore[assignment]

__all__ = [
    "SCALAR_TYPES",
    "CanonicalError",
    "audit_body_bytes",
    "audit_body_size",
    "check_audit_value",
    "options_bytes",
    "policy_fingerprint_bytes",
    "sha256_hex",
]


class CanonicalError(ValueError):
    """A value cannot be part of an audit record: a float, a non-string key or a non-JSON type."""


def sha256_hex(data: bytes) -> str:
    """Hex sha256 of bytes in any of the formats above."""
    return hashlib.sha256(data).hexdigest()


def policy_fingerprint_bytes(data: Any) -> bytes:
    """The policy fingerprint format: sorted keys, compact separators, UTF-8, NaN/Infinity refused."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")


def options_bytes(options: Any) -> bytes:
    """The run-options format: sorted keys, compact separators, UTF-8 (NaN/Infinity written as tokens)."""
    return json.dumps(options, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def audit_body_bytes(value: Any, *, checked: bool = False) -> bytes:
    """The audit record body format: sorted keys, compact separators, ASCII, no floats.

    Raises :class:`CanonicalError` naming the first path that holds a float, a non-string key or a non-JSON
    type. ``checked``: every part of ``value`` was already checked (:func:`check_audit_value`, or copied into
    plain JSON by the audit pipeline's ``normalise``), so it is not walked again; the bytes are the same.
    """
    if not checked:
        check_audit_value(value)
    fast = _ascii_orjson(value, sort_keys=True)
    if fast is not None:
        return fast
    # No circular check: the walk above (or the caller's) already met every container of an acyclic value.
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False, check_circular=False
    )
    return text.encode("ascii")


def audit_body_size(value: Any) -> int:
    """``len(audit_body_bytes(value, checked=True))`` for a value already checked: the same count of bytes,
    without sorting keys (the order changes no length) and without building the bytes."""
    fast = _ascii_orjson(value, sort_keys=False)
    if fast is not None:
        return len(fast)
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False, check_circular=False))


def _ascii_orjson(value: Any, *, sort_keys: bool) -> bytes | None:
    """orjson's text of a checked audit value when it is the audit body format's (see the module docstring),
    else None (no orjson, or a value only ``json`` writes in that format)."""
    if _orjson is not None:
        try:
            raw = _orjson.dumps(value, option=_orjson.OPT_SORT_KEYS if sort_keys else 0)
        except TypeError:  # orjson.JSONEncodeError: an integer beyond 64 bits, a lone surrogate, deep nesting
            return None
        if raw.isascii() and b"\x7f" not in raw:
            return raw
    return None


SCALAR_TYPES: frozenset[type] = frozenset({str, int, bool, type(None)})
"""Exactly these types (not subclasses such as an ``IntEnum``) are plain JSON scalars as they are: the walks
over a record test ``type(item) in SCALAR_TYPES`` to skip a call per member (a record holds hundreds)."""


def _is_plain(value: object) -> bool:
    """Fast walk without paths: True when ``value`` holds only audit-canonical JSON types.

    A member of exactly a scalar type costs no call (a record holds hundreds); anything else, subclasses
    included, is judged by ``isinstance``."""
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str) or (type(item) not in SCALAR_TYPES and not _is_plain(item)):
                return False
        return True
    if isinstance(value, (list, tuple)):
        for item in value:  # noqa: SIM110 - a loop, not all(): no generator per list (a third of the walk)
            if type(item) not in SCALAR_TYPES and not _is_plain(item):
                return False
        return True
    return False


def check_audit_value(value: object, path: str = "$") -> None:
    """Raise :class:`CanonicalError` naming the first path whose value the audit body format refuses."""
    if _is_plain(value):
        return
    _explain(value, path)


def _explain(value: object, path: str) -> None:
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        raise CanonicalError(f"{path}: float {value!r} in an audit record; use an integer (e.g. milliseconds)")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalError(f"{path}: non-string key {key!r} in an audit record")
            _explain(item, f"{path}.{key}")
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _explain(item, f"{path}[{index}]")
        return
    raise CanonicalError(f"{path}: {type(value).__name__} is not a JSON type")

"""The named canonical JSON formats: exact bytes for a sample value, and where the formats really differ."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import canonical
from gateway.audit import canonical as audit_canonical
from gateway.canonical import (
    CanonicalError,
    audit_body_bytes,
    audit_body_size,
    options_bytes,
    policy_fingerprint_bytes,
    sha256_hex,
)

SAMPLE: dict[str, Any] = {"zeta": {"b": [True, None, -3], "a": "é☃"}, "alpha": "plain", "n": 2}
"""Nested keys out of order, non-ASCII text, booleans, null and integers: common ground of all three formats."""


def test_policy_fingerprint_bytes() -> None:
    expected = '{"alpha":"plain","n":2,"zeta":{"a":"é☃","b":[true,null,-3]}}'.encode()
    assert policy_fingerprint_bytes(SAMPLE) == expected


def test_audit_body_bytes() -> None:
    expected = b'{"alpha":"plain","n":2,"zeta":{"a":"\\u00e9\\u2603","b":[true,null,-3]}}'
    assert audit_body_bytes(SAMPLE) == expected
    assert audit_body_bytes(SAMPLE).isascii()


def test_options_bytes() -> None:
    expected = '{"alpha":"plain","n":2,"zeta":{"a":"é☃","b":[true,null,-3]}}'.encode()
    assert options_bytes(SAMPLE) == expected


def test_sha256_hex() -> None:
    assert sha256_hex(b"abc") == hashlib.sha256(b"abc").hexdigest()
    assert sha256_hex(policy_fingerprint_bytes({})) == hashlib.sha256(b"{}").hexdigest()


def test_policy_and_audit_formats_differ_on_non_ascii_text() -> None:
    assert policy_fingerprint_bytes("é") == '"é"'.encode()
    assert audit_body_bytes("é") == b'"\\u00e9"'
    assert policy_fingerprint_bytes(SAMPLE) != audit_body_bytes(SAMPLE)
    assert policy_fingerprint_bytes({"a": [1]}) == audit_body_bytes({"a": [1]})  # the same for ASCII-only data


def test_policy_and_audit_formats_differ_on_floats_and_keys() -> None:
    assert policy_fingerprint_bytes({"cpus": 0.5}) == b'{"cpus":0.5}'
    with pytest.raises(CanonicalError, match=r"\$\.cpus: float 0\.5"):
        audit_body_bytes({"cpus": 0.5})
    assert policy_fingerprint_bytes({1: "a"}) == b'{"1":"a"}'
    with pytest.raises(CanonicalError, match="non-string key 1"):
        audit_body_bytes({1: "a"})
    with pytest.raises(CanonicalError, match=r"\$\[0\]: set is not a JSON type"):
        audit_body_bytes([set()])


def test_lone_surrogates_only_fit_the_ascii_format() -> None:
    assert audit_body_bytes("\ud800") == b'"\\ud800"'
    with pytest.raises(UnicodeEncodeError):
        policy_fingerprint_bytes("\ud800")
    with pytest.raises(UnicodeEncodeError):
        options_bytes("\ud800")


def test_options_format_is_the_policy_format_except_for_nan() -> None:
    value = {"nano_cpus": 500_000_000, "labels": {"gateway.request": "r-é"}, "cpus": 0.5}
    assert options_bytes(value) == policy_fingerprint_bytes(value)
    assert options_bytes({"x": math.nan}) == b'{"x":NaN}'
    with pytest.raises(ValueError, match="not JSON compliant"):
        policy_fingerprint_bytes({"x": math.nan})
    with pytest.raises(CanonicalError):
        audit_body_bytes({"x": math.inf})


def test_audit_package_uses_the_named_format() -> None:
    assert audit_canonical.canonical_bytes is canonical.audit_body_bytes
    assert audit_canonical.CanonicalError is canonical.CanonicalError
    assert audit_canonical.digest(b"x") == sha256_hex(b"x")


def test_policy_sha256_is_the_fingerprint_format() -> None:
    from gateway.policy import canonical_sha256

    assert canonical_sha256(SAMPLE) == sha256_hex(policy_fingerprint_bytes(SAMPLE))
    assert canonical_sha256(SAMPLE) == hashlib.sha256(policy_fingerprint_bytes(SAMPLE)).hexdigest()


def _json_audit_body(value: Any) -> bytes:
    """The audit record body format as ``json`` alone writes it: the reference for the orjson path."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


_JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)  # beyond 64 bits too: only json writes those
    | st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), max_size=8)
    | st.sampled_from(["\x7f", "a\x7fb", "\ud800", '\x00\x1f"\\/', "é", "\u2028"]),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text(max_size=4) | st.sampled_from(["\x7f", "é", "a", "B", "_"]), inner, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=600, deadline=None)
@given(_JSON_VALUES)
def test_audit_body_bytes_are_json_s_whatever_encoder_writes_them(value: Any) -> None:
    expected = _json_audit_body(value)
    assert audit_body_bytes(value) == expected
    assert audit_body_size(value) == len(expected)


def test_the_cases_orjson_writes_differently_fall_back_to_json() -> None:
    assert audit_body_bytes({"k": "a\x7fb"}) == b'{"k":"a\\u007fb"}'  # DEL: escaped by json, not by orjson
    assert audit_body_bytes(2**64) == b"18446744073709551616"  # beyond orjson's integers
    assert audit_body_bytes({"b": "\ud800", "a": 1}) == b'{"a":1,"b":"\\ud800"}'  # a lone surrogate
    deep: Any = 0
    for _ in range(300):  # deeper than orjson nests
        deep = [deep]
    assert audit_body_bytes(deep) == _json_audit_body(deep)

"""The named canonical JSON formats: exact bytes for a sample value, and where the formats really differ."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import pytest

from gateway import canonical
from gateway.audit import canonical as audit_canonical
from gateway.canonical import (
    CanonicalError,
    audit_body_bytes,
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

"""Canonical JSON and the sealed line format."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.audit.canonical import (
    GENESIS_HASH,
    CanonicalError,
    LineError,
    canonical_bytes,
    extract_prev_hash,
    extract_seq,
    seal,
    split_line,
)
from gateway.audit.pipeline import RecordPipeline, chain, utc_timestamp


def test_canonical_sorts_keys_compact_ascii() -> None:
    assert canonical_bytes({"b": 1, "a": ["é", None, True]}) == b'{"a":["\\u00e9",null,true],"b":1}'


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"data": {"duration": 1.5}}, "$.data.duration"),
        ({"x": [1, float("nan")]}, "$.x[1]"),
        ({"x": {1: "a"}}, "non-string key"),
        ({"x": b"bytes"}, "bytes is not a JSON type"),
    ],
)
def test_canonical_rejects_non_canonical_values(value: object, where: str) -> None:
    with pytest.raises(CanonicalError, match=where.replace("$", r"\$").replace("[", r"\[").replace("]", r"\]")):
        canonical_bytes(value)


def test_seal_and_split_round_trip_plain_and_keyed() -> None:
    body = canonical_bytes({"seq": 1, "prev_hash": GENESIS_HASH, "timestamp": "t"})
    line, digest, mac = seal(body)
    assert mac is None
    assert line.endswith(b"\n")
    assert json.loads(line)["hash"] == digest == hashlib.sha256(body).hexdigest()
    assert split_line(line) == (body, digest, None)

    key = b"k" * 32
    line, digest, mac = seal(body, key)
    parsed = json.loads(line)
    assert parsed["hmac"] == mac
    assert split_line(line) == (body, digest, mac)


@pytest.mark.parametrize("cut", [1, 3, 40, 80])
def test_split_line_rejects_torn_lines(cut: int) -> None:
    line, _, _ = seal(canonical_bytes({"seq": 1, "prev_hash": GENESIS_HASH}))
    with pytest.raises(LineError):
        split_line(line[: len(line) - 1 - cut])


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20))
json_tree = st.recursive(
    json_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.sampled_from(["seq", "prev_hash", "a", '"seq":', 'x"prev_hash":"']), children, max_size=4),
    ),
    max_leaves=20,
)


@given(data=st.dictionaries(st.text(max_size=10), json_tree, max_size=5), seq=st.integers(1, 10**12))
def test_extraction_finds_top_level_members_whatever_data_holds(data: dict[str, object], seq: int) -> None:
    """Nested keys named seq/prev_hash, or strings that look like them, never fool the byte extraction."""
    prev = hashlib.sha256(str(seq).encode()).hexdigest()
    record = RecordPipeline(host="h").build(
        "gateway.start", {"policy_source": "p", "extra": data}, request_id=None, principal=None, policy=None
    )
    sealed = chain(record, seq=seq, prev_hash=prev, key=None)
    body, _, _ = split_line(sealed.line)
    assert extract_seq(body) == seq
    assert extract_prev_hash(body) == prev


@pytest.mark.parametrize(
    "moment",
    [
        datetime(2026, 12, 1, 20, 0, 0, tzinfo=UTC),
        datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2024, 5, 1, 14, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2))),
        datetime(1999, 12, 31, 0, 0, 0, 1, tzinfo=timezone(timedelta(hours=-11, minutes=-30))),
    ],
)
def test_record_times_are_utc_with_microseconds_and_z(moment: datetime) -> None:
    text = utc_timestamp(moment)
    assert text == moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert datetime.fromisoformat(text.replace("Z", "+00:00")) == moment

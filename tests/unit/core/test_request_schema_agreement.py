"""The request schema's two validators agree: jsonschema-rs, which accepts requests, and python-jsonschema.

``schema_problems`` lets jsonschema-rs accept a request and python-jsonschema explain the others. Two things must
hold on every document: the problems reported are exactly python-jsonschema's (messages unchanged), and
jsonschema-rs never accepts what python-jsonschema refuses (that would let an invalid request through). The
one disagreement the other way is known and costs only time: in jsonschema-rs a pattern's ``$`` does not match
before a trailing newline, in Python's ``re`` it does. A string with a lone surrogate cannot cross into Rust at
all; python-jsonschema decides those.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from gateway.errors import Problem
from gateway.request import schema_problems
from gateway.resources import load_schema
from gateway.validation import problems_from_error

SCHEMA = load_schema("request")
REFERENCE = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
FAST = jsonschema_rs.Draft202012Validator(SCHEMA, validate_formats=True, ignore_unknown_formats=False)
SUITES = Path(__file__).resolve().parents[2] / "policies"


def _reference_problems(doc: Any) -> list[Problem]:
    """What ``schema_problems`` reported before jsonschema-rs: python-jsonschema alone."""
    found = [
        p for error in REFERENCE.iter_errors(doc) for p in problems_from_error(error, source=None, domain="request")
    ]
    return sorted(found, key=lambda p: p.path)


def _strings(doc: Any) -> Iterator[str]:
    """Every string of ``doc``, object keys included."""
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for key, value in doc.items():
            yield key
            yield from _strings(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from _strings(item)


def _has_lone_surrogate(doc: Any) -> bool:
    return any(0xD800 <= ord(ch) <= 0xDFFF for text in _strings(doc) for ch in text)


def _check(doc: Any) -> None:
    expected = _reference_problems(doc)
    assert schema_problems(doc) == expected
    try:
        fast = FAST.is_valid(doc)
    except ValueError:  # UnicodeEncodeError: the document cannot become Rust strings
        assert _has_lone_surrogate(doc)
        return
    if fast and expected:
        pytest.fail(f"jsonschema-rs accepts a document python-jsonschema refuses: {expected}")
    if not fast and not expected:  # the known dialect difference, and no other
        assert any(text.endswith("\n") for text in _strings(doc)), "jsonschema-rs refuses a valid document"


# --- the golden requests and their mutations -------------------------------------------------------------


def _golden_requests() -> list[dict[str, Any]]:
    requests = []
    for suite in sorted(SUITES.glob("*/suite.yaml")):
        for case in yaml.safe_load(suite.read_text(encoding="utf-8")).get("cases", []):
            if isinstance(case.get("request"), dict):
                requests.append(case["request"])
    return requests


GOLDEN = _golden_requests()
FULL = {
    "code": "print(2+2)",
    "language": "python",
    "image": "gateway/sandbox-python:3.11-bookworm",
    "limits": {"memory": "256m", "cpus": 0.5, "pids": 64, "timeout_s": 10, "output_bytes": 65536},
    "network": "none",
    "runtime": "runc",
    "mounts": [{"source": "/srv/data", "target": "/data", "mode": "ro"}],
    "files": {"a.txt": "content", "b.bin": {"content": "AAEC/w==", "encoding": "base64"}},
    "env": {"A": "value"},
    "principal": "agent-1",
    "metadata": {"k": [1, {"x": None}]},
}
_LIMITS = ("memory", "cpus", "pids", "timeout_s", "output_bytes", "output_files_bytes", "output_files", "tmpfs")
PATHS: list[tuple[str | int, ...]] = [
    ("code",), ("language",), ("image",), ("network",), ("runtime",), ("principal",), ("unknown",),
    ("limits",), *(("limits", name) for name in _LIMITS), ("limits", "swap"),
    ("mounts",), ("mounts", 0), ("mounts", 0, "source"), ("mounts", 0, "target"), ("mounts", 0, "mode"),
    ("files",), ("files", "a.txt"), ("files", "b.bin"), ("files", "b.bin", "content"), ("files", "b.bin", "encoding"),
    ("files", "b.bin", "x"), ("env",), ("env", "A"), ("metadata",), ("metadata", "k"), ("metadata", "k", 1),
]  # fmt: skip
TEXTS = [
    "base64", "base64\n", "hex", "AA==",
    "", "x", "none", "none\n", "none\n\n", "none\r", "\nnone", "nonE", "n\x00", "python", "python3.11", "runc",
    "runsc", "ro", "rw", "rw\n", "/", "/abs", "/abs\n", "//x", "rel", "C:\\x", "256m", "256M", "256mib", "256mb\n",
    "1" * 20, "1" * 21, "99999999999999999999k", "12q", "0b", "gateway/sandbox-python:3.11-bookworm",
    "gateway/sandbox-python:3.11-bookworm\n", "localhost:5000/a/b:tag", "a@sha256:" + "a" * 64, "a@sha256:" + "A" * 64,
    "a:" + "t" * 128, "a:" + "t" * 129, "a" * 32, "a" * 33, "a" * 128, "a" * 129, "a" * 1024, "a" * 1025,
    "agent@example.org", "agent-1\n", "A_B", "1BAD", "\u212a", "\u0130", "ß", "é", "\u0663", "1\u0663m",
    "\uff50\uff59\uff54\uff48\uff4f\uff4e",  # fullwidth "python"
    "\U0001f600", "\U0001f600" * 1024, "\U0001f600" * 1025, "\ud83d\ude00" * 512, "\ud83d\ude00" * 513,
    "\ud800", "a\ud800", "/\udfff",
]  # fmt: skip
NUMBERS = [
    0, -1, 1, 2, 0.5, -0.0, 2.0, 2.5, 1e-320, 5e-324, 64, 1024, 1024.0000000000002, 1025, 86400, 86400.00000001,
    1_000_000, 1_000_000.0, 1_000_001, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 2**64 + 1, -(2**63) - 1,
    10**30, -(10**30), 10**300, 1e308, -1e308, True, False, None,
    9223372036854775807, 9.223372036854775807e18, float(2**63 - 1024), 10**4300 - 1,
]  # fmt: skip
CONTAINERS = [
    [], {}, [[]], {"a": []}, [[[1]]], [[[[1]]]], {"a": {"b": {"c": 1}}}, {"a": {"b": {"c": {"d": 1}}}},
    {"k" * 128: 1}, {"k" * 129: 1}, {f"k{i}": i for i in range(64)}, {f"k{i}": i for i in range(65)},
    list(range(64)), list(range(65)), {"source": "/a", "target": "/b"}, {"source": "/a"},
    {"source": "/a", "target": "/b", "mode": "rw", "x": 1}, [{"source": "/a", "target": "/b"}] * 33,
]  # fmt: skip
KEYS = ["A", "A\n", "1A", "_", "", "A" * 128, "A" * 129, "\u212a", "é", "\ud800", "a.txt", "x" * 4097]


def _set(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A copy of ``doc`` with ``value`` at ``path``; what is missing on the way (or not a container) is made."""
    out = copy.deepcopy(doc)
    node: Any = out
    for key, following in itertools.pairwise(path):
        fresh: Any = [None] if isinstance(following, int) else {}
        if isinstance(node, list) and key == len(node):
            node.append(fresh)
        elif (isinstance(node, dict) and key not in node) or not isinstance(node[key], dict | list):
            node[key] = fresh
        node = node[key]
    if isinstance(node, list) and path[-1] == len(node):
        node.append(value)
    else:
        node[path[-1]] = value
    return out


def _mutations() -> Iterator[Any]:
    for base in (FULL, {"code": "x"}):
        for path in PATHS:
            for value in (*TEXTS, *NUMBERS, *CONTAINERS):
                yield _set(base, path, value)
        for field in ("env", "files", "metadata"):
            for key in KEYS:
                yield {**base, field: {key: "v"}}


def test_golden_requests_get_the_same_verdict_and_valid_ones_take_the_fast_path() -> None:
    assert len(GOLDEN) > 50
    valid = [doc for doc in GOLDEN if not _reference_problems(doc)]
    assert len(valid) > 40
    for doc in GOLDEN:
        _check(doc)
    assert all(FAST.is_valid(doc) for doc in valid)


def test_mutated_requests_get_the_same_verdict_and_problems() -> None:
    seen = 0
    for doc in _mutations():
        _check(doc)
        seen += 1
    assert seen > 2000


# --- generated documents ---------------------------------------------------------------------------------


def _patterns(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        if isinstance(schema.get("pattern"), str):
            yield schema["pattern"]
        for value in schema.values():
            yield from _patterns(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _patterns(item)


PATTERNS = sorted(set(_patterns(SCHEMA)))
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)  # surrogates included
ASCII_TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=40)


def test_the_schema_has_patterns_to_compare() -> None:
    assert len(PATTERNS) >= 8  # language, image, network, runtime, principal, env names, sizes, mount paths


@cache
def _pattern_validators(pattern: str) -> tuple[Draft202012Validator, jsonschema_rs.Validator]:
    schema = {"$schema": SCHEMA["$schema"], "type": "string", "pattern": pattern}
    return Draft202012Validator(schema), jsonschema_rs.Draft202012Validator(schema)


@pytest.mark.parametrize("pattern", PATTERNS, ids=range(len(PATTERNS)))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_each_pattern_matches_alike_in_both_regex_dialects(pattern: str, data: st.DataObject) -> None:
    """ECMA-262 regexes in jsonschema-rs, Python's ``re`` in python-jsonschema: the same matches, except that
    Python's ``$`` also matches before a trailing newline. A pattern may also stand under ``not`` (mount paths),
    where a match refuses: so the texts must match alike both ways, not just one."""
    near = data.draw(st.from_regex(pattern))
    text = data.draw(st.one_of(st.just(near), ANY_TEXT, ASCII_TEXT, st.builds(str.__add__, st.just(near), ANY_TEXT)))
    python_re, ecma = _pattern_validators(pattern)
    reference = python_re.is_valid(text)
    try:
        fast = ecma.is_valid(text)
    except ValueError:
        assert _has_lone_surrogate(text)
        return
    if fast != reference:
        dollar = "$" in pattern and text.endswith("\n") and reference
        assert dollar, f"{text!r} matches {pattern} in {'jsonschema-rs' if fast else 'python-jsonschema'} only"


def test_no_pattern_with_dollar_stands_under_not() -> None:
    """Under ``not``, a ``$`` that matches before a trailing newline in Python only would make jsonschema-rs
    accept what python-jsonschema refuses: a schema change that does this needs another anchor (``\\Z`` is not
    ECMA-262; use a character class that refuses the newline instead)."""

    def negated(schema: Any) -> Iterator[str]:
        if isinstance(schema, dict):
            if isinstance(schema.get("not"), dict):
                yield from _patterns(schema["not"])
            for value in schema.values():
                yield from negated(value)
        elif isinstance(schema, list):
            for item in schema:
                yield from negated(item)

    under_not = list(negated(SCHEMA))
    assert under_not  # the mount paths' "[\x00\n\r:,]"
    assert not [pattern for pattern in under_not if "$" in pattern]


_NUMBER = st.one_of(
    st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(NUMBERS), st.booleans()
)
_TEXT = st.one_of(ANY_TEXT, ASCII_TEXT, st.sampled_from(TEXTS), *(st.from_regex(p) for p in PATTERNS))
_SCALAR = st.one_of(st.none(), _NUMBER, _TEXT)
_JSON = st.recursive(
    _SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4), max_leaves=12
)
_BINARY_FILE = st.dictionaries(st.sampled_from(["content", "encoding", "x"]), st.one_of(_SCALAR, st.just("base64")))
_MOUNT = st.dictionaries(st.sampled_from(["source", "target", "mode", "x"]), _SCALAR, max_size=4)
_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "code": _SCALAR,
    "language": _SCALAR,
    "image": _SCALAR,
    "limits": st.one_of(st.dictionaries(st.sampled_from([*_LIMITS, "swap"]), _SCALAR, max_size=5), _SCALAR),
    "network": _SCALAR,
    "runtime": _SCALAR,
    "mounts": st.one_of(st.lists(_MOUNT, max_size=3), _SCALAR),
    "files": st.dictionaries(_TEXT, st.one_of(_SCALAR, _BINARY_FILE), max_size=3),
    "env": st.dictionaries(_TEXT, _SCALAR, max_size=3),
    "principal": _SCALAR,
    "metadata": _JSON,
    "unknown": _SCALAR,
}


@st.composite
def _request_like(draw: st.DrawFn) -> dict[str, Any]:
    base = draw(st.sampled_from([FULL, {"code": "x"}, *GOLDEN]))
    chosen = draw(st.lists(st.sampled_from(sorted(_FIELDS)), unique=True, max_size=3))
    return {**base, **{name: draw(_FIELDS[name]) for name in chosen}}


@settings(max_examples=500, deadline=None)
@given(_request_like())
@example({"code": "x", "network": "none\n"})
@example({"code": "x", "env": {"A\n": "v"}})
@example({"code": "x", "files": {"\ud800": "v"}})
@example({"code": "x", "metadata": {"a": "\ud83d\ude00" * 513}})
def test_generated_requests_get_the_same_verdict_and_problems(doc: dict[str, Any]) -> None:
    _check(doc)

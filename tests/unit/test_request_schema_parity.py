"""The hand-written request checker accepts exactly what request.schema.json accepts (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from gateway.request import fast_problems
from gateway.resources import load_schema

VALIDATOR = Draft202012Validator(load_schema("request"))

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=2_000_000),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-5, max_value=100_000),
    st.sampled_from([0.0, 2.0, 1024, 1024.5, 86400, 86400.01, 1_000_000, 1_000_001]),
    st.sampled_from(
        [
            "",
            "x",
            "none",
            "runc",
            "python",
            "256m",
            "1G",
            "12q",
            "1.5g",
            "/abs",
            "rel",
            "ro",
            "rw",
            "rwx",
            "gateway/sandbox-python:3.11-bookworm",
            "Bad Image",
            "agent-1",
            "host",
            "none\n",
            "A_B",
            "1BAD",
            "a" * 600,
        ]
    ),
)
_json = st.recursive(
    _scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=6
)

_limits = st.dictionaries(
    st.sampled_from(["memory", "cpus", "pids", "timeout_s", "output_bytes", "output_files_bytes", "tmpfs", "swap"]),
    _scalars,
    max_size=4,
)
_mount = st.dictionaries(st.sampled_from(["source", "target", "mode", "extra"]), _scalars, max_size=4)
_fields: dict[str, Any] = {
    "code": _scalars,
    "language": _scalars,
    "image": _scalars,
    "limits": st.one_of(_limits, _scalars),
    "network": _scalars,
    "runtime": _scalars,
    "mounts": st.one_of(st.lists(_mount, max_size=3), _scalars),
    "files": st.one_of(st.dictionaries(st.sampled_from(["a.txt", "", "x/y"]), _scalars, max_size=3), _scalars),
    "env": st.one_of(
        st.dictionaries(st.sampled_from(["A", "A_B", "1BAD", "a-b", "_x"]), _scalars, max_size=3), _scalars
    ),
    "principal": _scalars,
    "metadata": st.one_of(st.dictionaries(st.text(max_size=3), _json, max_size=3), _scalars),
    "bogus": _scalars,
}


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    chosen = draw(st.lists(st.sampled_from(sorted(_fields)), unique=True, max_size=6))
    doc = {name: draw(_fields[name]) for name in chosen}
    if draw(st.booleans()):
        doc["code"] = "print(1)"
    return doc


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_fast_checker_agrees_with_json_schema(doc: dict[str, Any]) -> None:
    assert (not fast_problems(doc)) == VALIDATOR.is_valid(doc), doc


@settings(max_examples=500, deadline=None)
@given(_json)
def test_fast_checker_agrees_on_arbitrary_json(doc: Any) -> None:
    assert (not fast_problems(doc)) == VALIDATOR.is_valid(doc), doc

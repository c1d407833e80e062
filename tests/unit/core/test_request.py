"""Requests: every malformed input is a RequestError with paths; nothing else escapes."""

from __future__ import annotations

import contextlib
import json
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import RequestError, exit_code_for
from gateway.request import (
    MAX_DEPTH,
    MAX_METADATA_BYTES,
    MAX_METADATA_DEPTH,
    ExecutionRequest,
    parse_request,
    schema_problems,
)


def _paths(data: Any, **kwargs: Any) -> set[str]:
    with pytest.raises(RequestError) as info:
        parse_request(data, **kwargs)
    assert exit_code_for(info.value) == 2
    return {p.path for p in info.value.problems}


def test_contract_example_parses_and_round_trips() -> None:
    doc = {
        "code": "print(2+2)",
        "language": "python",
        "image": "gateway/sandbox-python:3.11-bookworm",
        "limits": {"memory": "256m", "cpus": 0.5, "pids": 64, "timeout_s": 10, "output_bytes": 65536},
        "network": "none",
        "runtime": "runc",
        "mounts": [{"source": "/abs/host/path", "target": "/data", "mode": "ro"}],
        "files": {"relative/name.txt": "content"},
        "env": {"NAME": "value"},
        "principal": "agent-name",
        "metadata": {"k": [1, {"x": None}]},
    }
    req = parse_request(doc)
    assert isinstance(req, ExecutionRequest)
    assert req.limits.memory == 256 * 1024**2
    assert req.limits.cpus == 0.5
    assert req.mounts[0].mode == "ro"
    out = req.to_dict()
    assert out["limits"]["memory"] == 268435456
    assert parse_request(json.dumps(out)) == req
    assert req.code_bytes == len(b"print(2+2)")
    assert req.files_bytes == len(b"content")


def test_only_code_is_required() -> None:
    req = parse_request({"code": "x"})
    assert req.image is None
    assert req.limits.memory is None
    assert req.mounts == ()
    assert _paths({}) == {"$"}


def test_request_is_copied_so_later_mutation_cannot_change_it() -> None:
    doc: dict[str, Any] = {"code": "x", "env": {"A": "1"}}
    req = parse_request(doc)
    doc["env"]["A"] = "2"
    assert req.env["A"] == "1"
    with pytest.raises(TypeError):
        req.env["A"] = "3"  # type: ignore[index]


def test_mapping_types_and_tuples_are_accepted() -> None:
    req = parse_request(MappingProxyType({"code": "x", "mounts": ({"source": "/a", "target": "/data"},)}))
    assert req.mounts[0].source == "/a"


def test_every_problem_is_reported_with_its_path() -> None:
    paths = _paths(
        {
            "code": 5,
            "limits": {"memory": "12q", "pids": 0, "cpus": -1, "swap": 1},
            "mounts": [{"source": "relative", "target": "/d", "mode": "rwx"}],
            "env": {"1BAD": "x"},
            "docker": {"privileged": True},
        }
    )
    assert {
        "$.code",
        "$.limits.memory",
        "$.limits.pids",
        "$.limits.cpus",
        "$.limits.swap",
        "$.mounts[0].source",
        "$.mounts[0].mode",
        "$.docker",
    } <= paths
    assert any(p.startswith("$.env") for p in paths)


def test_bad_size_message_names_the_accepted_forms() -> None:
    with pytest.raises(RequestError) as info:
        parse_request({"code": "x", "limits": {"memory": "1.5g"}})
    assert "is not a size; expected an integer number of bytes" in info.value.problems[0].message


def test_non_utf8_bytes() -> None:
    with pytest.raises(RequestError, match="UTF-8"):
        parse_request(b'{"code": "caf\xe9"}')


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ('{"code": "x",}', "invalid JSON"),
        ('{"code": "x", "code": "y"}', "duplicate key 'code'"),
        ('{"code": "x", "limits": {"cpus": NaN}}', "NaN"),
        ('{"code": "x", "limits": {"cpus": Infinity}}', "Infinity"),
        ("[1, 2]", "is not of type 'object'"),
        ("", "invalid JSON"),
    ],
)
def test_malformed_json(raw: str, fragment: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_request(raw)
    assert fragment in info.value.diagnostics()


def test_deeply_nested_json_is_refused_without_recursion_error() -> None:
    for depth in (MAX_DEPTH + 1, 100_000):
        raw = '{"code": "x", "metadata": {"a": ' + "[" * depth + "]" * depth + "}}"
        with pytest.raises(RequestError, match="nested"):
            parse_request(raw)
    nested: dict[str, Any] = {}
    cursor = nested
    for _ in range(5000):
        cursor["a"] = {}
        cursor = cursor["a"]
    with pytest.raises(RequestError, match="nested"):
        parse_request({"code": "x", "metadata": nested})


def test_metadata_nesting_at_the_limit_is_fine_one_deeper_is_refused_with_its_path() -> None:
    value: Any = 1
    for _ in range(MAX_METADATA_DEPTH - 1):
        value = [value]
    assert parse_request({"code": "x", "metadata": {"a": value}}).metadata["a"] == value
    with pytest.raises(RequestError) as info:
        parse_request({"code": "x", "metadata": {"a": [value]}})
    [problem] = info.value.problems
    assert problem.path == "$.metadata.a" + "[0]" * (MAX_METADATA_DEPTH - 1)  # the list at level 5
    assert f"nest objects and arrays at most {MAX_METADATA_DEPTH} levels" in problem.message
    assert MAX_DEPTH > MAX_METADATA_DEPTH + 1


def test_metadata_size_keys_and_strings_are_capped_with_clear_errors() -> None:
    """Item 6: 8 MiB of metadata per dry run wrote 42 MB of trail in 2 s before."""
    fits = {f"k{i}": "v" * 200 for i in range(64)}
    assert len(json.dumps(fits)) < MAX_METADATA_BYTES
    assert parse_request({"code": "x", "metadata": fits}).metadata == fits
    too_big = {f"k{i}": ["v" * 1000] * 20 for i in range(10)}
    with pytest.raises(RequestError) as info:
        parse_request({"code": "x", "metadata": too_big})
    [problem] = info.value.problems
    assert problem.path == "$.metadata"
    assert f"at most {MAX_METADATA_BYTES} are allowed" in problem.message
    assert _paths({"code": "x", "metadata": {f"k{i}": 1 for i in range(65)}}) == {"$.metadata"}
    assert _paths({"code": "x", "metadata": {"k": "v" * 1025}}) == {"$.metadata.k"}
    assert _paths({"code": "x", "metadata": {"k": list(range(65))}}) == {"$.metadata.k"}
    assert _paths({"code": "x", "metadata": {"k" * 129: 1}}) == {"$.metadata"}
    assert _paths({"code": "x", "metadata": {"a": {"b" * 129: 1}}}) == {"$.metadata.a"}


def test_the_schema_states_the_metadata_depth_of_the_code() -> None:
    from gateway.resources import load_schema

    defs = load_schema("request")["$defs"]
    levels = sorted(int(name[len("metadata") :]) for name in defs if name.startswith("metadata"))
    assert levels == list(range(2, MAX_METADATA_DEPTH + 2))


def test_byte_cap_is_checked_before_parsing() -> None:
    raw = b'{"code": "' + b"x" * 2000 + b'"}'
    assert parse_request(raw, max_bytes=len(raw)).code == "x" * 2000
    with pytest.raises(RequestError, match="above the"):
        parse_request(raw, max_bytes=len(raw) - 1)
    with pytest.raises(RequestError, match="above the"):
        parse_request(b"\xff" * 100, max_bytes=10)  # refused before decoding


def test_non_json_python_values_are_refused() -> None:
    assert _paths({"code": "x", "metadata": {"when": object()}}) == {"$.metadata.when"}
    assert _paths({"code": "x", "metadata": {1: "a"}}) == {"$.metadata"}
    assert _paths({"code": "x", "limits": {"cpus": float("nan")}}) == {"$.limits.cpus"}


@pytest.mark.parametrize(
    ("field", "value"),
    [("image", "gateway/sandbox-python:3.11-bookworm\n"), ("network", "none\n"), ("runtime", "runc\n")],
)
def test_trailing_newlines_do_not_sneak_through_patterns(field: str, value: str) -> None:
    assert _paths({"code": "x", field: value}) == {f"$.{field}"}


@pytest.mark.parametrize("bad", ["/data:/etc", "/a,b", "/a\x00b", "/a\nb"])
def test_mount_paths_cannot_inject_bind_syntax(bad: str) -> None:
    assert _paths({"code": "x", "mounts": [{"source": bad, "target": "/data"}]}) == {"$.mounts[0].source"}
    assert _paths({"code": "x", "mounts": [{"source": "/srv", "target": bad}]}) == {"$.mounts[0].target"}


@pytest.mark.parametrize("where", [("limits", "memory"), ("limits", "pids"), ("metadata", "n")])
def test_integers_longer_than_json_text_carries_are_refused_with_their_path(where: tuple[str, str]) -> None:
    # As json.loads refuses them in text (more than 4300 digits); a mapping once raised ValueError here.
    field, key = where
    assert _paths({"code": "x", field: {key: 10**4300}}) == {f"$.{field}.{key}"}
    assert _paths({"code": "x", field: {key: -(10**5000)}}) == {f"$.{field}.{key}"}
    assert parse_request({"code": "x", "metadata": {"n": 10**4300 - 1}}).metadata["n"] == 10**4300 - 1


def test_integral_floats_count_as_integers_like_json_schema() -> None:
    req = parse_request({"code": "x", "limits": {"pids": 64.0, "memory": 1048576.0}})
    assert req.limits.pids == 64
    assert isinstance(req.limits.pids, int)
    assert req.limits.memory == 1048576


def test_huge_env_is_parsed_then_judged_by_policy() -> None:
    env = {f"APP_{i}": "v" * 10 for i in range(1024)}
    assert len(parse_request({"code": "x", "env": env}).env) == 1024
    env["APP_1024"] = "v"
    assert "$.env" in _paths({"code": "x", "env": env})


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_request_errors(data: bytes) -> None:
    with contextlib.suppress(RequestError):
        parse_request(data)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_raises_only_request_errors(text: str) -> None:
    with contextlib.suppress(RequestError):
        parse_request(text)


@pytest.mark.parametrize("raw", ['\ufeff{"code": "x"}', b'\xef\xbb\xbf{"code": "x"}'])
def test_byte_order_mark_is_refused(raw: str | bytes) -> None:
    with pytest.raises(RequestError, match="Unexpected UTF-8 BOM"):
        parse_request(raw)


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=2_000_000),
    st.floats(),
    st.sampled_from([0.0, 64.0, 1024.5, 86400.01, 1_000_001, 2**64]),
    st.sampled_from(["", "x", "none", "none\n", "runc", "python", "256m", "12q", "/abs", "/a:b", "rel", "ro", "rwx"]),
    st.sampled_from(["gateway/sandbox-python:3.11-bookworm", "Bad Image", "agent-1", "A_B", "1BAD", "\ud800"]),
)
_JSON = st.recursive(
    _SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=6
)
_LIMIT_NAMES = ["memory", "cpus", "pids", "timeout_s", "output_bytes", "output_files_bytes", "tmpfs", "swap"]
_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "code": _SCALARS,
    "language": _SCALARS,
    "image": _SCALARS,
    "limits": st.one_of(st.dictionaries(st.sampled_from(_LIMIT_NAMES), _SCALARS, max_size=4), _SCALARS),
    "network": _SCALARS,
    "runtime": _SCALARS,
    "mounts": st.lists(st.dictionaries(st.sampled_from(["source", "target", "mode", "x"]), _SCALARS), max_size=3),
    "files": st.dictionaries(st.sampled_from(["a.txt", "", "x/y"]), _SCALARS, max_size=3),
    "env": st.dictionaries(st.sampled_from(["A", "A_B", "1BAD", "B\n"]), _SCALARS, max_size=3),
    "principal": _SCALARS,
    "metadata": _JSON,
    "bogus": _SCALARS,
}


@st.composite
def _request_like(draw: st.DrawFn) -> dict[str, Any]:
    chosen = draw(st.lists(st.sampled_from(sorted(_FIELDS)), unique=True, max_size=6))
    doc = {name: draw(_FIELDS[name]) for name in chosen}
    if draw(st.booleans()):
        doc["code"] = "print(1)"
    return doc


@settings(max_examples=500, deadline=None)
@given(st.one_of(_request_like(), _JSON))
def test_request_like_documents_are_accepted_whole_or_refused_with_paths(doc: Any) -> None:
    try:
        req = parse_request(doc)
    except RequestError as exc:
        problems = exc.problems
    else:
        assert not schema_problems(doc)
        assert parse_request(req.to_dict()) == req
        return
    assert problems
    assert all(p.path.startswith("$") and p.code for p in problems)

"""What an invalid request can cost: a document with more values than any valid request holds is refused
before the schema is asked, and an invalid one's report names at most MAX_PROBLEMS problems."""

from __future__ import annotations

import json

import pytest

from gateway.errors import RequestError
from gateway.request import MAX_METADATA_BYTES, MAX_PROBLEMS, MAX_VALUES, parse_request


def _largest_valid_request() -> dict[str, object]:
    """Every bounded collection of the request schema at its largest: files (10,000, binary: three values each),
    env (1,024), mounts (32), metadata holding as many values as 16 KiB of compact JSON can (nested lists of
    small integers)."""
    metadata: dict[str, object] = {}
    while True:
        key = f"{len(metadata):x}"
        trial = {**metadata, key: [[0] * 63 + [[0] * 64]] + [[0] * 64] * 62}
        if len(json.dumps(trial, separators=(",", ":"))) > MAX_METADATA_BYTES:
            break
        metadata = trial
    return {
        "code": "print(1)",
        "files": {f"f{i}.bin": {"content": "", "encoding": "base64"} for i in range(10_000)},
        "env": {f"E{i}": "" for i in range(1024)},
        "mounts": [{"source": f"/data/{i}", "target": f"/m/{i}", "mode": "ro"} for i in range(32)],
        "limits": {"memory": "256m", "cpus": 1, "pids": 64, "timeout_s": 10, "output_bytes": 65536},
        "metadata": metadata,
    }


def _values(doc: object) -> int:
    if isinstance(doc, dict):
        return 1 + sum(_values(v) for v in doc.values())
    if isinstance(doc, list):
        return 1 + sum(_values(v) for v in doc)
    return 1


def test_the_largest_valid_request_is_within_the_value_bound() -> None:
    doc = _largest_valid_request()
    assert _values(doc) <= MAX_VALUES
    assert parse_request(json.dumps(doc)).files  # accepted, nothing refused for its size in values


@pytest.mark.parametrize(
    "doc",
    [
        {"code": "x", "metadata": {"a": [[] for _ in range(MAX_VALUES)]}},
        {"code": "x", "mounts": [{"source": 1} for _ in range(MAX_VALUES)]},
        {"code": [[] for _ in range(MAX_VALUES)]},
    ],
    ids=["metadata", "mounts", "code"],
)
def test_more_values_than_any_valid_request_is_one_problem_before_the_schema(doc: dict[str, object]) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request(json.dumps(doc))
    (problem,) = caught.value.problems
    assert problem.path == "$"
    assert problem.code == "request.too_many_values"
    assert f"more than {MAX_VALUES} JSON values" in problem.message


def test_an_invalid_request_reports_at_most_max_problems_and_says_how_many_it_left_out() -> None:
    doc = {"code": "x", "env": {f"E{i}": i for i in range(1000)}}  # 1,000 type errors, well within MAX_VALUES
    with pytest.raises(RequestError) as caught:
        parse_request(json.dumps(doc))
    problems = caught.value.problems
    assert len(problems) == MAX_PROBLEMS + 1
    assert all(p.code == "request.schema" for p in problems[:-1])
    assert problems[-1].code == "request.more_problems"
    assert problems[-1].path == "$"
    assert f"only the first {MAX_PROBLEMS}" in problems[-1].message


def test_a_request_with_few_problems_reports_every_one() -> None:
    doc = {"code": "x", "env": {f"E{i}": i for i in range(MAX_PROBLEMS)}}
    with pytest.raises(RequestError) as caught:
        parse_request(json.dumps(doc))
    assert len(caught.value.problems) == MAX_PROBLEMS
    assert {p.path for p in caught.value.problems} == {f"$.env.E{i}" for i in range(MAX_PROBLEMS)}

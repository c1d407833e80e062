"""Binary request files: base64 at intake (strict, sized before decoding), bytes to the sandbox, digests in the
trail; and the files a run wrote, with their contents, in the LLM tool's answer."""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.cli.run_cmd import build_request, register
from gateway.client import _content
from gateway.errors import RequestError
from gateway.policy import load_policy
from gateway.request import BinaryFile, parse_request
from gateway.resources import default_policy_path
from gateway.runner.fake import FakeRunner, make_outcome
from gateway.tool import MAX_TOOL_FILES_CHARS, TOOL_NAME, ToolHandler

EVERY_BYTE = bytes(range(256))


def b64(data: bytes) -> dict[str, str]:
    return {"content": base64.b64encode(data).decode("ascii"), "encoding": "base64"}


@pytest.fixture
def runner() -> FakeRunner:
    return FakeRunner()


@pytest.fixture
def sink() -> MemoryAuditSink:
    return MemoryAuditSink()


@pytest.fixture
def gw(runner: FakeRunner, sink: MemoryAuditSink) -> Gateway:
    return Gateway(load_policy(default_policy_path()), runner=runner, audit=sink)


def refusal(request: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(RequestError) as caught:
        parse_request(json.dumps(request))
    return [(p.path, p.message) for p in caught.value.problems]


# --- intake ----------------------------------------------------------------------------------------------


def test_a_base64_file_is_accepted_beside_a_text_file_and_sized_by_its_decoded_bytes() -> None:
    request = parse_request(json.dumps({"code": "x", "files": {"in/a.bin": b64(EVERY_BYTE), "b.txt": "hé"}}))
    assert request.files["b.txt"] == "hé"
    assert request.files["in/a.bin"] == BinaryFile(base64.b64encode(EVERY_BYTE).decode())
    assert request.files_bytes == 256 + 3
    assert request.file_contents() == {"in/a.bin": EVERY_BYTE, "b.txt": "hé".encode()}


@pytest.mark.parametrize("size", [0, 1, 2, 3, 4, 5, 6])
def test_the_decoded_size_is_known_from_the_length_for_every_padding(size: int) -> None:
    binary = parse_request({"code": "x", "files": {"a": b64(EVERY_BYTE[:size])}}).files["a"]
    assert isinstance(binary, BinaryFile)
    assert binary.size == size
    assert binary.decode() == EVERY_BYTE[:size]


def test_the_python_api_takes_bytes_and_records_them_as_base64() -> None:
    request = parse_request({"code": "x", "files": {"a.bin": EVERY_BYTE, "b.bin": bytearray(b"\x00")}})
    assert request.file_contents() == {"a.bin": EVERY_BYTE, "b.bin": b"\x00"}
    assert request.to_dict()["files"] == {"a.bin": b64(EVERY_BYTE), "b.bin": b64(b"\x00")}
    assert parse_request(request.to_dict()) == request  # the recorded form reads back the same


def test_bytes_are_taken_only_as_file_contents() -> None:
    with pytest.raises(RequestError, match="bytes is not a JSON type"):
        parse_request({"code": "x", "metadata": {"files": {"a": b"x"}}})


@pytest.mark.parametrize(
    "content",
    [
        "AAE",  # not a multiple of 4
        "AAE=AAE=",  # padding inside
        "A===",
        "AAF=",  # bits set beyond the data (AAE= is the canonical form)
        "AB==",  # likewise (AA==)
        "AAEC\n",  # a line break, even last (Python's "$" matches before it)
        "AAE=\n",
        "AA EC",
        "AA-_",  # the URL-safe alphabet is another encoding
    ],
)
def test_base64_that_is_not_canonical_is_refused_at_its_path(content: str) -> None:
    request = {"code": "x", "files": {"in/a.bin": {"content": content, "encoding": "base64"}}}
    [(path, message)] = refusal(request)
    assert path == "$.files['in/a.bin'].content"
    assert "is not canonical base64" in message


def test_an_unknown_encoding_is_refused_with_the_allowed_values() -> None:
    [(path, message)] = refusal({"code": "x", "files": {"a": {"content": "AA==", "encoding": "hex"}}})
    assert path == "$.files.a.encoding"
    assert "'hex' is not a known encoding; allowed: base64" in message


@pytest.mark.parametrize(
    ("value", "path", "says"),
    [
        ({"content": "AA=="}, "$.files.a", "'encoding' is required"),
        ({"encoding": "base64"}, "$.files.a", "'content' is required"),
        ({"content": "AA==", "encoding": "base64", "mode": "0755"}, "$.files.a.mode", "unknown field 'mode'"),
        ({"content": 1, "encoding": "base64"}, "$.files.a.content", "is not of type 'string'"),
        (["AA=="], "$.files.a", "is not of type 'string', 'object'"),
    ],
)
def test_a_malformed_file_object_is_refused(value: Any, path: str, says: str) -> None:
    [(got_path, message)] = refusal({"code": "x", "files": {"a": value}})
    assert got_path == path
    assert says in message


# --- the decision, the sandbox and the trail ----------------------------------------------------------------


def test_the_files_size_cap_counts_decoded_bytes(gw: Gateway, runner: FakeRunner) -> None:
    cap = int(gw.policy.limits.files_size.max)  # 1m in the default policy; base64 of it is 4/3 larger
    fits = gw.execute({"code": "x", "files": {"a.bin": b64(b"\xff" * cap)}})
    assert fits.allowed, fits.to_dict()["violations"]
    over = gw.execute({"code": "x", "files": {"a.bin": b64(b"\xff" * (cap - 1)), "b.txt": "é"}})
    assert not over.allowed
    assert [v["rule"] for v in over.to_dict()["violations"]] == ["limits.files_size"]
    assert len(runner.calls) == 1


def test_the_file_count_cap_applies_to_binary_files(gw: Gateway) -> None:
    count = gw.policy.files.max_count + 1
    result = gw.execute({"code": "x", "files": {f"f{i}": b"\x00" for i in range(count)}})
    assert [v["rule"] for v in result.to_dict()["violations"]] == ["files.path"]


@pytest.mark.parametrize("name", ["../up.bin", "/abs.bin", "a/../../b.bin", "a\\b.bin", "main.py", "out", "a\x00b"])
def test_name_tricks_with_binary_content_are_denied_and_nothing_runs(
    gw: Gateway, runner: FakeRunner, name: str
) -> None:
    result = gw.execute({"code": "x", "files": {name: EVERY_BYTE}})
    assert not result.allowed
    assert "files.path" in [v["rule"] for v in result.to_dict()["violations"]]
    assert runner.calls == []


def test_the_sandbox_gets_the_bytes_and_the_trail_their_digest(
    gw: Gateway, runner: FakeRunner, sink: MemoryAuditSink
) -> None:
    result = gw.execute({"code": "x", "files": {"a.bin": EVERY_BYTE, "t.txt": "é"}})
    assert result.ran
    [(_spec, payload)] = runner.calls
    assert payload.files == {"a.bin": EVERY_BYTE, "t.txt": "é".encode()}
    [received] = [r for r in sink.records if r["event_type"] == "request.received"]
    assert received["data"]["request"]["files"] == [
        {"name": "a.bin", "sha256": hashlib.sha256(EVERY_BYTE).hexdigest(), "bytes": 256, "encoding": "base64"},
        {"name": "t.txt", "sha256": hashlib.sha256("é".encode()).hexdigest(), "bytes": 2},
    ]
    assert base64.b64encode(EVERY_BYTE).decode() not in json.dumps(sink.records)  # contents never kept


# --- the client and the CLI --------------------------------------------------------------------------------


def test_the_client_sends_bytes_as_base64() -> None:
    body = json.loads(_content({"code": "x", "files": {"a.bin": EVERY_BYTE, "t.txt": "hi"}}))
    assert body["files"] == {"a.bin": b64(EVERY_BYTE), "t.txt": "hi"}


def test_the_cli_sends_a_binary_file_as_base64_and_text_as_text(tmp_path: Any) -> None:
    (tmp_path / "a.bin").write_bytes(EVERY_BYTE)
    (tmp_path / "t.txt").write_bytes(b"line\r\n")
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        ["run", "--code", "x", "--file", str(tmp_path / "a.bin"), "--file", f"{tmp_path / 't.txt'}:in/t.txt"]
    )
    request = build_request(args)
    assert request["files"] == {"a.bin": b64(EVERY_BYTE), "in/t.txt": "line\r\n"}
    assert parse_request(request).file_contents()["a.bin"] == EVERY_BYTE


# --- the LLM tool's answer ------------------------------------------------------------------------------


def test_the_tool_answer_carries_the_files_contents(gw: Gateway, runner: FakeRunner) -> None:
    runner.outcome = make_outcome(files={"plot.png": EVERY_BYTE, "report.txt": "héllo".encode()})
    answer = ToolHandler(gw)(TOOL_NAME, {"code": "x"})
    assert answer["files"] == [
        {"path": "plot.png", "bytes": 256, "encoding": "base64", "content": b64(EVERY_BYTE)["content"],
         "truncated": False},
        {"path": "report.txt", "bytes": 6, "encoding": "utf-8", "content": "héllo", "truncated": False},
    ]  # fmt: skip
    assert answer["files_truncated"] is False
    json.dumps(answer)


def test_the_tool_answer_bounds_the_contents_and_says_what_was_cut(gw: Gateway, runner: FakeRunner) -> None:
    big = bytes(range(256)) * (MAX_TOOL_FILES_CHARS // 256)  # its base64 is 4/3 of the budget
    runner.outcome = make_outcome(files={"a.bin": big, "b.txt": b"after", "c.txt": b""})
    answer = ToolHandler(gw)(TOOL_NAME, {"code": "x"})
    first, second, third = answer["files"]
    assert first["bytes"] == len(big)
    shown = (MAX_TOOL_FILES_CHARS - len("a.bin") - len("b.txt") - len("c.txt")) // 4 * 4  # the names count too
    assert len(first["content"]) == shown
    assert first["truncated"] is True
    assert base64.b64decode(first["content"], validate=True) == big[: shown // 4 * 3]
    # named, with its size; the few characters the base64 cut left over are all of it shown
    assert (second["content"], second["truncated"]) == ("after"[: MAX_TOOL_FILES_CHARS - 15 - shown], True)
    assert (third["content"], third["truncated"]) == ("", False)  # empty: nothing was cut
    assert answer["files_truncated"] is True


def test_the_tool_answer_bounds_the_names_too(gw: Gateway, runner: FakeRunner) -> None:
    name_chars = 200
    count = MAX_TOOL_FILES_CHARS // name_chars + 10
    runner.outcome = make_outcome(files={f"{i:04d}".ljust(name_chars, "n"): b"" for i in range(count)})
    answer = ToolHandler(gw)(TOOL_NAME, {"code": "x"})
    assert len(answer["files"]) == MAX_TOOL_FILES_CHARS // name_chars
    assert answer["files_omitted"] == 10
    assert answer["files_truncated"] is True
    assert len(json.dumps(answer["files"])) < 2 * MAX_TOOL_FILES_CHARS


def test_the_tool_answer_passes_on_the_policys_cut(gw: Gateway, runner: FakeRunner) -> None:
    runner.outcome = make_outcome(files={"a.txt": b"a"}, files_truncated=True)
    answer = ToolHandler(gw)(TOOL_NAME, {"code": "x"})
    assert answer["files"][0]["truncated"] is False
    assert answer["files_truncated"] is True

"""Binary files both ways on the real engine: every byte value in through a request, out through the result,
the LLM tool's answer, MCP and the HTTP client, byte for byte, with the trail's digests over the bytes.

Under runc (the default policy) and runsc (the strict policy, which requires gVisor).
"""

from __future__ import annotations

import base64
import hashlib
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from mcp import Client as McpClient

from gateway import Gateway
from gateway.audit import verify_trail
from gateway.client import Client
from gateway.resources import policies_dir
from gateway.service.mcp import build_server
from gateway.tool import TOOL_NAME, ToolHandler
from tests.integration.conftest import gateway_containers

if TYPE_CHECKING:
    from collections.abc import Callable

    from conftest import Server

pytestmark = pytest.mark.integration

EVERY_BYTE = bytes(range(256))
BLOB = EVERY_BYTE * 64  # 16 KiB: every byte value, every position modulo 256
PROGRAM = textwrap.dedent(
    """
    data = open("in/blob.bin", "rb").read()
    assert data == bytes(range(256)) * 64, len(data)
    open("out/reversed.bin", "wb").write(data[::-1])
    open("out/every.bin", "wb").write(bytes(range(256)))
    open("out/note.txt", "w").write("héllo")
    print(len(data))
    """
)
WRITES_EVERY_BYTE = "open('out/every.bin', 'wb').write(bytes(range(256)))"


def _records(audit_dir: Path, event_type: str) -> list[dict[str, Any]]:
    lines = (line for seg in sorted(audit_dir.glob("*.jsonl")) for line in seg.read_text().splitlines())
    return [r for r in map(json.loads, lines) if r["event_type"] == event_type]


def _decoded(entry: dict[str, Any]) -> bytes:
    if entry["encoding"] == "base64":
        return base64.b64decode(entry["content"], validate=True)
    return str(entry["content"]).encode("utf-8")


@pytest.fixture
def gateway(runtime: str, tmp_path: Path, engine: Any) -> Iterator[Gateway]:
    policy = policies_dir() / ("strict.yaml" if runtime == "runsc" else "default.yaml")
    with Gateway.from_env(policy, tmp_path / "audit") as gw:
        yield gw
    assert gateway_containers(engine) == []


def test_a_binary_file_goes_in_and_comes_out_byte_identical(gateway: Gateway, tmp_path: Path, runtime: str) -> None:
    result = gateway.execute({"code": PROGRAM, "runtime": runtime, "files": {"in/blob.bin": BLOB, "t.txt": "é"}})
    data = result.to_dict()
    assert data["exit_code"] == 0, data["stderr"]
    assert result.decision is not None
    assert result.decision.run is not None
    assert result.decision.run.options["runtime"] == runtime
    assert data["stdout"] == f"{len(BLOB)}\n"
    files = {entry["path"]: entry for entry in data["files"]}
    assert {path: _decoded(entry) for path, entry in files.items()} == {
        "every.bin": EVERY_BYTE,
        "note.txt": "héllo".encode(),
        "reversed.bin": BLOB[::-1],
    }
    assert [files[p]["encoding"] for p in ("every.bin", "note.txt", "reversed.bin")] == ["base64", "utf-8", "base64"]
    assert data["files_truncated"] is False

    audit_dir = tmp_path / "audit"
    [received] = _records(audit_dir, "request.received")
    assert received["data"]["request"]["files"] == [
        {"name": "in/blob.bin", "sha256": hashlib.sha256(BLOB).hexdigest(), "bytes": len(BLOB), "encoding": "base64"},
        {"name": "t.txt", "sha256": hashlib.sha256("é".encode()).hexdigest(), "bytes": 2},
    ]
    [outcome] = _records(audit_dir, "execution.outcome")
    digests = {f["name"]: (f["sha256"], f["bytes"]) for f in outcome["data"]["files"]}
    assert digests["every.bin"] == (hashlib.sha256(EVERY_BYTE).hexdigest(), 256)
    assert digests["reversed.bin"] == (hashlib.sha256(BLOB[::-1]).hexdigest(), len(BLOB))
    assert verify_trail(audit_dir).ok


def test_the_tool_and_mcp_answers_return_a_written_binary_file(gateway: Gateway) -> None:
    handler = ToolHandler(gateway)
    answer = handler(TOOL_NAME, {"code": WRITES_EVERY_BYTE})
    assert answer["ok"] is True, answer
    [entry] = answer["files"]
    assert (entry["path"], entry["bytes"], entry["encoding"], entry["truncated"]) == ("every.bin", 256, "base64", False)
    assert _decoded(entry) == EVERY_BYTE

    server = build_server(handler, max_concurrent=1)

    async def call() -> Any:
        async with McpClient(server) as client:
            return await client.call_tool(TOOL_NAME, {"code": WRITES_EVERY_BYTE})

    ran = anyio.run(call)
    assert ran.is_error is False
    [entry] = ran.structured_content["files"]
    assert _decoded(entry) == EVERY_BYTE


def test_the_http_client_sends_bytes_and_gets_them_back(serve: Callable[..., Server], engine: Any) -> None:
    server = serve(max_body_bytes=1 << 20)
    with Client(server.url, server.tokens["alice"]) as client:
        result = client.execute({"code": PROGRAM, "files": {"in/blob.bin": BLOB}})
    data = result.to_dict()
    assert data["exit_code"] == 0, data["stderr"]
    files = {entry["path"]: _decoded(entry) for entry in data["files"]}
    assert files["every.bin"] == EVERY_BYTE
    assert files["reversed.bin"] == BLOB[::-1]
    [received] = server.records("request.received")
    [blob] = received["data"]["request"]["files"]
    assert (blob["sha256"], blob["bytes"], blob["encoding"]) == (hashlib.sha256(BLOB).hexdigest(), len(BLOB), "base64")


def test_a_name_trick_with_binary_content_runs_nothing(gateway: Gateway, engine: Any) -> None:
    before = gateway_containers(engine)
    result = gateway.execute({"code": "print(1)", "files": {"../escape.bin": EVERY_BYTE, "/abs.bin": b"\x00"}})
    assert not result.allowed
    assert {v["rule"] for v in result.to_dict()["violations"]} == {"files.path"}
    assert result.outcome is None
    assert gateway_containers(engine) == before

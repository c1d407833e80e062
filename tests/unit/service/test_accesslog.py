"""gateway.service.accesslog: the line of each request (text and JSON), the request id it shares with the
response, the principal from the scope, and a client's path that cannot forge a line."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.types import Message, Receive, Scope, Send

from gateway.service.accesslog import AccessLog, AccessRecord

ARRIVED = datetime(2025, 6, 1, 12, 0, 0, 123456, tzinfo=UTC)
KEYS = ("time", "request_id", "principal", "method", "path", "status", "duration_ms")


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lines() -> Iterator[tuple[logging.Logger, list[str]]]:
    logger = logging.getLogger("test.accesslog")
    handler = Lines()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield logger, handler.lines
    logger.removeHandler(handler)


def answering(status: int, headers: list[tuple[bytes, bytes]], *, user: Any = None) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if user is not None:
            scope["user"] = user  # as the service's authentication sets it
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"{}"})

    return app


def call(app: Any, *, path: bytes = b"/v1/policy", method: str = "GET") -> list[Message]:
    scope = {"type": "http", "method": method, "path": path.decode("latin-1"), "raw_path": path, "headers": []}
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent


def timer(*readings: float) -> Any:
    values = iter(readings)
    return lambda: next(values)


def test_a_text_line_has_time_request_id_principal_method_path_status_and_ms(
    lines: tuple[logging.Logger, list[str]],
) -> None:
    logger, out = lines
    app = answering(200, [(b"x-request-id", b"abc123")], user=SimpleNamespace(principal="alice"))
    call(AccessLog(app, logger=logger, clock=lambda: ARRIVED, timer=timer(10.0, 10.8124)))
    assert out == ["2025-06-01T12:00:00.123Z abc123 alice GET /v1/policy 200 812.4"]


def test_a_json_line_has_the_same_fields(lines: tuple[logging.Logger, list[str]]) -> None:
    logger, out = lines
    arrived = datetime(2025, 6, 1, 14, 0, 0, 5000, tzinfo=timezone(timedelta(hours=2)))  # stated in UTC
    app = answering(403, [(b"x-request-id", b"abc123")], user=SimpleNamespace(principal="bob"))
    call(AccessLog(app, format="json", logger=logger, clock=lambda: arrived, timer=timer(1.0, 1.5)), method="POST")
    fields = ("2025-06-01T12:00:00.005Z", "abc123", "bob", "POST", "/v1/policy", 403, 500.0)
    assert [json.loads(line) for line in out] == [dict(zip(KEYS, fields, strict=True))]


def test_no_principal_is_a_dash_in_text_and_null_in_json(lines: tuple[logging.Logger, list[str]]) -> None:
    logger, out = lines
    unauthenticated = SimpleNamespace(is_authenticated=False)  # Starlette's UnauthenticatedUser has no principal
    for format in ("text", "json"):
        app = answering(401, [(b"x-request-id", b"r1")], user=unauthenticated)
        call(AccessLog(app, format=format, logger=logger, clock=lambda: ARRIVED, timer=timer(0.0, 0.001)))
    assert out[0].split(" ")[2] == "-"
    assert json.loads(out[1])["principal"] is None


def test_a_response_without_a_request_id_gets_one_and_the_line_names_it(
    lines: tuple[logging.Logger, list[str]],
) -> None:
    logger, out = lines
    sent = call(AccessLog(answering(200, [(b"content-type", b"application/json")]), logger=logger))
    headers = dict(sent[0]["headers"])
    assert headers[b"content-type"] == b"application/json"
    request_id = headers[b"x-request-id"].decode()
    assert len(request_id) == 32
    assert out[0].split(" ")[1] == request_id


def test_a_path_cannot_forge_a_line_or_a_field(lines: tuple[logging.Logger, list[str]]) -> None:
    logger, out = lines
    forged = b'/a b\n2025-01-01T00:00:00.000Z x admin GET /v1 200 1.0"\\\xff'
    call(AccessLog(answering(404, [(b"x-request-id", b"r2")]), logger=logger), path=forged)
    (line,) = out
    fields = line.split(" ")
    assert len(fields) == 7
    assert fields[4] == "/a%20b%0A2025-01-01T00:00:00.000Z%20x%20admin%20GET%20/v1%20200%201.0%22%5C%FF"


def test_an_application_that_sends_nothing_is_logged_without_a_status(lines: tuple[logging.Logger, list[str]]) -> None:
    logger, out = lines

    async def gone(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("the client went away")

    with pytest.raises(RuntimeError):
        call(AccessLog(gone, logger=logger, format="json"))
    record = json.loads(out[0])
    assert (record["status"], record["request_id"], record["principal"]) == (None, "-", None)


def test_the_lifespan_passes_through_unlogged(lines: tuple[logging.Logger, list[str]]) -> None:
    logger, out = lines
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def nothing() -> Message:
        return {}

    async def drop(message: Message) -> None:
        return None

    asyncio.run(AccessLog(app, logger=logger)({"type": "lifespan"}, nothing, drop))
    assert (seen, out) == (["lifespan"], [])


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="'xml'"):
        AccessLog(answering(200, []), format="xml")


def test_the_record_fields_are_the_json_keys() -> None:
    record = AccessRecord("t", "r", None, "GET", "/", None, 0.0)
    assert tuple(json.loads(record.line("json"))) == KEYS
    assert record.line("text") == "t r - GET / - 0.0"

"""The operator-only endpoints (``GET /metrics``, ``GET /v1/audit/records``) on a real server, engine and trail.

alice and bob (agents) and olga (an operator, added here to the shared principals file) talk to a real uvicorn
server; the runs are real sandboxes, the records are read back from the trail's files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.audit.canonical import digest, split_line
from gateway.audit.query import query_trail
from gateway.audit.records import view_record
from gateway.resources import policies_dir
from gateway.service.principals import PrincipalsStore

if TYPE_CHECKING:
    from conftest import Server

pytestmark = pytest.mark.usefixtures("engine")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def operated(principals_file: tuple[Path, dict[str, str]], serve: Callable[..., Server]) -> tuple[Server, str]:
    """A server whose principals file also holds olga, an operator; and olga's token."""
    token = PrincipalsStore(principals_file[0]).add(
        "olga", policy=str(policies_dir() / "default.yaml"), role="operator"
    )
    return serve(), token


def _scrape(server: Server, token: str) -> Samples:
    with server.client(token) as client:
        response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    assert response.headers["x-request-id"]
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_operator_metrics_move_with_a_real_run_a_denial_and_a_decision(operated: tuple[Server, str]) -> None:
    server, olga = operated
    before = _scrape(server, olga)
    assert _value(before, "gateway_running_executions") == 0
    assert _value(before, "gateway_queue_depth") == 0
    with server.client(server.tokens["alice"]) as alice:
        ran = alice.post("/v1/executions", json={"code": "print(2+2)"})
        assert ran.status_code == 200, ran.text
        assert ran.json()["stdout"] == "4\n"
        denied = alice.post("/v1/executions", json={"code": "print(1)", "limits": {"timeout_s": 3600}})
        assert denied.status_code == 403, denied.text
        rules = {v["rule"] for v in denied.json()["violations"]}
        decided = alice.post("/v1/decisions", json={"code": "print(1)", "limits": {"timeout_s": 3600}})
        assert decided.status_code == 200
        assert decided.json()["allowed"] is False
    after = _scrape(server, olga)

    def moved(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    executions = {"endpoint": "/v1/executions", "status_class": "2xx", "status": "200"}
    assert moved("gateway_http_requests_total", **executions) == 1
    assert moved("gateway_http_requests_total", endpoint="/v1/executions", status_class="4xx", status="403") == 1
    assert moved("gateway_http_requests_total", endpoint="/v1/decisions", status_class="2xx", status="200") == 1
    # the scrape before is itself counted by the time of the scrape after
    assert moved("gateway_http_requests_total", endpoint="/metrics", status_class="2xx", status="200") == 1
    assert moved("gateway_execution_seconds_count", status="200") == 1
    assert moved("gateway_execution_seconds_sum", status="200") > 0
    assert moved("gateway_execution_seconds_bucket", status="200", le="+Inf") == 1
    assert moved("gateway_execution_seconds_count", status="403") == 1
    assert moved("gateway_decision_seconds_count", status="200") == 1
    assert rules
    for rule in rules:
        assert moved("gateway_denials_total", rule=rule, dry_run="false") == 1
        assert moved("gateway_denials_total", rule=rule, dry_run="true") == 1
    assert _value(after, "gateway_running_executions") == 0
    assert _value(after, "gateway_queue_depth") == 0


def test_services_in_one_process_keep_their_own_metrics(
    operated: tuple[Server, str], serve: Callable[..., Server]
) -> None:
    first, olga = operated
    second = serve(audit_dir=first.audit_dir.parent / "audit-2")
    with first.client(first.tokens["alice"]) as alice:
        assert alice.get("/v1/policy").status_code == 200
    policy = {"endpoint": "/v1/policy", "status_class": "2xx", "status": "200"}
    assert _value(_scrape(first, olga), "gateway_http_requests_total", **policy) == 1
    assert _value(_scrape(second, olga), "gateway_http_requests_total", **policy) == 0


@pytest.mark.parametrize("path", ["/metrics", "/v1/audit/records"])
def test_agents_get_403_audited_and_no_token_gets_401(operated: tuple[Server, str], path: str) -> None:
    server, _olga = operated
    with server.client(server.tokens["alice"]) as alice:
        response = alice.get(path)
    assert response.status_code == 403, response.text
    body = response.json()
    assert body["code"] == "auth.forbidden"
    assert body["request_id"] == response.headers["x-request-id"]
    assert "Traceback" not in response.text
    (record,) = server.records("auth.forbidden")
    assert record["principal"] == "alice"
    assert record["request_id"] == body["request_id"]
    assert record["data"]["path"] == path
    assert record["data"]["role"] == "agent"
    assert record["data"]["token_id"] == server.tokens["alice"].split("_")[1]
    assert all(server.tokens["alice"] not in p.read_text() for p in server.audit_dir.glob("trail-*.jsonl"))
    with server.client() as anonymous:
        unauthenticated = anonymous.get(path)
    assert unauthenticated.status_code == 401
    assert unauthenticated.json()["code"] == "auth.failed"
    assert unauthenticated.headers["WWW-Authenticate"].startswith("Bearer")


def _stream(server: Server, token: str, params: Any) -> tuple[list[bytes], list[dict[str, Any]]]:
    """The lines of GET /v1/audit/records, each checked: its stored hash is the hash of its body."""
    lines: list[bytes] = []
    with server.client(token) as client, client.stream("GET", "/v1/audit/records", params=params) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("application/x-ndjson")
        for line in response.iter_lines():
            lines.append(line.encode())
    records = []
    for line in lines:
        body, stored, _mac = split_line(line)
        assert digest(body) == stored  # the line is the trail's own bytes: its hash still checks
        record = json.loads(line)
        view_record(record)  # and it has the shape of schemas/audit-record.schema.json
        records.append(record)
    return lines, records


def _ids(records: Any) -> list[str]:
    return [r["event_id"] for r in records]


def test_audit_records_filter_and_stream_verifiable_lines(operated: tuple[Server, str]) -> None:
    server, olga = operated
    with server.client(server.tokens["alice"]) as alice, server.client(server.tokens["bob"]) as bob:
        assert alice.post("/v1/executions", json={"code": "print(2+2)"}).status_code == 200
        assert alice.post("/v1/decisions", json={"code": "print(1)", "limits": {"timeout_s": 3600}}).status_code == 200
        assert bob.post("/v1/decisions", json={"code": "print(1)"}).status_code == 200
    trail = list(query_trail(server.audit_dir))

    _lines, everything = _stream(server, olga, {})
    assert _ids(everything) == _ids(trail)  # nothing filtered: the whole trail, in order

    _lines, denials = _stream(server, olga, {"decision": "deny"})
    assert denials
    assert all(r["event_type"] == "policy.decision" and r["principal"] == "alice" for r in denials)
    assert _ids(denials) == _ids(query_trail(server.audit_dir, decision="deny"))

    _lines, bobs = _stream(server, olga, {"principal": "bob"})
    assert bobs
    assert {r["principal"] for r in bobs} == {"bob"}
    assert _ids(bobs) == _ids(query_trail(server.audit_dir, principal="bob"))

    kinds = {"execution.outcome", "gateway.start"}
    _lines, typed = _stream(server, olga, [("event_type", kind) for kind in sorted(kinds)])
    assert {r["event_type"] for r in typed} == kinds
    assert _ids(typed) == _ids(query_trail(server.audit_dir, event_types=kinds))

    middle = trail[len(trail) // 2]["timestamp"]
    _lines, recent = _stream(server, olga, {"since": middle, "principal": "alice"})
    assert recent
    assert all(r["timestamp"] >= middle and r["principal"] == "alice" for r in recent)
    assert _ids(recent) == _ids(query_trail(server.audit_dir, since=middle, principal="alice"))

    _lines, none = _stream(server, olga, {"principal": "nobody"})
    assert none == []


@pytest.mark.parametrize(
    ("params", "names"),
    [
        ({"decision": "maybe"}, {"decision"}),
        ({"since": "yesterday"}, {"since"}),
        ({"event_type": "no.such"}, {"event_type"}),
        ({"dry_run": "perhaps"}, {"dry_run"}),
        ({"colour": "blue"}, {"colour"}),
        ({"until": "2026-13-40", "decision": "nope"}, {"until", "decision"}),
    ],
)
def test_a_bad_filter_is_a_422_naming_the_parameter(
    operated: tuple[Server, str], params: dict[str, str], names: set[str]
) -> None:
    server, olga = operated
    with server.client(olga) as client:
        response = client.get("/v1/audit/records", params=params)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] == "request.invalid"
    assert {e["path"] for e in body["errors"]} == {f"$.query.{name}" for name in names}
    for name in names:
        assert name in body["message"]

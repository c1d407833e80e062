"""Fuzz the HTTP API with schemathesis against the OpenAPI document the REAL server serves.

One server on a loopback port (real engine, real trail, a real agent's and a real operator's token). Every
operation of ``GET /openapi.json`` but ``/mcp`` is exercised with schemathesis' schema-valid requests (positive
data); every response must be no 5xx, have a documented status, content type and headers, a body valid against
the documented schema (the JSON Schemas in ``schemas/``), and no schema-valid request may be refused as invalid
(``positive_data_acceptance``; 401, 403 and 429 stay allowed: the caller's policy may deny what the schema
allows). Bounded: a fixed number of examples per operation, fewer for ``/v1/executions``, whose allowed
requests start real containers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, NamedTuple

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import positive_data_acceptance
from servers import one_principal, start

from gateway.request import MAX_METADATA_BYTES
from gateway.resources import policies_dir
from gateway.service.config import ServerConfig
from gateway.service.principals import PrincipalsStore

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("engine"), pytest.mark.slow]

MAX_BODY_BYTES = 64 * 1024


class Live(NamedTuple):
    url: str
    agent: str
    """An agent's token (policies/default.yaml)."""
    operator: str
    """An operator's token, for /metrics and /v1/audit/records."""
    sessions: str
    """An agent's token under policies/examples/sessions.yaml (the default policy plus both session modes)."""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, engine: Any) -> Iterator[Live]:
    directory = tmp_path_factory.mktemp("fuzz")
    principals, token = one_principal(directory)
    operator = PrincipalsStore(principals).add("olga", policy=str(policies_dir() / "default.yaml"), role="operator")
    sessions = PrincipalsStore(principals).add("sam", policy=str(policies_dir() / "examples" / "sessions.yaml"))
    config = ServerConfig(principals=principals, audit_dir=directory / "audit", max_body_bytes=MAX_BODY_BYTES)
    port, _service, stop = start(config)
    try:
        yield Live(f"http://127.0.0.1:{port}", token, operator, sessions)
    finally:
        stop()


EXAMPLES = {"/v1/executions": 6}
"""Allowed execution requests start containers: few of them. Every other operation gets DEFAULT_EXAMPLES."""
DEFAULT_EXAMPLES = 40
OPERATOR_PATHS = ("/v1/audit/records", "/metrics", "/v1/reload")
"""Operator-only endpoints, fuzzed with the operator's token (an agent's gets 403 whatever it sends)."""


def _operations(url: str) -> list[Any]:
    # from_dict, not from_url: schemathesis leaves out the operation its schema was loaded from (/openapi.json).
    schema = schemathesis.openapi.from_dict(httpx.get(f"{url}/openapi.json", timeout=10).json())
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/executions", "/v1/decisions", "/v1/policy", "/v1/tools"}
    return operations


def _refused_beyond_the_schema(case: Any) -> int | None:
    """The status of a documented refusal that no JSON Schema can state, when ``case`` meets one; else None.

    Only these two escape ``positive_data_acceptance``, and each must then get exactly its status:

    - a body larger than the server's ``max_body_bytes``: 413 (a byte count of the serialised body, not a shape);
    - ``metadata`` larger than MAX_METADATA_BYTES as compact JSON: 422 (the schema bounds its keys, strings,
      items and nesting, and states the byte cap in metadata's description).
    """
    if not isinstance(case.body, dict):
        return None
    if len(json.dumps(case.body).encode("utf-8")) > MAX_BODY_BYTES:  # as schemathesis' transport serialises it
        return 413
    if "metadata" in case.body:
        compact = json.dumps(case.body["metadata"], separators=(",", ":"), ensure_ascii=False)
        if len(compact.encode("utf-8", "surrogatepass")) > MAX_METADATA_BYTES:
            return 422
    return None


def _fuzz(operation: Any, url: str, token: str, examples: int) -> None:
    """schemathesis' schema-valid cases for ``operation``, each sent to ``url`` with ``token`` and checked by every
    check schemathesis has (no 5xx, status, content type, headers, the body's schema, auth enforced, schema-valid
    data accepted, ...), but for the two refusals of _refused_beyond_the_schema."""

    @given(case=operation.as_strategy())
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case: Any) -> None:
        refused = _refused_beyond_the_schema(case)
        response = case.call_and_validate(
            base_url=url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
            excluded_checks=[positive_data_acceptance] if refused is not None else [],
        )
        if refused is not None:
            assert response.status_code == refused, response.text

    run()


# /mcp is not fuzzed: its body is the MCP specification's JSON-RPC, which the document does not restate, so
# schemathesis could only send requests that the MCP SDK refuses.
@pytest.mark.parametrize(
    "path",
    ["/v1/decisions", "/v1/policy", "/v1/tools", "/healthz", "/readyz", "/openapi.json", *OPERATOR_PATHS],
)
def test_read_and_dry_run_endpoints_conform_to_the_document(live: Live, path: str) -> None:
    (operation,) = [op for op in _operations(live.url) if op.path == path]
    _fuzz(operation, live.url, live.operator if path in OPERATOR_PATHS else live.agent, DEFAULT_EXAMPLES)


def test_executions_conform_to_the_document(live: Live) -> None:
    (operation,) = [op for op in _operations(live.url) if op.path == "/v1/executions"]
    _fuzz(operation, live.url, live.agent, EXAMPLES["/v1/executions"])


SESSION_OPERATIONS = {
    ("POST", "/v1/sessions"): 6,
    ("GET", "/v1/sessions"): DEFAULT_EXAMPLES,
    ("GET", "/v1/sessions/{session_id}"): DEFAULT_EXAMPLES,
    ("DELETE", "/v1/sessions/{session_id}"): DEFAULT_EXAMPLES,
    ("POST", "/v1/sessions/{session_id}/executions"): DEFAULT_EXAMPLES,
}
"""Allowed session requests start a kernel's container or make a workspace (at most two live: the policy's
max_per_principal): few of them. The operations on one session get generated ids, which name no session (404
session.not_found, the answer to an unknown id and to another principal's alike): what they do to a live
session is tested in test_service_sessions.py."""


@pytest.mark.parametrize(("method", "path"), list(SESSION_OPERATIONS))
def test_session_endpoints_conform_to_the_document(live: Live, method: str, path: str) -> None:
    (operation,) = [op for op in _operations(live.url) if (op.method.upper(), op.path) == (method, path)]
    _fuzz(operation, live.url, live.sessions, SESSION_OPERATIONS[(method, path)])


def test_the_served_document_is_the_built_one(live: Live) -> None:
    """Unauthenticated on purpose: the document is the public contract and holds no principal or policy."""
    from gateway.service.openapi import openapi_document

    response = httpx.get(f"{live.url}/openapi.json", timeout=10)
    assert response.status_code == 200
    assert response.json() == openapi_document()


def _validator(name: str) -> Any:
    """A validator for ``schemas/<name>.schema.json`` that resolves the other schema files by their $id."""
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource

    from gateway.resources import load_schema

    files = ("request", "decision", "result", "error", "api")
    registry = Registry().with_resources((load_schema(f)["$id"], Resource.from_contents(load_schema(f))) for f in files)
    return Draft202012Validator(load_schema(name), registry=registry)


def test_real_results_validate_against_the_result_schema(live: Live) -> None:
    url, token = live.url, live.agent
    code = "import os\nprint(2+2)\nopen('out/a.txt','w').write('hi')\nopen('out/b.bin','wb').write(bytes([255]))"
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        ran = client.post("/v1/executions", json={"code": code})
        failed = client.post("/v1/executions", json={"code": "import sys; sys.exit(3)"})
        denied = client.post("/v1/executions", json={"code": "pass", "network": "bridge"})
        invalid = client.post("/v1/executions", json={"code": 1})
    result = _validator("result")
    error = _validator("error")
    assert ran.status_code == 200, ran.text
    assert ran.json()["stdout"] == "4\n"
    assert [f["encoding"] for f in ran.json()["files"]] == ["utf-8", "base64"]
    result.validate(ran.json())
    assert failed.status_code == 200
    assert failed.json()["exit_code"] == 3
    result.validate(failed.json())
    assert denied.status_code == 403, denied.text
    assert denied.json()["violations"]
    error.validate(denied.json())
    assert invalid.status_code == 422
    error.validate(invalid.json())

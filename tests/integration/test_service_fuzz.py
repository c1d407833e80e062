"""Fuzz the HTTP API with schemathesis against the OpenAPI document the REAL server serves.

One server on a loopback port (real engine, real trail, a real principal's token). Every operation of
``GET /openapi.json`` is exercised with schemathesis' generated requests, valid and invalid; every response
must be no 5xx, have a documented status, content type and headers, and a body valid against the documented
schema (the JSON Schemas in ``schemas/``). Bounded: the dry-run and read endpoints get more examples than
``/v1/executions``, whose valid requests start real containers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import positive_data_acceptance
from servers import one_principal, start

from gateway.service.config import ServerConfig

pytestmark = [pytest.mark.usefixtures("engine"), pytest.mark.slow]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, engine: Any) -> Iterator[tuple[str, str]]:
    directory = tmp_path_factory.mktemp("fuzz")
    principals, token = one_principal(directory)
    config = ServerConfig(principals=principals, audit_dir=directory / "audit", max_body_bytes=64 * 1024)
    port, _service, stop = start(config)
    try:
        yield f"http://127.0.0.1:{port}", token
    finally:
        stop()


EXAMPLES = {"/v1/executions": 6}
"""Valid execution requests start containers: few of them. Every other operation gets DEFAULT_EXAMPLES."""
DEFAULT_EXAMPLES = 40


def _operations(url: str) -> list[Any]:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/executions", "/v1/decisions", "/v1/policy", "/v1/tools"}
    return operations


def _fuzz(operation: Any, token: str, examples: int) -> None:
    """schemathesis' generated cases (valid and invalid) for ``operation``, each sent with the token and checked
    by every check schemathesis has (no 5xx, status, content type, headers, the body's schema, auth enforced,
    ...) except ``positive_data_acceptance``: a schema-valid request may still be refused with the documented 422
    by checks a JSON Schema cannot state (a size such as ``"99999999999999999999t"`` beyond the engine's maximum),
    or with 403 by the caller's policy."""

    @given(case=operation.as_strategy())
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case: Any) -> None:
        case.call_and_validate(
            headers={"Authorization": f"Bearer {token}"}, timeout=60, excluded_checks=[positive_data_acceptance]
        )

    run()


@pytest.mark.parametrize("path", ["/v1/decisions", "/v1/policy", "/v1/tools", "/healthz", "/readyz", "/openapi.json"])
def test_read_and_dry_run_endpoints_conform_to_the_document(live: tuple[str, str], path: str) -> None:
    url, token = live
    for operation in _operations(url):
        if operation.path == path:
            _fuzz(operation, token, DEFAULT_EXAMPLES)


def test_executions_conform_to_the_document(live: tuple[str, str]) -> None:
    url, token = live
    (operation,) = [op for op in _operations(url) if op.path == "/v1/executions"]
    _fuzz(operation, token, EXAMPLES["/v1/executions"])


def test_the_served_document_is_the_built_one(live: tuple[str, str]) -> None:
    """Unauthenticated on purpose: the document is the public contract and holds no principal or policy."""
    from gateway.service.openapi import openapi_document

    response = httpx.get(f"{live[0]}/openapi.json", timeout=10)
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


def test_real_results_validate_against_the_result_schema(live: tuple[str, str]) -> None:
    url, token = live
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

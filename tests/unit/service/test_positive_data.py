"""What the OpenAPI document calls valid, the service's own checks accept.

schemathesis' positive data (requests valid under ``GET /openapi.json``) for the execution request and the audit
query, handed to the functions the service calls with them; no server, no engine. The integration fuzz test
(tests/integration/test_service_fuzz.py) sends such requests to a real server; this one looks at many more.
"""

from __future__ import annotations

import json
import re
from datetime import date
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from starlette.datastructures import QueryParams

from gateway.audit.query import parse_time
from gateway.errors import RequestError
from gateway.request import MAX_METADATA_BYTES, parse_request
from gateway.service.openapi import openapi_document
from gateway.service.operator import audit_filters

DOCUMENT = openapi_document()
OPERATIONS = {
    operation.path: operation
    for operation in (result.ok() for result in schemathesis.openapi.from_dict(DOCUMENT).get_all_operations())
}
GENERATED = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _metadata_bytes(body: dict[str, Any]) -> int:
    compact = json.dumps(body["metadata"], separators=(",", ":"), ensure_ascii=False)
    return len(compact.encode("utf-8", "surrogatepass"))


def test_both_request_bodies_are_the_execution_request() -> None:
    for path in ("/v1/executions", "/v1/decisions"):
        body = DOCUMENT["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": "#/components/schemas/ExecutionRequest"}


@given(case=OPERATIONS["/v1/decisions"].as_strategy())
@GENERATED
def test_every_request_body_the_document_allows_is_parsed(case: Any) -> None:
    body = json.dumps(case.body).encode("utf-8")
    # The one check of the body that no JSON Schema states (documented in metadata's description).
    if "metadata" in case.body and _metadata_bytes(case.body) > MAX_METADATA_BYTES:
        with pytest.raises(RequestError) as refused:
            parse_request(body)
        assert [problem.path for problem in refused.value.problems] == ["$.metadata"]
    else:
        parse_request(body)


@given(case=OPERATIONS["/v1/audit/records"].as_strategy())
@GENERATED
def test_every_audit_query_the_document_allows_is_read(case: Any) -> None:
    query = case.query or {}
    pairs = [(name, item) for name, value in query.items() for item in (value if isinstance(value, list) else [value])]
    audit_filters(QueryParams(pairs))  # RequestError (422) for a parameter it refuses


def test_since_and_until_allow_exactly_the_days_that_exist_in_1900_to_2999() -> None:
    """Checked over every text YYYY-MM-DD of those years and their neighbours (month and day 00 to 32 included):
    a calendar the pattern has to state (leap years: 1900 is none, 2000 and 2800 are) and parse_time reads."""
    parameters = DOCUMENT["paths"]["/v1/audit/records"]["get"]["parameters"]
    since, until = ({p["name"]: p["schema"] for p in parameters}[name] for name in ("since", "until"))
    assert since == until
    pattern = re.compile(since["pattern"])
    for year in range(1890, 3010):
        for month in range(14):
            for day in range(33):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                try:
                    exists = date(year, month, day) and 1900 <= year <= 2999
                except ValueError:
                    exists = False
                assert bool(pattern.search(text)) == exists, text
    for text in ("2024-02-29T23:59:59Z", "1900-01-01T00:00:00+23:59", "2999-12-31T23:59:59.999999-23:59"):
        assert pattern.search(text), text
        parse_time(text)
    for text in ("2024-05-01T12:00Z", "2024-05-01 12:00:00Z", "2024-05-01T12:00:00z", "2024-05-01T23:59:60Z"):
        assert not pattern.search(text), text

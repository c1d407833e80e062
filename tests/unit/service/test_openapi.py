"""The OpenAPI document: built from schemas/, covering every route of the application."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import OpenAPIV31SpecValidator

from gateway.resources import load_schema
from gateway.service.config import McpSettings, ServerConfig
from gateway.service.openapi import COMPONENTS, openapi_document

pytest.importorskip("starlette")


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref" and isinstance(v, str)] + [
            r for v in node.values() for r in _refs(v)
        ]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def _resolve(document: dict[str, Any], ref: str) -> Any:
    node: Any = document
    for part in ref.removeprefix("#/").split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node


@pytest.mark.parametrize("name", ["result", "error", "api"])
def test_new_schemas_are_valid_and_described(name: str) -> None:
    from tests.unit.core.test_schemas import _described

    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    missing: list[str] = []
    _described(schema, "$", missing)
    assert missing == []


def test_every_ref_resolves_inside_the_document() -> None:
    document = openapi_document()
    refs = _refs(document)
    assert refs
    for ref in refs:
        assert ref.startswith("#/"), ref
        _resolve(document, ref)  # KeyError when it points nowhere


def test_components_are_the_schema_files_not_restatements() -> None:
    document = openapi_document()
    for file, name in COMPONENTS.items():
        embedded = document["components"]["schemas"][name]
        original = load_schema(file)
        assert (
            embedded["properties" if "properties" in original else "$defs"].keys()
            == original.get("properties", original.get("$defs", {})).keys()
        )
        assert "$id" not in embedded


def test_every_route_is_documented_with_its_errors_and_security() -> None:
    from gateway.service.app import build_app

    document = openapi_document()
    routes = {
        (re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path), method.lower())  # {path:path} is {path} in the document
        for route in build_app(_NoService()).routes  # type: ignore[arg-type]
        for method in (route.methods or ()) - {"HEAD"}
    }
    documented = {(path, method) for path, item in document["paths"].items() for method in item}
    assert routes == documented
    for path, item in document["paths"].items():
        for operation in item.values():
            statuses = set(operation["responses"])
            assert len(statuses & {"200", "201", "204"}) == 1  # one success: 201 a session made, 204 one closed
            if path.startswith("/v1/") or path in ("/metrics", "/mcp"):  # /mcp: the MCP transport, same bearer tokens
                assert operation["security"] == [{"bearer": []}]
                assert {"401", "405"} <= statuses
            else:
                assert operation["security"] == []
    for path in ("/v1/executions", "/v1/decisions"):
        assert {"400", "403", "413", "415", "422", "503"} <= set(document["paths"][path]["post"]["responses"])
    executed = document["paths"]["/v1/executions"]["post"]["responses"]["200"]["content"]
    assert set(executed) == {"application/json", "text/event-stream"}  # the result, or its live stream
    assert "event: result" in executed["text/event-stream"]["schema"]["description"]
    assert set(document["paths"]["/mcp"]) == {"post"}  # stateless: GET and DELETE get 405
    assert "streamable HTTP transport" in document["paths"]["/mcp"]["post"]["description"]
    unauthenticated = document["components"]["responses"]["Unauthenticated"]
    assert unauthenticated["headers"]["WWW-Authenticate"]["required"] is True
    bearer = document["components"]["securitySchemes"]["bearer"]
    assert (bearer["type"], bearer["scheme"]) == ("http", "bearer")
    json.dumps(document)


def test_the_document_is_valid_openapi_3_1() -> None:
    """What openapi-spec-validator finds (every error, with its place), so that tools that read the document
    (client generators, schemathesis, documentation viewers) can rely on it."""
    for sessions in (False, True):
        errors = [
            f"{'/'.join(map(str, error.absolute_path))}: {error.message}"
            for error in OpenAPIV31SpecValidator(openapi_document(mcp_sessions=sessions)).iter_errors()
        ]
        assert errors == []


def test_with_mcp_sessions_mcp_takes_delete_and_says_how_a_foreign_id_is_answered() -> None:
    """A service keeping MCP sessions (mcp.session) routes DELETE /mcp, and its document says so; the routes and
    the document agree as in the stateless default."""
    from gateway.service.app import build_app

    app = build_app(_NoService(ServerConfig(mcp=McpSettings(session="kernel"))))  # type: ignore[arg-type]
    (route,) = [r for r in app.routes if getattr(r, "path", None) == "/mcp"]
    assert set(route.methods or ()) - {"HEAD"} == {"POST", "DELETE"}  # GET: 405, no endless event stream
    mcp = openapi_document(mcp_sessions=True)["paths"]["/mcp"]
    assert set(mcp) == {"post", "delete"}
    assert "another token's" in mcp["post"]["responses"]["404"]["description"]
    assert {"401", "429"} <= set(mcp["post"]["responses"])


class _NoService:
    """build_app only reads ``service.gateway``, its configuration and its reload hooks when building the routes."""

    gateway = None

    def __init__(self, config: ServerConfig = ServerConfig()) -> None:  # noqa: B008 - frozen
        self.config = config
        self.on_reload: list[object] = []

"""Every schema is a valid Draft 2020-12 schema; every shipped policy, fixture and decision validates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from gateway.policy import Policy
from gateway.policy.compose import load_document
from gateway.request import parse_request
from gateway.resources import load_schema, policies_dir, schemas_dir
from gateway.testing import decide
from gateway.yamlstrict import load_yaml

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = sorted(policies_dir().rglob("*.yaml"))
SUITES = sorted((ROOT / "tests" / "policies").rglob("suite.yaml"))


def _described(node: Any, path: str, missing: list[str]) -> None:
    if isinstance(node, dict):
        if "properties" in node:
            for key, sub in node["properties"].items():
                if isinstance(sub, dict) and "description" not in sub and "$ref" not in sub:
                    missing.append(f"{path}.{key}")
        for key, sub in node.items():
            _described(sub, f"{path}.{key}", missing)
    elif isinstance(node, list):
        for index, sub in enumerate(node):
            _described(sub, f"{path}[{index}]", missing)


@pytest.mark.parametrize("name", ["policy", "request", "session-request", "decision", "policy-test", "principals"])
def test_schema_is_valid_and_every_field_described(name: str) -> None:
    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    missing: list[str] = []
    _described(schema, "$", missing)
    assert missing == []


def test_all_schema_files_are_checked() -> None:
    assert {p.name for p in schemas_dir().glob("*.schema.json")} >= {
        "policy.schema.json",
        "request.schema.json",
        "session-request.schema.json",
        "decision.schema.json",
        "policy-test.schema.json",
        "principals.schema.json",
    }


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_policy_validates_and_points_editors_at_the_schema(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("# yaml-language-server: $schema=")
    ref = text.splitlines()[0].split("$schema=", 1)[1]
    assert (path.parent / ref).resolve() == (schemas_dir() / "policy.schema.json").resolve()
    doc = load_document(path).data  # a policy that extends a base is validated merged (its file is partial)
    assert list(Draft202012Validator(load_schema("policy")).iter_errors(doc)) == []


@pytest.mark.parametrize("suite", SUITES, ids=lambda p: p.parent.name)
def test_fixture_requests_expected_valid_are_schema_valid(suite: Path) -> None:
    doc = load_yaml(suite.read_text(), source=str(suite)).data
    request = load_schema("request")
    validator = Draft202012Validator(request)
    registry: Registry[Any] = Registry().with_resource(request["$id"], Resource.from_contents(request))
    session_validator = Draft202012Validator(load_schema("session-request"), registry=registry)
    for case in doc.get("cases", []):
        if "session" in case:
            errors = list(session_validator.iter_errors(case["session"]))
        else:
            errors = list(validator.iter_errors(case["request"]))
        assert bool(errors) == ("invalid" in case), case["name"]


def test_decisions_validate_against_the_decision_schema(default_policy: Policy) -> None:
    validator = Draft202012Validator(load_schema("decision"), format_checker=Draft202012Validator.FORMAT_CHECKER)
    allowed = decide(default_policy, parse_request({"code": "print(1)", "env": {"APP_X": "1"}}))
    denied = decide(default_policy, parse_request({"code": "x", "network": "host", "limits": {"memory": "4g"}}))
    for decision in (allowed, denied):
        data = json.loads(json.dumps(decision.to_dict()))
        assert list(validator.iter_errors(data)) == []
    assert allowed.allowed
    assert not denied.allowed

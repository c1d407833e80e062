"""npm specs as spec.packages.npm judges them: a registry name with an optional range, nothing that names where
the package comes from; and the decision plan of an allowed JavaScript request."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.policy import load_policy, load_policy_text
from gateway.policy.npm import NpmSpec, NpmSpecError, npm_name_allowed, parse_npm_spec
from gateway.request import parse_request
from gateway.testing import decide

NPM_POLICY = Path(__file__).parents[2] / "policies" / "packages" / "npm" / "npm-mirror.yaml"


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("ms", NpmSpec("ms")),
        (" ms@2.1.3 ", NpmSpec("ms", "2.1.3")),
        ("ms@^2.1", NpmSpec("ms", "^2.1")),
        ("@types/node@>=20   <25", NpmSpec("@types/node", ">=20 <25")),
        ("lodash.get@1.x || 2", NpmSpec("lodash.get", "1.x || 2")),
        ("left-pad@latest", NpmSpec("left-pad", "latest")),
    ],
)
def test_a_name_with_an_optional_range_is_accepted_and_normalised(text: str, spec: NpmSpec) -> None:
    assert parse_npm_spec(text) == spec


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("https://evil.example/ms-2.1.3.tgz", "URL"),
        ("ms@git+https://github.com/vercel/ms.git", "URL"),
        ("git://github.com/vercel/ms", "URL"),
        ("ms@file:../ms", "file:"),
        ("file:ms", "file:"),
        ("vercel/ms", "GitHub"),
        ("github:vercel/ms", "URL"),
        ("./ms-2.1.3.tgz", "tarball"),
        ("/tmp/ms", "path"),
        ("ms@npm:evil@1.0.0", "alias"),
        ("--registry=https://evil.example/", "option"),
        ("Express", "lower case"),
        ("_private", "accepted form"),
        ("a" * 201, "at most 200"),
    ],
)
def test_anything_naming_a_source_is_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(NpmSpecError, match=why):
        parse_npm_spec(text)


def test_allow_patterns_match_names_and_scopes() -> None:
    assert npm_name_allowed("@types/node", ("@types/*",))
    assert npm_name_allowed("lodash.get", ("lodash.*",))
    assert not npm_name_allowed("lodash", ("lodash.*",))
    assert not npm_name_allowed("@evil/node", ("@types/*",))


def test_an_allowed_javascript_request_plans_the_npm_install_and_no_pip() -> None:
    policy = load_policy(NPM_POLICY)
    request = parse_request({"code": "x", "language": "javascript", "packages": ["ms@^2", "@types/node"]})
    decision = decide(policy, request)
    assert decision.allowed
    plan = decision.to_dict()["plan"]
    assert plan["npm"] == {"registry": "http://mirror.internal:18089/npm/", "specs": ["@types/node", "ms@^2"]}
    assert "packages" not in plan
    python = decide(policy, parse_request({"code": "x", "packages": ["idna"]})).to_dict()["plan"]
    assert "npm" not in python
    assert python["packages"]["requirements"] == ["idna"]


def test_a_policy_with_an_npm_registry_only_denies_python_packages() -> None:
    # The mirror's egress alone (egress-mirror.yaml also has a Python index): the npm policy over it.
    egress = (
        "  network:\n    egress:\n      allow:\n"
        "        - {host: mirror.internal, ports: [18089, 18443], cidrs: [127.0.0.0/8]}\n"
    )
    text = (
        NPM_POLICY.read_text()
        .replace(
            "extends: ../../../../policies/examples/egress-mirror.yaml",
            f"extends: {NPM_POLICY.parents[4] / 'policies' / 'default.yaml'}",
        )
        .replace("spec:\n", "spec:\n" + egress, 1)
    )
    policy = load_policy_text(text, source=str(NPM_POLICY))
    assert policy.packages is None
    assert policy.npm is not None
    denied = decide(policy, parse_request({"code": "x", "packages": ["idna"]}))
    assert not denied.allowed
    assert "packages.enabled" in {v.rule for v in denied.violations}
    allowed = decide(policy, parse_request({"code": "x", "language": "javascript", "packages": ["ms"]}))
    assert allowed.allowed

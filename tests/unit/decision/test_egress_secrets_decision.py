"""Secrets in the decision: bound by policy to hosts and principals, named (never valued) in the plan and the run."""

from __future__ import annotations

import json

from jsonschema import Draft202012Validator

from gateway.egress.secrets import SecretRule
from gateway.policy import Policy, load_policy, load_policy_text
from gateway.request import parse_request
from gateway.resources import load_schema, policies_dir
from gateway.testing import decide

EGRESS = {"code": "x", "network": "egress"}

PER_PRINCIPAL = """
apiVersion: gateway.agent-exec/v1
kind: Policy
extends: {base}
metadata: {{name: per-principal}}
spec:
  network:
    egress:
      allow:
        - {{host: mirror.internal, ports: [18089, 18443], cidrs: [127.0.0.0/8]}}
        - {{host: api.example.com}}
      secrets:
        - {{name: mirror-ci, hosts: [mirror.internal], principals: [ci-bot]}}
        - {{name: mirror-dev, hosts: [mirror.internal], principals: [dev-bot], template: "token {{secret}}"}}
        - {{name: api-key, hosts: [api.example.com], header: X-Api-Key, template: "{{secret}}"}}
"""


def per_principal() -> Policy:
    return load_policy_text(PER_PRINCIPAL.format(base=policies_dir() / "default.yaml"))


def test_the_plan_and_the_run_name_the_secret_and_its_hosts_only() -> None:
    policy = load_policy(policies_dir() / "examples" / "egress-mirror-secret.yaml")
    decision = decide(policy, parse_request(EGRESS))
    assert decision.allowed
    assert decision.settings is not None
    assert decision.settings.plan()["egress"]["secrets"] == [
        {"name": "mirror-token", "hosts": ["mirror.internal"], "header": "Authorization"}
    ]
    assert decision.run is not None
    assert decision.run.egress is not None
    assert decision.run.egress.secrets == (SecretRule("mirror-token", ("mirror.internal",)),)
    record = decision.to_dict()
    assert "Bearer" not in json.dumps(record)  # not even the template: names only
    Draft202012Validator(load_schema("decision")).validate(record)


def test_each_principal_gets_its_own_rules_and_others_none() -> None:
    policy = per_principal()

    def bound(principal: str | None) -> list[str]:
        decision = decide(policy, parse_request(EGRESS), principal=principal)
        assert decision.run is not None
        assert decision.run.egress is not None
        return [rule.name for rule in decision.run.egress.secrets]

    assert bound("ci-bot") == ["mirror-ci", "api-key"]
    assert bound("dev-bot") == ["mirror-dev", "api-key"]
    assert bound("someone") == ["api-key"]
    assert bound(None) == ["api-key"]


def test_a_narrowed_run_keeps_only_the_secrets_of_its_hosts() -> None:
    narrowed = {**EGRESS, "egress": [{"host": "api.example.com"}]}
    decision = decide(per_principal(), parse_request(narrowed), principal="ci-bot")
    assert decision.run is not None
    assert decision.run.egress is not None
    assert [rule.name for rule in decision.run.egress.secrets] == ["api-key"]


def test_a_run_without_egress_binds_no_secret() -> None:
    decision = decide(per_principal(), parse_request({"code": "x"}), principal="ci-bot")
    assert decision.run is not None
    assert decision.run.egress is None
    assert decision.settings is not None
    assert "egress" not in decision.settings.plan()

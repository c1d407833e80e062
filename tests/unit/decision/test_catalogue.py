"""The rule catalogue (`gateway policy rules`, docs/rules.md) is generated from the rules and cannot drift."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.decision import RULE_IDS, RULES, SESSION_PROFILE_RULE, SESSION_RULES
from gateway.decision.catalogue import catalogue, render_markdown
from gateway.policy import Policy, load_policy, load_policy_text
from gateway.request import parse_request
from gateway.resources import policies_dir
from gateway.testing import decide

DOCS = Path(__file__).resolve().parents[3] / "docs" / "rules.md"


def test_docs_rules_md_is_up_to_date() -> None:
    assert DOCS.read_text(encoding="utf-8") == render_markdown(), (
        "docs/rules.md is out of date: run `python3 scripts/gen-rules-doc.py`"
    )


def test_every_rule_is_catalogued_with_what_it_checks_and_an_example() -> None:
    ids = [e.id for e in catalogue()]
    assert len(ids) == len(set(ids))
    assert set(ids) >= RULE_IDS
    sessions = {r.id for r in SESSION_RULES} | {SESSION_PROFILE_RULE}
    assert set(ids) - RULE_IDS == {"engine.resolve", "assembly.build", "assembly.guard"} | sessions
    for rule in RULES:
        assert rule.checks, rule.id
        assert rule.example, rule.id
        assert rule.path.startswith("$"), rule.id
        assert not rule.setting or rule.setting.startswith("$.spec"), rule.id
        assert (
            rule.audit == "clamp"
            or not rule.id.startswith("limits.")
            or rule.id
            in {
                "limits.code_size",
                "limits.files_size",
            }
        )


def _all_audit(base_policy_text: str) -> Policy:
    """Every section that has a mode in audit mode (code and files sizes with the hard_max they need)."""
    text = re.sub(r"max: ([0-9a-z]+)\}", r"max: \1, mode: audit}", base_policy_text)
    text = text.replace("max: 1k, mode: audit}", "max: 1k, mode: audit, hard_max: 2k}")
    text = text.replace("max: 2k, mode: audit}", "max: 2k, mode: audit, hard_max: 4k}")
    text = text.replace("  images:\n", "  images:\n    mode: audit\n")
    text = text.replace("  user:", "    output_files: {default: 16, max: 256, mode: audit}\n  user:")
    extra = [
        "  languages: {mode: audit, allowed: [python]}",
        "  network: {mode: audit}",
        "  runtime: {mode: audit}",
        "  env: {mode: audit, allowed: [APP_*]}",
        "  files: {mode: audit}",
        "  mounts: {mode: audit, allow: [{root: /srv/agent-data, targets: [/data]}]}",
    ]
    return load_policy_text(text + "\n".join(extra) + "\n")


def test_the_audit_effect_matches_the_mode_the_rule_runs_in(base_policy_text: str, default_policy: Policy) -> None:
    audit = _all_audit(base_policy_text)
    for rule in RULES:
        expected = {"never": "enforce", "advisory": "audit"}.get(rule.audit, "audit")
        assert rule.mode(audit) == expected, rule.id
        if rule.audit in {"never", "advisory"}:
            assert rule.mode(default_policy) == expected, rule.id


_APP = {f"APP_{i}": "1" for i in range(17)}
EXAMPLES: list[tuple[str, str, dict[str, Any]]] = [
    ("images.allowlist", "default", {"image": "gateway/sandbox-python:latest"}),
    ("limits.memory", "default", {"limits": {"memory": "1g"}}),
    ("limits.cpus", "default", {"limits": {"cpus": 4}}),
    ("limits.pids", "default", {"limits": {"pids": 1000}}),
    ("limits.timeout", "default", {"limits": {"timeout_s": 600}}),
    ("limits.output_bytes", "default", {"limits": {"output_bytes": "16m"}}),
    ("limits.output_files_bytes", "default", {"limits": {"output_files_bytes": "16m"}}),
    ("limits.output_files", "default", {"limits": {"output_files": 5000}}),
    ("limits.tmpfs", "default", {"limits": {"tmpfs": "1g"}}),
    ("limits.code_size", "default", {"code": "x" * 300000}),
    ("limits.files_size", "default", {"files": {"a": "y" * 2000000}}),
    ("files.path", "default", {"files": {f"f{i}": "" for i in range(65)}}),
    ("network.mode", "default", {"network": "bridge"}),
    ("network.egress", "examples/egress-mirror", {"network": "egress", "egress": [{"host": "pypi.org"}]}),
    (
        "limits.egress_connections",
        "examples/egress-mirror",
        {"network": "egress", "limits": {"egress_connections": 1000}},
    ),
    ("limits.egress_bytes_out", "examples/egress-mirror", {"network": "egress", "limits": {"egress_bytes_out": "1g"}}),
    ("limits.egress_bytes_in", "examples/egress-mirror", {"network": "egress", "limits": {"egress_bytes_in": "2g"}}),
    ("limits.egress_rate", "examples/egress-mirror", {"network": "egress", "limits": {"egress_rate": 100}}),
    ("runtime.allowed", "default", {"runtime": "runsc"}),
    ("runtime.required", "strict", {"runtime": "runc"}),
    ("env.allowed", "default", {"env": {"SECRET": "1"}}),
    ("env.dangerous", "default", {"env": {"LD_PRELOAD": "/x.so"}}),
    ("env.limits", "default", {"env": _APP}),
    ("packages.enabled", "default", {"packages": ["idna"]}),
    ("packages.allowed", "examples/egress-mirror", {"packages": ["numpy"]}),
]


@pytest.mark.parametrize(("rule_id", "policy", "fields"), EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_the_example_message_is_what_the_rule_says(rule_id: str, policy: str, fields: dict[str, Any]) -> None:
    d = decide(load_policy(policies_dir() / f"{policy}.yaml"), parse_request({"code": "x", **fields}))
    [rule] = [r for r in RULES if r.id == rule_id]
    assert rule.example in [v.message for v in d.violations if v.rule == rule_id]


def test_gateway_policy_rules_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "rules", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    by_id = {e["id"]: e for e in entries}
    assert by_id["limits.memory"]["audit"] == "clamp"
    assert by_id["limits.memory"]["path"] == "$.limits.memory"
    assert by_id["limits.memory"]["setting"] == "$.spec.limits.memory"
    assert by_id["network.mode"]["never_relaxed"] == (
        "host networking and container:* networks; 'egress' without spec.network.egress"
    )
    assert by_id["mounts.writable"]["audit"] == "advisory"
    assert set(by_id["env.dangerous"]) == {"id", "checks", "path", "setting", "audit", "never_relaxed", "example"}
    assert main(["policy", "rules"]) == 0
    text = capsys.readouterr().out
    assert "limits.memory  [$.limits.memory  $.spec.limits.memory]" in text
    assert "audit mode:    clamp: a warning; the value is clamped to max" in text
    assert main(["policy", "rules", "--markdown"]) == 0
    assert capsys.readouterr().out == DOCS.read_text(encoding="utf-8")

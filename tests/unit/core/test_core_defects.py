"""The two defects the core redesign fixed, pinned at the seams where they lived, plus the contract rule.

1. What the policy allows, the runner must accept: a file name no runner can take is refused by the
   decision (one check, ``gateway.payload.file_name_problems``, used by the rule and by the payload).
2. A Gateway protects its own trail, whatever the environment says: the audit sink declares the paths
   that must never be mounted, and the decision reads no environment.
3. A contract failure between the gateway's own parts is the gateway's fault: 125 / HTTP 500, never 2 / 422.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway import ContractError, Gateway, exit_code_for, http_status_for
from gateway.audit import JsonlAuditTrail, MemoryAuditSink
from gateway.errors import EXIT_DENIED, EXIT_GATEWAY_FAILURE
from gateway.payload import Payload
from gateway.policy import Policy, load_policy, load_policy_text
from gateway.policy.model import LanguagesRule
from gateway.request import parse_request
from gateway.resources import default_policy_path
from gateway.testing import FakeRunner, decide


@pytest.fixture
def default_policy() -> Policy:
    return load_policy(default_policy_path())


@pytest.mark.parametrize(
    "files",
    [
        {"main.py": "x"},
        {"main.py/inner": "x"},
        {"out": "x"},
        {"a": "1", "a/b": "2"},
        {"x" * 256: "long component"},
    ],
)
def test_a_file_name_the_runner_cannot_take_is_denied_by_the_decision(
    default_policy: Policy, files: dict[str, str]
) -> None:
    runner, sink = FakeRunner(), MemoryAuditSink()
    result = Gateway(default_policy, runner=runner, audit=sink).execute({"code": "print(1)", "files": files})
    assert result.exit_status == EXIT_DENIED
    assert [v["rule"] for v in result.to_dict()["violations"]] == ["files.path"]
    assert runner.calls == []
    decision = next(r for r in sink.records if r["event_type"] == "policy.decision")
    assert decision["data"]["decision"]["allowed"] is False
    assert "request.invalid" not in [r["event_type"] for r in sink.records]


_NAME_PART = st.sampled_from(["a", "b", "main.py", "out", "..", ".", "", "x y", "ü", "\t", "a" * 256])


@given(st.dictionaries(st.lists(_NAME_PART, min_size=1, max_size=3).map("/".join), st.just("x"), max_size=4))
def test_what_the_decision_allows_the_payload_accepts(names: dict[str, str]) -> None:
    policy = load_policy(default_policy_path())
    try:
        request = parse_request({"code": "print(1)", "files": names})
    except Exception:  # noqa: BLE001 - names the request schema refuses never reach a decision
        return
    decision = decide(policy, request)
    files = {name: content.encode() for name, content in request.files.items()}
    if decision.allowed:
        Payload("print(1)", files=files)  # must not raise
    else:
        assert {v.rule for v in decision.violations} == {"files.path"}


def _mount_policy(root: Path) -> Policy:
    # The default policy allows no mounts; this one adds a root whose subdirectory holds a trail.
    return load_policy_text(
        default_policy_path().read_text(encoding="utf-8")
        + f"""
  mounts:
    max_count: 2
    allow:
      - root: {root}
        modes: [ro, rw]
        targets: [/data]
""",
        source="mounts.yaml",
    )


def test_a_gateway_built_directly_protects_its_own_trail(tmp_path: Path) -> None:
    # The environment names another trail (the suite's autouse fixture sets $GATEWAY_AUDIT_DIR): the Gateway
    # must protect the one it writes to.
    root = tmp_path / "shared"
    trail = root / "trail"
    trail.mkdir(parents=True)
    (root / "data").mkdir()
    policy = _mount_policy(root)
    runner = FakeRunner()
    with JsonlAuditTrail(trail) as sink:
        gateway = Gateway(policy, runner=runner, audit=sink)
        assert sink.protected_paths == (str(trail.resolve()),)
        for source in (trail, root):
            mount = {"source": str(source), "target": "/data", "mode": "rw"}
            result = gateway.execute({"code": "print(1)", "mounts": [mount]})
            assert result.exit_status == EXIT_DENIED, source
            assert "mounts.denied_path" in [v["rule"] for v in result.to_dict()["violations"]]
        ok = gateway.execute({"code": "print(1)", "mounts": [{"source": str(root / "data"), "target": "/data"}]})
        assert ok.allowed
    assert len(runner.calls) == 1


def test_a_contract_failure_between_the_gateways_parts_is_the_gateways_fault(default_policy: Policy) -> None:
    assert (exit_code_for(ContractError), http_status_for(ContractError)) == (EXIT_GATEWAY_FAILURE, 500)
    # A policy object no loader produces lets a language through that no sandbox can run: the decision
    # allows, the payload refuses, and the result blames the gateway, not the caller.
    odd = dataclasses.replace(default_policy, languages=LanguagesRule(allowed=("python", "cobol"), default="python"))
    runner, sink = FakeRunner(), MemoryAuditSink()
    result = Gateway(odd, runner=runner, audit=sink).execute(parse_request({"code": "x", "language": "cobol"}))
    assert result.decision is not None
    assert result.decision.allowed
    assert result.error is not None
    assert result.error.code == "gateway.contract"
    assert result.exit_status == EXIT_GATEWAY_FAILURE
    assert runner.calls == []
    outcome = next(r for r in sink.records if r["event_type"] == "execution.outcome")
    assert outcome["data"]["error"]["code"] == "gateway.contract"

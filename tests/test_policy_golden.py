"""Golden policy cases under tests/policies, run through the same library code as `gateway policy test`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.testing import CaseResult, discover_suites, run_suite

POLICY_CASES = Path(__file__).parent / "policies"
SUITES = list(discover_suites(POLICY_CASES))


def test_every_shipped_policy_and_the_invalid_fixtures_have_a_suite() -> None:
    names = {p.parent.name for p in SUITES}
    assert {"default", "strict", "readonly-data-mount", "invalid", "data-science", "exceptions", "sessions"} <= names
    assert {"polyglot", "data-agent", "coding-agent"} <= names


def _cases() -> list[CaseResult]:
    return [result for suite in SUITES for result in run_suite(suite)]


@pytest.mark.parametrize("result", _cases(), ids=lambda r: f"{Path(r.suite).parent.name}:{r.name}")
def test_golden_case(result: CaseResult) -> None:
    assert result.ok, f"{result.suite}: {result.name}: expected {result.expected}, got {result.got}. {result.detail}"


def test_runner_reports_a_mismatch(tmp_path: Path) -> None:
    suite = tmp_path / "suite.yaml"
    policy = (POLICY_CASES.parent.parent / "policies" / "default.yaml").resolve()
    suite.write_text(
        f"kind: PolicyTest\npolicy: {policy}\ncases:\n"
        "  - name: wrongly expected allow\n    request: {code: x, limits: {memory: 1g}}\n    allowed: true\n"
    )
    [result] = run_suite(suite)
    assert not result.ok
    assert "limits.memory" in result.got

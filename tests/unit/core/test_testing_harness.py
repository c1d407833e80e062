"""The golden-suite runner (``gateway policy test``): a strict, schema-checked format, and what a case can expect.

Defect 2 of issue 13: a case with a typo (``violation:``) and no ``allowed:`` used to pass against a request
denied for another rule, a test that checked nothing. Suites are now read by the strict YAML loader and
validated by ``schemas/policy-test.schema.json``; every problem is reported as ``file:line: $.path: ...``
and a broken suite runs no case at all.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from gateway.decision import engine
from gateway.decision.rules import Context, Finding, Rule
from gateway.errors import PolicyError
from gateway.policy import load_policy
from gateway.request import parse_request
from gateway.resources import load_schema, policies_dir, schemas_dir
from gateway.testing import CaseResult, decide, load_suite, run_suite
from gateway.yamlstrict import load_yaml

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = policies_dir() / "default.yaml"
SUITES = sorted((ROOT / "tests" / "policies").rglob("suite.yaml"))

WriteSuite = Callable[[str], Path]


@pytest.fixture
def write_suite(tmp_path: Path) -> WriteSuite:
    def write(body: str) -> Path:
        path = tmp_path / "suite.yaml"
        path.write_text(f"kind: PolicyTest\npolicy: {DEFAULT}\n" + textwrap.dedent(body))
        return path

    return write


def _one(results: list[CaseResult]) -> CaseResult:
    assert len(results) == 1, results
    return results[0]


# --- defect 2: the strict format ------------------------------------------------------------------------


def test_typo_and_missing_allowed_fail_with_file_line_and_path(write_suite: WriteSuite) -> None:
    """Before the fix this case passed: ``violation`` was ignored and a missing ``allowed`` meant deny."""
    path = write_suite(
        """\
        cases:
          - name: typo
            request: {code: x, network: host}
            violation: [limits.memory]
        """
    )
    results = run_suite(path)
    assert not any(r.ok for r in results)
    details = [r.detail for r in results]
    assert f"{path}:6: $.cases[0].violation: unknown field 'violation'" in "\n".join(details)
    assert any(d.startswith(f"{path}:4: $.cases[0]: 'allowed' is required here but missing") for d in details)


def test_a_broken_suite_runs_no_case(write_suite: WriteSuite) -> None:
    path = write_suite(
        """\
        cases:
          - name: fine on its own
            request: {code: "print(1)"}
            allowed: true
          - name: broken
            request: {code: x}
            allowed: true
            warning: []
        """
    )
    [result] = run_suite(path)
    assert result.name == "<suite>"
    assert not result.ok
    assert "$.cases[1].warning: unknown field" in result.detail


def test_suite_problems_are_all_reported_sorted(write_suite: WriteSuite) -> None:
    path = write_suite(
        """\
        extra: 1
        cases:
          - name: a
            request: {code: x}
            allowed: maybe
            options: {mem_limit: 1}
        """
    )
    with pytest.raises(PolicyError) as info:
        load_suite(path)
    lines = [p.line for p in info.value.problems]
    assert lines == sorted(lines)
    paths = {p.path for p in info.value.problems}
    assert {"$.extra", "$.cases[0].allowed"} <= paths
    assert "policy-test.schema.json" in info.value.diagnostics()


def test_duplicate_keys_in_a_suite_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text(
        f"kind: PolicyTest\npolicy: {DEFAULT}\ncases:\n"
        "  - name: a\n    request: {code: x}\n    allowed: true\n    allowed: false\n"
    )
    [result] = run_suite(path)
    assert not result.ok
    assert f"{path}:7: $.cases[0].allowed: duplicate key 'allowed'" in result.detail


def test_cases_need_a_policy(tmp_path: Path) -> None:
    path = tmp_path / "suite.yaml"
    path.write_text("kind: PolicyTest\ncases:\n  - {name: a, request: {code: x}, allowed: true}\n")
    [result] = run_suite(path)
    assert not result.ok
    assert "'policy' is required" in result.detail


@pytest.mark.parametrize(
    ("case", "where", "says"),
    [
        ("{name: a, request: {code: x}, allowed: false, options: {mem_limit: 1}}", "options", "allowed"),
        ("{name: a, request: {code: x}, allowed: true, violations: [network.mode]}", "violations", "allowed"),
        ("{name: a, request: {code: x, principal: p}, principal: q, allowed: true}", "principal", "once"),
        ("{name: a, request: {code: 1}, invalid: [$.code], allowed: false}", "allowed", "invalid"),
        ("{name: a, request: {code: x}, allowed: true, now: yesterday}", "now", "date-time"),
        ("{name: a, request: {code: x}, allowed: true, violations: [{rule: x}]}", "violations[0]", "path"),
    ],
)
def test_contradictory_or_malformed_cases_are_refused(
    write_suite: WriteSuite, case: str, where: str, says: str
) -> None:
    [result] = run_suite(write_suite(f"cases:\n  - {case}\n"))
    assert not result.ok
    assert f"$.cases[0].{where}" in result.detail
    assert says in result.detail


def test_schema_key_is_allowed_for_editors(tmp_path: Path) -> None:
    path = tmp_path / "suite.yaml"
    schema = schemas_dir() / "policy-test.schema.json"
    path.write_text(
        f"$schema: {schema}\nkind: PolicyTest\npolicy: {DEFAULT}\n"
        "cases:\n  - {name: a, request: {code: x}, allowed: true}\n"
    )
    assert _one(run_suite(path)).ok


def test_policy_test_schema_is_valid() -> None:
    schema = load_schema("policy-test")
    Draft202012Validator.check_schema(schema)
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize("suite", SUITES, ids=lambda p: p.parent.name)
def test_shipped_suites_are_schema_valid_and_point_editors_at_the_schema(suite: Path) -> None:
    text = suite.read_text()
    first = text.splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    ref = first.split("$schema=", 1)[1]
    assert (suite.parent / ref).resolve() == (schemas_dir() / "policy-test.schema.json").resolve()
    doc = load_yaml(text, source=str(suite)).data
    validator = Draft202012Validator(load_schema("policy-test"), format_checker=Draft202012Validator.FORMAT_CHECKER)
    assert list(validator.iter_errors(doc)) == []
    load_suite(suite)  # and the semantic pass


# --- the case extensions ----------------------------------------------------------------------------------


def test_violations_are_a_multiset(write_suite: WriteSuite) -> None:
    """``[env.allowed]`` no longer passes when two variables fail ``env.allowed``."""
    body = "cases:\n  - name: two\n    request: {code: x, env: {A: '1', B: '2'}}\n    allowed: false\n"
    assert not _one(run_suite(write_suite(body + "    violations: [env.allowed]\n"))).ok
    assert _one(run_suite(write_suite(body + "    violations: [env.allowed, env.allowed]\n"))).ok


def test_violations_with_paths(write_suite: WriteSuite) -> None:
    body = "cases:\n  - name: p\n    request: {code: x, network: host, limits: {memory: 1g}}\n    allowed: false\n"
    good = "    violations: [network.mode, {rule: limits.memory, path: $.limits.memory}]\n"
    assert _one(run_suite(write_suite(body + good))).ok
    bad = _one(run_suite(write_suite(body + "    violations: [network.mode, {rule: limits.memory, path: $.x}]\n")))
    assert not bad.ok
    assert "limits.memory@$.limits.memory" in bad.detail


def test_options_are_a_subset(write_suite: WriteSuite) -> None:
    body = "cases:\n  - name: o\n    request: {code: x, limits: {memory: 128m}}\n    allowed: true\n"
    ok = "    options: {mem_limit: 134217728, labels: {io.agent-gateway.managed: 'true'}, cap_drop: [ALL]}\n"
    assert _one(run_suite(write_suite(body + ok))).ok
    wrong = _one(run_suite(write_suite(body + "    options: {mem_limit: 1, no_such_key: 1}\n")))
    assert not wrong.ok
    assert "mem_limit" in wrong.detail
    assert "no_such_key" in wrong.detail
    typed = _one(run_suite(write_suite(body + "    options: {read_only: 1}\n")))  # true is not 1
    assert not typed.ok


def test_exceptions_are_compared(write_suite: WriteSuite) -> None:
    body = "cases:\n  - name: e\n    request: {code: x}\n    allowed: true\n"
    assert _one(run_suite(write_suite(body + "    exceptions: []\n"))).ok
    wrong = _one(run_suite(write_suite(body + "    exceptions: [EXC-1]\n")))
    assert not wrong.ok
    assert "exceptions - != expected EXC-1" in wrong.detail


def test_principal_sets_the_requests_principal(write_suite: WriteSuite, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []
    _spy(monkeypatch, lambda ctx: seen.append(ctx.request.principal))
    path = write_suite("cases:\n  - {name: p, request: {code: x}, principal: ml-bot-1, allowed: true}\n")
    assert _one(run_suite(path)).ok
    assert seen == ["ml-bot-1"]


def test_now_reaches_the_rules(write_suite: WriteSuite, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[datetime] = []
    _spy(monkeypatch, lambda ctx: seen.append(ctx.now))
    path = write_suite(
        "cases:\n  - {name: n, request: {code: x}, now: '2026-12-01T01:00:00+01:00', allowed: true}\n"
        "  - {name: default, request: {code: x}, allowed: true}\n"
    )
    before = datetime.now(UTC)
    assert all(r.ok for r in run_suite(path))
    after = datetime.now(UTC)
    assert seen[0] == datetime(2026, 12, 1, tzinfo=UTC)
    assert seen[0].tzinfo is UTC
    assert before <= seen[1] <= after  # no `now`: the current time


def test_decide_passes_now_and_principal_on(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[datetime, str | None]] = []
    _spy(monkeypatch, lambda ctx: seen.append((ctx.now, ctx.request.principal)))
    moment = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    decision = decide(load_policy(DEFAULT), parse_request({"code": "x"}), now=moment, principal="bot")
    assert decision.allowed
    assert seen == [(moment, "bot")]


def _spy(monkeypatch: pytest.MonkeyPatch, record: Callable[[Context], object]) -> None:
    """Add one passing rule that records what it was given (no shipped rule reads ``now`` yet)."""

    def check(ctx: Context) -> list[Finding]:
        record(ctx)
        return [Finding(True, "$", None, None, "seen")]

    monkeypatch.setattr(engine, "RULES", (*engine.RULES, Rule("test.spy", check, lambda _p: "enforce")))


# --- session cases (issue 29) ---------------------------------------------------------------------------


def test_a_case_is_an_execution_request_or_a_session_request_never_both(write_suite: WriteSuite) -> None:
    path = write_suite(
        """\
        cases:
          - name: both
            request: {code: x}
            session: {mode: workspace}
            allowed: false
          - name: a live-session count needs a session
            request: {code: x}
            live_sessions: 1
            allowed: true
        """
    )
    with pytest.raises(PolicyError) as info:
        load_suite(path)
    assert [p.path for p in info.value.problems] == ["$.cases[0]", "$.cases[1]"]


def test_a_session_case_is_decided_by_decide_session(write_suite: WriteSuite) -> None:
    sessions = policies_dir() / "examples" / "sessions.yaml"
    path = write_suite(
        """\
        cases:
          - name: the count is the case's
            session: {mode: workspace}
            live_sessions: 2
            allowed: true
          - name: malformed
            session: {mode: workspace, idle_s: -1}
            invalid: ["$.idle_s"]
        """
    )
    path.write_text(path.read_text().replace(str(DEFAULT), str(sessions)))
    denied, malformed = run_suite(path)
    assert not denied.ok
    assert denied.got == "deny sessions.count"
    assert malformed.ok

"""Helpers for testing with the gateway: the policy-suite runner, an in-memory audit capture, and fakes.

For users' own tests as much as the project's: :func:`capture_audit` gives a Gateway whose trail is kept in
memory, and :class:`FakeRunner` (re-exported) answers with scripted outcomes and no engine. Neither is ever
a security test: containment is only tested against a real engine.

Policy test suites are YAML files of requests with their expected decisions, and invalid-policy fixtures.
The same runner backs ``gateway policy test DIR`` and the project's golden tests. A suite file is any
``*.yaml`` under DIR whose top level says ``kind: PolicyTest``::

    kind: PolicyTest
    policy: ../../../policies/default.yaml     # relative to this file
    cases:
      - name: plain snippet runs
        request: {code: "print(2+2)"}
        allowed: true
      - name: too much memory
        request: {code: "x", limits: {memory: 1g}}
        allowed: false
        violations: [limits.memory]            # exact set of denying rule ids
        warnings: []                            # optional: exact set of warning rule ids
      - name: malformed request
        request: {code: 1}
        invalid: ["$.code"]                     # the request is rejected; these paths must be among the errors
    invalid_policies:
      - name: duplicate key
        policy: invalid/duplicate-key.yaml
        errors: [{path: "$.spec.limits.memory", line: 14}]   # each must appear among the problems
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from gateway._gateway import Gateway
from gateway.audit.memory import MemoryAuditSink
from gateway.decision import Decision, evaluate, resolve
from gateway.errors import PolicyError, Problem, RequestError
from gateway.policy import Policy, PolicySet, compile_policy, load_policy
from gateway.policy.yamlstrict import load_yaml
from gateway.request import ExecutionRequest, parse_request
from gateway.runner.docker.options import DockerAssembler, build_options
from gateway.runner.fake import FakeRunner, FakeSandbox, make_outcome

__all__ = [
    "CaseResult",
    "FakeRunner",
    "FakeSandbox",
    "MemoryAuditSink",
    "assemble",
    "capture_audit",
    "decide",
    "discover_suites",
    "make_outcome",
    "run_suite",
    "run_suites",
]


def decide(
    policy: Policy,
    request: ExecutionRequest,
    *,
    now: datetime | None = None,
    principal: str | None = None,
    **kwargs: Any,
) -> Decision:
    """``evaluate`` with the Docker backend's assembler: the decision a Gateway over the Docker runner makes
    (``kwargs``: ``denied_paths``, ``request_id``, ``decision_id``, ``admission``). ``now``: the decision time
    (exception expiry); ``principal``: replaces the request's principal."""
    if principal is not None:
        request = replace(request, principal=principal)
    return evaluate(policy, request, assembler=DockerAssembler(), now=now, **kwargs)


def assemble(policy: Policy, request: ExecutionRequest, *, decision_id: str, request_id: str) -> dict[str, Any]:
    """The Docker options for ``request`` under ``policy``, *without judging it* (use :func:`decide` for that)."""
    return build_options(resolve(policy, request), decision_id=decision_id, request_id=request_id)


@contextmanager
def capture_audit(
    policy: Policy | PolicySet, runner: FakeRunner | None = None
) -> Iterator[tuple[Gateway, MemoryAuditSink]]:
    """A started Gateway over ``policy`` with an in-memory trail (and a :class:`FakeRunner` unless given).

    ``sink.records`` holds every record as written, hash-chained like a real trail::

        with capture_audit(load_policy("my.yaml")) as (gw, sink):
            gw.execute({"code": "print(1)"})
        assert [r["event_type"] for r in sink.records][-2:] == ["execution.outcome", "gateway.stop"]
    """
    sink = MemoryAuditSink()
    with Gateway(policy, runner=runner if runner is not None else FakeRunner(), audit=sink) as gateway:
        yield gateway, sink


@dataclass(frozen=True, slots=True)
class CaseResult:
    suite: str
    name: str
    ok: bool
    expected: str
    got: str
    detail: str = ""


def _fmt(ids: Iterable[str]) -> str:
    items = sorted(set(ids))
    return ",".join(items) if items else "-"


def _suite_error(suite: str, message: str) -> CaseResult:
    return CaseResult(suite, "<suite>", False, "a valid suite", "broken suite", message)


def _run_case(suite: str, policy: Policy, index: int, case: Any, denied_paths: Sequence[str]) -> CaseResult:
    if not isinstance(case, dict) or "request" not in case:
        return _suite_error(suite, f"cases[{index}] needs a request")
    name = str(case.get("name", f"case {index}"))
    if "invalid" in case:
        wanted = [str(p) for p in case.get("invalid") or []]
        try:
            parse_request(case["request"])
        except RequestError as exc:
            paths = {p.path for p in exc.problems}
            missing = [p for p in wanted if p not in paths]
            return CaseResult(
                suite, name, not missing, f"invalid {_fmt(wanted)}", f"invalid {_fmt(paths)}",
                f"missing error paths: {missing}" if missing else "",
            )  # fmt: skip
        return CaseResult(suite, name, False, f"invalid {_fmt(wanted)}", "valid request")
    try:
        request = parse_request(case["request"])
    except RequestError as exc:
        return CaseResult(suite, name, False, "a valid request", "invalid request", exc.diagnostics())
    if case.get("principal") is not None:
        request = replace(request, principal=str(case["principal"]))
    now = datetime.fromisoformat(str(case["now"])) if case.get("now") is not None else None
    decision = evaluate(
        compile_policy(policy), request, assembler=DockerAssembler(), denied_paths=denied_paths, now=now
    )
    want_allowed = bool(case.get("allowed", False))
    expected = f"{'allow' if want_allowed else 'deny'} {_fmt(case.get('violations') or [])}"
    got_violations = [v.rule for v in decision.violations]
    got = f"{'allow' if decision.allowed else 'deny'} {_fmt(got_violations)}"
    ok = decision.allowed == want_allowed
    detail = []
    if "violations" in case and set(case["violations"] or []) != set(got_violations):
        ok = False
        detail.append(f"violations {_fmt(got_violations)} != expected {_fmt(case['violations'] or [])}")
    if "warnings" in case:
        got_warnings = [w.rule for w in decision.warnings]
        if set(case["warnings"] or []) != set(got_warnings):
            ok = False
            detail.append(f"warnings {_fmt(got_warnings)} != expected {_fmt(case['warnings'] or [])}")
    if "exceptions" in case and sorted(case["exceptions"] or []) != sorted(decision.exceptions):
        ok = False
        detail.append(f"exceptions {_fmt(decision.exceptions)} != expected {_fmt(case['exceptions'] or [])}")
    if not ok:
        detail.extend(f"{v.rule}: {v.message}" for v in decision.violations)
    return CaseResult(suite, name, ok, expected, got, "; ".join(detail))


def _run_invalid(suite: str, base: Path, index: int, case: Any) -> CaseResult:
    if not isinstance(case, dict) or "policy" not in case:
        return _suite_error(suite, f"invalid_policies[{index}] needs a policy")
    name = str(case.get("name", case["policy"]))
    wanted = case.get("errors") or []
    expected = "invalid " + _fmt(f"{e.get('path', '$')}@{e.get('line', '?')}" for e in wanted)
    try:
        load_policy(base / str(case["policy"]))
    except PolicyError as exc:
        problems: tuple[Problem, ...] = exc.problems
        got = "invalid " + _fmt(f"{p.path}@{p.line}" for p in problems)
        missing = []
        for want in wanted:
            if not any(
                p.path == want.get("path", p.path)
                and (want.get("line") is None or p.line == want["line"])
                and str(want.get("contains", "")) in p.message
                for p in problems
            ):
                missing.append(want)
        detail = f"missing: {missing}; got: " + "; ".join(str(p) for p in problems) if missing else ""
        return CaseResult(suite, name, not missing, expected, got, detail)
    return CaseResult(suite, name, False, expected, "valid policy")


def run_suite(path: str | os.PathLike[str], *, denied_paths: Sequence[str] = ()) -> list[CaseResult]:
    """Run one suite file; a broken suite is reported as a failing case, never raised.

    ``denied_paths``: host paths no mount may reach in these decisions (a Gateway passes its trail's)."""
    suite_path = Path(path)
    suite = os.fspath(path)
    try:
        loaded = load_yaml(suite_path.read_text(encoding="utf-8"), source=suite)
    except (OSError, UnicodeDecodeError) as exc:
        return [_suite_error(suite, f"cannot read: {exc}")]
    except PolicyError as exc:
        return [_suite_error(suite, exc.diagnostics())]
    doc = loaded.data
    if not isinstance(doc, dict) or doc.get("kind") != "PolicyTest":
        return [_suite_error(suite, "not a suite (kind: PolicyTest)")]
    results: list[CaseResult] = []
    base = suite_path.parent
    if doc.get("cases"):
        try:
            policy = load_policy(base / str(doc.get("policy", "")))
        except PolicyError as exc:
            return [_suite_error(suite, exc.diagnostics())]
        results.extend(_run_case(suite, policy, i, c, denied_paths) for i, c in enumerate(doc["cases"]))
    results.extend(_run_invalid(suite, base, i, c) for i, c in enumerate(doc.get("invalid_policies") or []))
    if not results:
        results.append(_suite_error(suite, "the suite has no cases"))
    return results


def discover_suites(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """Every ``*.yaml``/``*.yml`` under ``directory`` that declares ``kind: PolicyTest``, sorted."""
    for path in sorted(Path(directory).rglob("*.y*ml")):
        try:
            head = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if any(line.strip() == "kind: PolicyTest" for line in head.splitlines()):
            yield path


def run_suites(directory: str | os.PathLike[str], *, denied_paths: Sequence[str] = ()) -> list[CaseResult]:
    """Run every suite under ``directory``."""
    results: list[CaseResult] = []
    for path in discover_suites(directory):
        results.extend(run_suite(path, denied_paths=denied_paths))
    return results

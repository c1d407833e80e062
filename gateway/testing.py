"""Helpers for testing with the gateway: the policy-suite runner, an in-memory audit capture, and fakes.

For users' own tests as much as the project's: :func:`capture_audit` gives a Gateway whose trail is kept in
memory, and :class:`FakeRunner` (re-exported) answers with scripted outcomes and no engine. Neither is ever
a security test: containment is only tested against a real engine.

Policy test suites are YAML files of requests with their expected decisions, and invalid-policy fixtures.
The same runner backs ``gateway policy test DIR`` and the project's golden tests. A suite file is any
``*.yaml`` under DIR whose top level says ``kind: PolicyTest``; it is read by the same strict YAML loader as
policies and validated by ``schemas/policy-test.schema.json`` (an unknown key is an error, every problem is
reported as ``file:line: $.path: ...``, and a suite with any problem runs no case)::

    # yaml-language-server: $schema=../../../schemas/policy-test.schema.json
    kind: PolicyTest
    policy: ../../../policies/default.yaml     # relative to this file
    cases:
      - name: plain snippet runs
        request: {code: "print(2+2)"}
        allowed: true                           # required in every decision case
        options: {mem_limit: 268435456}         # assembled options that must match (a subset)
      - name: too much memory
        request: {code: "x", limits: {memory: 1g}}
        allowed: false
        violations: [{rule: limits.memory, path: $.limits.memory}]   # ids or {rule, path}: a multiset
        warnings: []                            # optional, the same forms
        approvals: []                           # approve-mode failures (a request waiting for approval), the same
      - name: a principal's exception, before it expires
        request: {code: "x", limits: {memory: 6g}}
        principal: ml-bot-1                     # sets the request's principal
        now: "2026-12-01T00:00:00Z"             # the decision time
        allowed: true
        exceptions: [EXC-2026-001]              # ids of the exceptions the decision used
      - name: malformed request
        request: {code: 1}
        invalid: ["$.code"]                     # the request is rejected; these paths must be among the errors
      - name: a session request instead of an execution (decide_session)
        session: {mode: kernel, idle_s: 600}    # schemas/session-request.schema.json
        live_sessions: 1                        # the principal's live sessions (rule sessions.count); default 0
        allowed: false
        violations: [sessions.enabled]          # the default policy allows no sessions
    invalid_policies:
      - name: duplicate key
        policy: invalid/duplicate-key.yaml
        errors: [{path: "$.spec.limits.memory", line: 14}]   # each must appear among the problems

``violations``, ``warnings`` and ``approvals`` are compared as multisets: a rule id matches one result of that rule, a
``{rule, path}`` one result of that rule at that path; omitted, they are not checked.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from gateway._gateway import Gateway
from gateway.audit.memory import MemoryAuditSink
from gateway.decision import Decision, RuleResult, decide_session, evaluate, resolve
from gateway.errors import PolicyError, Problem, RequestError
from gateway.policy import CompiledPolicy, Policy, PolicySet, compile_policy, load_policy
from gateway.request import ExecutionRequest, parse_request, parse_session_request
from gateway.resources import load_schema
from gateway.runner.docker.options import DockerAssembler, build_options
from gateway.runner.fake import FakeRunner, FakeSandbox, make_outcome
from gateway.validation import problems_from_error
from gateway.yamlstrict import LoadedYaml, load_yaml

__all__ = [
    "MAX_SUITE_BYTES",
    "CaseResult",
    "FakeRunner",
    "FakeSandbox",
    "MemoryAuditSink",
    "assemble",
    "capture_audit",
    "decide",
    "discover_suites",
    "load_suite",
    "make_outcome",
    "run_suite",
    "run_suites",
]

MAX_SUITE_BYTES = 4 * 1024 * 1024
"""A suite file larger than this is refused before parsing."""

SUITE_HINT = "fix the suite file; its format is schemas/policy-test.schema.json (every decision case states `allowed`)"


def decide(
    policy: Policy | CompiledPolicy,
    request: ExecutionRequest,
    *,
    now: datetime | None = None,
    principal: str | None = None,
    **kwargs: Any,
) -> Decision:
    """``evaluate`` with the Docker backend's assembler: the decision a Gateway over the Docker runner makes.

    ``now``: the decision time (UTC; ``None``: the current time). ``principal``: replaces the request's
    principal. ``kwargs``: ``denied_paths``, ``request_id``, ``decision_id``, ``admission``.
    """
    if principal is not None:
        request = dataclasses.replace(request, principal=principal)
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


# --- loading a suite: strict YAML, the schema, a semantic pass ---------------------------------------------


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(load_schema("policy-test"), format_checker=Draft202012Validator.FORMAT_CHECKER)


def _suite_problem(loaded: LoadedYaml, path: str, message: str) -> Problem:
    return Problem(message, path=path, source=loaded.source, line=loaded.line_of(path), code="policy_test.semantic")


def _semantic_problems(loaded: LoadedYaml) -> list[Problem]:
    """What the schema cannot say: cases that could never pass, a principal given twice, a time we cannot read."""
    problems: list[Problem] = []
    for index, case in enumerate(loaded.data.get("cases") or ()):
        at = f"$.cases[{index}]"
        if "invalid" in case:
            continue
        if case["allowed"] is False and "options" in case:
            problems.append(
                _suite_problem(loaded, f"{at}.options", "a denied decision has no assembled options; expect "
                               "`allowed: true` or drop `options`")
            )  # fmt: skip
        if case["allowed"] is True and case.get("violations"):
            problems.append(
                _suite_problem(loaded, f"{at}.violations", "an allowed decision has no violations; expect "
                               "`allowed: false` or drop the violations (audit-mode failures are `warnings`)")
            )  # fmt: skip
        if "principal" in case and "principal" in case.get("request", case.get("session", {})):
            problems.append(
                _suite_problem(loaded, f"{at}.principal", "the principal is given twice (here and in the request); "
                               "give it once")
            )  # fmt: skip
        if "now" in case and _parse_now(case["now"]) is None:
            problems.append(
                _suite_problem(loaded, f"{at}.now", f"{case['now']!r} is not an RFC 3339 date-time with a time zone "
                               "(e.g. 2026-12-01T00:00:00Z)")
            )  # fmt: skip
    return problems


def _parse_now(value: str) -> datetime | None:
    """An RFC 3339 time (the schema checked its form) as an aware datetime; ``None`` when Python cannot read it."""
    try:
        moment = datetime.fromisoformat(value.upper())
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def load_suite(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read one suite file strictly and validate it; raise :class:`PolicyError` listing every problem, sorted.

    Duplicate keys, anchors and unknown keys are errors, like in a policy; each problem reads
    ``file:line: $.path: what is wrong``.
    """
    source = os.fspath(path)
    try:
        with Path(source).open("rb") as fh:
            raw = fh.read(MAX_SUITE_BYTES + 1)
    except OSError as exc:
        problem = Problem(f"cannot read: {exc.strerror or exc}", source=source)
        raise PolicyError(f"suite {source} cannot be read", problems=[problem], hint=SUITE_HINT) from exc
    if len(raw) > MAX_SUITE_BYTES:
        problem = Problem(f"larger than the {MAX_SUITE_BYTES} byte cap", source=source)
        raise PolicyError(f"suite {source} is too large", problems=[problem], hint=SUITE_HINT)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = Problem(f"not valid UTF-8 at byte {exc.start}", source=source)
        raise PolicyError(f"suite {source} is not UTF-8", problems=[problem], hint=SUITE_HINT) from exc
    try:
        loaded = load_yaml(text, source=source)
    except PolicyError as exc:
        raise PolicyError(exc.message, problems=exc.problems, hint=SUITE_HINT) from exc
    problems: list[Problem] = []
    for error in _validator().iter_errors(loaded.data):
        problems.extend(problems_from_error(error, source=source, domain="policy_test", line_of=loaded.line_of))
    if not problems:
        problems = _semantic_problems(loaded)
    if problems:
        problems.sort(key=lambda p: (p.line or 0, p.path))
        raise PolicyError(f"suite {source} has {len(problems)} problem(s)", problems=problems, hint=SUITE_HINT)
    suite: dict[str, Any] = loaded.data
    return suite


# --- running cases -----------------------------------------------------------------------------------------


def _fmt(items: Iterable[str]) -> str:
    ordered = sorted(items)
    return ",".join(ordered) if ordered else "-"


def _suite_error(suite: str, message: str) -> CaseResult:
    return CaseResult(suite, "<suite>", False, "a valid suite", "broken suite", message)


_Expected = tuple[str, str | None]
"""An expected result: rule id, and its path when the case names one."""


def _expected(items: Sequence[Any]) -> list[_Expected]:
    return [(item, None) if isinstance(item, str) else (item["rule"], item["path"]) for item in items]


def _show(item: _Expected) -> str:
    rule, path = item
    return rule if path is None else f"{rule}@{path}"


def _unmatched(want: list[_Expected], got: Sequence[RuleResult]) -> tuple[list[_Expected], list[_Expected]]:
    """Multiset matching: first every ``(rule, path)`` against a result at that path, then each bare rule id
    against any remaining result of that rule. Returns (expected but missing, got but not expected)."""
    left = Counter((r.rule, r.path) for r in got)
    missing: list[_Expected] = []
    for rule, path in sorted(want, key=lambda item: item[1] is None):  # the ones with a path first
        candidates = [key for key, n in sorted(left.items()) if n > 0 and key[0] == rule and path in (None, key[1])]
        if candidates:
            left[candidates[0]] -= 1
        else:
            missing.append((rule, path))
    extra: list[_Expected] = [key for key, n in sorted(left.items()) for _ in range(n)]
    return missing, extra


def _compare_results(what: str, want_raw: Sequence[Any], got: Sequence[RuleResult]) -> str | None:
    want = _expected(want_raw)
    missing, extra = _unmatched(want, got)
    if not missing and not extra:
        return None
    paths = any(path is not None for _rule, path in want)
    shown = _fmt(_show(g) if paths else g[0] for g in ((r.rule, r.path) for r in got))
    parts = [f"{what} {shown} != expected {_fmt(_show(w) for w in want)}"]
    if missing:
        parts.append(f"missing {_fmt(_show(m) for m in missing)}")
    if extra:
        parts.append(f"unexpected {_fmt(_show(e) for e in extra)}")
    return "; ".join(parts)


def _same_json(want: Any, got: Any) -> bool:
    """Equal as JSON values: ``true`` is not ``1`` (Python says it is), ``1`` equals ``1.0``."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(want) is type(got) and want == got
    if isinstance(want, list) and isinstance(got, list):
        return len(want) == len(got) and all(_same_json(w, g) for w, g in zip(want, got, strict=True))
    if isinstance(want, dict) and isinstance(got, dict):
        return want.keys() == got.keys() and all(_same_json(want[k], got[k]) for k in want)
    return bool(want == got)


def _options_mismatches(want: Mapping[str, Any], got: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every key of ``want`` missing from ``got`` or with another value; maps are compared as subsets."""
    out: list[str] = []
    for key, value in want.items():
        name = f"{prefix}{key}"
        if key not in got:
            out.append(f"{name}: absent (expected {value!r})")
        elif isinstance(value, dict) and isinstance(got[key], dict):
            out.extend(_options_mismatches(value, got[key], f"{name}."))
        elif not _same_json(value, got[key]):
            out.append(f"{name}: {got[key]!r} (expected {value!r})")
    return out


def _decide_case(
    policy: CompiledPolicy, raw: Mapping[str, Any], case: Mapping[str, Any], denied_paths: Sequence[str]
) -> Decision:
    """The decision a case asks for: an execution's (``request``) or a session's (``session``)."""
    now = _parse_now(case["now"]) if "now" in case else None
    if "session" in case:
        session = decide_session(
            policy, parse_session_request(raw), live_sessions=case.get("live_sessions", 0),
            assembler=DockerAssembler(), denied_paths=denied_paths, now=now,
        )  # fmt: skip
        return session.decision
    return decide(policy, parse_request(raw), now=now, denied_paths=denied_paths)


def _run_case(
    suite: str, policy: CompiledPolicy, index: int, case: Mapping[str, Any], denied_paths: Sequence[str]
) -> CaseResult:
    name = str(case.get("name", f"case {index}"))
    raw_request = dict(case["session"] if "session" in case else case["request"])
    if "principal" in case:
        raw_request["principal"] = case["principal"]
    parse = parse_session_request if "session" in case else parse_request
    if "invalid" in case:
        wanted = [str(p) for p in case["invalid"]]
        try:
            parse(raw_request)
        except RequestError as exc:
            paths = {p.path for p in exc.problems}
            missing = [p for p in wanted if p not in paths]
            return CaseResult(
                suite, name, not missing, f"invalid {_fmt(set(wanted))}", f"invalid {_fmt(paths)}",
                f"missing error paths: {missing}" if missing else "",
            )  # fmt: skip
        return CaseResult(suite, name, False, f"invalid {_fmt(set(wanted))}", "valid request")
    try:
        decision = _decide_case(policy, raw_request, case, denied_paths)
    except RequestError as exc:
        return CaseResult(suite, name, False, "a valid request", "invalid request", exc.diagnostics())
    want_allowed: bool = case["allowed"]
    want_violations = _expected(case.get("violations") or [])
    expected = f"{'allow' if want_allowed else 'deny'} {_fmt(_show(w) for w in want_violations)}"
    got = f"{'allow' if decision.allowed else 'deny'} {_fmt(v.rule for v in decision.violations)}"
    detail: list[str] = []
    if decision.allowed != want_allowed:
        detail.append(f"{'allowed' if decision.allowed else 'denied'}, expected {'allow' if want_allowed else 'deny'}")
    judged = (("violations", decision.violations), ("warnings", decision.warnings), ("approvals", decision.approvals))
    for key, results in judged:
        if key in case:
            mismatch = _compare_results(key, case[key], results)
            if mismatch is not None:
                detail.append(mismatch)
    if "exceptions" in case:
        got_exceptions = [str(e) for e in decision.to_dict().get("exceptions", [])]
        if Counter(got_exceptions) != Counter(case["exceptions"]):
            detail.append(f"exceptions {_fmt(got_exceptions)} != expected {_fmt(case['exceptions'])}")
    if "options" in case:
        options = decision.options
        if options is None:
            detail.append("options: none were assembled (the request was denied)")
        else:
            detail.extend(f"options.{m}" for m in _options_mismatches(case["options"], options))
    if detail:
        detail.extend(f"{v.rule} at {v.path}: {v.message}" for v in decision.violations)
        detail.extend(f"warning {w.rule} at {w.path}: {w.message}" for w in decision.warnings)
    return CaseResult(suite, name, not detail, expected, got, "; ".join(detail))


def _run_invalid(suite: str, base: Path, index: int, case: Mapping[str, Any]) -> CaseResult:
    name = str(case.get("name", case["policy"]))
    wanted: list[Mapping[str, Any]] = case.get("errors") or []
    expected = "invalid " + _fmt({f"{e.get('path', '$')}@{e.get('line', '?')}" for e in wanted})
    try:
        load_policy(base / str(case["policy"]))
    except PolicyError as exc:
        problems: tuple[Problem, ...] = exc.problems
        got = "invalid " + _fmt({f"{p.path}@{p.line}" for p in problems})
        missing = []
        for want in wanted:
            if not any(
                p.path == want.get("path", p.path)
                and (want.get("line") is None or p.line == want["line"])
                and str(want.get("contains", "")) in p.message
                for p in problems
            ):
                missing.append(dict(want))
        detail = f"missing: {missing}; got: " + "; ".join(str(p) for p in problems) if missing else ""
        return CaseResult(suite, name, not missing, expected, got, detail)
    return CaseResult(suite, name, False, expected, "valid policy")


def run_suite(path: str | os.PathLike[str], *, denied_paths: Sequence[str] = ()) -> list[CaseResult]:
    """Run one suite file; a broken suite is reported as failing results (one per problem), never raised.

    ``denied_paths``: host paths no mount may reach in these decisions (a Gateway passes its trail's)."""
    suite = os.fspath(path)
    try:
        doc = load_suite(path)
    except PolicyError as exc:
        return [_suite_error(suite, str(p)) for p in exc.problems] or [_suite_error(suite, exc.diagnostics())]
    results: list[CaseResult] = []
    base = Path(path).parent
    if doc.get("cases"):
        try:
            policy = compile_policy(load_policy(base / str(doc["policy"])))
        except PolicyError as exc:
            return [_suite_error(suite, exc.diagnostics())]
        results.extend(_run_case(suite, policy, i, c, denied_paths) for i, c in enumerate(doc["cases"]))
    results.extend(_run_invalid(suite, base, i, c) for i, c in enumerate(doc.get("invalid_policies") or []))
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

"""Composition (extends), exceptions and the shadow (audit) policy: loading, deciding, recording, and the CLI
commands that review them (show, diff, impact, validate --warn-expiring)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.decision import evaluate
from gateway.decision.settings import BackendLimits
from gateway.errors import PolicyError
from gateway.policy import canonical_sha256, load_policy
from gateway.policy.compiled import compile_policy
from gateway.policy.compose import load_document
from gateway.request import parse_request
from gateway.resources import policies_dir
from gateway.runner.docker.options import DockerAssembler
from gateway.testing import capture_audit, decide

DEFAULT = policies_dir() / "default.yaml"
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _child(tmp_path: Path, spec: str, *, name: str = "child", base: Path = DEFAULT) -> Path:
    head = f"apiVersion: gateway.agent-exec/v1\nkind: Policy\nextends: {base}\nmetadata: {{name: {name}}}\n"
    return _write(tmp_path / f"{name}.yaml", head + spec)


def _exception(ident: str, expires: datetime | str, *, principals: str = "[ml-bot-*]", relax: str = "") -> str:
    stamp = expires if isinstance(expires, str) else expires.isoformat().replace("+00:00", "Z")
    body = relax or "limits: {memory: {max: 2g}}"
    return (
        f"    - id: {ident}\n      match: {{principals: {principals}}}\n      {body}\n"
        f"      reason: r\n      approved_by: alice@example.com\n      expires: '{stamp}'\n"
    )


# --- extends --------------------------------------------------------------------------------------------


def test_maps_merge_lists_replace_and_metadata_is_the_childs(tmp_path: Path) -> None:
    path = _child(tmp_path, "spec:\n  limits:\n    memory: {max: 1g}\n  env:\n    allowed: [ONLY_THIS]\n")
    policy = load_policy(path)
    assert policy.name == "child"
    assert policy.description == ""  # metadata is the child's alone: the base's description is not inherited
    assert policy.limits.memory.max == 1 << 30
    assert policy.limits.memory.default == 256 << 20  # merged key by key: the base's default stays
    assert policy.env.allowed == ("ONLY_THIS",)  # lists replace the base's list whole
    assert policy.env.max_count == 16  # ... while the rest of the env mapping is inherited
    doc = load_document(path).data
    assert "extends" not in doc
    assert policy.sha256 == canonical_sha256(doc)  # the merged document is what is fingerprinted


def test_a_child_without_spec_is_its_base_with_its_own_name(tmp_path: Path) -> None:
    policy = load_policy(_child(tmp_path, ""))
    base = load_policy(DEFAULT)
    assert (policy.limits, policy.images, policy.env) == (base.limits, base.images, base.env)
    assert policy.sha256 != base.sha256  # the name differs, so the fingerprint does


def test_problems_point_to_the_file_that_wrote_the_value(tmp_path: Path) -> None:
    base = _write(
        tmp_path / "base.yaml",
        DEFAULT.read_text().replace("memory: {default: 256m, max: 512m}", "memory: {default: 256m, max: 512m, x: 1}"),
    )
    child = _child(tmp_path, "spec:\n  limits:\n    cpus: {default: nine, max: 2}\n", base=base)
    with pytest.raises(PolicyError) as info:
        load_policy(child)
    where = {(p.source, p.path) for p in info.value.problems}
    assert (str(base), "$.spec.limits.memory.x") in where  # inherited: the base file's line
    assert (str(child), "$.spec.limits.cpus.default") in where  # the child's own value: the child's line
    lines = {p.path: p.line for p in info.value.problems}
    assert lines["$.spec.limits.cpus.default"] == 7


def test_extending_itself_is_a_cycle(tmp_path: Path) -> None:
    path = tmp_path / "self.yaml"
    _write(path, "apiVersion: gateway.agent-exec/v1\nkind: Policy\nextends: self.yaml\nmetadata: {name: s}\n")
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    [problem] = info.value.problems
    assert (problem.path, problem.line, problem.source) == ("$.extends", 3, str(path))
    assert "extends cycle" in problem.message


def test_extends_must_be_a_path(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.yaml", "apiVersion: gateway.agent-exec/v1\nkind: Policy\nextends: [a]\n")
    with pytest.raises(PolicyError, match="is not a path"):
        load_policy(path)


# --- exceptions -----------------------------------------------------------------------------------------


def _exceptions_policy(tmp_path: Path, *entries: str) -> Path:
    return _child(tmp_path, "spec:\n  exceptions:\n" + "".join(entries), name="exc")


def test_an_exception_applies_to_matching_principals_before_expiry(tmp_path: Path) -> None:
    policy = load_policy(_exceptions_policy(tmp_path, _exception("EXC-1", "2027-01-31T00:00:00Z")))
    request = parse_request({"code": "x", "limits": {"memory": "2g"}})
    bot = decide(policy, request, principal="ml-bot-3", now=NOW)
    assert bot.allowed
    assert bot.exceptions == ("EXC-1",)
    assert bot.to_dict()["exceptions"] == ["EXC-1"]
    assert bot.options is not None
    assert bot.options["mem_limit"] == 2 << 30
    other = decide(policy, request, principal="analyst", now=NOW)
    assert not other.allowed
    assert other.exceptions == ()
    expired = decide(policy, request, principal="ml-bot-3", now=datetime(2027, 1, 31, tzinfo=UTC))
    assert not expired.allowed
    assert expired.exceptions == ()
    naive = decide(policy, request, principal="ml-bot-3", now=datetime(2026, 12, 1))
    assert naive.allowed
    nobody = decide(policy, request, now=NOW)  # a request without a principal matches no exception
    assert not nobody.allowed


def test_an_exception_never_relaxes_the_backend_or_the_guard(tmp_path: Path) -> None:
    relax = "limits: {cpus: {max: 64}, pids: {max: 100000}}"
    policy = load_policy(_exceptions_policy(tmp_path, _exception("EXC-1", "2027-01-31T00:00:00Z", relax=relax)))
    small_host = DockerAssembler(capacity=lambda: BackendLimits(max_cpus=4))
    request = parse_request({"code": "x", "limits": {"cpus": 32}, "principal": "ml-bot-1"})
    denied = evaluate(policy, request, assembler=small_host, now=NOW)
    assert not denied.allowed  # above what the backend can give: denied even with the exception
    assert [v.rule for v in denied.violations] == ["limits.cpus"]
    allowed = evaluate(policy, parse_request({"code": "x", "limits": {"pids": 100000}, "principal": "ml-bot-1"}),
                       assembler=small_host, now=NOW)  # fmt: skip
    assert allowed.allowed
    assert allowed.exceptions == ("EXC-1",)
    options = allowed.options
    assert options is not None
    assert options["pids_limit"] == 100000
    assert options["cap_drop"] == ["ALL"]
    assert options["read_only"] is True
    assert options["memswap_limit"] == options["mem_limit"]


def test_an_exception_never_lowers_a_ceiling(tmp_path: Path) -> None:
    """Two live exceptions for one principal: the later, smaller one does not undo the earlier, larger one (and
    the loader refuses an exception below the policy's own ceiling, so relax sees only ceilings above it)."""
    wide = _exception("EXC-WIDE", "2027-01-31T00:00:00Z", relax="limits: {memory: {max: 2g}}")
    narrow = _exception("EXC-NARROW", "2027-01-31T00:00:00Z", relax="limits: {memory: {max: 1g}}")
    policy = load_policy(_exceptions_policy(tmp_path, wide, narrow))
    relaxed = compile_policy(policy).relaxed(policy.exceptions).policy
    assert relaxed.limits.memory.max == 2 << 30
    bot = decide(policy, parse_request({"code": "x", "limits": {"memory": "2g"}}), principal="ml-bot-1", now=NOW)
    assert bot.allowed, bot.to_dict()
    assert bot.exceptions == ("EXC-WIDE", "EXC-NARROW")
    low = _exception("EXC-LOW", "2027-01-31T00:00:00Z", relax="limits: {memory: {max: 300m}}")
    with pytest.raises(PolicyError) as info:
        load_policy(_exceptions_policy(tmp_path, low))
    assert info.value.problems[0].message.startswith("300m does not raise the policy's ceiling 512m")


def test_exception_ids_reach_the_audit_trail(tmp_path: Path) -> None:
    soon = datetime.now(UTC) + timedelta(days=3)
    gone = datetime.now(UTC) - timedelta(days=3)
    policy = load_policy(
        _exceptions_policy(tmp_path, _exception("EXC-LIVE", soon), _exception("EXC-GONE", gone, relax=""))
    )
    with capture_audit(policy) as (gw, sink):
        result = gw.decide({"code": "x", "limits": {"memory": "2g"}, "principal": "ml-bot-1"})
    assert result.allowed  # the Gateway decides at the current time: the live exception applies
    [record] = [r for r in sink.records if r["event_type"] == "policy.decision"]
    assert record["data"]["decision"]["exceptions"] == ["EXC-LIVE"]  # the expired one is ignored


# --- shadow policy --------------------------------------------------------------------------------------


def test_the_shadow_policy_warns_and_never_denies(tmp_path: Path) -> None:
    stricter = _child(tmp_path / "shadows", "spec:\n  limits:\n    memory: {default: 64m, max: 128m}\n", name="next")
    # The base names the shadow (relative to the base's own directory); the child inherits it.
    base = _child(tmp_path / "base", f"spec:\n  audit_policy: ../shadows/{stricter.name}\n", name="base")
    policy = load_policy(_child(tmp_path, "", name="team", base=base))
    assert policy.audit_policy is not None
    assert policy.audit_policy.name == "next"
    decision = decide(policy, parse_request({"code": "x", "limits": {"memory": "256m"}}))
    assert decision.allowed
    assert [(w.rule, w.status, w.mode) for w in decision.warnings] == [("shadow:limits.memory", "fail", "audit")]
    out = decision.to_dict()
    assert out["shadow"] == {"policy": {"name": "next", "sha256": policy.audit_policy.sha256}, "allowed": False}
    assert [w["rule"] for w in out["warnings"]] == ["shadow:limits.memory"]
    quiet = decide(policy, parse_request({"code": "x", "limits": {"memory": "64m"}}))
    assert quiet.warnings == ()
    assert quiet.to_dict()["shadow"]["allowed"] is True


def test_a_missing_shadow_policy_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = _child(tmp_path, "spec:\n  audit_policy: nowhere.yaml\n")
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    head = info.value.problems[0]
    assert (head.path, head.line, head.source) == ("$.spec.audit_policy", 6, str(path))
    assert "does not load" in head.message


# --- CLI ------------------------------------------------------------------------------------------------


def test_show_prints_the_effective_policy_that_loads_to_the_same_fingerprint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = policies_dir() / "examples" / "data-science.yaml"
    assert main(["policy", "show", str(example)]) == 0
    text = capsys.readouterr().out
    policy = load_policy(example)
    assert f"data-science@sha256:{policy.sha256}" in text.splitlines()[0]
    standalone = _write(tmp_path / "effective.yaml", text)
    assert load_policy(standalone).sha256 == policy.sha256  # what is shown is exactly what is enforced
    assert "extends" not in text
    assert "max: 4g" in text
    assert "APP_*" in text


def test_show_refuses_an_invalid_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _child(tmp_path, "spec:\n  limits:\n    memory: {max: lots}\n")
    assert main(["policy", "show", str(path)]) != 0
    assert f"{path}:7: $.spec.limits.memory.max" in capsys.readouterr().err


def test_diff_lists_changed_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example = policies_dir() / "examples" / "data-science.yaml"
    assert main(["policy", "diff", str(DEFAULT), str(example)]) == 1
    text = capsys.readouterr().out
    assert "$.spec.limits.memory.max: 512m -> 4g" in text
    assert "$.spec.exceptions: (absent) -> " in text
    assert "$.spec.env" not in text  # inherited unchanged
    assert main(["policy", "diff", "--json", str(DEFAULT), str(example)]) == 1
    report = json.loads(capsys.readouterr().out)
    changes = {c["path"]: c for c in report["changes"]}
    assert changes["$.spec.limits.cpus.max"] == {"path": "$.spec.limits.cpus.max", "old": 2, "new": 4}
    assert "old" not in changes["$.spec.exceptions"]
    assert report["new"]["sha256"] == load_policy(example).sha256
    assert main(["policy", "diff", str(DEFAULT), str(DEFAULT)]) == 0
    assert "no differences" in capsys.readouterr().out


def _check(request: dict[str, object], trail: Path, tmp_path: Path, policy: Path = DEFAULT) -> None:
    req = _write(tmp_path / "request.json", json.dumps(request))
    main(["check", "--policy", str(policy), "--audit-dir", str(trail), str(req)])


def test_impact_replays_the_trail_under_a_candidate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trail = tmp_path / "trail"
    _check({"code": "print(1)", "principal": "ml-bot-1", "limits": {"memory": "400m"}}, trail, tmp_path)
    _check({"code": "print(1)", "principal": "analyst"}, trail, tmp_path)
    _check({"code": "y" * 100_000, "principal": "big-coder"}, trail, tmp_path)  # stored code is cut at 64 KiB
    _check({"code": "x", "principal": "ml-bot-1", "limits": {"memory": "1g"}}, trail, tmp_path)  # denied then
    candidate = _child(tmp_path, "spec:\n  limits:\n    memory: {max: 300m}\n    code_size: {max: 80k}\n")
    capsys.readouterr()
    assert main(["policy", "impact", str(candidate), "--audit-dir", str(trail), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["replayed"] == 4
    assert report["skipped"] == []
    denied = {(d["principal"], tuple(d["rules"]), d["was_allowed"]) for d in report["denied"]}
    assert denied == {
        ("ml-bot-1", ("limits.memory",), True),
        ("ml-bot-1", ("limits.memory",), False),
        ("big-coder", ("limits.code_size",), True),  # judged on the full recorded size, not the stored prefix
    }
    by_who = {p["principal"]: p for p in report["principals"]}
    assert by_who["analyst"] == {"principal": "analyst", "requests": 1, "denied": 0, "rules": {}}
    assert by_who["ml-bot-1"]["rules"] == {"limits.memory": 2}
    assert main(["policy", "impact", str(candidate), "--audit-dir", str(trail)]) == 0
    text = capsys.readouterr().out
    assert "4 recorded request(s) replayed" in text
    assert "ml-bot-1" in text
    assert "limits.memory (2)" in text
    assert "(allowed then)" in text
    future = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%d")
    assert main(["policy", "impact", str(candidate), "--audit-dir", str(trail), "--since", future, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["replayed"] == 0


def test_validate_warns_about_expiring_and_expired_exceptions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = datetime.now(UTC)
    path = _exceptions_policy(
        tmp_path,
        _exception("EXC-SOON", now + timedelta(days=5, hours=1)),
        _exception("EXC-LATER", now + timedelta(days=60)),
        _exception("EXC-OLD", now - timedelta(days=1)),
    )
    assert main(["policy", "validate", str(path)]) == 0
    plain = capsys.readouterr().out
    assert "EXC-OLD expired" in plain
    assert "EXC-SOON" not in plain
    assert main(["policy", "validate", "--warn-expiring", "14d", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    [soon] = [line for line in lines if "EXC-SOON" in line]
    assert soon.startswith(f"{path}:7: warning: exception EXC-SOON expires in 5 day(s)")
    assert not any("EXC-LATER" in line for line in lines)
    assert main(["policy", "validate", "--warn-expiring", "fortnight", str(path)]) == 2


@pytest.mark.parametrize(
    ("flag", "hours"), [("14d", 14 * 24), ("36h", 36), ("2w", 14 * 24), ("3", 72)]
)  # fmt: skip
def test_durations(flag: str, hours: int) -> None:
    from gateway.cli.policy_review import parse_duration

    assert parse_duration(flag) == timedelta(hours=hours)

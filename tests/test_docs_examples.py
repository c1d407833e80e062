"""Every example of docs/policies.md is a file under docs/examples/, and every one of them is checked here.

(a) each example policy validates (`gateway policy validate`); (b) each example suite passes (`gateway policy
test`, and the same runner file by file); (c) every ```yaml block of the guide that is a full policy or suite
is byte-identical to a file under docs/examples/, and every fragment appears verbatim in one, so the guide
cannot drift from what is tested. Plus what a suite cannot express: allowed mounts against real directories,
and the PolicySet of the per-principal recipe.
"""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.policy import load_policy_text
from gateway.request import parse_request
from gateway.testing import capture_audit, decide, run_suite
from gateway.yamlstrict import load_yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"
GUIDE = ROOT / "docs" / "policies.md"
SCHEMAS = ROOT / "schemas"


# --- the example files ----------------------------------------------------------------------------------


def _kind(path: Path) -> str | None:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("kind: "):
            return line.removeprefix("kind: ").strip()
    return None


YAML_FILES = sorted(EXAMPLES.rglob("*.yaml"))
POLICIES = [p for p in YAML_FILES if _kind(p) == "Policy"]
SUITES = [p for p in YAML_FILES if _kind(p) == "PolicyTest"]


def _id(path: Path) -> str:
    return path.relative_to(EXAMPLES).as_posix()


def test_every_example_file_is_a_policy_or_a_suite() -> None:
    assert YAML_FILES, f"no examples under {EXAMPLES}"
    assert set(YAML_FILES) == set(POLICIES) | set(SUITES)


def test_every_example_policy_has_a_suite() -> None:
    tested = set()
    for suite in SUITES:
        doc = load_yaml(suite.read_text(encoding="utf-8"), source=str(suite)).data
        tested.add((suite.parent / str(doc["policy"])).resolve())
    untested = [_id(p) for p in POLICIES if p.resolve() not in tested]
    assert not untested, f"example policies without a suite: {untested}"


@pytest.mark.parametrize("path", POLICIES, ids=_id)
def test_example_policy_validates(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["policy", "validate", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"{path}: ok (" in out


@pytest.mark.parametrize("path", SUITES, ids=_id)
def test_example_suite_passes(path: Path) -> None:
    results = run_suite(path)
    assert results
    failed = [f"{r.name}: expected {r.expected}, got {r.got}. {r.detail}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)


def test_examples_through_gateway_policy_test(capsys: pytest.CaptureFixture[str]) -> None:
    """The command a reader runs, over every example."""
    rc = main(["policy", "test", str(EXAMPLES)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert " 0 failed" in out, out
    assert "FAIL" not in out, out


# --- the guide cannot drift -----------------------------------------------------------------------------

_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def _blocks(lang: str) -> list[str]:
    return [m.group(2) for m in _BLOCK.finditer(GUIDE.read_text(encoding="utf-8")) if m.group(1) == lang]


def _is_full_document(block: str) -> bool:
    return any(line in ("kind: Policy", "kind: PolicyTest") for line in block.splitlines())


def test_every_full_yaml_block_of_the_guide_is_an_example_file() -> None:
    files = {p.read_text(encoding="utf-8"): _id(p) for p in YAML_FILES}
    full = [b for b in _blocks("yaml") if _is_full_document(b)]
    assert len(full) >= 8, "the guide shows the example policies and suites verbatim"
    for block in full:
        first = block.splitlines()[:3]
        assert block in files, f"a yaml block of the guide is not byte-identical to an example file: {first}"


def test_every_yaml_fragment_of_the_guide_appears_in_an_example() -> None:
    texts = [p.read_text(encoding="utf-8") for p in YAML_FILES]
    fragments = [b for b in _blocks("yaml") if not _is_full_document(b)]
    assert fragments
    for fragment in fragments:
        assert any(fragment in text for text in texts), f"fragment not found in any example:\n{fragment}"


def test_python_blocks_of_the_guide_appear_in_the_example() -> None:
    source = (EXAMPLES / "per-principal" / "gateway_setup.py").read_text(encoding="utf-8")
    blocks = _blocks("python")
    assert blocks
    for block in blocks:
        assert block in source, f"python block not found verbatim in per-principal/gateway_setup.py:\n{block}"


def test_links_of_the_guide_exist() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert links
    broken = [link for link in links if not (GUIDE.parent / link).exists()]
    assert not broken, f"broken links in {GUIDE.name}: {broken}"
    shown = {_id(p) for p in YAML_FILES} | {"per-principal/gateway_setup.py"}
    linked = {str((GUIDE.parent / link).resolve().relative_to(EXAMPLES)) for link in links if "examples/" in link}
    verbatim = {_id(p) for p in YAML_FILES if p.read_text(encoding="utf-8") in _blocks("yaml")}
    assert shown <= linked | verbatim, f"example files the guide neither links nor shows: {sorted(shown - linked)}"


def test_readme_links_the_guide() -> None:
    assert "docs/policies.md" in (ROOT / "README.md").read_text(encoding="utf-8")


# --- what a suite cannot express ------------------------------------------------------------------------


def test_data_mounts_allowed_against_real_directories(tmp_path: Path) -> None:
    """The recipe's policy with its roots moved to real directories: ro and rw mounts are allowed, a mode
    the root does not allow is not, and the plan binds exactly the judged directories."""
    data, scratch = tmp_path / "agent-data", tmp_path / "agent-scratch"
    (data / "set1").mkdir(parents=True)
    (scratch / "team-a").mkdir(parents=True)
    text = (EXAMPLES / "data-mounts" / "datasets.yaml").read_text(encoding="utf-8")
    assert "root: /srv/agent-data\n" in text
    assert "root: /srv/agent-scratch\n" in text
    text = text.replace("root: /srv/agent-data\n", f"root: {data}\n")
    text = text.replace("root: /srv/agent-scratch\n", f"root: {scratch}\n")
    policy = load_policy_text(text, source=str(tmp_path / "datasets.yaml"))

    ok = decide(
        policy,
        parse_request(
            {
                "code": "x",
                "mounts": [
                    {"source": str(data / "set1"), "target": "/data/set1"},
                    {"source": str(scratch / "team-a"), "target": "/scratch", "mode": "rw"},
                ],
            }
        ),
    )
    assert ok.allowed, [v.message for v in ok.violations]
    assert ok.run is not None
    assert [(m.path, m.target, m.read_only) for m in ok.run.mounts] == [
        (str(data / "set1"), "/data/set1", True),
        (str(scratch / "team-a"), "/scratch", False),
    ]

    rw_data = decide(
        policy, parse_request({"code": "x", "mounts": [{"source": str(data), "target": "/data", "mode": "rw"}]})
    )
    assert not rw_data.allowed
    assert [v.rule for v in rw_data.violations] == ["mounts.allowlist"]
    assert "mode 'rw' is not allowed" in rw_data.violations[0].message


def test_per_principal_policy_set() -> None:
    setup = runpy.run_path(str(EXAMPLES / "per-principal" / "gateway_setup.py"))
    policies = setup["policies"]
    assert callable(setup["make_gateway"])
    assert policies.for_principal("ci-bot").policy.name == "ci-bots"
    assert policies.for_principal("analytics-agent").policy.name == "analytics"
    assert policies.for_principal("someone-else").policy.name == "default"
    assert policies.for_principal(None).policy.name == "default"
    with capture_audit(policies) as (gateway, _sink):
        ci_runc = gateway.decide({"code": "x", "principal": "ci-bot", "runtime": "runc"}).decision
        assert not ci_runc.allowed
        assert {v.rule for v in ci_runc.violations} == {"runtime.allowed", "runtime.required"}
        ci = gateway.decide({"code": "x", "principal": "ci-bot"}).decision
        assert ci.allowed
        assert ci.run is not None
        assert ci.run.options["runtime"] == "runsc"
        big = {"code": "x", "limits": {"memory": "1g"}}
        assert gateway.decide({**big, "principal": "analytics-agent"}).decision.allowed
        assert not gateway.decide({**big, "principal": "someone-else"}).decision.allowed


# --- the commands the guide shows -----------------------------------------------------------------------

COMMANDS: list[tuple[list[str], int]] = [  # the command, and its exit status
    (["policy", "show", "docs/examples/composition/data-science.yaml"], 0),
    (["policy", "diff", "policies/default.yaml", "docs/examples/composition/data-science.yaml"], 1),  # they differ
    (["policy", "rules"], 0),
]


@pytest.mark.parametrize(("argv", "status"), COMMANDS, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_guide_command_runs(
    argv: list[str], status: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert f"gateway {' '.join(argv)}" in " ".join(GUIDE.read_text(encoding="utf-8").split())
    monkeypatch.chdir(ROOT)
    assert main(argv) == status, capsys.readouterr()
    assert capsys.readouterr().out.strip()


def test_guide_warn_expiring_and_impact_are_real_options(capsys: pytest.CaptureFixture[str]) -> None:
    """`validate --warn-expiring 14d` and `impact --since` as the guide writes them parse (not a usage error)."""
    assert main(["policy", "validate", "--help"]) == 0
    assert "--warn-expiring" in capsys.readouterr().out
    policy = str(EXAMPLES / "exceptions" / "ml-team.yaml")
    assert main(["policy", "validate", "--warn-expiring", "14d", policy]) != 2
    assert main(["policy", "impact", "--help"]) == 0
    assert "--since" in capsys.readouterr().out

"""``benchmarks/languages.py`` without an engine: the issue's targets computed from a run's p50s, and the policy
its ``--runtime runsc`` runs under. No timing asserts (the p50s are made up)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture
def languages(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import languages as module  # a script directory: importable once it is on the path

    return module


def _steps(**p50: float) -> dict[str, dict[str, float]]:
    return {step: {"p50_ms": ms, "p95_ms": ms, "n": 1} for step, ms in p50.items()}


def test_targets_compare_pooled_with_python_and_cold_with_the_same_image_cli(languages: ModuleType) -> None:
    steps = _steps(
        python_cold=200, python_pooled=20, python_docker_cli=400,
        shell_cold=180, shell_pooled=26, shell_docker_cli=360,
        javascript_cold=500, javascript_pooled=60, javascript_docker_cli=450,
    )  # fmt: skip
    ratios, found = languages.targets(steps)
    met = {t["target"]: (t["value"], t["met"]) for t in found}
    assert met == {
        "shell pooled p50 / python pooled p50": (1.3, True),  # the bound itself is met
        "shell cold p50 / docker run gateway/sandbox-python:3.11-bookworm p50": (0.5, True),
        "javascript pooled p50 / python pooled p50": (3.0, False),
        "javascript cold p50 / docker run gateway/sandbox-node:24-bookworm p50": (1.111, False),
    }
    assert ratios["python_cold / python_docker_cli p50"] == 0.5


def test_the_runsc_policy_allows_every_language_under_runsc_only(languages: ModuleType, tmp_path: Path) -> None:
    from gateway import Gateway

    assert languages.policy_for("runc", tmp_path) == languages.POLICY
    with Gateway.from_env(languages.policy_for("runsc", tmp_path), tmp_path / "audit") as gw:
        for lang in languages.LANGUAGES:
            decided = gw.decide({"code": lang.code, "language": lang.name}).decision
            assert decided is not None
            assert decided.allowed, lang.name
            assert (decided.settings.profile.runtime, decided.settings.profile.image) == ("runsc", lang.image)
        refused = gw.decide({"code": "print(2+2)", "runtime": "runc"}).decision
        assert refused is not None
        assert not refused.allowed


def test_languages_always_include_the_python_baseline(languages: ModuleType) -> None:
    assert [lang.name for lang in languages.languages_arg("shell")] == ["python", "shell"]
    with pytest.raises(SystemExit):
        languages.main(["--languages", "ruby"])


def test_only_nodes_plain_run_under_runsc_drops_seccomp(languages: ModuleType) -> None:
    unconfined = ["--security-opt", "seccomp=unconfined"]
    node_runsc = languages.plain_run("runsc", "x=1", languages.NODE_IMAGE)
    assert node_runsc[-3:] == [*unconfined, languages.NODE_IMAGE]
    for runtime, image in (("runc", languages.NODE_IMAGE), ("runsc", languages.PYTHON_IMAGE)):
        assert "--security-opt" not in languages.plain_run(runtime, "x=1", image)

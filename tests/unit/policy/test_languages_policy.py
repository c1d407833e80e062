"""spec.languages: shell and javascript next to python, each language's default image and allowlist."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.decision import decide_session
from gateway.errors import PolicyError
from gateway.payload import LANGUAGES, Payload, file_name_problem
from gateway.policy import Policy, load_policy
from gateway.request import parse_request, parse_session_request
from gateway.resources import policies_dir
from gateway.runner.docker.options import DockerAssembler
from gateway.testing import decide

NODE = "gateway/sandbox-node:24-bookworm"
PYTHON = "gateway/sandbox-python:3.11-bookworm"


@pytest.fixture(scope="module")
def polyglot() -> Policy:
    return load_policy(policies_dir() / "examples" / "polyglot.yaml")


def _problems(make: Callable[[str], Policy], extra: str) -> list[tuple[str, str]]:
    with pytest.raises(PolicyError) as info:
        make(extra)
    return [(p.path, p.message) for p in info.value.problems]


def test_each_language_resolves_to_its_own_default_image(polyglot: Policy) -> None:
    images = {}
    for language in LANGUAGES:
        decision = decide(polyglot, parse_request({"code": "x", "language": language}))
        assert decision.allowed, decision.violations
        assert decision.settings is not None
        images[language] = decision.settings.profile.image
    assert images == {"python": PYTHON, "shell": PYTHON, "javascript": NODE}


def test_an_image_the_language_may_not_run_in_is_denied_by_language_image(polyglot: Policy) -> None:
    decision = decide(polyglot, parse_request({"code": "x", "language": "javascript", "image": PYTHON}))
    assert [(v.rule, v.path) for v in decision.violations] == [("language.image", "$.image")]
    assert "may not run javascript" in decision.violations[0].message


def test_a_policy_without_images_per_language_keeps_its_old_decisions(default_policy: Policy) -> None:
    assert default_policy.languages.images == ()
    decision = decide(default_policy, parse_request({"code": "x"}))
    assert decision.allowed
    assert [r.status for r in decision.results if r.rule == "language.image"] == ["skip"]
    denied = decide(default_policy, parse_request({"code": "echo 4", "language": "shell"}))
    assert [v.rule for v in denied.violations] == ["language.supported"]


def test_javascript_needs_an_image_of_its_own(make_policy: Callable[[str], Policy]) -> None:
    problems = _problems(make_policy, "languages: {allowed: [python, javascript]}\n")
    assert [path for path, _ in problems] == ["$.spec.languages.images"]
    assert "javascript is allowed but has no images" in problems[0][1]


def test_a_language_default_image_must_be_allowed_by_its_list_and_by_spec_images(
    make_policy: Callable[[str], Policy],
) -> None:
    problems = _problems(
        make_policy,
        f"""
        languages:
          allowed: [python, javascript]
          images:
            javascript: {{default: "{NODE}"}}
            shell: {{default: "{PYTHON}"}}
        """,
    )
    paths = sorted(path for path, _ in problems)
    assert paths == ["$.spec.languages.images.javascript.default", "$.spec.languages.images.shell"]


def test_the_default_images_are_each_languages_default(polyglot: Policy, default_policy: Policy) -> None:
    # What /readyz checks is present: javascript's node image too, not only spec.images.default.
    assert polyglot.default_images == (NODE, PYTHON)
    assert default_policy.default_images == (PYTHON,)


def test_the_default_image_is_allowed_alone_when_allow_is_omitted(polyglot: Policy) -> None:
    rule = polyglot.languages.images_of("javascript")
    assert rule is not None
    assert [(e.repository, e.tags) for e in rule.allow] == [("gateway/sandbox-node", ("24-bookworm",))]


def test_a_kernel_session_of_another_language_is_denied_by_sessions_language() -> None:
    policy = load_policy(policies_dir() / "examples" / "polyglot.yaml")
    sessions = load_policy(policies_dir() / "examples" / "data-agent.yaml")
    for pol, language in ((sessions, "python"), (policy, "shell")):
        decision = decide_session(
            pol, parse_session_request({"mode": "kernel", "language": language}), live_sessions=0,
            assembler=DockerAssembler(),
        )  # fmt: skip
        rules = [v.rule for v in decision.violations]
        assert ("sessions.language" in rules) == (language != "python"), rules
    shell = decide_session(
        sessions, parse_session_request({"mode": "workspace"}), live_sessions=0, assembler=DockerAssembler()
    )
    assert [r.status for r in shell.decision.results if r.rule == "sessions.language"] == ["skip"]


def test_the_payload_reserves_every_program_file_and_knows_the_languages() -> None:
    assert LANGUAGES == ("python", "shell", "javascript")
    for name in ("main.py", "main.sh", "main.js", "main.js/x"):
        assert file_name_problem(name) == "is reserved for the submitted code"
    assert Payload("echo 4", language="shell").language == "shell"

"""gateway doctor's image and sbom checks: every image the loaded policies name, present, with its SBOM."""

from __future__ import annotations

from gateway.doctor import checks
from gateway.policy.model import ImageEntry, ImagesRule
from gateway.runner.docker.runner import build_command

PYTHON = "gateway/sandbox-python:3.11-bookworm"
DATA = "gateway/sandbox-datascience:3.11-bookworm"
NODE = "gateway/sandbox-node:24-bookworm"
PY_ID, DATA_ID = "sha256:" + "1" * 64, "sha256:" + "2" * 64
SBOM = "sha256:" + "a" * 64
WHERE = "/var/lib/agent-gateway/sbom"


def _rule(default: str, *allow: str) -> ImagesRule:
    entries = tuple(ImageEntry(ref.rsplit(":", 1)[0], (ref.rsplit(":", 1)[1],)) for ref in (default, *allow))
    return ImagesRule(default=default, allow=entries)


def test_the_named_images_are_each_default_then_each_allowlisted_tag_once() -> None:
    rules = [_rule(PYTHON, NODE), _rule(DATA, PYTHON)]
    assert checks.named_images(rules) == {PYTHON: True, DATA: True, NODE: False}
    digest_only = ImagesRule(PYTHON, (ImageEntry("gateway/pinned", (), ("sha256:" + "3" * 64,)),))
    assert checks.named_images([digest_only]) == {PYTHON: True}, "a digest-only entry names nothing to build"


def test_every_named_image_present_passes_with_its_id() -> None:
    check = checks.images({PYTHON: True, DATA: False}, {PYTHON: PY_ID, DATA: DATA_ID}, build_command)
    assert check.status == "PASS"
    assert f"{PYTHON} {PY_ID}" in check.detail
    assert f"{DATA} {DATA_ID}" in check.detail


def test_a_missing_default_image_fails_naming_the_command_that_builds_it() -> None:
    check = checks.images({DATA: True, PYTHON: False}, {DATA: None, PYTHON: PY_ID}, build_command)
    assert check.status == "FAIL"
    assert f"{DATA} is missing (the default image)" in check.detail
    assert check.remediation == f"scripts/build-image.sh {DATA}"


def test_a_missing_allowlisted_image_only_warns() -> None:
    check = checks.images({PYTHON: True, NODE: False}, {PYTHON: PY_ID, NODE: None}, build_command)
    assert check.status == "WARN"
    assert f"{NODE} is missing (allowlisted)" in check.detail
    assert f"present: {PYTHON} {PY_ID}" in check.detail
    assert check.remediation == f"scripts/build-image.sh {NODE}"


def test_without_a_policy_both_checks_fail() -> None:
    assert checks.images({}, {}, build_command).status == "FAIL"
    assert checks.sboms({}, {}, {}, WHERE).status == "FAIL"


def test_the_sbom_check_names_each_digest_and_each_image_without_one() -> None:
    named, ids = {PYTHON: True, DATA: False}, {PYTHON: PY_ID, DATA: DATA_ID}
    both = checks.sboms(named, ids, {PY_ID: SBOM, DATA_ID: SBOM}, WHERE)
    assert both.status == "PASS"
    assert f"{PYTHON} SBOM {SBOM}" in both.detail
    assert f"{DATA} SBOM {SBOM}" in both.detail

    allowlisted = checks.sboms(named, ids, {PY_ID: SBOM, DATA_ID: None}, WHERE)
    assert allowlisted.status == "WARN"
    assert f"no SBOM recorded for {DATA} ({DATA_ID}) in {WHERE}" in allowlisted.detail
    assert f"`gateway sbom --image {DATA} --record`" in allowlisted.detail

    default = checks.sboms(named, ids, {PY_ID: None, DATA_ID: SBOM}, WHERE)
    assert default.status == "FAIL"
    assert f"`gateway sbom --image {PYTHON} --record`" in default.detail


def test_a_missing_image_fails_the_sbom_check_only_when_it_is_a_default() -> None:
    gone = checks.sboms({PYTHON: True}, {PYTHON: None}, {}, WHERE)
    assert gone.status == "FAIL"
    assert f"{PYTHON} is missing, so it has no SBOM" in gone.detail
    left = checks.sboms({PYTHON: True, NODE: False}, {PYTHON: PY_ID, NODE: None}, {PY_ID: SBOM}, WHERE)
    assert left.status == "PASS"

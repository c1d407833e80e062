"""Requirement strings and project names as spec.packages judges them (gateway.policy.packages)."""

from __future__ import annotations

import pytest

from gateway.policy.packages import RequirementError, canonical_name, name_allowed, parse_requirement


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("idna", "idna"),
        ("  Charset_Normalizer  ", "charset-normalizer"),
        ("Requests[Socks, security]>=2.0, <3", "requests[security,socks]<3,>=2.0"),
        ("zope.interface~=6.1", "zope-interface~=6.1"),
        ("pkg===1.0+local", "pkg===1.0+local"),
        ("pkg!=1.*", "pkg!=1.*"),
    ],
)
def test_an_accepted_requirement_is_normalised(text: str, expected: str) -> None:
    assert str(parse_requirement(text)) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("requests @ https://example.com/r.whl", "URL"),
        ("requests@file:///tmp/r.whl", "URL"),
        ("git+https://example.com/r.git#egg=requests", "URL or VCS"),
        ("--index-url=https://evil.example/simple/", "pip option"),
        ("-e .", "pip option"),
        ("-r requirements.txt", "pip option"),
        ("./requests", "local path"),
        ("/tmp/requests-2.0.tar.gz", "local path"),
        ("requests; python_version > '3'", "environment marker"),
        ("requests (>=2)", "not a requirement"),
        ("requests==2.0 --hash=sha256:00", "pip option"),
        ("", "not a requirement"),
        ("x" * 201, "at most 200"),
    ],
)
def test_anything_but_a_name_extras_and_versions_is_refused(text: str, why: str) -> None:
    with pytest.raises(RequirementError, match=why):
        parse_requirement(text)


def test_names_and_patterns_compare_in_pep_503_form() -> None:
    assert canonical_name("Foo.Bar__baz") == "foo-bar-baz"
    patterns = ("django-*", "requests")
    assert name_allowed("Django_REST.framework", patterns)
    assert name_allowed("REQUESTS", patterns)
    assert not name_allowed("requests-toolbelt", patterns)
    assert not name_allowed("django", patterns)

"""Python package names and requirements as ``spec.packages`` judges them: PEP 503 names, a strict PEP 508 subset.

Pure functions, no I/O. A requirement is a name, optional extras and optional version specifiers, nothing else:
a direct reference (``name @ URL``), a path, a VCS link, an environment marker or a pip option (``--index-url``)
is refused, so what a request can change is the set of names and versions, never where they come from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

__all__ = [
    "MAX_REQUIREMENT_LENGTH",
    "Requirement",
    "RequirementError",
    "canonical_name",
    "canonical_pattern",
    "name_allowed",
    "parse_requirement",
]

MAX_REQUIREMENT_LENGTH = 200
"""Characters in one requirement string (the request schema's bound too)."""

_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_VERSION = r"[A-Za-z0-9.*+!_-]+"
_OP = r"(?:~=|===|==|!=|<=|>=|<|>)"
_SPEC = rf"{_OP}\s*{_VERSION}"
_REQUIREMENT = re.compile(
    rf"\s*(?P<name>{_NAME})\s*"
    rf"(?:\[\s*(?P<extras>{_NAME}(?:\s*,\s*{_NAME})*)\s*\])?\s*"
    rf"(?P<spec>{_SPEC}(?:\s*,\s*{_SPEC})*)?\s*",
    re.ASCII,
)
_SEPARATORS = re.compile(r"[-_.]+")


class RequirementError(ValueError):
    """A requirement string outside the accepted form; the message says what was found and what is accepted."""


def canonical_name(name: str) -> str:
    """The PEP 503 normal form: lower case, every run of ``-``, ``_`` and ``.`` one ``-`` (``Foo.Bar_baz`` is
    ``foo-bar-baz``)."""
    return _SEPARATORS.sub("-", name).lower()


def canonical_pattern(pattern: str) -> str:
    """An ``allow`` pattern in the same normal form as the names it is compared with (``*``, ``?`` and ``[...]``
    keep their fnmatch meaning)."""
    return canonical_name(pattern)


def name_allowed(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether a project name matches one of ``patterns`` (canonical, see :func:`canonical_pattern`), compared
    case-sensitively after normalising the name: ``Django_Foo`` matches ``django-*``."""
    key = canonical_name(name)
    return any(fnmatchcase(key, pattern) for pattern in patterns)


@dataclass(frozen=True, slots=True)
class Requirement:
    """One accepted requirement, normalised: what is recorded and handed to the installer."""

    name: str
    """The canonical project name."""
    extras: tuple[str, ...] = ()
    """Canonical extra names, sorted."""
    specifier: str = ""
    """Version specifiers without spaces, sorted (``<2,>=1.4``); empty for any version."""

    def __str__(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f"{self.name}{extras}{self.specifier}"


def _refusal(text: str) -> str:
    stripped = text.strip()
    if re.search(r"(^|\s)-", stripped):
        return "a pip option is not a requirement (no --index-url, -e, -r...); the index is the policy's"
    if "://" in text or stripped.startswith(("git+", "hg+", "svn+", "bzr+")):
        return "a URL or VCS link is refused; name a project (and a version) from the policy's index"
    if "@" in text:
        return "a direct reference (name @ URL) is refused; name a project (and a version) from the policy's index"
    if stripped.startswith((".", "/", "~")) or "/" in text or "\\" in text:
        return "a local path is refused; name a project (and a version) from the policy's index"
    if ";" in text:
        return "an environment marker (';') is not accepted: the run's environment is the image's"
    return "is not a requirement of the accepted form"


def parse_requirement(text: str) -> Requirement:
    """The normalised requirement of ``text``: ``name``, ``name[extra,...]``, with version specifiers such as
    ``==1.2``, ``>=1,<2`` or ``~=1.4``. Anything else raises :class:`RequirementError`."""
    if len(text) > MAX_REQUIREMENT_LENGTH:
        raise RequirementError(f"{len(text)} characters; at most {MAX_REQUIREMENT_LENGTH} are accepted")
    found = _REQUIREMENT.fullmatch(text)
    if found is None:
        raise RequirementError(
            f"{text!r}: {_refusal(text)} (accepted: name, name[extra], name==1.2, name>=1,<2, name~=1.4)"
        )
    extras = found["extras"]
    spec = found["spec"]
    return Requirement(
        name=canonical_name(found["name"]),
        extras=tuple(sorted({canonical_name(e.strip()) for e in extras.split(",")})) if extras else (),
        specifier=",".join(sorted(re.sub(r"\s+", "", s) for s in spec.split(","))) if spec else "",
    )

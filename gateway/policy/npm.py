"""npm package names and specs as ``spec.packages.npm`` judges them: a registry name and a version range only.

Pure functions, no I/O. A spec is ``name`` or ``name@range`` (``left-pad``, ``@scope/pkg@^1.2``, ``ms@>=2 <3``);
a URL, a git or GitHub reference, a ``file:`` or tarball path and an alias (``npm:``) are refused, so what a
request can change is the set of names and versions, never where they come from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase

__all__ = [
    "MAX_SPEC_LENGTH",
    "NpmSpec",
    "NpmSpecError",
    "npm_name_allowed",
    "parse_npm_spec",
]

MAX_SPEC_LENGTH = 200
"""Characters in one npm spec (the request schema's bound too)."""

_PART = r"[a-z0-9~-][a-z0-9._~-]*"
NAME = rf"(?:@{_PART}/)?{_PART}"
"""An npm package name: lower case, optionally scoped (``@scope/name``); what the registry publishes."""
_RANGE = r"[A-Za-z0-9.*^~<>=|+ -]+"
_SPEC = re.compile(rf"\s*(?P<name>{NAME})(?:@(?P<range>{_RANGE}))?\s*", re.ASCII)


class NpmSpecError(ValueError):
    """An npm spec outside the accepted form; the message says what was found and what is accepted."""


@dataclass(frozen=True, slots=True)
class NpmSpec:
    """One accepted npm spec, normalised: what is recorded and handed to ``npm install``."""

    name: str
    range: str = ""
    """The version range with single spaces (``>=2 <3``); empty for the registry's latest."""

    def __str__(self) -> str:
        return f"{self.name}@{self.range}" if self.range else self.name


def npm_name_allowed(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether a package name matches one of ``patterns`` (fnmatch, case-sensitive: npm names are lower case;
    ``@types/*`` matches every package of the scope)."""
    return any(fnmatchcase(name, pattern) for pattern in patterns)


def _refusal(text: str) -> str:
    stripped = text.strip()
    if stripped.startswith("-"):
        return "an npm option is not a package (no --registry...); the registry is the policy's"
    if "npm:" in text:
        return "an alias (npm:) is refused; name the package itself"
    if ":" in text:
        return "a URL, git or file: reference is refused; name a package (and a range) from the policy's registry"
    if "/" in text or "\\" in text or stripped.startswith((".", "~")):
        return "a path, tarball or GitHub reference is refused; name a package (and a range) from the registry"
    if any(c.isupper() for c in text.partition("@")[0] or text):
        return "npm package names are lower case"
    return "is not an npm spec of the accepted form"


def parse_npm_spec(text: str) -> NpmSpec:
    """The normalised spec of ``text``: ``name`` or ``name@range`` with a semver range or tag (``1.2.3``,
    ``^1.2``, ``~1.2.3``, ``>=1 <2``, ``1.x || 2``, ``latest``). Anything else raises :class:`NpmSpecError`."""
    if len(text) > MAX_SPEC_LENGTH:
        raise NpmSpecError(f"{len(text)} characters; at most {MAX_SPEC_LENGTH} are accepted")
    found = _SPEC.fullmatch(text)
    if found is None or len(found["name"]) > 214 or found["name"].startswith((".", "_")):
        raise NpmSpecError(
            f"{text!r}: {_refusal(text)} (accepted: name, @scope/name, name@1.2.3, name@^1.2, name@>=1 <2)"
        )
    spec_range = " ".join((found["range"] or "").split())
    return NpmSpec(name=found["name"], range=spec_range)

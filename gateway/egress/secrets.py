"""Secrets the egress proxy injects on the way out: the policy's rules (names only) and the gateway's values.

A :class:`SecretRule` binds a secret, by name, to hosts and a header template; the policy holds it and the
decision's plan shows it. Values live only in the gateway's configuration (:class:`SecretStore`: a file on the
gateway host, or ``GATEWAY_SECRET_<NAME>`` variables), never in the policy text or a request.

A secret's name is lower case (``mirror-token``); its variable is ``GATEWAY_SECRET_`` plus the name in upper case
with ``-`` as ``_`` (``GATEWAY_SECRET_MIRROR_TOKEN``). The store's file is JSON or YAML, a mapping of names to
strings, and must be readable by its owner only (mode 0600 or stricter): a secrets file others can read is refused.
"""

from __future__ import annotations

import base64
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "ENV_PREFIX",
    "Injection",
    "Redaction",
    "SecretRule",
    "SecretStore",
    "SecretStoreError",
    "injections",
    "longest_form",
    "redact",
    "secret_variable",
]

ENV_PREFIX = "GATEWAY_SECRET_"
"""The prefix of the environment variables that hold secret values."""

NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$")
"""A secret's name: lower-case letters, digits and inner hyphens, at most 64 characters."""

PLACEHOLDER = "{secret}"
"""Where the value goes in a rule's header template."""


class SecretStoreError(ValueError):
    """A secrets file that cannot be used (unreadable, readable by others, not a mapping of names to strings)."""


def secret_variable(name: str) -> str:
    """The environment variable holding secret ``name``: ``mirror-token`` -> ``GATEWAY_SECRET_MIRROR_TOKEN``."""
    return ENV_PREFIX + name.upper().replace("-", "_")


@dataclass(frozen=True)
class SecretRule:
    """One secret bound to hosts: the proxy sets ``header`` to ``template`` with the value in place of ``{secret}``
    on every request to one of ``hosts``. Names only: a rule never holds a value."""

    name: str
    hosts: tuple[str, ...]
    """Normalised host names (no wildcards, no literals), each on the egress list."""
    header: str = "Authorization"
    template: str = "Bearer " + PLACEHOLDER
    principals: tuple[str, ...] = ()
    """The principals whose runs get this secret; empty: every principal's."""

    def applies_to(self, principal: str | None) -> bool:
        """Whether a run of ``principal`` gets this secret."""
        return not self.principals or principal in self.principals

    def header_value(self, value: str) -> str:
        """The header's value with ``value`` in place of ``{secret}``."""
        return self.template.replace(PLACEHOLDER, value)

    def to_dict(self) -> dict[str, object]:
        """What the decision record shows: the name, the hosts and the header, never a value."""
        return {"name": self.name, "hosts": list(self.hosts), "header": self.header}


@dataclass(frozen=True)
class Injection:
    """What the proxy sets on a request to one host: the header, its value holding the secret, the secret's name."""

    name: str
    header: str
    value: str = field(repr=False)
    """The header's whole value (the template filled in): held by the gateway process only, never recorded."""


def injections(rules: tuple[SecretRule, ...], values: Mapping[str, str]) -> dict[str, Injection]:
    """Each host's injection for a run: ``rules`` (one per host, as the loader ensures per principal) with the
    secrets' ``values``; a rule without its value raises KeyError (the runner refused that run already)."""
    return {
        host: Injection(rule.name, rule.header, rule.header_value(values[rule.name]))
        for rule in rules
        for host in rule.hosts
    }


@dataclass(frozen=True)
class Redaction:
    """A secret's value found in (and erased from) what a run returned: which secret, where, how many times."""

    secret: str
    where: str
    """``stdout``, ``stderr`` or ``file:<path>`` (a returned file)."""
    count: int

    def to_dict(self) -> dict[str, object]:
        return {"secret": self.secret, "where": self.where, "count": self.count}


def _forms(value: str) -> list[bytes]:
    """The spellings of a value an upstream may echo: itself and its base64 (standard and URL-safe, padded or not)."""
    raw = value.encode()
    forms = {raw}
    for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        forms |= {encoded, encoded.rstrip(b"=")}
    return sorted(forms, key=len, reverse=True)  # the longest first: a padded form before its unpadded prefix


def longest_form(values: Mapping[str, str]) -> int:
    """The length of the longest form :func:`redact` looks for (0 without values)."""
    return max((len(form) for value in values.values() for form in _forms(value)), default=0)


def redact(data: bytes, values: Mapping[str, str]) -> tuple[bytes, dict[str, int]]:
    """``data`` with every form of each secret's value replaced by ``[secret:<name>]``, and the count per name."""
    counts: dict[str, int] = {}
    for name, value in sorted(values.items()):
        mark = f"[secret:{name}]".encode()
        for form in _forms(value):
            found = data.count(form)
            if found:
                data = data.replace(form, mark)
                counts[name] = counts.get(name, 0) + found
    return data, counts


def value_problem(value: str) -> str | None:
    """Why a secret's value cannot go into a header (a line break would add headers of its own), or None."""
    if not value.isascii() or not value.isprintable():
        return "holds a control or non-ASCII character, which a header value cannot carry"
    return None


@dataclass(frozen=True)
class SecretStore:
    """The gateway's secret values by name: a secrets file's, then ``GATEWAY_SECRET_<NAME>`` variables' (a
    variable overrides the file). ``repr`` never shows a value."""

    values: Mapping[str, str] = field(default_factory=dict, repr=False)
    source: str = "environment"
    """Where the values came from, for error messages (a file's path, or ``environment``)."""

    @classmethod
    def load(cls, environ: Mapping[str, str], path: str | None = None) -> SecretStore:
        """The store of ``environ``'s ``GATEWAY_SECRET_*`` variables over the secrets file at ``path`` (if any)."""
        values: dict[str, str] = dict(_read_file(path)) if path else {}
        for key, value in environ.items():
            if key.startswith(ENV_PREFIX) and len(key) > len(ENV_PREFIX):
                values[key[len(ENV_PREFIX) :].lower().replace("_", "-")] = value
        source = f"{path} and the environment" if path else "the environment"
        return cls(values, source)

    def value(self, name: str) -> str | None:
        """Secret ``name``'s value, or None when neither the file nor the environment has one."""
        value = self.values.get(name)
        return value if value else None

    def missing(self, name: str) -> str:
        """The message for a secret with no value: what is missing and how to provide it."""
        return (
            f"the policy binds secret {name!r}, but {self.source} has no value for it: set {secret_variable(name)} "
            "or add it to the gateway's secrets file (secrets_file, GATEWAY_SECRETS_FILE); nothing ran"
        )


def _read_file(path: str) -> dict[str, str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise SecretStoreError(f"cannot open the secrets file {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise SecretStoreError(f"the secrets file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise SecretStoreError(
                f"the secrets file {path} has mode {stat.S_IMODE(st.st_mode):04o}: others may read it; chmod 600 {path}"
            )
        text = f.read(1024 * 1024 + 1)
    if len(text) > 1024 * 1024:
        raise SecretStoreError(f"the secrets file {path} is larger than 1 MiB")
    import yaml  # noqa: PLC0415 -- only a secrets file needs it

    try:
        doc = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise SecretStoreError(f"the secrets file {path} is not valid JSON or YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise SecretStoreError(f"the secrets file {path} must be a mapping of secret names to strings")
    values: dict[str, str] = {}
    for name, value in doc.items():
        if not isinstance(name, str) or not NAME.match(name) or not isinstance(value, str):
            raise SecretStoreError(
                f"the secrets file {path}: entry {name!r} must be a lower-case name (letters, digits, hyphens) "
                "mapped to a string"
            )
        values[name] = value
    return values

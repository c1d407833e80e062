"""Loading a principals file strictly: the schema (``schemas/principals.schema.json``) through the project's strict
YAML reader, then what the schema cannot say; every problem reported as ``file:line: $.path: message``."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, cast

from jsonschema import Draft202012Validator

from gateway.errors import PrincipalsError, PrincipalsInvalidError, PrincipalsNotFoundError, Problem
from gateway.resources import load_schema
from gateway.service.principals.model import DEFAULT_QUOTAS, Principal, Principals, Quotas, Role, TokenRecord
from gateway.validation import load_yaml_checked
from gateway.yamlstrict import LoadedYaml, read_capped

__all__ = ["MAX_PRINCIPALS_BYTES", "load_principals", "load_principals_text"]

MAX_PRINCIPALS_BYTES = 4 * 1024 * 1024
"""A principals file larger than this is refused before parsing."""


@cache
def _validator() -> Draft202012Validator:
    return Draft202012Validator(load_schema("principals"), format_checker=Draft202012Validator.FORMAT_CHECKER)


def _invalid(source: str, problems: list[Problem]) -> PrincipalsInvalidError:
    problems = sorted(problems, key=lambda p: (p.line or 0, p.path))
    return PrincipalsInvalidError(
        f"{source} is not a valid principals file: {len(problems)} problem(s)", problems=problems
    )


def _semantic(loaded: LoadedYaml) -> list[Problem]:
    """What the schema cannot say: unique names and token ids, normalised absolute policy paths."""
    problems: list[Problem] = []

    def fail(path: str, message: str) -> None:
        problems.append(
            Problem(message, path=path, source=loaded.source, line=loaded.line_of(path), code="principals.semantic")
        )

    names: dict[str, str] = {}
    token_ids: dict[str, str] = {}
    for index, raw in enumerate(loaded.data["principals"]):
        base = f"$.principals[{index}]"
        name = raw["name"]
        if name in names:
            fail(f"{base}.name", f"duplicate principal name {name!r} (first at line {loaded.line_of(names[name])})")
        else:
            names[name] = f"{base}.name"
        policy = raw["policy"]
        if os.path.normpath(policy) != policy:
            fail(f"{base}.policy", f"{policy!r} is not a normalised path; write {os.path.normpath(policy)!r}")
        for t_index, token in enumerate(raw["tokens"]):
            path = f"{base}.tokens[{t_index}].id"
            if token["id"] in token_ids:
                first = loaded.line_of(token_ids[token["id"]])
                fail(path, f"duplicate token id {token['id']!r} (first at line {first}); token ids are unique")
            else:
                token_ids[token["id"]] = path
    return problems


def _principal(raw: dict[str, Any]) -> Principal:
    quotas = raw.get("quotas", {})
    return Principal(
        name=raw["name"],
        role=cast(Role, raw["role"]),
        policy=Path(raw["policy"]),
        quotas=Quotas(**{**DEFAULT_QUOTAS.to_dict(), **quotas}),  # the schema admits only Quotas' fields
        tokens=tuple(
            TokenRecord(t["id"], t["sha256"], datetime.fromisoformat(t["created"]).astimezone(UTC))
            for t in raw["tokens"]
        ),
        quotas_set=frozenset(quotas),
    )


def load_principals_text(text: str | bytes, *, source: str = "<string>") -> Principals:
    """Principals from YAML text; :class:`PrincipalsInvalidError` lists every problem as file:line: $.path."""
    if len(text) > MAX_PRINCIPALS_BYTES:
        problem = Problem(f"{len(text)} bytes is above the {MAX_PRINCIPALS_BYTES} byte cap", source=source)
        raise _invalid(source, [problem])
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _invalid(source, [Problem(f"not valid UTF-8 at byte {exc.start}", source=source)]) from exc
    loaded, problems = load_yaml_checked(
        text, source=source, validator=_validator(), domain="principals", invalid=_invalid
    )
    if not problems:
        problems = _semantic(loaded)
    if problems:
        raise _invalid(source, problems)
    return Principals.of([_principal(raw) for raw in loaded.data["principals"]], source=source)


def load_principals(path: str | os.PathLike[str]) -> Principals:
    """Principals from the file at ``path``; :class:`PrincipalsNotFoundError` when it does not exist."""
    source = os.fspath(path)
    data = read_capped(
        source,
        MAX_PRINCIPALS_BYTES,
        missing=lambda: PrincipalsNotFoundError(f"principals file {source} does not exist"),
        unreadable=lambda reason: PrincipalsError(f"principals file {source} cannot be read: {reason}"),
    )
    return load_principals_text(data, source=source)

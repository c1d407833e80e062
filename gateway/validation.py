"""JSON Schema errors turned into the gateway's :class:`Problem`s, the same way for policies and requests.

One place decides how a validator error reads: unknown fields name the allowed ones, a schema's own
``x-messages`` wording wins, long messages are cut, and every problem carries its JSON path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jsonschema.exceptions import ValidationError

from gateway.errors import GatewayError, PolicyError, Problem
from gateway.yamlstrict import LoadedYaml, load_yaml

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

__all__ = ["load_yaml_checked", "problems_from_error"]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _no_line(_path: str) -> int | None:
    return None


def problems_from_error(
    error: ValidationError,
    *,
    source: str | None,
    domain: str,
    line_of: Callable[[str], int | None] = _no_line,
) -> list[Problem]:
    """The problems one validator error stands for; codes are ``<domain>.unknown_field`` / ``<domain>.schema``."""
    path = error.json_path
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = sorted(schema.get("properties", {}))
        return [
            Problem(
                f"unknown field {key!r}; allowed fields here: {', '.join(known)}",
                path=f"{path}.{key}",
                source=source,
                line=line_of(f"{path}.{key}"),
                code=f"{domain}.unknown_field",
            )
            for key in error.instance
            if key not in known
        ]
    custom = schema.get("x-messages", {}).get(str(error.validator))
    if custom:
        message = f"{_short(error.instance)} {custom}"
    elif error.validator == "required":
        message = error.message.replace("is a required property", "is required here but missing")
    else:
        message = error.message if len(error.message) <= 300 else error.message[:297] + "..."
    return [Problem(message, path=path, source=source, line=line_of(path), code=f"{domain}.schema")]


def load_yaml_checked(
    text: str, *, source: str, validator: Validator, domain: str,
    invalid: Callable[[str, list[Problem]], GatewayError],
) -> tuple[LoadedYaml, list[Problem]]:  # fmt: skip
    """A YAML file of the gateway's own (server config, principals): read strictly, then every schema problem
    of it. What the strict reader refuses is raised through ``invalid(source, problems)`` (the file's own error,
    not a policy's); the schema problems are returned, so a caller may add its semantic pass."""
    try:
        loaded = load_yaml(text, source=source)
    except PolicyError as exc:  # the strict reader speaks for policies; the problems are this file's
        raise invalid(source, list(exc.problems)) from exc
    problems = [
        problem
        for error in validator.iter_errors(loaded.data)
        for problem in problems_from_error(error, source=source, domain=domain, line_of=loaded.line_of)
    ]
    return loaded, problems

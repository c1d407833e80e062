"""Policy composition: a policy may ``extends`` a base file, and what is loaded is the merged document.

``extends: PATH`` (beside ``apiVersion``; relative to the file that says it) names a base policy. This file's
``spec`` is merged over the base's field by field: mappings merge key by key, everything else (lists, scalars)
replaces the base's value whole. ``apiVersion``, ``kind`` and ``metadata`` are this file's own. A base may
extend another base; a cycle, a missing base or a chain deeper than :data:`MAX_EXTENDS_DEPTH` is an error at
the ``extends`` line. The merged document (without ``extends``) is what the loader validates, fingerprints
and compiles, and what ``gateway policy show`` prints.

The merged :class:`~gateway.yamlstrict.LoadedYaml` remembers, for every JSON path, the file and line
it was written at, so a problem in an inherited value points into the base file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gateway.errors import PolicyError, PolicyNotFoundError, Problem
from gateway.yamlstrict import LoadedYaml, load_yaml, path_join, read_capped

__all__ = ["MAX_EXTENDS_DEPTH", "MAX_POLICY_BYTES", "decode_policy", "load_document", "read_policy", "resolve_extends"]

MAX_POLICY_BYTES = 1024 * 1024
"""A policy larger than this is refused before parsing."""
MAX_EXTENDS_DEPTH = 8
"""How many bases a chain of ``extends`` may have."""


def decode_policy(text: str | bytes, *, source: str) -> str:
    """The policy text as ``str``, refusing oversized or non-UTF-8 input (a :class:`PolicyError`)."""
    if isinstance(text, bytes):
        if len(text) > MAX_POLICY_BYTES:
            raise PolicyError(
                f"{source} is too large",
                problems=[Problem(f"{len(text)} bytes is above the {MAX_POLICY_BYTES} byte cap", source=source)],
            )
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PolicyError(
                f"{source} is not UTF-8",
                problems=[Problem(f"not valid UTF-8 at byte {exc.start}", source=source)],
            ) from exc
    if len(text) > MAX_POLICY_BYTES:
        raise PolicyError(
            f"{source} is too large",
            problems=[Problem(f"{len(text)} characters is above the {MAX_POLICY_BYTES} cap", source=source)],
        )
    return text


def read_policy(source: str) -> bytes:
    """The bytes of the policy file ``source`` (at most one byte past the cap); :class:`PolicyError` if absent."""
    return read_capped(
        source,
        MAX_POLICY_BYTES,
        missing=lambda: PolicyNotFoundError(
            f"policy file {source} does not exist", problems=[Problem("no such file", source=source)]
        ),
        unreadable=lambda reason: PolicyError(
            f"policy file {source} cannot be read", problems=[Problem(f"cannot read: {reason}", source=source)]
        ),
    )


def load_document(path: str | os.PathLike[str]) -> LoadedYaml:
    """The effective document of the policy file at ``path``: strict YAML, with every base merged in."""
    source = os.fspath(path)
    loaded = load_yaml(decode_policy(read_policy(source), source=source), source=source)
    return resolve_extends(loaded)


def _extends_problem(loaded: LoadedYaml, message: str) -> PolicyError:
    problem = Problem(
        message, path="$.extends", source=loaded.source, line=loaded.line_of("$.extends"), code="policy.extends"
    )
    return PolicyError(f"{loaded.source}: {message}", problems=[problem])


def resolve_extends(loaded: LoadedYaml, *, _chain: tuple[str, ...] = ()) -> LoadedYaml:
    """``loaded`` with its base (and the base's bases) merged in; itself when it extends nothing.

    A base path is relative to the directory of the file that names it (``<string>`` documents: the working
    directory)."""
    doc = loaded.data
    if not isinstance(doc, dict) or "extends" not in doc:
        return loaded
    here = os.path.realpath(loaded.source) if not loaded.source.startswith("<") else loaded.source
    chain = (*_chain, here)
    target = doc["extends"]
    if not isinstance(target, str) or not target.strip():
        raise _extends_problem(loaded, f"{target!r} is not a path; extends names a base policy file")
    folder = os.path.dirname(loaded.source) if not loaded.source.startswith("<") else ""
    base_source = os.path.normpath(os.path.join(folder, target))
    real = os.path.realpath(base_source)
    if real in chain:
        names = [*_chain_names(chain), base_source]
        raise _extends_problem(loaded, f"extends cycle: {' -> '.join(names)}; a policy cannot extend itself")
    if len(chain) > MAX_EXTENDS_DEPTH:
        raise _extends_problem(loaded, f"extends chain is deeper than {MAX_EXTENDS_DEPTH} bases")
    if not Path(base_source).is_file():
        raise _extends_problem(
            loaded, f"base policy {target!r} does not exist (looked for {base_source}); the path is relative to "
            "the file that names it",
        )  # fmt: skip
    base = load_yaml(decode_policy(read_policy(base_source), source=base_source), source=base_source)
    return merge_documents(resolve_extends(base, _chain=chain), loaded)


def _chain_names(chain: tuple[str, ...]) -> list[str]:
    cwd = os.getcwd()
    return [os.path.relpath(p, cwd) if os.path.isabs(p) else p for p in chain]


class _Origins:
    """Collects the line and file of every path of the merged document."""

    def __init__(self) -> None:
        self.lines: dict[str, int] = {}
        self.sources: dict[str, str] = {}

    def note(self, loaded: LoadedYaml, path: str) -> None:
        if path in loaded.lines:
            self.lines[path] = loaded.lines[path]
            self.sources[path] = loaded.source_of(path)

    def take(self, loaded: LoadedYaml, value: Any, path: str) -> Any:
        """``value`` (from ``loaded`` at ``path``) whole, with the origin of every path below it."""
        stack = [(value, path)]
        while stack:
            item, where = stack.pop()
            self.note(loaded, where)
            if isinstance(item, dict):
                stack.extend((v, path_join(where, k)) for k, v in item.items())
            elif isinstance(item, list):
                stack.extend((v, path_join(where, i)) for i, v in enumerate(item))
        return value

    def merge(self, base: LoadedYaml, base_value: Any, child: LoadedYaml, child_value: Any, path: str) -> Any:
        if not (isinstance(base_value, dict) and isinstance(child_value, dict)):
            return self.take(child, child_value, path)  # lists and scalars replace the base's value
        self.note(child, path)
        out: dict[str, Any] = {}
        for key, value in base_value.items():
            where = path_join(path, key)
            if key in child_value:
                out[key] = self.merge(base, value, child, child_value[key], where)
            else:
                out[key] = self.take(base, value, where)
        for key, value in child_value.items():
            if key not in base_value:
                out[key] = self.take(child, value, path_join(path, key))
        return out


def merge_documents(base: LoadedYaml, child: LoadedYaml) -> LoadedYaml:
    """``child``'s top level (less ``extends``) with its ``spec`` merged over ``base``'s."""
    origins = _Origins()
    origins.note(child, "$")
    merged: dict[str, Any] = {}
    for key, value in child.data.items():
        if key == "extends":
            continue
        where = path_join("$", key)
        if key == "spec" and isinstance(base.data, dict) and "spec" in base.data:
            merged[key] = origins.merge(base, base.data["spec"], child, value, where)
        else:
            merged[key] = origins.take(child, value, where)
    if "spec" not in merged and isinstance(base.data, dict) and "spec" in base.data:
        merged["spec"] = origins.take(base, base.data["spec"], "$.spec")
    sources = {path: src for path, src in origins.sources.items() if src != child.source}
    return LoadedYaml(data=merged, lines=origins.lines, source=child.source, sources=sources)

"""A strict YAML reader: duplicate keys, aliases and non-string keys are errors, and every node's line is kept.

PyYAML silently keeps the last of two equal keys, which lets a reviewer read one value while the gateway
enforces another. This reader builds the data itself from the composed node tree, so it can refuse
duplicates, refuse anchors/aliases (no billion-laughs expansion, no action at a distance), and record the
line of every JSON path for error messages.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.errors import GatewayError, PolicyError, Problem

__all__ = ["LoadedYaml", "load_yaml", "path_join", "read_capped"]


def read_capped(
    source: str, cap: int, *, missing: Callable[[], GatewayError], unreadable: Callable[[str], GatewayError]
) -> bytes:
    """At most ``cap + 1`` bytes of the file ``source`` (one byte past the cap tells the caller it is too large);
    ``missing()`` / ``unreadable(reason)`` build the error of the file's own kind (policy, principals, config)."""
    try:
        with Path(source).open("rb") as fh:
            return fh.read(cap + 1)
    except FileNotFoundError as exc:
        raise missing() from exc
    except OSError as exc:
        raise unreadable(exc.strerror or str(exc)) from exc


MAX_DEPTH = 32
"""Deeper documents are refused before any recursion can run out of stack."""

_TIMESTAMP = "tag:yaml.org,2002:timestamp"


class _Loader(yaml.SafeLoader):
    """SafeLoader without implicit timestamps: ``2024-01-01`` stays a string, as in JSON."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def path_join(parent: str, key: str | int) -> str:
    """JSON path of ``key`` under ``parent``, in the same spelling jsonschema's ``json_path`` uses."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}"


@dataclass(frozen=True, slots=True)
class LoadedYaml:
    data: Any
    """The document as plain JSON-like data (dict, list, str, int, float, bool, None)."""
    lines: Mapping[str, int]
    """1-based line of every JSON path (a mapping entry's line is its key's line)."""
    source: str
    sources: Mapping[str, str] = field(default_factory=dict)
    """File of every JSON path that came from another file than ``source`` (a policy merged over the base it
    ``extends``); empty for a document read from one file."""

    def _located(self, path: str) -> str:
        """``path`` or its nearest ancestor that has a line."""
        probe = path
        while probe not in self.lines:
            cut = max(probe.rfind("."), probe.rfind("["))
            if cut <= 0:
                return "$"
            probe = probe[:cut]
        return probe

    def line_of(self, path: str) -> int | None:
        """Line of ``path`` or of its nearest ancestor that has one."""
        return self.lines.get(self._located(path))

    def source_of(self, path: str) -> str:
        """The file :meth:`line_of` refers to: where ``path`` (or its nearest ancestor with a line) was written."""
        return self.sources.get(self._located(path), self.source)


class _Builder:
    def __init__(self, loader: _Loader, source: str) -> None:
        self.loader = loader
        self.source = source
        self.lines: dict[str, int] = {}
        self.problems: list[Problem] = []
        self.seen: set[int] = set()

    def problem(self, node: yaml.Node, path: str, message: str) -> None:
        self.problems.append(Problem(message, path=path, source=self.source, line=node.start_mark.line + 1))

    def build(self, root: yaml.Node) -> Any:
        # Iterative construction: an explicit stack, so nesting depth never meets Python's recursion limit.
        result: list[Any] = [None]
        stack: list[tuple[yaml.Node, str, int, Any, Any]] = [(root, "$", 0, result, 0)]
        while stack:
            node, path, depth, container, slot = stack.pop()
            self.lines.setdefault(path, node.start_mark.line + 1)
            if id(node) in self.seen:
                self.problem(node, path, "YAML anchors and aliases are not allowed")
                continue
            self.seen.add(id(node))
            if depth > MAX_DEPTH:
                self.problem(node, path, f"nested deeper than {MAX_DEPTH} levels")
                continue
            if isinstance(node, yaml.MappingNode):
                value: dict[str, Any] = {}
                container[slot] = value
                key_lines: dict[str, int] = {}
                for key_node, value_node in node.value:
                    if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                        self.problem(
                            key_node, path, "mapping keys must be plain strings (no merge keys << or complex keys)"
                        )
                        continue
                    key = self.loader.construct_object(key_node)
                    if not isinstance(key, str):
                        self.problem(key_node, path, f"mapping key {key!r} must be a string (quote it)")
                        continue
                    child = path_join(path, key)
                    if key in key_lines:
                        self.problem(
                            key_node,
                            child,
                            f"duplicate key {key!r} (first defined on line {key_lines[key]}); YAML would silently "
                            "keep the last one",
                        )
                        continue
                    key_lines[key] = key_node.start_mark.line + 1
                    self.lines[child] = key_node.start_mark.line + 1
                    value[key] = None
                    stack.append((value_node, child, depth + 1, value, key))
            elif isinstance(node, yaml.SequenceNode):
                items: list[Any] = [None] * len(node.value)
                container[slot] = items
                for index, item in enumerate(node.value):
                    stack.append((item, path_join(path, index), depth + 1, items, index))
            else:
                scalar = self.loader.construct_object(node)
                if isinstance(scalar, float) and not math.isfinite(scalar):
                    self.problem(node, path, f"{scalar!r} is not a finite number")
                container[slot] = scalar
        return result[0]


def load_yaml(text: str, *, source: str) -> LoadedYaml:
    """Parse one YAML document strictly; raise :class:`PolicyError` listing every problem."""
    try:
        loader = _Loader(text)  # the reader already refuses non-printable characters here
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        line = mark.line + 1 if mark is not None else None
        detail = " ".join(part for part in (exc.context, exc.problem) if part)
        raise PolicyError(
            f"{source} is not valid YAML", problems=[Problem(f"malformed YAML: {detail}", source=source, line=line)]
        ) from exc
    except yaml.YAMLError as exc:
        raise PolicyError(
            f"{source} is not valid YAML", problems=[Problem(f"malformed YAML: {exc}", source=source)]
        ) from exc
    except RecursionError as exc:
        raise PolicyError(
            f"{source} is nested too deeply", problems=[Problem("YAML nested too deeply", source=source)]
        ) from exc
    if root is None:
        raise PolicyError(f"{source} is empty", problems=[Problem("the document is empty", source=source)])
    builder = _Builder(loader, source)
    try:
        data = builder.build(root)
    except yaml.YAMLError as exc:  # a scalar that cannot be constructed (e.g. a bad !!binary)
        raise PolicyError(
            f"{source} is not valid YAML", problems=[Problem(f"malformed YAML: {exc}", source=source)]
        ) from exc
    if builder.problems:
        problems = sorted(builder.problems, key=lambda p: (p.line or 0, p.path))
        raise PolicyError(f"{source} has {len(problems)} problem(s)", problems=problems)
    return LoadedYaml(data=data, lines=dict(builder.lines), source=source)

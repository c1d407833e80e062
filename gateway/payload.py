"""What a program receives in its sandbox: its code and the files placed beside it, and the one file-name check.

The decision's ``files.path`` rule and :class:`Payload` both call :func:`file_name_problems`, so a name the
policy allows is a name every runner accepts, and a name no runner can take is refused by the decision,
before anything runs. (The in-container supervisor checks again, as defence in depth.)
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ContractError, Problem

__all__ = [
    "LANGUAGES",
    "MAX_NAME_BYTES",
    "MAX_PART_BYTES",
    "PROGRAM_FILES",
    "RESERVED_NAMES",
    "Payload",
    "file_name_problem",
    "file_name_problems",
    "request_file",
]

PROGRAM_FILES = {"python": "main.py", "shell": "main.sh", "javascript": "main.js"}
"""Each language a sandbox can run, and the workspace file its code is written to and run from (``python3
main.py``, ``bash --noprofile --norc main.sh``, ``node main.js``)."""
LANGUAGES = tuple(PROGRAM_FILES)
"""Languages a sandbox can run."""

MAX_NAME_BYTES = 1024
"""Longest file name (UTF-8 bytes, the whole relative path)."""
MAX_PART_BYTES = 255
"""Longest component of a file name (the kernel's NAME_MAX)."""

RESERVED_NAMES = {
    **dict.fromkeys(PROGRAM_FILES.values(), "is reserved for the submitted code"),
    "out": "is reserved: out/ is the directory of the files the program returns",
}
"""Top-level workspace entries the sandbox itself creates, with why. The program files (``main.py``,
``main.sh``, ``main.js``, whatever the language: one check for every request) are files, so nothing may be placed
as or beneath them; ``out`` is a directory, so a file may go inside it but not take its name."""

_CONTROL_CHAR = re.compile("[\x00-\x1f\x7f]")


def file_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a file in the workspace (a phrase to follow the quoted name), or ``None``."""
    if not name:
        return "is empty"
    if "\x00" in name:
        return "contains NUL"
    if "\\" in name:
        return "contains a backslash; use '/' separators"
    if name.startswith("/"):
        return "is absolute; names are relative to the workspace"
    parts = name.split("/")
    if ".." in parts:
        return "contains '..'"
    if "" in parts or "." in parts:
        return "has an empty or '.' component"
    if _CONTROL_CHAR.search(name) is not None:
        return "contains a control character"
    if parts[0] in PROGRAM_FILES.values() or name == "out":
        return RESERVED_NAMES[parts[0]]
    encoded = name.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    if any(len(part.encode("utf-8", "surrogatepass")) > MAX_PART_BYTES for part in parts):
        return f"has a component longer than {MAX_PART_BYTES} bytes"
    return None


def file_name_problems(names: Iterable[str]) -> Iterator[tuple[str, str]]:
    """``(name, why)`` for every name that cannot be written, alone or beside the others.

    Besides each name on its own, a name cannot also be a directory of another (``a`` and ``a/b``).
    """
    names = list(names)
    directories = {"/".join(n.split("/")[:i]) for n in names for i in range(1, n.count("/") + 1)}
    for name in names:
        why = file_name_problem(name)
        if why is None and name in directories:
            why = "is both a file and the directory of another file"
        if why is not None:
            yield name, why


def request_file(content: str | bytes | bytearray | memoryview) -> Any:
    """How a request carries one file's ``content``: text as itself (UTF-8), bytes as
    ``{"content": "<base64>", "encoding": "base64"}``. The Python API and the client send ``bytes`` this way."""
    if isinstance(content, str):
        return content
    return {"content": base64.b64encode(content).decode("ascii"), "encoding": "base64"}


@dataclass(frozen=True)
class Payload:
    """What the program gets: its code and the files placed next to it in the workspace.

    Built by the Gateway from a request the decision allowed. A payload that fails its own checks is the
    gateway's fault (the decision should have refused the request), so it raises :class:`ContractError`.
    """

    code: str
    """Source code; written to the language's program file (:data:`PROGRAM_FILES`) in the workspace and run with
    the language's interpreter."""
    language: str = "python"
    """One of :data:`LANGUAGES`."""
    files: Mapping[str, bytes] = field(default_factory=dict)
    """Relative paths under the workspace mapped to their content (binary-safe)."""

    def __post_init__(self) -> None:
        problems: list[Problem] = []
        if self.language not in LANGUAGES:
            problems.append(
                Problem(f"language {self.language!r} is not supported; supported: {', '.join(LANGUAGES)}", "$.language")
            )
        for name, why in file_name_problems(self.files):
            problems.append(Problem(f"file name {name!r} {why}", f"$.files[{name!r}]"))
        for name, content in self.files.items():
            raw: object = content  # callers outside the type checker may pass str
            if not isinstance(raw, bytes | bytearray | memoryview):
                problems.append(Problem(f"content of {name!r} must be bytes", f"$.files[{name!r}]"))
        if problems:
            raise ContractError("the payload cannot be handed to a sandbox", problems=problems)

#!/usr/bin/env python3
"""Reads the hash-locked requirements that scripts/lock.sh writes (requirements/*.txt).

    lockcheck.py check [LOCK]    every dependency pyproject.toml names (the library's, every extra's and the
                                 build backend's) is pinned in LOCK, inside its range, with at least one hash;
                                 exit 1 naming each one that is not, and the command that fixes it
    lockcheck.py extras [LOCK]   the distributions installed next to this interpreter that LOCK does not pin
                                 (scripts/setup.sh warns about them: a fresh machine will not have them)

LOCK defaults to requirements/dev.txt. The test suite imports this file too (tests/unit/core/test_supply_chain.py),
so the rules about what a complete lock is live in one place.
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LOCK = ROOT / "requirements" / "dev.txt"
REFRESH = "bash scripts/lock.sh"


@dataclass(frozen=True)
class Pin:
    """One ``name==version`` line of a lock, with the hashes pip checks the downloaded file against."""

    name: str
    """The canonical (PEP 503 normalised) distribution name."""
    version: str
    hashes: tuple[str, ...]
    line: int
    """Where the pin starts in the lock file (1-based), for messages."""


def read_lock(path: Path) -> dict[str, Pin]:
    """The pins of a pip-compile output, keyed by canonical name; anything that is not a pin is an error."""
    pins: dict[str, Pin] = {}
    logical: list[tuple[int, str]] = []
    start, parts = 0, []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        text = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not text and not parts:
            continue
        if not parts:
            start = number
        continued = text.endswith("\\")
        parts.append(text.removesuffix("\\").strip())
        if not continued:
            logical.append((start, " ".join(p for p in parts if p)))
            parts = []
    for number, text in logical:
        words = text.split()
        hashes = tuple(w.removeprefix("--hash=") for w in words if w.startswith("--hash="))
        spec = " ".join(w for w in words if not w.startswith("--hash="))
        if spec.startswith("-"):
            raise ValueError(f"{path}:{number}: an option in a lock file ({spec!r}); regenerate it with {REFRESH}")
        req = Requirement(spec)
        specifiers = list(req.specifier)
        if len(specifiers) != 1 or specifiers[0].operator != "==":
            raise ValueError(f"{path}:{number}: {spec!r} is not pinned with ==")
        name = canonicalize_name(req.name)
        pins[name] = Pin(name=name, version=specifiers[0].version, hashes=hashes, line=number)
    return pins


def declared(pyproject: Path) -> list[tuple[str, Requirement]]:
    """Every requirement pyproject.toml declares, with where: ``dependencies``, ``extra <name>``, ``build``."""
    doc = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    project = doc["project"]
    found = [("dependencies", Requirement(r)) for r in project.get("dependencies", [])]
    for extra, reqs in sorted(project.get("optional-dependencies", {}).items()):
        found += [(f"optional-dependencies.{extra}", Requirement(r)) for r in reqs]
    found += [("build-system.requires", Requirement(r)) for r in doc.get("build-system", {}).get("requires", [])]
    return found


def problems(lock: Path, pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """What makes ``lock`` not cover ``pyproject``: missing pins, pins outside a range, pins without a hash."""
    pins = read_lock(lock)
    out: list[str] = []
    for where, req in declared(pyproject):
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        pin = pins.get(canonicalize_name(req.name))
        if pin is None:
            out.append(f"pyproject.toml {where}: {req} is not in {lock.name}")
        elif not req.specifier.contains(pin.version, prereleases=True):
            out.append(f"pyproject.toml {where}: {req} but {lock.name}:{pin.line} pins {pin.name}=={pin.version}")
    out += [f"{lock.name}:{p.line}: {p.name}=={p.version} has no --hash" for p in pins.values() if not p.hashes]
    return out


def extras(lock: Path, pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """Installed distributions (of this interpreter's environment) that the lock does not pin."""
    pins = read_lock(lock)
    own = canonicalize_name(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["name"])
    names = {canonicalize_name(d.metadata["Name"]) for d in metadata.distributions() if d.metadata["Name"]}
    return sorted(n for n in names if n not in pins and n != own)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"check", "extras"} or len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    lock = Path(argv[1]) if len(argv) == 2 else DEFAULT_LOCK
    if argv[0] == "extras":
        print(" ".join(extras(lock)))
        return 0
    found = problems(lock)
    for problem in found:
        print(f"lockcheck: {problem}", file=sys.stderr)
    if found:
        print(f"lockcheck: the lock does not cover pyproject.toml; refresh it with: {REFRESH}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Installed package trees, cached by resolved set: what an install resolved, every file's sha256, and the index.

Layout below the cache root (``GATEWAY_PACKAGES_DIR``, default ``/var/lib/agent-gateway/packages``; root-only):

``trees/<resolved key>/``
    an installed tree, read-only (files 0444, directories 0555). The resolved key is the sha256 over the image id
    and the sorted ``name==version sha256`` of every distribution installed: the same set is one tree, whoever
    asked for it and however they wrote it.
``trees/<resolved key>.json``
    its manifest: the image id, the distributions, and each file's relative path, size and sha256.
``requests/<request key>.json``
    which tree a request resolved to. The request key is the sha256 over the index URL, the normalised sorted
    requirements, ``binary_only`` and the image id: an identical request installs nothing. An unpinned
    requirement (``idna``, ``requests>=2``) therefore keeps its first resolution until the entry expires
    (``max_age_s``, default one day) or is dropped (:meth:`PackageCache.drop`, or delete the file).

The tree is copied out of the install sandbox's workspace after the sandbox is gone, through descriptors with
no symlink followed: a symlink, device, FIFO or socket in it is refused, as are more entries or levels than a
mount may carry (``gateway.hostfs`` bounds).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.errors import PackageInstallError, PackageRefusedError
from gateway.hostfs import SCAN_MAX_DEPTH, SCAN_MAX_ENTRIES
from gateway.policy.model import PackagesRule
from gateway.policy.packages import name_allowed

__all__ = [
    "DEFAULT_MAX_AGE_S",
    "DEFAULT_ROOT",
    "MAX_RECORDED_FILES",
    "Distribution",
    "Installed",
    "InstalledFile",
    "PackageCache",
    "check_distributions",
    "default_root",
]

DEFAULT_ROOT = "/var/lib/agent-gateway/packages"
DEFAULT_MAX_AGE_S = 86400.0
"""How long a request's resolution is reused (a day): an unpinned requirement is resolved again after that."""
MAX_RECORDED_FILES = 1000
"""Files listed in an ``execution.outcome`` record (sorted by path); the rest are counted, and ``tree_sha256``
covers every file."""
_COPY_CHUNK = 1 << 20


def default_root() -> str:
    """``$GATEWAY_PACKAGES_DIR``, else :data:`DEFAULT_ROOT`."""
    return os.environ.get("GATEWAY_PACKAGES_DIR") or DEFAULT_ROOT


@dataclass(frozen=True, slots=True)
class Distribution:
    """One distribution an install resolved (a requirement or a dependency)."""

    name: str
    """Canonical project name."""
    version: str
    sha256: str
    """Of the archive the installer downloaded."""
    filename: str
    """The archive's file name (``.whl`` for a wheel)."""

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "sha256": self.sha256, "filename": self.filename}


@dataclass(frozen=True, slots=True)
class InstalledFile:
    path: str
    """Relative to the tree's root (``/opt/gateway-packages`` in the run)."""
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Installed:
    """An installed tree, ready to be bound read-only into a run."""

    key: str
    """The resolved key (names the tree)."""
    root: str
    """The directory holding the trees (the bind's root: the tree is opened below it with no symlink followed)."""
    path: str
    """The tree's host path."""
    image_id: str
    distributions: tuple[Distribution, ...]
    files: tuple[InstalledFile, ...]
    cached: bool
    """True when no install ran: the request's resolution was in the cache."""

    @property
    def tree_sha256(self) -> str:
        """sha256 over every file's ``path NUL size NUL sha256`` line, sorted by path: one digest for the tree."""
        lines = "".join(f"{f.path}\0{f.size}\0{f.sha256}\n" for f in sorted(self.files, key=lambda f: f.path))
        return hashlib.sha256(lines.encode("utf-8", "surrogateescape")).hexdigest()

    def to_record(self) -> dict[str, Any]:
        """The ``packages`` object of the run's ``execution.outcome`` record (at most :data:`MAX_RECORDED_FILES`
        files listed; ``files_total`` and ``tree_sha256`` cover them all)."""
        files = sorted(self.files, key=lambda f: f.path)
        return {
            "key": self.key,
            "cached": self.cached,
            "image_id": self.image_id,
            "distributions": [d.to_dict() for d in self.distributions],
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in files[:MAX_RECORDED_FILES]],
            "files_total": len(files),
            "bytes_total": sum(f.size for f in files),
            "tree_sha256": self.tree_sha256,
        }


def check_distributions(rule: PackagesRule, distributions: Sequence[Distribution]) -> None:
    """Refuse (:class:`PackageRefusedError`, naming the package and the rule) any resolved distribution the policy
    does not allow: a name outside ``allow``, a source archive with ``binary_only``, an archive whose sha256 is
    not listed for its ``name==version`` when the policy lists hashes."""
    for d in distributions:
        if not name_allowed(d.name, rule.allow):
            raise PackageRefusedError(
                f"the install resolved {d.name}=={d.version}, which spec.packages.allow does not list "
                f"(allowed: {list(rule.allow)}); nothing from it reaches a run (rule packages.allowed)"
            )
        if rule.binary_only and not d.filename.endswith(".whl"):
            raise PackageRefusedError(
                f"the install resolved {d.name}=={d.version} from {d.filename!r}, not a wheel, and "
                "spec.packages.binary_only is set; nothing from it reaches a run"
            )
        digests = rule.allowed_hashes(d.name, d.version)
        if digests is not None and d.sha256 not in digests:
            what = "is not listed" if not digests else f"has sha256 {d.sha256}, not one listed"
            raise PackageRefusedError(
                f"{d.name}=={d.version} {what} in spec.packages.hashes; nothing from it reaches a run"
            )


def resolved_key(distributions: Sequence[Distribution], image_id: str) -> str:
    lines = sorted(f"{d.name}=={d.version} {d.sha256}" for d in distributions)
    return hashlib.sha256("\n".join([image_id, *lines]).encode()).hexdigest()


def request_key(rule: PackagesRule, requirements: Sequence[str], image_id: str) -> str:
    data = {
        "index": rule.index,
        "requirements": sorted(requirements),
        "binary_only": rule.binary_only,
        "image_id": image_id,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class PackageCache:
    """The trees on this host (see the module's docstring). ``clock``: seconds since the epoch (tests inject)."""

    def __init__(
        self, root: str | os.PathLike[str] | None = None, *, max_age_s: float = DEFAULT_MAX_AGE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self.root = Path(root if root is not None else default_root())
        self.max_age_s = max_age_s
        self.clock = clock

    @property
    def trees(self) -> Path:
        return self.root / "trees"

    def _prepare(self) -> None:
        for directory in (self.root, self.trees, self.root / "requests"):
            directory.mkdir(mode=0o700, exist_ok=True, parents=directory == self.root)
            st = os.lstat(directory)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                raise PackageInstallError(f"package cache {directory} is not a directory this gateway owns")
            os.chmod(directory, 0o700)  # a tree is bound by descriptor: the sandbox never walks these

    def lookup(self, key: str) -> Installed | None:
        """The tree an identical earlier request resolved to, unless its entry expired (then it is dropped)."""
        entry = self.root / "requests" / f"{key}.json"
        try:
            data = json.loads(entry.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if self.clock() - float(data.get("created", 0)) > self.max_age_s:
            with contextlib.suppress(OSError):
                entry.unlink()
            return None
        return self._load(str(data.get("resolved", "")))

    def _load(self, key: str) -> Installed | None:
        if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
            return None
        try:
            manifest = json.loads((self.trees / f"{key}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not (self.trees / key).is_dir():
            return None
        return Installed(
            key=key,
            root=str(self.trees),
            path=str(self.trees / key),
            image_id=manifest["image_id"],
            distributions=tuple(Distribution(**d) for d in manifest["distributions"]),
            files=tuple(InstalledFile(*f) for f in manifest["files"]),
            cached=True,
        )

    def store(
        self, key: str, source: str, distributions: Sequence[Distribution], image_id: str, *, max_bytes: int
    ) -> Installed:
        """Copy the tree at ``source`` (an install sandbox's output, its sandbox gone) into the cache under its
        resolved key, record it for request ``key`` and return it."""
        self._prepare()
        resolved = resolved_key(distributions, image_id)
        existing = self._load(resolved)
        if existing is None:
            scratch = self.trees / f".tmp-{secrets.token_hex(8)}"
            try:
                files = _copy_tree(source, scratch, max_bytes=max_bytes)
                manifest = {
                    "image_id": image_id,
                    "distributions": [d.to_dict() for d in distributions],
                    "files": [[f.path, f.size, f.sha256] for f in files],
                }
                _seal(scratch)
                (self.trees / f"{resolved}.json").write_text(json.dumps(manifest), encoding="utf-8")
                try:
                    os.rename(scratch, self.trees / resolved)
                except OSError:  # a concurrent install of the same set won
                    _remove(scratch)
            except BaseException:
                _remove(scratch)
                raise
            existing = self._load(resolved)
            if existing is None:
                raise PackageInstallError(f"the installed tree {resolved} could not be stored in {self.trees}")
        entry = {"resolved": resolved, "created": self.clock()}
        temporary = self.root / "requests" / f".{key}.{secrets.token_hex(4)}"
        temporary.write_text(json.dumps(entry), encoding="utf-8")
        os.replace(temporary, self.root / "requests" / f"{key}.json")
        return Installed(
            key=existing.key, root=existing.root, path=existing.path, image_id=image_id,
            distributions=existing.distributions, files=existing.files, cached=False,
        )  # fmt: skip

    def drop(self, key: str | None = None) -> int:
        """Forget request ``key``'s resolution (every request's when None), so that it is resolved again; trees no
        request uses any more are removed too (do it while no run uses them). Returns the entries dropped."""
        requests = self.root / "requests"
        if not requests.is_dir():
            return 0
        names = [f"{key}.json"] if key is not None else [p.name for p in requests.iterdir()]
        dropped = 0
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                (requests / name).unlink()
                dropped += 1
        used = set()
        for entry in requests.glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                used.add(json.loads(entry.read_text(encoding="utf-8")).get("resolved"))
        for tree in self.trees.iterdir() if self.trees.is_dir() else ():
            name = tree.name.removesuffix(".json")
            if name not in used:
                _remove(tree)
        return dropped


def _remove(path: Path) -> None:
    """Remove a file or a sealed tree (its directories are 0555: made writable again first)."""
    if path.is_dir() and not path.is_symlink():
        for directory, _, _ in os.walk(path):
            with contextlib.suppress(OSError):
                os.chmod(directory, 0o700)
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _seal(tree: Path) -> None:
    """Files 0444, directories 0555, bottom up: readable by the sandbox's user, writable by no one."""
    # The modes are meant to be permissive for reading: the sandbox's user is not the owner (root).
    for directory, dirs, files in os.walk(tree, topdown=False):
        for name in files:
            os.chmod(os.path.join(directory, name), 0o444, follow_symlinks=False)
        for name in dirs:
            os.chmod(os.path.join(directory, name), 0o555)  # noqa: S103
    os.chmod(tree, 0o555)  # noqa: S103


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _copy_tree(source: str, target: Path, *, max_bytes: int) -> list[InstalledFile]:
    """Copy ``source`` to ``target`` (new), hashing every file, through descriptors with no symlink followed."""
    try:
        top = os.open(source, _DIRECTORY)
    except OSError as exc:
        raise PackageInstallError(f"the install left no tree at {source}: {exc.strerror}; nothing ran") from exc
    files: list[InstalledFile] = []
    budget = [SCAN_MAX_ENTRIES, max_bytes]
    try:
        os.mkdir(target, 0o700)
        for relative, fd in _walk(top, "", 0, budget):
            destination = target / relative
            if fd < 0:
                os.mkdir(destination, 0o700)
                continue
            digest = hashlib.sha256()
            size = 0
            with open(destination, "xb") as out:
                while chunk := os.read(fd, _COPY_CHUNK):
                    size += len(chunk)
                    budget[1] -= len(chunk)
                    if budget[1] < 0:
                        raise PackageRefusedError(f"the installed tree is larger than spec.packages.size ({max_bytes})")
                    digest.update(chunk)
                    out.write(chunk)
            os.close(fd)
            files.append(InstalledFile(relative, size, digest.hexdigest()))
    finally:
        os.close(top)
    return files


def _walk(fd: int, prefix: str, depth: int, budget: list[int]) -> Iterator[tuple[str, int]]:
    """``(relative path, open file descriptor)`` of each regular file below directory ``fd``, and
    ``(relative path + "/", -1)`` of each directory before what it holds; anything else is refused."""
    if depth > SCAN_MAX_DEPTH:
        raise PackageRefusedError(f"the installed tree is deeper than {SCAN_MAX_DEPTH} levels at {prefix!r}")
    for entry in sorted(os.scandir(fd), key=lambda e: e.name):
        budget[0] -= 1
        if budget[0] < 0:
            raise PackageRefusedError(f"the installed tree has more than {SCAN_MAX_ENTRIES} entries")
        relative = f"{prefix}{entry.name}"
        mode = entry.stat(follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            child = os.open(entry.name, _DIRECTORY, dir_fd=fd)
            try:
                yield relative + "/", -1  # a directory: the caller makes it
                yield from _walk(child, relative + "/", depth + 1, budget)
            finally:
                os.close(child)
        elif stat.S_ISREG(mode):
            file_fd = os.open(entry.name, _FILE, dir_fd=fd)
            if not stat.S_ISREG(os.fstat(file_fd).st_mode):
                os.close(file_fd)
                raise PackageRefusedError(f"{relative!r} in the installed tree changed while it was read")
            yield relative, file_fd
        else:
            kind = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
            raise PackageRefusedError(f"{relative!r} in the installed tree is {kind}; nothing from it reaches a run")

"""The npm install phase on the Docker engine: ``npm install --ignore-scripts`` in a sandbox whose only destination
is the registry, then the gateway checks the lock file and the downloaded tarballs itself.

For an allowed JavaScript request with packages whose resolution is not cached (the same
:class:`~gateway.packages.cache.PackageCache` as Python's, keyed apart by registry and specs):

1. Install. A sandbox with the run's own settings (image, runtime, user, limits; the same hardening, assembled and
   guarded by the runner's assembler), network ``egress`` to exactly one destination, the policy's registry
   (``NpmRule.registry_egress``, with its CIDRs), and a workspace of ``spec.packages.npm.size``. It runs the
   image's npm (``/usr/lib/node_modules/npm``, from the pinned wheel the image's node comes from: the gateway host
   needs no Node.js) with the gateway's arguments only: ``install --ignore-scripts --no-audit --no-fund
   --omit=dev --no-bin-links --prefix /workspace/tree SPEC...``, the registry, proxy and cache set by
   ``npm_config_*`` variables, no user or global configuration. No package's install script ever runs.
2. Check. Once that sandbox is gone the gateway trusts nothing npm said: it reads ``tree/package-lock.json``
   (:func:`lock_packages`): every package (dependencies too) must be a registry package (no link, git, file or
   bundled entry) whose ``resolved`` URL is on the registry's own host and path, with a ``sha512`` integrity,
   a name within ``allow`` and, with ``hashes``, a listed integrity; every directory below ``node_modules`` must
   be one of them, and every requested name installed. Each tarball is read from npm's content-addressed cache
   in the workspace and its sha512 checked against the lock's integrity by the gateway; its sha256 is what the
   cache and the ``execution.outcome`` record list.
3. The tree (``package.json``, ``package-lock.json``, ``node_modules``) is copied into the cache and the
   workspace removed. A cached tree's lock file is checked again against the policy before each use.

The run gets the tree read-only at ``/opt/gateway-packages`` (the same bind as Python's) and ``RunSpec.packages``
set: its supervisor puts ``/opt/gateway-packages/node_modules`` on node's module search path, so ``require('ms')``
finds it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import hashlib
import json
import posixpath
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from gateway.decision.engine import assemble
from gateway.decision.settings import ResolvedEgress, SandboxSettings
from gateway.errors import GatewayError, PackageInstallError, PackageRefusedError
from gateway.packages.cache import Distribution, Installed, PackageCache
from gateway.policy.model import EGRESS, NpmRule
from gateway.policy.npm import npm_name_allowed
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import Payload
from gateway.runner.supervisor import EGRESS_PROXY_URL
from gateway.runner.workspace import Workspace
from gateway.runspec import RunSpec
from gateway.slots import HostSlots

__all__ = [
    "NPM_CLI",
    "NPM_PROGRAM",
    "Installers",
    "LockPackage",
    "NpmInstaller",
    "check_tree_paths",
    "lock_packages",
    "npm_request_key",
]

NPM_CLI = "/usr/lib/node_modules/npm/bin/npm-cli.js"
"""The image's npm (scripts/build-image.sh copies it out of the wheel the image's node comes from)."""
INSTALL_TIMEOUT_S = 300.0
_OUTPUT_BYTES = 64 * 1024
_STDERR_SHOWN = 1500
_TREE = "tree"
_CACHE = "home/.npm"
_LOCK = f"{_TREE}/package-lock.json"
_HIDDEN_LOCK = "node_modules/.package-lock.json"
_MAX_PACKAGES = 512

NPM_PROGRAM = r"""
import json, os, subprocess, sys
job = json.load(open("npm.json"))
for name in ("home", "tmp", "tree"):
    os.makedirs(name, exist_ok=True)
sys.exit(subprocess.run(["/usr/bin/node", job["cli"], *job["args"]], env=job["env"]).returncode)
"""
"""What the install sandbox runs (its working directory is the workspace): the image's npm with the gateway's
arguments and environment (``npm.json``) only."""


@dataclasses.dataclass(frozen=True, slots=True)
class LockPackage:
    """One package of a lock file, checked: where it is, what it is, and the tarball it came from."""

    path: str
    """Its directory in the tree (``node_modules/ms``, ``node_modules/a/node_modules/b``)."""
    name: str
    version: str
    integrity: str
    """``sha512-<base64>``."""
    resolved: str
    """The tarball's URL, on the registry."""


def npm_request_key(rule: NpmRule, specs: Sequence[str], image_id: str) -> str:
    """The cache's request key of an npm install: registry, sorted specs and image (never equal to a pip one)."""
    data = {"ecosystem": "npm", "registry": rule.registry, "specs": sorted(specs), "image_id": image_id}
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _refuse(what: str) -> PackageRefusedError:
    return PackageRefusedError(f"{what}; nothing from the install reaches a run (rule packages.allowed)")


def _on_registry(url: str, registry: str) -> bool:
    got, want = urlsplit(url), urlsplit(registry)
    prefix = want.path if want.path.endswith("/") else want.path + "/"
    return (
        (got.scheme, got.hostname, got.port) == (want.scheme, want.hostname, want.port)
        and got.username is None
        and not got.query
        and got.path.startswith(prefix)
        and ".." not in got.path.split("/")
    )


def _name_of(path: str) -> str:
    """The package name a lock key's directory holds (after its last ``node_modules/``)."""
    return path.rsplit("node_modules/", 1)[-1]


def lock_packages(lock: bytes, rule: NpmRule) -> list[LockPackage]:
    """Every package of ``lock`` (a ``package-lock.json``, version 2 or 3), checked against ``rule``; raises
    :class:`~gateway.errors.PackageRefusedError` naming the first package that is not a registry package the policy
    allows (see the module's docstring)."""
    try:
        document = json.loads(lock)
        entries = document["packages"]
    except (ValueError, KeyError, TypeError) as exc:
        raise _refuse(f"the install's package-lock.json is not a lock file npm 7 or later writes ({exc})") from exc
    if not isinstance(entries, dict) or len(entries) > _MAX_PACKAGES + 1:
        raise _refuse(f"the install's package-lock.json lists no packages object or more than {_MAX_PACKAGES}")
    found = []
    for path, entry in sorted(entries.items()):
        if path == "":
            continue
        name = _name_of(path)
        if not isinstance(entry, dict) or not path.startswith("node_modules/") or ".." in path.split("/"):
            raise _refuse(f"the lock file lists {path!r}, which is not a package below node_modules")
        if entry.get("link") or entry.get("inBundle") or entry.get("name", name) != name:
            raise _refuse(f"{path} is a link, a bundled package or an alias, not a package from the registry")
        version, resolved, integrity = (str(entry.get(k, "")) for k in ("version", "resolved", "integrity"))
        if not (version and resolved and integrity):
            raise _refuse(f"{path} has no version, resolved URL or integrity: it did not come from the registry")
        if not _on_registry(resolved, rule.registry):
            raise _refuse(f"{name}@{version} came from {resolved!r}, not from the registry {rule.registry}")
        if not integrity.startswith("sha512-") or " " in integrity:
            raise _refuse(f"{name}@{version} has integrity {integrity!r}; one sha512 is required")
        if not npm_name_allowed(name, rule.allow):
            raise _refuse(
                f"the install resolved {name}@{version}, which spec.packages.npm.allow does not list "
                f"(allowed: {list(rule.allow)})"
            )
        listed = rule.allowed_integrity(name, version)
        if listed is not None and integrity not in listed:
            what = "is not listed" if not listed else f"has integrity {integrity}, not one listed"
            raise _refuse(f"{name}@{version} {what} in spec.packages.npm.hashes")
        found.append(LockPackage(path, name, version, integrity, resolved))
    return found


def _sha512_hex(integrity: str) -> str:
    try:
        digest = base64.b64decode(integrity.removeprefix("sha512-"), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _refuse(f"integrity {integrity!r} is not base64") from exc
    if len(digest) != 64:
        raise _refuse(f"integrity {integrity!r} is not a sha512 digest")
    return digest.hex()


class NpmInstaller:
    """The npm install phase of runs on a Docker runner (see the module's docstring); ``bind`` hands a tree to a
    run specification (the Python installer's ``apply``: the same read-only mount). ``install_count`` counts the
    installs that ran (a cached request runs none)."""

    def __init__(
        self, runner: DockerRunner, cache: PackageCache, bind: Callable[[RunSpec, Installed], RunSpec], *,
        image_id: Callable[[str], str],
    ) -> None:  # fmt: skip
        self.runner = runner
        self.cache = cache
        self.apply = bind
        self._image_id = image_id
        self.install_count = 0

    def install(self, settings: SandboxSettings, *, request_id: str, slots: HostSlots) -> Installed:
        """The run's installed tree: from the cache when an identical request resolved it before (no sandbox), else
        installed now in a sandbox of its own (holding one of ``slots``)."""
        npm = settings.npm
        if npm is None:
            raise PackageInstallError("the run has no npm packages to install")
        rule = npm.rule
        image_id = self._image_id(settings.profile.image)
        key = npm_request_key(rule, [str(s) for s in npm.specs], image_id)
        found = self.cache.lookup(key)
        if found is not None:
            with open(posixpath.join(found.path, "package-lock.json"), "rb") as lock:
                lock_packages(lock.read(), rule)  # the policy may have changed since
            return found
        self.install_count += 1
        workspaces = self.runner.workspaces
        workspace = workspaces.create(rule.size, settings.profile.uid, settings.profile.gid)
        try:
            with slots.take():
                self._npm_run(settings, workspace, request_id)
            distributions = self._check(settings, workspace)
            return self.cache.store(key, f"{workspace.path}/{_TREE}", distributions, image_id, max_bytes=rule.size)
        finally:
            with contextlib.suppress(GatewayError, OSError):
                workspaces.destroy(workspace)

    def _npm_run(self, settings: SandboxSettings, workspace: Workspace, request_id: str) -> None:
        assert settings.npm is not None  # noqa: S101 -- checked by install
        rule = settings.npm.rule
        network = dataclasses.replace(settings.profile, network=EGRESS)
        limits = ResolvedEgress(
            destinations=(rule.registry_egress,), connections=256, bytes_out=16 * 1024 * 1024, bytes_in=rule.size,
            rate=32,
        )  # fmt: skip
        phase = dataclasses.replace(
            settings, profile=network, egress=limits, packages=None, npm=None, mounts=(), env=(),
            timeout_s=INSTALL_TIMEOUT_S, output_bytes=_OUTPUT_BYTES, output_files=0,
        )  # fmt: skip
        assembled = assemble(
            self.runner.assembler, phase, denied_paths=(), decision_id=uuid.uuid4().hex, request_id=request_id
        )
        if not isinstance(assembled, tuple):
            raise PackageInstallError(f"the install run could not be assembled: {assembled.message}; nothing ran")
        job = {"cli": NPM_CLI, "args": _arguments(settings), "env": _environment(rule)}
        self.runner.workspaces.put(workspace, "npm.json", json.dumps(job).encode())
        outcome = self.runner.execute(
            dataclasses.replace(assembled[0], workspace=workspace), Payload(code=NPM_PROGRAM, language="python")
        )
        if outcome.exit_code != 0:
            asked = ", ".join(str(s) for s in settings.npm.specs)
            stderr = outcome.stderr.decode("utf-8", "replace").strip()[-_STDERR_SHOWN:]
            why = "timed out" if outcome.timed_out else f"exited with {outcome.exit_code}"
            raise PackageInstallError(f"installing {asked} from {rule.registry} failed (npm {why}): {stderr}")

    def _check(self, settings: SandboxSettings, workspace: Workspace) -> list[Distribution]:
        """The lock file and tarballs the install left, read and checked by the gateway (module docstring, 2)."""
        assert settings.npm is not None  # noqa: S101 -- checked by install
        rule = settings.npm.rule
        workspaces = self.runner.workspaces
        try:
            packages = lock_packages(workspaces.get(workspace, _LOCK, rule.size), rule)
        except PackageRefusedError:
            raise
        except GatewayError as exc:
            raise PackageInstallError(f"the install left no readable package-lock.json: {exc.message}") from exc
        listing = workspaces.list(workspace)
        if listing.truncated:
            raise _refuse("the install left more files than a workspace listing holds")
        check_tree_paths([f.path for f in listing.files], {p.path for p in packages})
        installed = {p.name for p in packages if p.path == f"node_modules/{p.name}"}
        missing = [str(s) for s in settings.npm.specs if s.name not in installed]
        if missing:
            raise _refuse(f"the install did not install {', '.join(missing)}, which the request asked for")
        distributions = []
        budget = rule.size
        for package in packages:
            digest = _sha512_hex(package.integrity)
            content = f"{_CACHE}/_cacache/content-v2/sha512/{digest[:2]}/{digest[2:4]}/{digest[4:]}"
            try:
                data = workspaces.get(workspace, content, budget)
            except GatewayError as exc:
                raise _refuse(f"the tarball of {package.name}@{package.version} is not in npm's cache") from exc
            budget -= len(data)
            if hashlib.sha512(data).hexdigest() != digest:
                raise _refuse(f"the tarball of {package.name}@{package.version} does not match its integrity")
            filename = posixpath.basename(urlsplit(package.resolved).path)
            distributions.append(
                Distribution(package.name, package.version, hashlib.sha256(data).hexdigest(), filename)
            )
        return sorted(distributions, key=lambda d: (d.name, d.version))


def check_tree_paths(paths: Sequence[str], packages: set[str]) -> None:
    """Refuse a file below ``tree/node_modules`` (a workspace path) that belongs to no package of the lock file
    (``packages``: their directories, ``node_modules/a/node_modules/@s/b``); npm's hidden lock file is its own."""
    for path in paths:
        if not path.startswith(f"{_TREE}/node_modules/"):
            continue
        relative = path[len(_TREE) + 1 :]
        if relative == _HIDDEN_LOCK:
            continue
        parts = relative.split("/")
        owner = None
        i = 0
        while i + 1 < len(parts) and parts[i] == "node_modules":
            step = 3 if parts[i + 1].startswith("@") else 2
            candidate = "/".join(parts[: i + step])
            if candidate not in packages:
                break
            owner, i = candidate, i + step
        if owner is None:
            raise _refuse(f"the install left {relative!r}, which belongs to no package of the lock file")


def _arguments(settings: SandboxSettings) -> list[str]:
    assert settings.npm is not None  # noqa: S101 -- only for a run with npm packages
    return [
        "install", "--ignore-scripts", "--no-audit", "--no-fund", "--omit=dev", "--no-bin-links",
        "--no-update-notifier", "--loglevel=warn", "--prefix", f"/workspace/{_TREE}",
        "--", *(str(s) for s in settings.npm.specs),
    ]  # fmt: skip


def _environment(rule: NpmRule) -> Mapping[str, str]:
    """npm's whole environment: the registry and proxy by variable, no configuration file read, no scripts."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": "/workspace/home",
        "TMPDIR": "/workspace/tmp",
        "npm_config_registry": rule.registry,
        "npm_config_proxy": EGRESS_PROXY_URL,
        "npm_config_https_proxy": EGRESS_PROXY_URL,
        "npm_config_noproxy": "",
        "npm_config_cache": f"/workspace/{_CACHE}",
        "npm_config_userconfig": "/workspace/home/no-npmrc",  # neither exists: no configuration file is read
        "npm_config_globalconfig": "/workspace/tmp/no-npmrc",
        "npm_config_ignore_scripts": "true",
        "npm_config_fetch_retries": "1",
        "npm_config_update_notifier": "false",
    }


class Installers:
    """Python's installer and npm's behind one :class:`~gateway.packages.Installer`: a run with npm packages
    (``settings.npm``) gets npm's, any other Python's. Both bind the tree the same way (``python.apply``)."""

    def __init__(self, python: Any) -> None:
        self.python = python
        self.npm = NpmInstaller(python.runner, python.cache, python.apply, image_id=python.image_id)

    def install(self, settings: SandboxSettings, *, request_id: str, slots: HostSlots) -> Installed:
        chosen = self.npm if settings.npm is not None else self.python
        installed: Installed = chosen.install(settings, request_id=request_id, slots=slots)
        return installed

    def apply(self, spec: RunSpec, installed: Installed) -> RunSpec:
        applied: RunSpec = self.python.apply(spec, installed)
        return applied

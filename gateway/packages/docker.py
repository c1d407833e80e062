"""The install phase on the Docker engine: pip downloads in a sandbox whose only destination is the index, the
gateway checks what it downloaded, and pip installs exactly that in a second sandbox with no network.

For an allowed request with packages whose resolution is not cached (:class:`~gateway.packages.cache.PackageCache`):

1. Download. The sandbox's settings are the run's own (image, runtime, user, limits: the same hardening,
   assembled and guarded by the runner's assembler) with network ``egress`` to exactly one destination, the
   policy's index (``PackagesRule.index_egress``, with its CIDRs), and a workspace of ``spec.packages.size`` bound
   at ``/workspace`` in place of the tmpfs. pip (the gateway's own, as a zipapp put into the workspace: the
   sandbox image needs none) runs there with the gateway's arguments only: ``download --index-url INDEX
   --only-binary=:all: (binary_only) --dest dl``, through the run's proxy, with no configuration file, cache or
   version check. It resolves the requirements and their dependencies; nothing is installed.
2. Check. Once that sandbox is gone the gateway trusts nothing pip said: it reads the archives in ``dl/`` itself
   (regular files only, no symlink followed, bounded in number and bytes), computes each one's sha256, takes
   name and version from its file name (:mod:`gateway.packages.archives`: the PEP 427 grammar; a source archive
   only without ``binary_only``), and refuses what the policy does not allow (name, ``binary_only``, ``hashes``)
   or a requested project missing from them. The checked archives are copied into a fresh workspace; nothing
   else of the first one survives.
3. Install. A second sandbox of the same image and hardening with no network at all runs ``pip install
   --no-index --find-links dl --require-hashes -r requirements.txt --target tree``, the requirements written by
   the gateway: every archive pinned to its version and the sha256 the gateway computed (pip also refuses a
   wheel whose metadata names another project or version than its file name). The tree is copied into the
   cache, keyed by those digests, and the workspace removed.

The run phase then gets the tree bound read-only at :data:`PACKAGES_TARGET` (a judged mount: staged, non-recursive,
checked after start; ``nosuid,nodev`` and, alone of all mounts, without ``noexec`` (``HostMount.exec``): the tree
is the gateway's own copy, sealed and hash-checked, and a wheel's compiled extension must load from it) and
``RunSpec.packages`` set: its supervisor puts the tree on the program's path where ``PYTHONPATH`` would (no
``PYTHON*`` variable in the request's environment, so the interpreter the sandbox started ahead runs the
program); its network is the decision's own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import posixpath
import threading
import uuid
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.decision.engine import assemble
from gateway.decision.settings import ResolvedEgress, SandboxSettings
from gateway.errors import GatewayError, PackageInstallError, PackageRefusedError
from gateway.packages.archives import distribution_of, pinned_requirements
from gateway.packages.cache import Distribution, Installed, PackageCache, check_distributions, request_key
from gateway.policy.model import EGRESS
from gateway.runner.docker.mounts import engine_mounts
from gateway.runner.docker.options import DECISION_LABEL
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import Payload
from gateway.runner.supervisor import EGRESS_PROXY_URL, PACKAGES_TARGET
from gateway.runner.workspace import Workspace
from gateway.runspec import HostMount, RunSpec
from gateway.slots import HostSlots

__all__ = [
    "INSTALL_TIMEOUT_S",
    "MAX_ARCHIVES",
    "PACKAGES_TARGET",
    "PIP_PROGRAM",
    "PIP_STEP",
    "DockerInstaller",
    "pip_zipapp",
]

INSTALL_TIMEOUT_S = 300.0
"""Each install sandbox's deadline."""
MAX_ARCHIVES = 256
"""Archives a download may leave (the requirements and every dependency); more is refused."""
_OUTPUT_BYTES = 64 * 1024
_STDERR_SHOWN = 1500
_DOWNLOADS = "dl"

PIP_STEP = r"""
import json, os, subprocess, sys
args = json.load(open("pip.json"))
env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/workspace/home", "TMPDIR": "/workspace/tmp",
       "PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INPUT": "1"}
for name in ("home", "tmp"):
    os.makedirs(name, exist_ok=True)
status = subprocess.run([sys.executable, "-I", "pip.pyz", *args], env=env).returncode
"""
"""An install sandbox's program up to pip's end (its working directory is the workspace): pip with the gateway's
arguments (``pip.json``) only; ``status`` is pip's exit status."""
PIP_PROGRAM = PIP_STEP + "sys.exit(status)\n"
"""What both install sandboxes run by default."""


def pip_zipapp() -> bytes:
    """The gateway's own pip as a zipapp (pip runs from a zip): what the install sandboxes run."""
    spec = importlib.util.find_spec("pip")
    if spec is None or spec.origin is None:
        raise PackageInstallError("pip is not installed alongside the gateway, so no package can be installed")
    root = Path(spec.origin).parent
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for directory, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if not name.endswith(".pyc"):
                    path = Path(directory) / name
                    archive.write(path, str(Path("pip") / path.relative_to(root)))
        archive.writestr("__main__.py", "import runpy\nrunpy.run_module('pip', run_name='__main__', alter_sys=True)\n")
    return buffer.getvalue()


_QUIET = ["--isolated", "--no-cache-dir", "--disable-pip-version-check", "--no-input", "--progress-bar", "off"]


def _download_arguments(settings: SandboxSettings, proxy: str) -> list[str]:
    assert settings.packages is not None  # noqa: S101 -- only called for a run with packages
    rule = settings.packages.rule
    args = [
        "download", *_QUIET, "--index-url", rule.index, "--proxy", proxy, "--dest", _DOWNLOADS,
        "--retries", "1", "--timeout", "30",
    ]  # fmt: skip
    if rule.index.startswith("http://"):  # the policy chose plain HTTP (an internal mirror): pip must be told
        args += ["--trusted-host", f"{rule.index_egress.host}:{rule.index_egress.ports[0]}"]
    if rule.binary_only:
        args.append("--only-binary=:all:")
    return [*args, "--", *(str(r) for r in settings.packages.requirements)]


def _install_arguments(binary_only: bool) -> list[str]:
    args = [
        "install", *_QUIET, "--no-compile", "--no-index", "--find-links", _DOWNLOADS, "--require-hashes",
        "--target", "tree", "-r", "requirements.txt",
    ]  # fmt: skip
    # Without binary_only a source archive is built here, offline: with the image's own build tools.
    return [*args, "--only-binary=:all:" if binary_only else "--no-build-isolation"]


class DockerInstaller:
    """The install phase of runs on a :class:`DockerRunner` (see the module's docstring).

    ``image_id``: the id of an image reference (default: the engine's); ``install_count`` counts the installs
    that ran (a cached request runs none). ``download_program``: what the download sandbox runs (default
    :data:`PIP_PROGRAM`; tests give one that lies, starting from :data:`PIP_STEP`)."""

    def __init__(
        self, runner: DockerRunner, cache: PackageCache | None = None, *,
        image_id: Callable[[str], str] | None = None, download_program: str = PIP_PROGRAM,
    ) -> None:  # fmt: skip
        self.runner = runner
        self.cache = cache if cache is not None else PackageCache()
        self._image_id = image_id
        self._download_program = download_program
        self._pip: bytes | None = None
        self._lock = threading.Lock()
        self.install_count = 0

    def image_id(self, image: str) -> str:
        if self._image_id is not None:
            return self._image_id(image)
        try:
            return str(self.runner.client.api.inspect_image(image)["Id"])
        except Exception as exc:
            raise PackageInstallError(f"cannot read the id of image {image!r}: {exc}; nothing ran") from exc

    def install(self, settings: SandboxSettings, *, request_id: str, slots: HostSlots) -> Installed:
        """The run's installed tree: from the cache when an identical request resolved it before (no sandbox),
        else installed now in two sandboxes of its own, one after the other (each holding one of ``slots``)."""
        packages = settings.packages
        if packages is None:
            raise PackageInstallError("the run has no packages to install")
        image_id = self.image_id(settings.profile.image)
        key = request_key(packages.rule, [str(r) for r in packages.requirements], image_id)
        found = self.cache.lookup(key)
        if found is not None:
            check_distributions(packages.rule, found.distributions)  # the policy may have changed since
            return found
        if self._pip is None:
            with self._lock:
                self._pip = self._pip or pip_zipapp()
        self.install_count += 1
        rule = packages.rule
        workspaces = self.runner.workspaces
        downloaded = workspaces.create(rule.size, settings.profile.uid, settings.profile.gid)
        try:
            with slots.take():
                self._pip_run(settings, downloaded, request_id, egress=True)
            checked = workspaces.create(rule.size, settings.profile.uid, settings.profile.gid)
            try:
                distributions = self._take_archives(settings, downloaded, checked)
            except BaseException:
                _destroy(workspaces, checked)
                raise
        finally:
            _destroy(workspaces, downloaded)
        try:
            workspaces.put(checked, "requirements.txt", pinned_requirements(distributions).encode())
            with slots.take():
                self._pip_run(settings, checked, request_id, egress=False)
            return self.cache.store(key, f"{checked.path}/tree", distributions, image_id, max_bytes=rule.size)
        finally:
            _destroy(workspaces, checked)

    def _pip_run(self, settings: SandboxSettings, workspace: Workspace, request_id: str, *, egress: bool) -> None:
        """pip in a sandbox of the run's image and hardening on ``workspace``: the download (network ``egress``
        to the index alone) or the install (no network); a failure raises :class:`PackageInstallError`."""
        assert settings.packages is not None  # noqa: S101 -- checked by install
        rule = settings.packages.rule
        if egress:
            network = dataclasses.replace(settings.profile, network=EGRESS)
            limits = ResolvedEgress(
                destinations=(rule.index_egress,), connections=256, bytes_out=16 * 1024 * 1024, bytes_in=rule.size,
                rate=32,
            )  # fmt: skip
            arguments, program = _download_arguments(settings, EGRESS_PROXY_URL), self._download_program
        else:
            network, limits = dataclasses.replace(settings.profile, network="none"), None
            arguments, program = _install_arguments(rule.binary_only), PIP_PROGRAM
        phase = dataclasses.replace(
            settings, profile=network, egress=limits, packages=None, mounts=(), env=(), timeout_s=INSTALL_TIMEOUT_S,
            output_bytes=_OUTPUT_BYTES, output_files=0,
        )  # fmt: skip
        assembled = assemble(
            self.runner.assembler, phase, denied_paths=(), decision_id=uuid.uuid4().hex, request_id=request_id
        )
        if not isinstance(assembled, tuple):
            raise PackageInstallError(f"the install run could not be assembled: {assembled.message}; nothing ran")
        workspaces = self.runner.workspaces
        assert self._pip is not None  # noqa: S101 -- made by install
        workspaces.put(workspace, "pip.pyz", self._pip)
        workspaces.put(workspace, "pip.json", json.dumps(arguments).encode())
        outcome = self.runner.execute(
            dataclasses.replace(assembled[0], workspace=workspace), Payload(code=program, language="python")
        )
        if outcome.exit_code != 0:
            asked = ", ".join(str(r) for r in settings.packages.requirements)
            stderr = outcome.stderr.decode("utf-8", "replace").strip()[-_STDERR_SHOWN:]
            why = "timed out" if outcome.timed_out else f"exited with {outcome.exit_code}"
            step = f"downloading {asked} from {rule.index}" if egress else f"installing {asked} (no network)"
            raise PackageInstallError(f"{step} failed (pip {why}): {stderr}")

    def _take_archives(self, settings: SandboxSettings, source: Workspace, target: Workspace) -> list[Distribution]:
        """The archives the download left in ``source``'s ``dl/``, read by the gateway (regular files, no symlink
        followed, at most :data:`MAX_ARCHIVES` and ``spec.packages.size`` bytes), hashed, named by their file
        names, checked against the policy, and copied into ``target``'s ``dl/``: their distributions."""
        assert settings.packages is not None  # noqa: S101 -- checked by install
        rule = settings.packages.rule
        workspaces = self.runner.workspaces
        listing = workspaces.list(source)
        names = [f.path for f in listing.files if f.path.startswith(f"{_DOWNLOADS}/")]
        if listing.truncated or len(names) > MAX_ARCHIVES:
            raise PackageRefusedError(f"the download left more than {MAX_ARCHIVES} files; nothing reaches a run")
        if not names:
            raise PackageInstallError("the download left no archive; nothing ran")
        found: list[Distribution] = []
        budget = rule.size
        for path in names:
            if posixpath.dirname(path) != _DOWNLOADS:
                raise PackageRefusedError(
                    f"the download left {path!r} in a directory of its own; nothing reaches a run"
                )
            try:
                data = workspaces.get(source, path, budget)
            except GatewayError as exc:
                raise PackageRefusedError(
                    f"the downloaded archives are larger than spec.packages.size ({rule.size}) or unreadable: "
                    f"{exc.message}; nothing reaches a run"
                ) from exc
            budget -= len(data)
            found.append(distribution_of(posixpath.basename(path), data, binary_only=rule.binary_only))
            workspaces.put(target, path, data)
        check_distributions(rule, found)
        have = {d.name for d in found}
        missing = [str(r) for r in settings.packages.requirements if r.name not in have]
        if missing:
            raise PackageRefusedError(
                f"the download left no archive of {', '.join(missing)}, which the request asked for; nothing reaches "
                "a run"
            )
        return sorted(found, key=lambda d: d.name)

    def apply(self, spec: RunSpec, installed: Installed) -> RunSpec:
        """``spec`` with the installed tree bound read-only at :data:`PACKAGES_TARGET` (a judged mount after the
        request's own) and ``packages`` set (the supervisor puts the tree on the program's path); its options
        guarded again by the runner's assembler."""
        options: dict[str, Any] = dict(spec.options)
        labels: Mapping[str, str] = options.get("labels") or {}
        st = os.stat(installed.path)
        tree = HostMount(
            installed.root, installed.path, st.st_dev, st.st_ino, PACKAGES_TARGET, read_only=True, exec=True
        )
        mounts = (*spec.mounts, tree)
        options["mounts"] = engine_mounts([(m.target, m.read_only) for m in mounts], str(labels[DECISION_LABEL]))
        self.runner.assembler.guard(options)
        return dataclasses.replace(spec, options=options, mounts=mounts, packages=True)


def _destroy(workspaces: Any, workspace: Workspace) -> None:
    with contextlib.suppress(GatewayError, OSError):
        workspaces.destroy(workspace)

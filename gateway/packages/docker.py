"""The install phase on the Docker engine: pip in a sandbox whose only destination is the index, then the tree.

For an allowed request with packages whose resolution is not cached (:class:`~gateway.packages.cache.PackageCache`):

1. The install run's settings are the run's own (image, runtime, user, limits: the same hardening, assembled and
   guarded by the runner's assembler) with network ``egress`` to exactly one destination, the policy's index
   (``PackagesRule.index_egress``, with its CIDRs), and a workspace of ``spec.packages.size`` bound at
   ``/workspace`` in place of the tmpfs.
2. pip (the gateway's own, as a zipapp put into the workspace: the sandbox image needs none) runs there:
   ``install --index-url INDEX --only-binary=:all: (binary_only) --target tree --report report.json``, through the
   run's proxy, with no configuration file, cache or version check.
3. Once the sandbox is gone the gateway reads pip's report (every distribution installed: name, version, the
   archive's sha256), refuses any distribution the policy does not allow (name, binary_only, hashes), copies the
   tree into the cache and removes the workspace.

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
import threading
import uuid
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.decision.engine import assemble
from gateway.decision.settings import ResolvedEgress, SandboxSettings
from gateway.errors import GatewayError, PackageInstallError, PackageRefusedError
from gateway.packages.cache import Distribution, Installed, PackageCache, check_distributions, request_key
from gateway.policy.model import EGRESS
from gateway.policy.packages import canonical_name
from gateway.runner.docker.mounts import engine_mounts
from gateway.runner.docker.options import DECISION_LABEL
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import Payload
from gateway.runner.supervisor import EGRESS_PROXY_URL, PACKAGES_TARGET
from gateway.runspec import HostMount, RunSpec
from gateway.slots import HostSlots

__all__ = ["INSTALL_TIMEOUT_S", "PACKAGES_TARGET", "DockerInstaller", "pip_zipapp"]

INSTALL_TIMEOUT_S = 300.0
"""The install run's deadline."""
_OUTPUT_BYTES = 64 * 1024
_REPORT_BYTES = 8 * 1024 * 1024
_STDERR_SHOWN = 1500

_INSTALL = r"""
import json, subprocess, sys
args = json.load(open("install.json"))
env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/workspace/home", "TMPDIR": "/workspace/tmp",
       "PIP_CONFIG_FILE": "/dev/null", "PIP_NO_INPUT": "1"}
for name in ("home", "tmp"):
    __import__("os").makedirs(name, exist_ok=True)
sys.exit(subprocess.run([sys.executable, "-I", "pip.pyz", *args], env=env).returncode)
"""
"""The install run's program (its working directory is the workspace): pip with the gateway's arguments only."""


def pip_zipapp() -> bytes:
    """The gateway's own pip as a zipapp (pip runs from a zip): what the install sandbox runs."""
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


def _pip_arguments(settings: SandboxSettings, proxy: str) -> list[str]:
    assert settings.packages is not None  # noqa: S101 -- only called for a run with packages
    rule = settings.packages.rule
    args = [
        "install", "--isolated", "--no-cache-dir", "--disable-pip-version-check", "--no-input", "--no-compile",
        "--progress-bar", "off", "--index-url", rule.index, "--proxy", proxy, "--target", "tree",
        "--report", "report.json", "--retries", "1", "--timeout", "30",
    ]  # fmt: skip
    if rule.index.startswith("http://"):  # the policy chose plain HTTP (an internal mirror): pip must be told
        args += ["--trusted-host", f"{rule.index_egress.host}:{rule.index_egress.ports[0]}"]
    if rule.binary_only:
        args.append("--only-binary=:all:")
    return [*args, "--", *(str(r) for r in settings.packages.requirements)]


def _distributions(report: bytes) -> list[Distribution]:
    """Every distribution pip's ``--report`` says it installed (name, version, archive file and sha256)."""
    try:
        data = json.loads(report)
        found = []
        for item in data["install"]:
            download = item["download_info"]
            archive = download.get("archive_info")
            if archive is None:
                raise PackageRefusedError(f"{item['metadata']['name']} was not installed from an archive of the index")
            sha256 = (archive.get("hashes") or {}).get("sha256") or ""
            if not sha256:
                raise PackageRefusedError(
                    f"the index gave {item['metadata']['name']} without a sha256; an index must link files with "
                    "#sha256= fragments"
                )
            found.append(
                Distribution(
                    name=canonical_name(item["metadata"]["name"]),
                    version=str(item["metadata"]["version"]),
                    sha256=sha256,
                    filename=str(download["url"]).rsplit("/", 1)[-1].split("#", 1)[0],
                )
            )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PackageInstallError(f"pip's install report could not be read: {exc!r}") from exc
    return sorted(found, key=lambda d: d.name)


class DockerInstaller:
    """The install phase of runs on a :class:`DockerRunner` (see the module's docstring).

    ``image_id``: the id of an image reference (default: the engine's); ``install_count`` counts the install
    sandboxes started (a cached request starts none)."""

    def __init__(
        self, runner: DockerRunner, cache: PackageCache | None = None, *,
        image_id: Callable[[str], str] | None = None,
    ) -> None:  # fmt: skip
        self.runner = runner
        self.cache = cache if cache is not None else PackageCache()
        self._image_id = image_id
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
        else installed now in a sandbox of its own (holding one of ``slots`` while it exists)."""
        packages = settings.packages
        if packages is None:
            raise PackageInstallError("the run has no packages to install")
        image_id = self.image_id(settings.profile.image)
        key = request_key(packages.rule, [str(r) for r in packages.requirements], image_id)
        found = self.cache.lookup(key)
        if found is not None:
            check_distributions(packages.rule, found.distributions)  # the policy may have changed since
            return found
        with slots.take():
            return self._install(settings, key, image_id, request_id)

    def _install(self, settings: SandboxSettings, key: str, image_id: str, request_id: str) -> Installed:
        assert settings.packages is not None  # noqa: S101 -- checked by install
        rule = settings.packages.rule
        egress = ResolvedEgress(
            destinations=(rule.index_egress,), connections=256, bytes_out=16 * 1024 * 1024, bytes_in=rule.size,
            rate=32,
        )  # fmt: skip
        phase = dataclasses.replace(
            settings, profile=dataclasses.replace(settings.profile, network=EGRESS), egress=egress, packages=None,
            mounts=(), env=(), timeout_s=INSTALL_TIMEOUT_S, output_bytes=_OUTPUT_BYTES, output_files=0,
        )  # fmt: skip
        assembled = assemble(
            self.runner.assembler, phase, denied_paths=(), decision_id=uuid.uuid4().hex, request_id=request_id
        )
        if not isinstance(assembled, tuple):
            raise PackageInstallError(f"the install run could not be assembled: {assembled.message}; nothing ran")
        spec = assembled[0]
        if self._pip is None:
            with self._lock:
                self._pip = self._pip or pip_zipapp()
        workspaces = self.runner.workspaces
        workspace = workspaces.create(rule.size, settings.profile.uid, settings.profile.gid)
        try:
            workspaces.put(workspace, "pip.pyz", self._pip)
            arguments = _pip_arguments(settings, EGRESS_PROXY_URL)
            workspaces.put(workspace, "install.json", json.dumps(arguments).encode())
            self.install_count += 1
            outcome = self.runner.execute(
                dataclasses.replace(spec, workspace=workspace), Payload(code=_INSTALL, language="python")
            )
            asked = ", ".join(str(r) for r in settings.packages.requirements)
            if outcome.exit_code != 0:
                stderr = outcome.stderr.decode("utf-8", "replace").strip()[-_STDERR_SHOWN:]
                why = "timed out" if outcome.timed_out else f"exited with {outcome.exit_code}"
                raise PackageInstallError(f"installing {asked} from {rule.index} failed (pip {why}): {stderr}")
            distributions = _distributions(workspaces.get(workspace, "report.json", _REPORT_BYTES))
            check_distributions(rule, distributions)
            return self.cache.store(key, f"{workspace.path}/tree", distributions, image_id, max_bytes=rule.size)
        finally:
            with contextlib.suppress(GatewayError, OSError):
                workspaces.destroy(workspace)

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

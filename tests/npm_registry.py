"""An npm registry on loopback for tests: package tarballs built by the test with ``tarfile``, served by http.server.

:func:`build_package` writes a tarball as ``npm pack`` does (``package/package.json``, ``package/index.js``, any
other files); :class:`NpmRegistry` serves each package's packument at ``/<name>`` (every version with its
``dist.tarball`` on the registry's own URL and ``dist.integrity``, ``sha512-<base64>``) and the tarballs at
``/<name>/-/<basename>-<version>.tgz``, on ``127.0.0.1`` and a random port, counting the requests it answered.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from tests.loopback_http import LoopbackServer

__all__ = ["NpmPackage", "NpmRegistry", "build_package", "integrity"]


def integrity(data: bytes) -> str:
    """The ``sha512-<base64>`` integrity string npm records for ``data``."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


@dataclass(frozen=True)
class NpmPackage:
    """One version of one package the registry serves."""

    name: str
    version: str
    manifest: Mapping[str, Any]
    """Its package.json."""
    data: bytes
    """The tarball."""

    @property
    def integrity(self) -> str:
        return integrity(self.data)

    @property
    def filename(self) -> str:
        return f"{self.name.rsplit('/', 1)[-1]}-{self.version}.tgz"


def build_package(
    name: str, version: str, index_js: str, *, dependencies: Mapping[str, str] | None = None,
    scripts: Mapping[str, str] | None = None, files: Mapping[str, str] | None = None,
) -> NpmPackage:  # fmt: skip
    """A tarball of ``name`` ``version`` (``package/package.json``, ``package/index.js`` holding ``index_js``,
    ``files``), depending on ``dependencies`` (name -> range), with lifecycle ``scripts`` (``postinstall``...)."""
    manifest: dict[str, Any] = {"name": name, "version": version, "main": "index.js"}
    if dependencies:
        manifest["dependencies"] = dict(dependencies)
    if scripts:
        manifest["scripts"] = dict(scripts)
    contents = {"package/package.json": json.dumps(manifest), "package/index.js": index_js}
    contents |= {f"package/{path}": text for path, text in (files or {}).items()}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, text in sorted(contents.items()):
            data = text.encode()
            entry = tarfile.TarInfo(path)
            entry.size, entry.mode, entry.mtime = len(data), 0o644, 499162500
            tar.addfile(entry, io.BytesIO(data))
    return NpmPackage(name, version, manifest, buffer.getvalue())


@dataclass
class NpmRegistry(LoopbackServer):
    """Serves ``packages`` on ``http://127.0.0.1:<port>/`` (or under the ``host`` name the runs use, when given)
    while entered; ``requests`` lists the paths asked for."""

    packages: Sequence[NpmPackage]
    host: str | None = None
    requests: list[str] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """The registry's URL, as runs name it (``host`` when given, else 127.0.0.1)."""
        return f"http://{self.host or '127.0.0.1'}:{self.port}/"

    def packument(self, name: str) -> dict[str, Any]:
        """The registry's document of ``name``: every version, with its dist, and ``dist-tags.latest``."""
        versions = {}
        for package in self.packages:
            if package.name == name:
                dist = {"tarball": f"{self.url}{name}/-/{package.filename}", "integrity": package.integrity}
                versions[package.version] = {**package.manifest, "dist": dist}
        latest = max(versions, key=lambda v: tuple(int(p) for p in v.split(".")))
        return {"name": name, "dist-tags": {"latest": latest}, "versions": versions}

    def answer(self, path: str) -> tuple[int, str, bytes]:
        name = unquote(path.lstrip("/"))
        if "/-/" in name:
            owner, _, filename = name.partition("/-/")
            for package in self.packages:
                if package.name == owner and package.filename == filename:
                    return 200, "application/octet-stream", package.data
            return 404, "text/plain", b"no such tarball"
        if any(p.name == name for p in self.packages):
            return 200, "application/json", json.dumps(self.packument(name)).encode()
        return 404, "application/json", b'{"error": "Not found"}'

"""A PEP 503 package index on loopback for tests: small wheels written by hand, an sdist, served by http.server.

A wheel is a zip holding the package's files and ``<name>-<version>.dist-info/`` with METADATA, WHEEL and
RECORD; :func:`build_wheel` writes exactly that (pure Python, ``py3-none-any``, or with a compiled extension that
:func:`compile_extension` builds with the host's C compiler), :func:`build_sdist` a source-only ``.tar.gz``.
:class:`PackageIndex` serves ``/simple/`` and ``/simple/<name>/`` (links with ``#sha256=`` fragments) and the
files, on ``127.0.0.1`` and a random port, counting the requests it answered.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import re
import shutil
import subprocess
import sysconfig
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Self

from tests.loopback_http import LoopbackServer

__all__ = ["EXTENSION_TAG", "Archive", "PackageIndex", "build_sdist", "build_wheel", "canonical", "compile_extension"]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Archive:
    """One file the index serves."""

    project: str
    """Canonical project name."""
    filename: str
    data: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(
    name: str, version: str, files: Mapping[str, str], *, requires: Sequence[str] = (),
    binaries: Mapping[str, bytes] | None = None, tag: str = "py3-none-any",
) -> Archive:  # fmt: skip
    """A wheel of ``name`` ``version`` holding ``files`` (path -> text) and ``binaries`` (path -> bytes: a compiled
    extension, with a platform ``tag``), depending on ``requires``; pure Python, ``py3-none-any``, by default."""
    stem = re.sub(r"[-_.]+", "_", name)
    info = f"{stem}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    contents = {path: text.encode() for path, text in files.items()} | dict(binaries or {})
    contents[f"{info}/METADATA"] = metadata.encode()
    purelib = "true" if tag == "py3-none-any" else "false"
    contents[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: {purelib}\nTag: {tag}\n".encode()
    )
    record = [_record_line(path, data) for path, data in contents.items()] + [f"{info}/RECORD,,"]
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in contents.items():
            wheel.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return Archive(canonical(name), f"{stem}-{version}-{tag}.whl", buffer.getvalue())


EXTENSION_TAG = f"cp311-abi3-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"
"""The tag of a wheel holding :func:`compile_extension`'s module: CPython's stable ABI from 3.11 on, this host's
platform (the sandbox images' Python is 3.11 on the same machine)."""


def compile_extension(module: str, answer: int) -> bytes | None:
    """A CPython extension module (stable ABI, ``<last part of module>.abi3.so``) whose ``answer()`` returns
    ``answer``, compiled with the host's ``cc`` against this interpreter's headers; None without a compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    leaf = module.rsplit(".", 1)[-1]
    source = f"""
#define Py_LIMITED_API 0x030B0000
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *unused) {{ return PyLong_FromLong({answer}); }}
static PyMethodDef methods[] = {{{{"answer", answer, METH_NOARGS, NULL}}, {{NULL, NULL, 0, NULL}}}};
static struct PyModuleDef definition = {{PyModuleDef_HEAD_INIT, "{module}", NULL, -1, methods}};
PyMODINIT_FUNC PyInit_{leaf}(void) {{ return PyModule_Create(&definition); }}
"""
    with tempfile.TemporaryDirectory(prefix="gw-ext-") as tmp:
        (Path(tmp) / "ext.c").write_text(source)
        argv = [compiler, "-shared", "-fPIC", "-O2", f"-I{sysconfig.get_paths()['include']}", "ext.c", "-o", "ext.so"]
        subprocess.run(argv, cwd=tmp, check=True, capture_output=True)
        return (Path(tmp) / "ext.so").read_bytes()


def build_sdist(name: str, version: str) -> Archive:
    """A source distribution only (its build would run ``setup.py``): what ``binary_only`` must refuse."""
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    members = {
        f"{stem}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{stem}/setup.py": b"raise SystemExit('an sdist was built: binary_only did not hold')\n",
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path, data in members.items():
            entry = tarfile.TarInfo(path)
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
    return Archive(canonical(name), f"{stem}.tar.gz", buffer.getvalue())


@dataclass
class PackageIndex(LoopbackServer):
    """A PEP 503 simple index of ``archives`` on 127.0.0.1; use as a context manager (serves in a thread)."""

    archives: Sequence[Archive]
    requests: list[str] = field(default_factory=list)
    """The paths it answered, in order (for asserting that a cached install asked nothing)."""
    _server: ThreadingHTTPServer | None = None
    _served: dict[str, bytes] = field(default_factory=dict)

    def url(self, host: str = "127.0.0.1") -> str:
        """The index URL (``http://host:port/simple/``)."""
        return f"http://{host}:{self.port}/simple/"

    def _pages(self) -> dict[str, bytes]:
        pages: dict[str, bytes] = {}
        projects = sorted({a.project for a in self.archives})
        links = "".join(f'<a href="{p}/">{p}</a>\n' for p in projects)
        pages["/simple/"] = f"<!DOCTYPE html><html><body>\n{links}</body></html>\n".encode()
        for project in projects:
            files = [a for a in self.archives if a.project == project]
            anchors = "".join(
                f'<a href="../../files/{html.escape(a.filename)}#sha256={a.sha256}">{html.escape(a.filename)}</a>\n'
                for a in files
            )
            pages[f"/simple/{project}/"] = f"<!DOCTYPE html><html><body>\n{anchors}</body></html>\n".encode()
        for archive in self.archives:
            pages[f"/files/{archive.filename}"] = archive.data
        return pages

    def answer(self, path: str) -> tuple[int, str, bytes]:
        body = self._served.get(path) or self._served.get(path + "/")
        if body is None:
            return 404, "text/plain", b"not found"
        return 200, "text/html" if path.startswith("/simple/") else "application/octet-stream", body

    def __enter__(self) -> Self:
        self._served = self._pages()
        return super().__enter__()

    def files(self) -> Iterator[Archive]:
        yield from self.archives

    def write_to(self, directory: Path) -> None:
        """Write every archive into ``directory`` (for a look with a real pip)."""
        for archive in self.archives:
            (directory / archive.filename).write_bytes(archive.data)

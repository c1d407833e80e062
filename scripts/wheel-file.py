#!/usr/bin/env python3
"""Copy one file (or directory) out of a hash-checked wheel into an image's root file system; record it for the SBOM.

    wheel-file.py WHEEL_DIR DISTRIBUTION MEMBER ROOTFS DEST NAME

Used by scripts/build-image.sh (`wheel_file` in an image definition): WHEEL_DIR holds the wheels `pip download
--require-hashes` fetched, DISTRIBUTION names the one wheel to take MEMBER from (its path inside the wheel), and
the file becomes ROOTFS/DEST (mode 0755, owned by whoever runs this: root in a build). The component NAME, at the
wheel's version, is added to ROOTFS/usr/share/agent-gateway/components.json, which `gateway sbom --image` reads
next to the dpkg database: the wheel (file name, sha256, its PyPI purl) and the installed file (path, sha256).
The file is written in a fixed form (sorted, no times), so two builds give the same bytes.

A MEMBER ending in ``/`` is a directory: every file under it is copied below DEST (mode 0755 where the wheel marks
it executable, else 0644; no symlink, no path outside DEST), and the component's sha256 is that of its manifest
(one ``<sha256>  <relative path>`` line per file, sorted), as ``sha256sum`` would list the tree.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

COMPONENTS = "usr/share/agent-gateway/components.json"
"""Where the image's components that dpkg does not know are listed (relative to the root file system)."""


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _the_wheel(wheel_dir: Path, distribution: str) -> tuple[Path, str]:
    """The one wheel of ``distribution`` in ``wheel_dir``, and its version (from the file name)."""
    found = []
    for path in sorted(wheel_dir.glob("*.whl")):
        name, version = path.name.split("-")[:2]
        if _normalise(name) == _normalise(distribution):
            found.append((path, version))
    if len(found) != 1:
        names = ", ".join(p.name for p in sorted(wheel_dir.glob("*.whl"))) or "none"
        sys.exit(f"wheel-file: expected one wheel of {distribution} in {wheel_dir}, found: {names}")
    return found[0]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _copy_directory(archive: zipfile.ZipFile, wheel: str, member: str, target: Path) -> str:
    """Every file under ``member`` written below ``target``; the manifest of what was written."""
    manifest = []
    for info in sorted(archive.infolist(), key=lambda i: i.filename):
        if not info.filename.startswith(member) or info.is_dir():
            continue
        relative = info.filename[len(member) :]
        mode = info.external_attr >> 16
        if ".." in relative.split("/") or relative.startswith("/") or (mode & 0o170000) == 0o120000:
            sys.exit(f"wheel-file: {wheel} has {info.filename!r}: a link or a path outside {member}")
        data = archive.read(info)
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o755 if mode & 0o111 else 0o644)
        manifest.append(f"{_sha256(data)}  {relative}\n")
    if not manifest:
        sys.exit(f"wheel-file: {wheel} has no file under {member}")
    return "".join(manifest)


def main(argv: list[str]) -> int:
    if len(argv) != 6:
        sys.exit(__doc__)
    wheel_dir, distribution, member, rootfs, dest, name = argv
    if not dest.startswith("/") or ".." in dest.split("/"):
        sys.exit(f"wheel-file: DEST must be an absolute path without '..', got {dest!r}")
    wheel, version = _the_wheel(Path(wheel_dir), distribution)
    target = Path(rootfs) / dest.lstrip("/")
    with zipfile.ZipFile(wheel) as archive:
        if member.endswith("/"):
            data = _copy_directory(archive, wheel.name, member, target).encode()
        else:
            try:
                data = archive.read(member)
            except KeyError:
                sys.exit(f"wheel-file: {wheel.name} has no {member}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o755)

    listing = Path(rootfs) / COMPONENTS
    components = json.loads(listing.read_text(encoding="utf-8"))["components"] if listing.exists() else []
    components = [c for c in components if c["path"] != dest]
    components.append(
        {
            "name": name,
            "version": version,
            "path": dest,
            "sha256": _sha256(data),
            "purl": f"pkg:pypi/{_normalise(distribution)}@{version}",
            "wheel": wheel.name,
            "wheel_sha256": _sha256(wheel.read_bytes()),
        }
    )
    listing.parent.mkdir(parents=True, exist_ok=True)
    document = {"components": sorted(components, key=lambda c: c["path"])}
    listing.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    listing.chmod(0o644)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

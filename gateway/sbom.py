"""CycloneDX SBOMs: of the gateway's own Python environment, and of a sandbox image's Debian packages.

Auditors ask two questions: what does the gateway run on, and what is inside the sandboxes it starts. The first
is answered from ``importlib.metadata`` (every installed distribution, with its purl, and hashes where the
installer recorded them); the second from the image's dpkg database (``/var/lib/dpkg/status``), read by the
backend without running the image (``gateway/runner/docker/imagefs.py``), next to the image id, and from the list
of files the image build took from elsewhere (``COMPONENTS``: the Node.js image's ``node``, from a pinned wheel).

An image's SBOM is **recorded** under the state directory keyed by the image id
(``<state>/sbom/<hex>.cdx.json``), so that ``gateway doctor`` and the compliance report can name it by digest
(:func:`sbom_digest_for_image`). It is a file and not an image label: a label is part of the image config, so
putting the SBOM's digest there would change the very image id the SBOM names. An image SBOM is a function of
the image, the name it was asked by and the gateway version that writes it (its serial number is derived from
the image id, its timestamp is the image's creation time), so recording it again gives the same bytes and the
same digest, and so do two reproducible builds.

cyclonedx-python-lib (the ``sbom`` extra) is imported only by the functions that build documents; reading a
recorded digest needs nothing beyond the standard library.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway._files import whole_file
from gateway.errors import ContractError, GatewayError

if TYPE_CHECKING:
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component

__all__ = [
    "COMPONENTS",
    "DPKG_STATUS",
    "OS_RELEASE",
    "DebPackage",
    "SbomError",
    "default_state_dir",
    "environment_sbom",
    "image_sbom",
    "parse_dpkg_status",
    "record_image_sbom",
    "sbom_digest_for_image",
    "sbom_path_for_image",
]

DPKG_STATUS = "/var/lib/dpkg/status"
COMPONENTS = "/usr/share/agent-gateway/components.json"
"""What ``scripts/build-image.sh`` put into an image besides Debian packages (written by
``scripts/wheel-file.py``): ``{"components": [{"name", "version", "path", "sha256", "purl", "wheel",
"wheel_sha256"}]}``; absent from an image that holds only Debian packages."""
OS_RELEASE = "/usr/lib/os-release"
"""Read for the purls' ``distro`` qualifier (``/etc/os-release`` is a symlink to it on Debian)."""
PROPERTY = "io.agent-gateway"
"""Prefix of the gateway's own CycloneDX property names."""
_IMAGE_ID = re.compile(r"^(?:sha256:)?([0-9a-f]{64})$")
_SERIAL_NAMESPACE = uuid.UUID("8c4f2d7e-5b1a-4e0c-9a57-3f1d2c6b8e90")
"""uuid5 namespace of image SBOM serial numbers (fixed: the same image gives the same serial)."""


class SbomError(GatewayError):
    """An SBOM could not be built or recorded (missing library, bad image id, unreadable dpkg database)."""

    code = "gateway.sbom"


@dataclass(frozen=True)
class DebPackage:
    """One installed package of a dpkg status file."""

    name: str
    version: str
    architecture: str
    source: str | None = None
    """The source package (``Source:``, without its version), when it differs from the binary's name."""


def default_state_dir() -> Path:
    """Where the gateway keeps state that outlives a run: ``$GATEWAY_STATE_DIR``, else ``/var/lib/agent-gateway``
    for root, else ``$XDG_STATE_HOME`` (or ``~/.local/state``) ``/agent-gateway``."""
    configured = os.environ.get("GATEWAY_STATE_DIR")
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/var/lib/agent-gateway")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "agent-gateway"


def _image_hex(image_id: str) -> str:
    match = _IMAGE_ID.match(image_id)
    if match is None:
        raise SbomError(f"not an image id: {image_id!r} (expected sha256: and 64 hex digits)")
    return match.group(1)


def sbom_path_for_image(image_id: str, state_dir: Path | None = None) -> Path:
    """Where the SBOM of ``image_id`` is recorded."""
    return (state_dir or default_state_dir()) / "sbom" / f"{_image_hex(image_id)}.cdx.json"


def sbom_digest_for_image(image_id: str, state_dir: Path | None = None) -> str | None:
    """``sha256:<hex>`` of the SBOM recorded for ``image_id``, or None when none is (or the id is not one).

    A file that is not an SBOM of that very image (another image id inside, not JSON) counts as none: the
    compliance report must never cite a document for an image it does not describe."""
    try:
        path = sbom_path_for_image(image_id, state_dir)
        data = path.read_bytes()
        document = json.loads(data)
    except (SbomError, OSError, ValueError):
        return None
    if not isinstance(document, dict) or _described_image(document) != f"sha256:{_image_hex(image_id)}":
        return None
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _described_image(document: Mapping[str, Any]) -> str | None:
    component = (document.get("metadata") or {}).get("component") or {}
    version = component.get("version") if isinstance(component, dict) else None
    return version if isinstance(version, str) else None


def record_image_sbom(image_id: str, document: str, state_dir: Path | None = None) -> Path:
    """Write ``document`` (the SBOM of ``image_id``) to its place, atomically; returns the path."""
    path = sbom_path_for_image(image_id, state_dir)
    if _described_image(json.loads(document)) != f"sha256:{_image_hex(image_id)}":
        raise ContractError(f"the SBOM to record for {image_id} describes another image")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with whole_file(path, sync=True) as f:
            f.write(document.encode("utf-8"))
    except OSError as exc:
        raise SbomError(
            f"cannot record the SBOM of {image_id} in {path.parent}: {exc}",
            hint="set GATEWAY_STATE_DIR to a writable directory",
        ) from exc
    return path


def parse_dpkg_status(text: str) -> list[DebPackage]:
    """The installed packages of a dpkg status file (``Status: install ok installed``), sorted by name."""
    packages: dict[tuple[str, str], DebPackage] = {}
    for stanza in _stanzas(text):
        if stanza.get("status", "").split()[-1:] != ["installed"]:
            continue
        name, version = stanza.get("package"), stanza.get("version")
        if not name or not version:
            raise SbomError(f"a dpkg status stanza without Package or Version: {sorted(stanza)}")
        source = stanza.get("source", "").split(" ", 1)[0] or None
        arch = stanza.get("architecture", "")
        packages[name, arch] = DebPackage(name, version, arch, source if source != name else None)
    return [packages[k] for k in sorted(packages)]


def _stanzas(text: str) -> Iterator[dict[str, str]]:
    """deb822 stanzas as lower-cased field → first line of the value (continuation lines are dropped)."""
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                yield current
            current = {}
        elif not line[0].isspace() and ":" in line:
            key, _, value = line.partition(":")
            current[key.strip().lower()] = value.strip()
    if current:
        yield current


def _os_release(text: str | None) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            found[key.strip()] = value.strip().strip('"')
    return found


def _require_cyclonedx() -> None:
    try:
        import cyclonedx  # noqa: F401, PLC0415
    except ImportError as exc:
        raise SbomError(
            "building an SBOM needs cyclonedx-python-lib, which is not installed",
            hint="pip install 'agent-exec-gateway[sbom]'",
        ) from exc


def _tool_component() -> Component:
    from cyclonedx.model.component import Component, ComponentType  # noqa: PLC0415

    return Component(type=ComponentType.APPLICATION, name="agent-exec-gateway", version=_own_version())


def _own_version() -> str:
    try:
        return metadata.version("agent-exec-gateway")
    except metadata.PackageNotFoundError:
        return "unknown"


def _serialise(bom: Bom) -> str:
    from cyclonedx.output.json import JsonV1Dot6  # noqa: PLC0415

    return JsonV1Dot6(bom).output_as_string(indent=2) + "\n"


def environment_sbom(distributions: Iterable[metadata.Distribution] | None = None) -> str:
    """The CycloneDX 1.6 JSON SBOM of the Python environment the gateway runs in (``distributions``: tests)."""
    _require_cyclonedx()
    from cyclonedx.model import HashAlgorithm, HashType, Property  # noqa: PLC0415
    from cyclonedx.model.bom import Bom, BomMetaData  # noqa: PLC0415
    from cyclonedx.model.component import Component, ComponentType  # noqa: PLC0415
    from packageurl import PackageURL  # noqa: PLC0415

    components: dict[str, Component] = {}
    for dist in metadata.distributions() if distributions is None else distributions:
        name, version = dist.metadata["Name"], dist.version
        if not name or not version:
            continue
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in components:  # a shadowed copy further down sys.path: the import system uses the first
            continue
        purl = PackageURL(type="pypi", name=key, version=version)
        hashes = [HashType(alg=HashAlgorithm.SHA_256, content=h) for h in _archive_hashes(dist)]
        properties = []
        record = dist.read_text("RECORD")
        if record is not None:
            # Not the archive's hash (pip does not keep it): the digest of the list of every installed file
            # with its own sha256, which pins what is on disk just as well.
            digest = hashlib.sha256(record.encode()).hexdigest()
            properties.append(Property(name=f"{PROPERTY}:record-sha256", value=digest))
        components[key] = Component(
            type=ComponentType.LIBRARY,
            name=name,
            version=version,
            purl=purl,
            bom_ref=purl.to_string(),
            hashes=hashes,
            properties=properties,
        )
    root = Component(
        type=ComponentType.APPLICATION,
        name="agent-exec-gateway",
        version=_own_version(),
        bom_ref="agent-exec-gateway-environment",
        description="the Python environment the gateway runs in",
        properties=[
            Property(name=f"{PROPERTY}:python", value=platform.python_version()),
            Property(name=f"{PROPERTY}:python-implementation", value=platform.python_implementation()),
        ],
    )
    meta = BomMetaData(component=root, timestamp=datetime.now(tz=UTC))
    meta.tools.components.add(_tool_component())
    bom = Bom(components=components.values(), metadata=meta)
    bom.register_dependency(root, components.values())  # flat: the environment holds each of them
    return _serialise(bom)


def _archive_hashes(dist: metadata.Distribution) -> list[str]:
    """sha256 digests of the archive the installer took, when it recorded them (PEP 610 ``direct_url.json``)."""
    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}").get("archive_info") or {}
    except ValueError:
        return []
    found: set[str] = set()
    hashes = info.get("hashes")
    if isinstance(hashes, dict) and isinstance(hashes.get("sha256"), str):
        found.add(hashes["sha256"].lower())
    legacy = info.get("hash")
    if isinstance(legacy, str) and legacy.startswith("sha256="):
        found.add(legacy.removeprefix("sha256=").lower())
    return sorted(h for h in found if re.fullmatch(r"[0-9a-f]{64}", h))


def image_sbom(
    *,
    image: str,
    image_id: str,
    created: str,
    dpkg_status: bytes,
    os_release: bytes | None = None,
    components: bytes | None = None,
) -> str:
    """The CycloneDX 1.6 JSON SBOM of a sandbox image from its dpkg database and its ``COMPONENTS`` list (when it
    has one): the same bytes for the same image."""
    _require_cyclonedx()
    from cyclonedx.model import HashAlgorithm, HashType, Property  # noqa: PLC0415
    from cyclonedx.model.bom import Bom, BomMetaData  # noqa: PLC0415
    from cyclonedx.model.component import Component, ComponentType  # noqa: PLC0415
    from packageurl import PackageURL  # noqa: PLC0415

    hex_id = _image_hex(image_id)
    try:
        packages = parse_dpkg_status(dpkg_status.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SbomError(f"{DPKG_STATUS} of {image} is not UTF-8 text: {exc}") from exc
    if not packages:
        raise SbomError(f"{DPKG_STATUS} of {image} lists no installed package: not a Debian-based image?")
    release = _os_release(os_release.decode("utf-8", "replace") if os_release else None)
    distro_id = release.get("ID", "debian")
    distro = f"{distro_id}-{release['VERSION_ID']}" if "VERSION_ID" in release else None
    found = []
    for pkg in packages:
        qualifiers = {"arch": pkg.architecture} if pkg.architecture else {}
        if distro:
            qualifiers["distro"] = distro
        purl = PackageURL(type="deb", namespace=distro_id, name=pkg.name, version=pkg.version, qualifiers=qualifiers)
        properties = [Property(name=f"{PROPERTY}:deb-source", value=pkg.source)] if pkg.source else []
        found.append(
            Component(
                type=ComponentType.LIBRARY,
                name=pkg.name,
                version=pkg.version,
                purl=purl,
                bom_ref=purl.to_string(),
                properties=properties,
            )
        )
    root_properties = [
        Property(name=f"{PROPERTY}:image-id", value=f"sha256:{hex_id}"),
        Property(name=f"{PROPERTY}:dpkg-status-sha256", value=hashlib.sha256(dpkg_status).hexdigest()),
    ]
    if components is not None:
        for entry in _other_components(components, image):
            found.append(
                Component(
                    type=ComponentType.APPLICATION,
                    name=entry["name"],
                    version=entry["version"],
                    purl=PackageURL.from_string(entry["purl"]),
                    bom_ref=f"file:{entry['path']}",
                    hashes=[HashType(alg=HashAlgorithm.SHA_256, content=entry["sha256"])],
                    properties=[
                        Property(name=f"{PROPERTY}:path", value=entry["path"]),
                        Property(name=f"{PROPERTY}:wheel", value=entry["wheel"]),
                        Property(name=f"{PROPERTY}:wheel-sha256", value=entry["wheel_sha256"]),
                    ],
                )
            )
        root_properties.append(
            Property(name=f"{PROPERTY}:components-sha256", value=hashlib.sha256(components).hexdigest())
        )
    root = Component(
        type=ComponentType.CONTAINER,
        name=image,
        version=f"sha256:{hex_id}",
        bom_ref=f"image:sha256:{hex_id}",
        description=release.get("PRETTY_NAME"),
        properties=root_properties,
    )
    meta = BomMetaData(component=root, timestamp=_parse_created(created))
    meta.tools.components.add(_tool_component())
    bom = Bom(components=found, metadata=meta, serial_number=uuid.uuid5(_SERIAL_NAMESPACE, hex_id))
    bom.register_dependency(root, found)  # flat: the image holds each package (dpkg's Depends are not kept)
    return _serialise(bom)


_COMPONENT_FIELDS = {
    "name": r"[A-Za-z0-9][A-Za-z0-9._+-]*",
    "version": r"[A-Za-z0-9][A-Za-z0-9._+~-]*",
    "path": r"/[^\0]*",
    "sha256": r"[0-9a-f]{64}",
    "purl": r"pkg:[a-z]+/\S+",
    "wheel": r"\S+\.whl",
    "wheel_sha256": r"[0-9a-f]{64}",
}


def _other_components(components: bytes, image: str) -> list[dict[str, str]]:
    """The entries of an image's ``COMPONENTS`` list, each with every field and well-formed, or SbomError."""
    where = f"{COMPONENTS} of {image}"
    try:
        entries = json.loads(components)["components"]
    except (ValueError, TypeError, KeyError) as exc:
        raise SbomError(f"{where} is not a JSON object with a components list: {exc}") from exc
    if not isinstance(entries, list):
        raise SbomError(f"{where}: components is not a list")
    for index, entry in enumerate(entries):
        bad = (
            sorted(_COMPONENT_FIELDS)
            if not isinstance(entry, dict)
            else [
                k
                for k, pattern in _COMPONENT_FIELDS.items()
                if not isinstance(entry.get(k), str) or not re.fullmatch(pattern, entry[k])
            ]
        )
        if bad:
            raise SbomError(
                f"{where}: entry {index} lacks a well-formed {', '.join(bad)}",
                hint="rebuild the image with scripts/build-image.sh, which writes that list",
            )
    return entries


def _parse_created(created: str) -> datetime:
    """The engine's ``Created`` (RFC 3339, maybe with nanoseconds) as a UTC time to the second."""
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", created)
    if match is None:
        raise SbomError(f"the image's creation time is not RFC 3339: {created!r}")
    return datetime.fromisoformat(match.group(1)).replace(tzinfo=UTC)

"""Reading files out of an image without running anything from it (the image SBOM's dpkg database).

The files are copied out of a container that is **created and never started**: no program of the image runs, so
the image cannot influence what is read beyond the files' own bytes, and there is no process to harden or to
time out. The container has no network, a read-only root and no capabilities anyway (should anything ever start
it), carries the gateway's labels (managed, instance, a deadline a minute ahead) so `gateway reap` removes it if
this process dies in between, and is removed in ``finally``. That costs one create, one archive read per file and
one remove (tens of milliseconds), where `docker save` would export the whole image.
"""

from __future__ import annotations

import contextlib
import io
import posixpath
import tarfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import docker.errors

from gateway.errors import GatewayError, SandboxError
from gateway.runner.docker.errors import map_engine_error
from gateway.runner.docker.options import DEADLINE_LABEL, INSTANCE_LABEL, MANAGED_LABEL

if TYPE_CHECKING:
    from gateway.runner.docker.runner import DockerRunner

__all__ = ["MAX_FILE_BYTES", "ImageFiles", "read_image_files"]

MAX_FILE_BYTES = 64 * 1024 * 1024
"""The most one read returns: a dpkg status file is a few hundred KiB; anything far larger is refused."""
_LIFETIME_S = 60


@dataclass(frozen=True)
class ImageFiles:
    """Regular files of an image, with the image they came from."""

    image: str
    """The name that was asked for."""
    image_id: str
    """``sha256:...``: the image the file was read from (a tag can move; the id cannot)."""
    created: str
    """The image's ``Created`` time as the engine reports it (RFC 3339)."""
    files: Mapping[str, bytes]
    """Absolute path → bytes, for each asked-for path that exists in the image."""


def read_image_files(runner: DockerRunner, image: str, paths: Sequence[str]) -> ImageFiles:
    """The bytes of the regular files ``paths`` (absolute) in ``image``; a missing one is left out. Never pulls."""
    for path in paths:
        if not posixpath.isabs(path):
            raise SandboxError(f"an image path must be absolute, got {path!r}")
    client = runner.client
    container_id: str | None = None
    try:
        info = client.api.inspect_image(image)
        host_config = client.api.create_host_config(
            network_mode="none", read_only=True, cap_drop=["ALL"], security_opt=["no-new-privileges"]
        )
        labels = {
            MANAGED_LABEL: "true",
            INSTANCE_LABEL: runner.instance,
            DEADLINE_LABEL: str(int(time.time()) + _LIFETIME_S),
        }
        created = client.api.create_container(
            info["Id"],
            command=["/nonexistent"],  # never started; a command is only needed by images without one
            user="65534:65534",
            network_disabled=True,
            labels=labels,
            host_config=host_config,
        )
        container_id = str(created["Id"])
        files: dict[str, bytes] = {}
        for path in paths:
            try:
                stream, stat = client.api.get_archive(container_id, path)
            except docker.errors.NotFound:
                continue
            files[path] = _only_file(_capped(stream, stat, path, image), path, image)
    except GatewayError:
        raise
    except Exception as exc:
        raise map_engine_error(exc, f"reading {', '.join(paths)} from {image}") from exc
    finally:
        if container_id is not None:
            with contextlib.suppress(Exception):  # labelled: the reaper removes it at its deadline
                client.api.remove_container(container_id, force=True)
    return ImageFiles(image=image, image_id=str(info["Id"]), created=str(info.get("Created", "")), files=files)


def _capped(stream: Iterable[bytes], stat: Mapping[str, Any], path: str, image: str) -> bytes:
    if int(stat.get("size", 0)) > MAX_FILE_BYTES:
        raise SandboxError(f"{path} in {image} is {stat['size']} bytes, more than {MAX_FILE_BYTES} allowed")
    return b"".join(stream)


def _only_file(archive: bytes, path: str, image: str) -> bytes:
    """The one regular file of the engine's tar answer (a symlink or a directory is refused, not followed)."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = tar.getmembers()
        if len(members) != 1 or not members[0].isreg():
            raise SandboxError(f"{path} in {image} is not a regular file")
        extracted = tar.extractfile(members[0])
        if extracted is None:  # pragma: no cover - isreg() members always have content
            raise SandboxError(f"{path} in {image} cannot be read")
        return extracted.read()

#!/usr/bin/env python3
"""Write a `docker load` archive of a one-layer image whose id depends only on its content.

    image-archive.py [--cmd WORD] [--env KEY=VALUE ...] [--history TEXT] LAYER.tar NAME:TAG EPOCH OUT.tar
                     [KEY=VALUE label ...]

`docker import` stamps the image config with the time of the import, so every build gets a new image id even
when the file system is byte for byte the same. An image id is the sha256 of its config, and the config names
the layer by the sha256 of its uncompressed tar (``rootfs.diff_ids``): writing that config ourselves, with
``created`` set to EPOCH (SOURCE_DATE_EPOCH) and keys in a fixed order, makes the id a function of the layer's
bytes and the fixed settings below. `docker load` of the legacy archive format keeps the config as written.
It needs nothing beyond the engine (no BuildKit, no registry). Prints the image id on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from datetime import UTC, datetime
from pathlib import Path

ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"]
"""The sandbox's settings; the same as the former `docker import --change` lines (``--env`` adds to them)."""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _add(tar: tarfile.TarFile, name: str, data: bytes, epoch: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), epoch, 0o644
    tar.addfile(info, io.BytesIO(data))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="image-archive.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cmd", default="python3", help="the image's command (default: python3)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="one more variable")
    parser.add_argument("--history", default="scripts/build-image.sh: debootstrap minbase + python3")
    parser.add_argument("layer", type=Path)
    parser.add_argument("tag")
    parser.add_argument("epoch", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("labels", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    layer, tag, epoch, out = args.layer, args.tag, args.epoch, args.out
    labels = dict(arg.split("=", 1) for arg in args.labels)
    created = datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    diff_id = _digest(layer)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": created,
        "config": {
            "Env": ENV + args.env,
            "User": "65534:65534",
            "WorkingDir": "/workspace",
            "Cmd": [args.cmd],
            "Labels": dict(sorted(labels.items())),
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created": created, "created_by": args.history}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    image_hex = hashlib.sha256(config_bytes).hexdigest()
    manifest = [{"Config": f"{image_hex}.json", "RepoTags": [tag], "Layers": [f"{diff_id}/layer.tar"]}]
    with tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tar:
        _add(tar, f"{image_hex}.json", config_bytes, epoch)
        _add(tar, "manifest.json", json.dumps(manifest, sort_keys=True).encode(), epoch)
        info = tar.gettarinfo(str(layer), arcname=f"{diff_id}/layer.tar")
        info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = epoch, 0, 0, "", "", 0o644
        with layer.open("rb") as f:
            tar.addfile(info, f)
    print(f"sha256:{image_hex}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""``gateway sbom``: CycloneDX SBOMs of the gateway's Python environment and of a sandbox image."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from gateway.sbom import COMPONENTS, DPKG_STATUS, OS_RELEASE, SbomError, environment_sbom, image_sbom, record_image_sbom

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "sbom",
        help="write a CycloneDX JSON SBOM of the gateway's environment, or of a sandbox image (--image)",
        description=(
            "Without --image: every Python distribution installed where the gateway runs, with purls and hashes "
            "where recorded. With --image: the image's Debian packages from its dpkg database, and what its build "
            "took from pinned wheels (read from a container that is created, never started, and removed), next to "
            "the image id."
        ),
    )
    p.add_argument("--image", metavar="NAME", help="the sandbox image (name:tag or id) to describe")
    p.add_argument("-o", "--output", metavar="FILE", help="write the SBOM to FILE (default: standard output)")
    p.add_argument(
        "--record",
        action="store_true",
        help="with --image: also store it under the state directory keyed by the image id, where `gateway doctor` "
        "and the compliance report find it ($GATEWAY_STATE_DIR; default /var/lib/agent-gateway for root); "
        "prints the stored path and digest unless -o is given",
    )
    p.set_defaults(func=_sbom)


def _sbom(args: argparse.Namespace) -> int:
    if args.record and not args.image:
        print("gateway sbom: --record needs --image (only image SBOMs are recorded)", file=sys.stderr)
        return 2
    recorded: str | None = None
    if args.image:
        from gateway.runner.docker.imagefs import read_image_files  # noqa: PLC0415 - docker-py only when needed
        from gateway.runner.docker.runner import DockerRunner  # noqa: PLC0415
        from gateway.sbom import sbom_digest_for_image  # noqa: PLC0415

        runner = DockerRunner()
        try:
            found = read_image_files(runner, args.image, [DPKG_STATUS, OS_RELEASE, COMPONENTS])
        finally:
            runner.close()
        if DPKG_STATUS not in found.files:
            raise SbomError(f"{args.image} has no {DPKG_STATUS}: only Debian-based images can be described")
        document = image_sbom(
            image=args.image,
            image_id=found.image_id,
            created=found.created,
            dpkg_status=found.files[DPKG_STATUS],
            os_release=found.files.get(OS_RELEASE),
            components=found.files.get(COMPONENTS),
        )
        if args.record:
            path = record_image_sbom(found.image_id, document)
            recorded = f"{path} {sbom_digest_for_image(found.image_id)}"
    else:
        document = environment_sbom()
    if args.output:
        try:
            Path(args.output).write_text(document, encoding="utf-8")
        except OSError as exc:
            raise SbomError(f"cannot write {args.output}: {exc}") from exc
    elif recorded is not None:
        print(recorded)
    else:
        sys.stdout.write(document)
    return 0

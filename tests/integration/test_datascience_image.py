"""The data-science image on the real engine, through the gateway's own runner: numpy, pandas, scipy, matplotlib
and pillow import as the sandbox user, a plot saved by matplotlib comes back as a PNG file of the result, and
`gateway sbom --image` lists the pinned package set.

The image is named in a policy written here (the default policy allows the Python image only);
``scripts/setup.sh`` builds it (``scripts/build-image.sh --all``).
"""

from __future__ import annotations

import base64
import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.cli import main
from gateway.resources import policies_dir
from tests.integration.conftest import _unavailable, gateway_containers

pytestmark = pytest.mark.integration

IMAGE = "gateway/sandbox-datascience:3.11-bookworm"
PINS = Path(__file__).resolve().parents[2] / "images" / "sandbox-datascience.packages"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PROGRAM = textwrap.dedent(
    """
    import matplotlib, numpy, pandas, PIL, scipy.stats
    import matplotlib.pyplot as plt
    frame = pandas.DataFrame({"x": numpy.arange(10), "y": numpy.arange(10) ** 2})
    plt.plot(frame["x"], frame["y"])
    plt.savefig("out/plot.png")
    print(matplotlib.get_backend(), round(float(scipy.stats.pearsonr(frame["x"], frame["y"])[0]), 3))
    """
)


@pytest.fixture
def image(engine: Any) -> str:
    try:
        found: str = engine.images.get(IMAGE).id
    except Exception:  # noqa: BLE001 - docker.errors.ImageNotFound, without importing docker here
        _unavailable(f"the image {IMAGE} is missing; run scripts/build-image.sh {IMAGE}")
    return found


@pytest.fixture
def gateway(engine: Any, image: str, tmp_path: Path) -> Iterator[Gateway]:
    default = (policies_dir() / "default.yaml").read_text()
    policy = tmp_path / "data.yaml"
    policy.write_text(
        default.replace("default: gateway/sandbox-python:3.11-bookworm", f"default: {IMAGE}")
        .replace("repository: gateway/sandbox-python", "repository: gateway/sandbox-datascience")
        .replace("memory: {default: 256m,", "memory: {default: 512m,")
        .replace("timeout_s: {default: 10,", "timeout_s: {default: 60,")
    )
    with Gateway.from_env(policy, tmp_path / "audit") as gw:
        yield gw
    assert gateway_containers(engine) == []


def test_the_libraries_import_and_a_saved_plot_comes_back_as_a_png(gateway: Gateway) -> None:
    data = gateway.execute({"code": PROGRAM}).to_dict()
    assert data["exit_code"] == 0, data["stderr"]
    assert data["stdout"] == "agg 0.963\n"
    assert data["stderr"] == "", "no warning about a missing display or an unwritable config directory"
    files = {entry["path"]: entry for entry in data["files"]}
    assert list(files) == ["plot.png"]
    assert files["plot.png"]["encoding"] == "base64"
    png = base64.b64decode(files["plot.png"]["content"], validate=True)
    assert png.startswith(PNG_SIGNATURE)
    assert len(png) > 1000, "a drawn figure, not an empty file"


def test_the_images_sbom_lists_the_pinned_libraries(image: str, tmp_path: Path) -> None:
    out = tmp_path / "image.cdx.json"
    assert main(["sbom", "--image", IMAGE, "-o", str(out)]) == 0
    bom = json.loads(out.read_text())
    assert bom["metadata"]["component"]["version"] == image
    listed = {c["name"]: c["version"] for c in bom["components"]}
    pinned = dict(line.split(" ")[:2] for line in PINS.read_text().splitlines() if not line.startswith("#"))
    assert listed == pinned, "the SBOM lists exactly the pinned package set"
    assert listed["python3-numpy"].startswith("1:1.24.")

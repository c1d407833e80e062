"""Issue 13, defect 3: a locally built image is pinned by its image id (it has no registry digest).

Before the fix, ``gateway/sandbox-python@sha256:<image id>`` was allowed by the decision and then failed at
run time (125) with a hint to rebuild the image, which would change the id. Now the runner finds the image by
its id, creates the container from that id, records it, and refuses with a clear error before any container
when the local image is not the pinned one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.errors import ImageMissingError
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import Payload, RunSpec
from tests.integration.conftest import SANDBOX_IMAGE, hardened_options

pytestmark = pytest.mark.integration

REPOSITORY, TAG = SANDBOX_IMAGE.split(":")
OTHER_ID = "sha256:" + "0" * 64


@pytest.fixture(scope="module")
def image_id(engine: Any) -> str:
    """The project image's id, as ``docker image inspect --format '{{.Id}}'`` prints it."""
    found: str = engine.api.inspect_image(SANDBOX_IMAGE)["Id"]
    assert found.startswith("sha256:")
    assert not engine.api.inspect_image(SANDBOX_IMAGE).get("RepoDigests")  # built locally: no registry digest
    return found


def _spec(image: str) -> RunSpec:
    return RunSpec(hardened_options(image=image), timeout_s=20, output_bytes=4096)


@pytest.mark.parametrize("form", ["{repo}@{id}", "{repo}:{tag}@{id}"])
def test_a_local_image_pinned_by_its_id_runs_and_the_id_is_recorded(
    runner: DockerRunner, image_id: str, form: str
) -> None:
    image = form.format(repo=REPOSITORY, tag=TAG, id=image_id)
    assert runner.image_id(image) == image_id
    outcome = runner.execute(_spec(image), Payload("print(6*7)"))
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.stdout == b"42\n"
    assert outcome.image_id == image_id


def test_a_pin_the_local_image_does_not_match_is_refused_before_create(
    runner: DockerRunner, image_id: str, managed_containers: Callable[[], list[str]]
) -> None:
    before = managed_containers()
    with pytest.raises(ImageMissingError) as info:
        runner.execute(_spec(f"{REPOSITORY}:{TAG}@{OTHER_ID}"), Payload("print(1)"))
    message = info.value.message
    assert f"pinned to {OTHER_ID}, but the local {SANDBOX_IMAGE} is {image_id}" in message
    assert "nothing was created" in message
    assert "build-image" not in info.value.diagnostics()
    assert "docker image inspect --format" in info.value.diagnostics()
    assert managed_containers() == before


def test_an_image_id_is_not_taken_for_another_repository(runner: DockerRunner, image_id: str) -> None:
    assert runner.image_id(f"gateway/other@{image_id}") is None
    with pytest.raises(ImageMissingError) as info:
        runner.execute(_spec(f"gateway/other@{image_id}"), Payload("print(1)"))
    assert "pinned by digest" in info.value.message
    assert "build-image" not in info.value.diagnostics()


def test_gateway_run_with_a_policy_pinning_the_project_image_by_id(
    engine: Any, image_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    default = (Path(__file__).resolve().parents[2] / "policies" / "default.yaml").read_text()
    pinned = default.replace(f"default: {SANDBOX_IMAGE}", f"default: {REPOSITORY}@{image_id}").replace(
        'tags: ["3.11-bookworm"]', f'tags: ["3.11-bookworm"]\n        digests: ["{image_id}"]'
    )
    policy = tmp_path / "pinned.yaml"
    policy.write_text(pinned)
    audit = tmp_path / "audit"
    rc = main(["run", "--json", "--policy", str(policy), "--audit-dir", str(audit), "--code", "print(2+2)"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 0, result
    assert result["exit_code"] == 0
    records = [json.loads(line) for seg in sorted(audit.glob("*.jsonl")) for line in seg.read_text().splitlines()]
    [outcome] = [r["data"] for r in records if r["event_type"] == "execution.outcome"]
    assert outcome["image"] == f"{REPOSITORY}@{image_id}"
    assert outcome["image_id"] == image_id

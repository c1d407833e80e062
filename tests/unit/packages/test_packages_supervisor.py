"""A run with packages: the supervisor puts the installed tree on the program's path where ``PYTHONPATH`` would, in
the interpreter it started ahead and in a fresh one alike, with no ``PYTHON*`` variable in the request (run locally:
no engine)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from gateway.runner.frames import FRAME_ERROR, FRAME_STDOUT
from gateway.runner.supervisor import PACKAGES_TARGET, SUPERVISOR
from tests.unit.runner.supervisor_support import IMAGE_ENV, needs_system_python, supervise

pytestmark = needs_system_python

PROBE = "import json, os, sys\nprint(json.dumps([sys.path, os.environ.get('PYTHONPATH'), sys.flags.isolated]))\n"
"""What the program sees: its path, its PYTHONPATH, and whether it is the supervisor's fork (``-I``) or fresh."""


def _seen(workspace: Path, **supervised: Any) -> list[Any]:
    shutil.rmtree(workspace, ignore_errors=True)
    status, frames = supervise(workspace, PROBE, {}, **supervised)
    assert status == 0, frames
    seen: list[Any] = json.loads(b"".join(f.data for f in frames if f.kind == FRAME_STDOUT))
    return seen


def test_the_supervisors_constant_is_the_packages_target() -> None:
    [line] = [line for line in SUPERVISOR.splitlines() if line.startswith("PKG = ")]
    assert line == f'PKG = "{PACKAGES_TARGET}"'


def test_the_tree_comes_after_the_programs_directory_and_before_site_packages_as_pythonpath_puts_it(
    tmp_path: Path,
) -> None:
    workspace = tmp_path / "w"  # the same path every time: only how the program started may differ
    ahead = _seen(workspace, packages=True)
    fresh = _seen(workspace, packages=True, env={"TZ": "UTC"})  # TZ is read at start: a fresh interpreter
    assert (ahead[2], fresh[2]) == (1, 0)
    shutil.rmtree(workspace, ignore_errors=True)
    workspace.mkdir()
    (workspace / "main.py").write_text(PROBE)
    alone = subprocess.run(
        ["/usr/bin/python3", str(workspace / "main.py")], cwd=workspace, capture_output=True, check=True,
        env={**IMAGE_ENV, "PYTHONPATH": PACKAGES_TARGET},
    )  # fmt: skip
    reference = json.loads(alone.stdout)
    assert ahead[:2] == fresh[:2] == reference[:2]
    assert ahead[0][:2] == [str(workspace), PACKAGES_TARGET]
    assert ahead[1] == PACKAGES_TARGET  # the processes it starts find the packages too


def test_a_run_without_packages_has_no_tree_on_its_path(tmp_path: Path) -> None:
    path, pythonpath, _ = _seen(tmp_path / "w")
    assert PACKAGES_TARGET not in path
    assert pythonpath is None


def test_the_images_pythonpath_comes_after_the_tree(tmp_path: Path) -> None:
    path, pythonpath, isolated = _seen(tmp_path / "w", packages=True, image_env={**IMAGE_ENV, "PYTHONPATH": "/img"})
    assert isolated == 0  # a PYTHON* variable in the image's environment: always a fresh interpreter
    assert pythonpath == f"{PACKAGES_TARGET}:/img"
    assert path[1:3] == [PACKAGES_TARGET, "/img"]


def test_a_kernel_with_packages_is_refused(tmp_path: Path) -> None:
    status, frames = supervise(tmp_path, "", {}, kernel=True, packages=True)
    assert status == 125
    assert any(f.kind == FRAME_ERROR and b"cannot have packages" in f.data for f in frames)

"""The workspace store's choices that need no mount: which leftovers a reap removes, and the names it refuses.

(Creating, binding and using workspaces needs root and loop devices: ``tests/integration/test_workspace.py``.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.hostfs import file_system_of
from gateway.runner.docker.workspace import DEFAULT_ROOT, DockerWorkspaces, WorkspaceError, backing, default_root

MINE, DEAD, ALIVE = "host-1-aaaa", "host-2-bbbb", "host-3-cccc"


def _leftovers(root: Path) -> dict[str, Path]:
    """Directories shaped like workspaces of three instances (nothing mounted), and one that is not a workspace."""
    made = {}
    for owner, suffix in ((MINE, "1"), (DEAD, "2"), (ALIVE, "3")):
        directory = root / f"{owner}--{suffix * 16}"
        (directory / "mnt").mkdir(parents=True)
        made[owner] = directory
    (root / "not-a-workspace").mkdir()
    return made


@pytest.mark.parametrize(
    ("kwargs", "removed"),
    [
        ({}, {MINE, DEAD}),
        ({"expired_only": True}, {DEAD}),  # what a starting gateway does: only dead instances' leftovers
        ({"everything": True}, {MINE, DEAD, ALIVE}),
    ],
)
def test_reap_removes_this_instances_and_dead_instances_workspaces(
    tmp_path: Path, kwargs: dict[str, bool], removed: set[str]
) -> None:
    made = _leftovers(tmp_path)
    store = DockerWorkspaces(MINE, root=str(tmp_path))
    names = store.reap(dead=lambda instance: instance == DEAD, **kwargs)
    assert sorted(names) == sorted(made[owner].name for owner in removed)
    assert {owner for owner, directory in made.items() if not directory.exists()} == removed
    assert (tmp_path / "not-a-workspace").is_dir()  # never touched: not named like a workspace


def test_reap_of_a_missing_root_finds_nothing(tmp_path: Path) -> None:
    assert DockerWorkspaces(MINE, root=str(tmp_path / "absent")).reap(everything=True) == []


@pytest.mark.parametrize("instance", ["", "a/b", "../x", "-leading", "x" * 129, "a b"])
def test_an_instance_id_that_cannot_name_a_directory_is_refused(instance: str) -> None:
    with pytest.raises(WorkspaceError, match="cannot name a workspace"):
        DockerWorkspaces(instance)


def test_the_workspace_directory_is_the_setting_else_on_disk_for_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_WORKSPACE_DIR", "/srv/spaces")
    assert default_root() == "/srv/spaces"
    assert DockerWorkspaces(MINE).root == "/srv/spaces"
    monkeypatch.delenv("GATEWAY_WORKSPACE_DIR")
    monkeypatch.setenv("GATEWAY_RUNTIME_DIR", "/run/elsewhere")
    if os.geteuid() == 0:  # never below the runtime directory, a tmpfs on most hosts
        assert default_root() == DEFAULT_ROOT == "/var/lib/agent-gateway/workspaces"
    else:
        assert default_root() == "/run/elsewhere/workspaces"


def test_backing_names_the_file_system_of_a_directory_not_made_yet(tmp_path: Path) -> None:
    kind, free = backing(str(tmp_path / "not" / "yet"))
    assert kind == file_system_of(str(tmp_path))
    assert kind != ""
    assert free > 0

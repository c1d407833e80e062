"""The Docker backend's own cross-check: the assembled mounts must be exactly the staged binds of the judged ones."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

import pytest

from gateway.runner.docker.mounts import STAGING_ROOT, MountStagingError, Staging, engine_mounts, staging_path
from gateway.runner.interface import HostMount
from gateway.runner.supervisor import PACKAGES_TARGET

JUDGED = (
    HostMount("/srv/data", "/srv/data/in", 1, 2, "/data", True),
    HostMount("/srv/out", "/srv/out", 1, 3, "/out", False),
)


def staging() -> Staging:
    return Staging(STAGING_ROOT, "d1", JUDGED)


def test_the_assembled_mounts_of_the_decision_pass() -> None:
    staging().check_options(engine_mounts([("/data", True), ("/out", False)], "d1"))


@pytest.mark.parametrize(
    "mounts",
    [
        None,
        [],
        engine_mounts([("/data", False), ("/out", False)], "d1"),  # ro judged, rw assembled
        engine_mounts([("/out", False), ("/data", True)], "d1"),  # swapped
        engine_mounts([("/data", True), ("/out", False)], "d2"),  # another run's staging
        engine_mounts([("/data", True)], "d1"),  # one left out
    ],
    ids=["none", "empty", "read-only-mismatch", "order", "other-decision", "missing"],
)
def test_anything_else_is_refused(mounts: Any) -> None:
    with pytest.raises(MountStagingError, match="not the staged binds"):
        staging().check_options(mounts)


@pytest.mark.parametrize("decision_id", ["", "..", "a/b", "x" * 65, "a b"])
def test_a_decision_id_that_is_not_a_plain_name_names_no_staging_directory(decision_id: str) -> None:
    with pytest.raises(ValueError, match="cannot name a staging directory"):
        staging_path(decision_id, 0)


def test_staging_refuses_a_source_that_is_not_the_judged_directory_before_binding(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("staging binds directories: it needs root")
    source, other = tmp_path / "data", tmp_path / "other"
    source.mkdir()
    other.mkdir()
    st = other.stat()  # judged: another directory (the source was swapped after the decision)
    judged = HostMount(str(tmp_path), str(source), st.st_dev, st.st_ino, "/data", True)
    decision_id = "unit-judged-" + secrets.token_hex(4)
    with pytest.raises(MountStagingError) as info:
        Staging.stage([judged], decision_id)
    assert info.value.message == (
        f"mount source {source} is no longer the directory that was judged (device/inode "
        f"{source.stat().st_dev}/{source.stat().st_ino}, judged {st.st_dev}/{st.st_ino}); nothing was bound"
    )
    assert not Path(STAGING_ROOT, decision_id).exists()


@pytest.mark.parametrize(
    ("target", "read_only"), [("/data", True), (PACKAGES_TARGET, False)], ids=["other-target", "writable"]
)
def test_exec_is_refused_on_any_mount_but_the_read_only_packages_tree(target: str, read_only: bool) -> None:
    mount = HostMount("/srv/data", "/srv/data/in", 1, 2, target, read_only, exec=True)
    with pytest.raises(MountStagingError, match="without noexec: only the packages tree"):
        Staging.stage([mount], "unit-exec-" + secrets.token_hex(4))


def test_only_the_packages_tree_is_staged_without_noexec(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("staging binds directories: it needs root")
    tree, data = tmp_path / "tree", tmp_path / "data"
    tree.mkdir()
    data.mkdir()
    mounts = [
        HostMount(str(tmp_path), str(d), d.stat().st_dev, d.stat().st_ino, target, True, exec=exec_)
        for d, target, exec_ in ((tree, PACKAGES_TARGET, True), (data, "/data", False))
    ]
    staging = Staging.stage(mounts, "unit-exec-" + secrets.token_hex(4))
    try:
        flags = [os.statvfs(f"{staging.directory}/{i}").f_flag for i in range(2)]
    finally:
        staging.remove()
    noexec, rdonly = 0x8, 0x1
    assert [(bool(f & noexec), bool(f & rdonly)) for f in flags] == [(False, True), (True, True)]

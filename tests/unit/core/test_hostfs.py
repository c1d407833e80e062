"""Opening a mount source below its root without following symlinks, and the scan of what a bind exposes."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.errors import PolicyError
from gateway.hostfs import HostPathError, file_system_of, identity_of, open_beneath, scan
from gateway.policy import PolicySet
from tests.conftest import mount_policy


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "root" / "a" / "b").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    return tmp_path


def _open(root: Path, path: Path | str) -> int:
    return open_beneath(str(root), str(path))


def test_opens_the_judged_directory_and_reports_its_identity(tree: Path) -> None:
    fd = _open(tree / "root", tree / "root" / "a" / "b")
    try:
        st = (tree / "root" / "a" / "b").stat()
        assert (identity_of(fd).device, identity_of(fd).inode) == (st.st_dev, st.st_ino)
        assert scan(fd, str(tree / "root" / "a" / "b")) is None
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("link_at", "reason"),
    [
        ("a", "a component is a symlink"),  # ELOOP from RESOLVE_NO_SYMLINKS
        ("a/b", "it, or a component of it, is not a directory (or was just"),  # ENOTDIR: O_NOFOLLOW | O_DIRECTORY
    ],
)
def test_a_symlink_anywhere_on_the_way_is_refused(tree: Path, link_at: str, reason: str) -> None:
    target = tree / "root" / link_at
    os.rename(target, tree / "moved")
    target.symlink_to(tree / "moved")  # points at a real directory: still refused
    with pytest.raises(HostPathError) as info:
        _open(tree / "root", tree / "root" / "a" / "b")
    assert f"below {tree / 'root'}: {reason}" in str(info.value)  # the reason, not "symlink" in pytest's tmp path


def test_a_symlink_in_the_middle_that_stays_inside_the_root_is_refused(tree: Path) -> None:
    (tree / "root" / "c" / "b").mkdir(parents=True)
    os.rename(tree / "root" / "a", tree / "moved")
    (tree / "root" / "a").symlink_to("c")  # relative, resolves to root/c: beneath the root, yet a symlink
    with pytest.raises(HostPathError) as info:
        _open(tree / "root", tree / "root" / "a" / "b")
    assert f"below {tree / 'root'}: a component is a symlink" in str(info.value)


def test_a_symlink_root_is_refused(tree: Path) -> None:
    (tree / "link-root").symlink_to(tree / "root")
    with pytest.raises(HostPathError, match="allowlisted root"):
        _open(tree / "link-root", tree / "link-root" / "a")


def test_a_path_outside_the_root_is_refused(tree: Path) -> None:
    with pytest.raises(HostPathError, match="not inside"):
        _open(tree / "root", tree / "outside")


def test_a_file_is_not_a_mount_source(tree: Path) -> None:
    (tree / "root" / "f").write_text("x")
    with pytest.raises(HostPathError, match="not a directory"):
        _open(tree / "root", tree / "root" / "f")


@pytest.fixture
def tmpfs(tree: Path) -> Iterator[Path]:
    """A tmpfs mounted at root/a (root only; skipped where this process cannot mount)."""
    point = tree / "root" / "a"
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "none", str(point)], check=False, capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        (point / "b").mkdir()
        yield point
    finally:
        subprocess.run(["umount", "--lazy", str(point)], check=True)  # lazy: even if a descriptor is still open


def test_a_mount_point_between_the_root_and_the_source_is_refused(tree: Path, tmpfs: Path) -> None:
    with pytest.raises(HostPathError) as info:
        _open(tree / "root", tmpfs / "b")
    assert str(info.value).endswith(": the path leaves the allowlisted root or crosses a mount point")


def test_a_device_change_during_the_walk_is_reported(tree: Path, tmpfs: Path) -> None:
    fd = _open(tree / "root", tree / "root")
    try:
        # Shown under a name with nothing mounted below it in mountinfo: only the walk can see the tmpfs.
        problem = scan(fd, "/shown-as/root")
    finally:
        os.close(fd)
    assert problem == "/shown-as/root/a is a mount point; a mount source may not have mount points below it"


@pytest.fixture
def listening(tree: Path) -> Iterator[Path]:
    path = tree / "root" / "a" / "b" / "api.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(1)
    try:
        yield path
    finally:
        sock.close()


def test_scan_finds_a_socket_deep_below(tree: Path, listening: Path) -> None:
    fd = _open(tree / "root", tree / "root")
    try:
        problem = scan(fd, str(tree / "root"))
    finally:
        os.close(fd)
    assert problem is not None
    assert f"{listening} is a unix socket" in problem


def test_scan_finds_a_fifo(tree: Path) -> None:
    os.mkfifo(tree / "root" / "a" / "pipe")
    fd = _open(tree / "root", tree / "root" / "a")
    try:
        assert "is a FIFO" in (scan(fd, str(tree / "root" / "a")) or "")
    finally:
        os.close(fd)


def test_scan_does_not_follow_symlinks(tree: Path, listening: Path) -> None:
    (tree / "root" / "clean").mkdir()
    (tree / "root" / "clean" / "to-sockets").symlink_to(listening.parent)
    fd = _open(tree / "root", tree / "root" / "clean")
    try:
        assert scan(fd, str(tree / "root" / "clean")) is None  # a symlink resolves inside the sandbox, not here
    finally:
        os.close(fd)


def test_a_source_too_large_to_walk_is_refused_with_what_to_do(tree: Path) -> None:
    for i in range(12):
        (tree / "root" / "a" / f"f{i}").write_text("")
    fd = _open(tree / "root", tree / "root")
    try:
        problem = scan(fd, str(tree / "root"), max_entries=10)
    finally:
        os.close(fd)
    assert problem is not None
    assert "more than 10 entries" in problem
    assert "mount a narrower directory" in problem


def test_a_policy_set_refuses_one_principals_rw_root_overlapping_anothers_root(tree: Path) -> None:
    writer = mount_policy(tree / "root", name="writer")
    reader = mount_policy(tree / "root" / "a", modes=("ro",), name="reader")
    sibling = mount_policy(tree / "outside", modes=("ro",), name="sibling")
    with pytest.raises(PolicyError, match="share a writable mount tree") as info:
        PolicySet.of(reader, {"writer": writer})
    assert "overlap and one allows rw" in info.value.problems[0].message
    PolicySet.of(sibling, {"writer": writer, "writer2": writer})  # disjoint roots; one policy twice is fine


def test_file_system_of_takes_the_deepest_mount_holding_the_path(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "25 22 0:21 / /run rw,nosuid shared:5 - tmpfs tmpfs rw\n"
        "26 25 0:22 / /run/with\\040space rw - ramfs none rw\n"
    )
    found = {p: file_system_of(p, mountinfo=str(mountinfo)) for p in ("/var/lib/x", "/run", "/run/a/b", "/runs")}
    assert found == {"/var/lib/x": "ext4", "/run": "tmpfs", "/run/a/b": "tmpfs", "/runs": "ext4"}
    assert file_system_of("/run/with space/ws", mountinfo=str(mountinfo)) == "ramfs"

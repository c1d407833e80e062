"""Mounts against real temporary directories, symlinks and sockets: canonicalise first, then judge."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.decision import Decision
from gateway.policy import Policy
from gateway.request import parse_request
from gateway.testing import decide


def mount(policy: Policy, source: str | Path, target: str = "/data", mode: str = "ro", **kw: object) -> Decision:
    req = parse_request({"code": "x", "mounts": [{"source": str(source), "target": target, "mode": mode}]})
    return decide(policy, req, **kw)  # type: ignore[arg-type]


def failing(d: Decision) -> list[str]:
    return sorted(v.rule for v in d.violations)


def test_allowed_read_only_mount(mount_policy: Policy, data_root: Path) -> None:
    d = mount(mount_policy, data_root / "sets", "/data/sets")
    assert d.allowed, [v.message for v in d.violations]
    assert d.options is not None
    # The engine gets this run's staging path, never the host path; the plan records what was judged.
    assert [(m["Source"], m["Target"], m["ReadOnly"]) for m in d.options["mounts"]] == [
        (f"/run/agent-gateway/staging/{d.decision_id}/0", "/data/sets", True)
    ]
    st = (data_root / "sets").stat()
    assert d.to_dict()["plan"]["mounts"] == [
        {
            "source": str(data_root / "sets"),
            "canonical": str((data_root / "sets").resolve()),
            "target": "/data/sets",
            "mode": "ro",
            "device": st.st_dev,
            "inode": st.st_ino,
        }
    ]
    assert d.run is not None
    assert [(m.path, m.device, m.inode, m.read_only) for m in d.run.mounts] == [
        (str((data_root / "sets").resolve()), st.st_dev, st.st_ino, True)
    ]
    assert mount(mount_policy, data_root).allowed


def test_rw_not_allowed_by_root(mount_policy: Policy, data_root: Path) -> None:
    assert failing(mount(mount_policy, data_root, mode="rw")) == ["mounts.allowlist"]


def test_prefix_sibling_is_not_inside_root(mount_policy: Policy, data_root: Path) -> None:
    d = mount(mount_policy, data_root.parent / "data2")
    assert failing(d) == ["mounts.allowlist"]
    assert "not inside an allowlisted root" in d.violations[0].message


def test_missing_source(mount_policy: Policy, data_root: Path) -> None:
    d = mount(mount_policy, data_root / "nope")
    assert failing(d) == ["mounts.allowlist"]
    assert "does not exist" in d.violations[0].message


def test_dotdot_traversal_is_resolved_before_matching(mount_policy: Policy, data_root: Path) -> None:
    d = mount(mount_policy, f"{data_root}/sets/../../data2")
    assert failing(d) == ["mounts.allowlist"]
    assert d.violations[0].got == str((data_root.parent / "data2").resolve())


def test_symlink_escape_to_etc(mount_policy: Policy, data_root: Path) -> None:
    (data_root / "etc-link").symlink_to("/etc")
    d = mount(mount_policy, data_root / "etc-link")
    assert failing(d) == ["mounts.allowlist", "mounts.denied_path"]


def test_symlink_escape_to_a_sibling(mount_policy: Policy, data_root: Path) -> None:
    (data_root / "out").symlink_to(data_root.parent / "data2")
    assert failing(mount(mount_policy, data_root / "out")) == ["mounts.allowlist"]


def test_symlink_inside_root_to_docker_socket(mount_policy: Policy, data_root: Path) -> None:
    (data_root / "docker.sock").symlink_to("/var/run/docker.sock")
    d = mount(mount_policy, data_root / "docker.sock")
    assert "mounts.denied_path" in failing(d)


@pytest.fixture
def unix_socket(data_root: Path) -> Iterator[Path]:
    path = data_root / "engine.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    try:
        yield path
    finally:
        sock.close()


def test_any_socket_inside_a_root_is_denied(mount_policy: Policy, data_root: Path, unix_socket: Path) -> None:
    (data_root / "innocent").symlink_to(unix_socket)
    for source in (unix_socket, data_root / "innocent"):
        assert "mounts.denied_path" in failing(mount(mount_policy, source))


def test_audit_directory_is_never_mountable(mount_policy: Policy, data_root: Path) -> None:
    audit = data_root / "sets" / "audit"
    audit.mkdir()
    assert failing(mount(mount_policy, audit, denied_paths=[str(audit)])) == ["mounts.denied_path"]
    # a source that contains the audit directory exposes it too
    assert failing(mount(mount_policy, data_root / "sets", denied_paths=[str(audit)])) == ["mounts.denied_path"]
    assert mount(mount_policy, data_root / "sets", denied_paths=[str(data_root.parent / "elsewhere")]).allowed


def test_the_decision_reads_no_environment_and_no_working_directory(
    mount_policy: Policy, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What must never be mounted comes from the caller (the Gateway passes its audit sink's paths), never
    # from $GATEWAY_AUDIT_DIR or ./audit: a Gateway built around another trail would protect the wrong one.
    monkeypatch.setenv("GATEWAY_AUDIT_DIR", str(data_root))
    monkeypatch.chdir(data_root.parent)
    (data_root.parent / "audit").mkdir()
    assert mount(mount_policy, data_root / "sets").allowed
    assert failing(mount(mount_policy, data_root / "sets", denied_paths=[str(data_root)])) == ["mounts.denied_path"]


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("/", "shadow"),
        ("/etc", "/etc"),
        ("/proc/x", "/proc"),
        ("/workspace", "/workspace"),
        ("/workspace/data", "/workspace"),
        ("/tmp", "/tmp"),
        ("/lib64", "/lib*"),
        ("/data/../etc", "not normalised"),
        ("/opt/data", "not one of the allowed targets"),
        ("/database", "not one of the allowed targets"),
    ],
)
def test_targets(mount_policy: Policy, data_root: Path, target: str, reason: str) -> None:
    d = mount(mount_policy, data_root, target)
    assert "mounts.target" in failing(d)
    assert any(reason in v.message for v in d.violations if v.rule == "mounts.target")


def test_duplicate_targets(mount_policy: Policy, data_root: Path) -> None:
    req = parse_request(
        {
            "code": "x",
            "mounts": [
                {"source": str(data_root), "target": "/data/a"},
                {"source": str(data_root / "sets"), "target": "/data/a"},
            ],
        }
    )
    assert failing(decide(mount_policy, req)) == ["mounts.target"]


def test_mount_count_cap(mount_policy: Policy, data_root: Path) -> None:
    mounts = [{"source": str(data_root), "target": f"/data/{i}"} for i in range(3)]
    d = decide(mount_policy, parse_request({"code": "x", "mounts": mounts}))
    assert failing(d) == ["mounts.allowlist"]
    d = decide(mount_policy, parse_request({"code": "x", "mounts": mounts[:2]}))
    assert d.allowed


def test_root_given_through_a_symlink_is_canonicalised(make_policy: Callable[[str], Policy], data_root: Path) -> None:
    link = data_root.parent / "via-link"
    link.symlink_to(data_root)
    policy = make_policy(f"mounts:\n  allow:\n    - root: {link}\n      targets: [/data]\n")
    assert policy.mounts.allow[0].root == str(data_root.resolve())
    assert mount(policy, data_root / "sets").allowed
    assert mount(policy, link / "sets").allowed


def test_rw_mount_when_allowed(make_policy: Callable[[str], Policy], data_root: Path) -> None:
    policy = make_policy(f"mounts:\n  allow:\n    - root: {data_root}\n      modes: [ro, rw]\n      targets: [/out]\n")
    d = mount(policy, data_root, "/out", "rw")
    assert d.allowed
    assert d.options is not None
    assert d.options["mounts"][0]["ReadOnly"] is False
    assert d.run is not None
    assert d.run.mounts[0].path == os.path.realpath(data_root)


def test_a_socket_deep_below_the_source_is_denied_by_mounts_contents(
    mount_policy: Policy, data_root: Path, unix_socket: Path
) -> None:
    d = mount(mount_policy, data_root)  # the socket is data_root/engine.sock, below the source
    assert failing(d) == ["mounts.contents"]
    assert f"{unix_socket} is a unix socket" in d.violations[0].message
    assert d.violations[0].mode == "enforce"

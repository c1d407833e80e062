"""gateway doctor's daemon checks on recorded `docker info` / `docker version` answers, for every status."""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from gateway.doctor import checks
from gateway.doctor.vulns import KNOWN_VULNERABILITIES, match, parse_version

RECORDED = json.loads((Path(__file__).resolve().parents[1] / "data" / "docker-engine-20.10-bookworm.json").read_text())


@pytest.fixture
def info() -> dict[str, Any]:
    """This test machine's `docker info`: Debian bookworm's docker.io 20.10.24, dockerd --bridge=none."""
    return copy.deepcopy(RECORDED["info"])


@pytest.fixture
def version() -> dict[str, Any]:
    return copy.deepcopy(RECORDED["version"])


def test_the_recorded_machine(info: dict[str, Any], version: dict[str, Any]) -> None:
    """What doctor says of the machine the answers were recorded on (see docs/doctor.md)."""
    assert checks.live_restore(info).status == "WARN"
    assert checks.userns_remap(info).status == "WARN"
    assert checks.no_new_privileges(info).status == "WARN"
    assert checks.authz_plugin(info).status == "WARN"
    assert checks.seccomp_default(info).status == "PASS"
    engine = checks.engine_version(version, info)
    assert engine.status == "WARN"  # CVE-2024-41110 needs an authorization plugin; there is none
    assert "CVE-2024-41110" in engine.detail
    runc = checks.runc_version(info)
    assert runc.status == "FAIL"  # 1.1.5+ds1-1+deb12u1 carries the CVE-2024-21626 fix, not the 2025 ones
    assert "CVE-2025-31133" in runc.detail
    assert "CVE-2024-21626" not in runc.detail
    assert checks.runsc_host_uds(info).status == "WARN"  # recorded before runsc got --host-uds=open


def test_live_restore(info: dict[str, Any]) -> None:
    info["LiveRestoreEnabled"] = True
    assert checks.live_restore(info).status == "PASS"
    info["LiveRestoreEnabled"] = False
    warned = checks.live_restore(info)
    assert (warned.status, warned.ok) == ("WARN", True)
    assert "live-restore" in warned.remediation


def test_userns_and_no_new_privileges_read_security_options(info: dict[str, Any]) -> None:
    info["SecurityOptions"] = ["name=seccomp,profile=default", "name=userns", "name=no-new-privileges"]
    assert checks.userns_remap(info).status == "PASS"
    assert checks.no_new_privileges(info).status == "PASS"
    assert checks.security_options(info) == {"seccomp": {"profile": "default"}, "userns": {}, "no-new-privileges": {}}


def test_default_bridge() -> None:
    assert checks.default_bridge(None).status == "PASS"
    assert checks.default_bridge({"Options": {"com.docker.network.bridge.enable_icc": "false"}}).status == "PASS"
    warned = checks.default_bridge({"Options": {"com.docker.network.bridge.enable_icc": "true"}})
    assert warned.status == "WARN"
    assert '"icc": false' in warned.remediation
    assert checks.default_bridge({"Options": {}}).status == "WARN"  # icc defaults to true


def test_authz_plugin(info: dict[str, Any]) -> None:
    info["Plugins"]["Authorization"] = ["opa-docker-authz"]
    assert checks.authz_plugin(info).status == "PASS"


@pytest.mark.parametrize(
    ("options", "policy_seccomp", "status"),
    [
        (["name=seccomp,profile=default"], ("gateway",), "PASS"),
        (["name=seccomp,profile=builtin"], ("engine-default",), "PASS"),
        (["name=seccomp,profile=/etc/docker/seccomp.json"], ("gateway",), "PASS"),
        (["name=seccomp,profile=unconfined"], ("gateway",), "WARN"),
        (["name=seccomp,profile=unconfined"], ("gateway", "engine-default"), "FAIL"),
        (["name=apparmor"], ("gateway",), "FAIL"),
    ],
)
def test_seccomp(info: dict[str, Any], options: list[str], policy_seccomp: tuple[str, ...], status: str) -> None:
    info["SecurityOptions"] = options
    found = checks.seccomp_default(info, policy_seccomp=policy_seccomp)
    assert found.status == status
    assert bool(found.remediation) is (status != "PASS")


def test_engine_version_statuses(info: dict[str, Any], version: dict[str, Any]) -> None:
    version["Version"] = "29.3.1"
    assert checks.engine_version(version, info).status == "PASS"
    info["Plugins"]["Authorization"] = ["authz"]
    version["Version"] = "27.1.0"  # vulnerable, and an authorization plugin is configured
    failed = checks.engine_version(version, info)
    assert (failed.status, failed.ok) == ("FAIL", False)
    assert "CVE-2024-41110" in failed.detail
    assert "27.1.1" in failed.remediation
    version["Version"] = "20.10.24+dfsg1"  # Debian's build: the revision that says "fixed" is not reported
    unknown = checks.engine_version(version, info)
    assert unknown.status == "FAIL"  # CVE-2026-34040 applies to every build before 29.3.1
    assert "may carry the fix for CVE-2024-41110" in unknown.detail
    version["Version"] = ""
    info.pop("ServerVersion")
    assert checks.engine_version(version, info).status == "WARN"


def test_runc_version_statuses(info: dict[str, Any]) -> None:
    info["RuncCommit"]["ID"] = "v1.2.8-0-gdeadbee"
    assert checks.runc_version(info).status == "PASS"
    info["RuncCommit"]["ID"] = "v1.1.11-0-g4bccb38"
    failed = checks.runc_version(info)
    assert failed.status == "FAIL"
    assert "CVE-2024-21626" in failed.detail
    warned = checks.runc_version(info, runtimes=("runsc",))  # runc cannot be chosen by any policy
    assert warned.status == "WARN"
    assert "only runsc" in warned.detail
    info["RuncCommit"]["ID"] = ""
    assert checks.runc_version(info).status == "WARN"


def test_runsc_host_uds_warns_on_the_recorded_machine(info: dict[str, Any]) -> None:
    """Registered before the egress proxy: no --host-uds, so a sandbox under gVisor cannot reach its socket."""
    check = checks.runsc_host_uds(info)
    assert check.status == "WARN"
    assert "--host-uds=open" in check.detail
    assert "scripts/setup-engine.sh" in check.remediation
    assert "/etc/docker/daemon.json" in check.remediation


@pytest.mark.parametrize(
    ("added", "status"),
    [
        (["--host-uds=open"], "PASS"),
        (["--host-uds=all"], "PASS"),
        (["-host-uds", "open"], "PASS"),  # Go's flag package takes the value as the next argument too
        (["--fsgofer-host-uds"], "PASS"),  # the older releases' flag
        (["--fsgofer-host-uds=true"], "PASS"),
        (["--host-uds=create"], "WARN"),  # may bind a socket, not connect to one
        (["--host-uds=none"], "WARN"),
        (["--host-uds"], "WARN"),  # no value
        (["--fsgofer-host-uds=false"], "WARN"),
        (["--host-uds=open", "--host-uds=none"], "WARN"),  # the last one wins
        (["--host-uds=none", "--host-uds=open"], "PASS"),
    ],
)
def test_runsc_host_uds_reads_the_runtime_args(info: dict[str, Any], added: list[str], status: str) -> None:
    info["Runtimes"]["runsc"]["runtimeArgs"] += added
    check = checks.runsc_host_uds(info)
    assert check.status == status
    assert bool(check.remediation) == (status == "WARN")


def test_runsc_host_uds_without_runsc(info: dict[str, Any]) -> None:
    del info["Runtimes"]["runsc"]
    check = checks.runsc_host_uds(info)
    assert check.status == "WARN"
    assert "not registered" in check.detail
    info["Runtimes"] = None
    assert checks.runsc_host_uds(info).status == "WARN"


def test_version_ranges() -> None:
    assert parse_version("1.4.0-rc.3") < parse_version("1.4.0")  # type: ignore[operator]
    assert parse_version("v1.1.12-0-g51d5e94") == (1, 1, 12, 1 << 30)
    assert parse_version("garbage") is None
    assert {f.vulnerability.cve for f in match("runc", "1.3.2", authz_plugin=False)} == {
        "CVE-2025-31133",
        "CVE-2025-52565",
        "CVE-2025-52881",
    }
    assert match("runc", "1.3.3", authz_plugin=False) == []
    assert match("runc", "1.4.0-rc.3", authz_plugin=False) == []
    assert "CVE-2019-5736" in {f.vulnerability.cve for f in match("runc", "1.0.0-rc6", authz_plugin=False)}
    assert "CVE-2024-21626" not in {
        f.vulnerability.cve for f in match("runc", "1.1.5+ds1-1+deb12u1", authz_plugin=False)
    }
    assert {f.verdict for f in match("engine", "26.1.4", authz_plugin=False)} == {"not_exploitable"}
    assert [f.vulnerability.cve for f in match("engine", "26.1.5", authz_plugin=True)] == ["CVE-2026-34040"]
    for vuln in KNOWN_VULNERABILITIES:
        assert vuln.cve.startswith("CVE-")
        assert vuln.reference.startswith("https://")
        assert all(low < high for low, high in vuln.affected)


def test_audit_permissions(tmp_path: Path) -> None:
    trail = tmp_path / "audit"
    assert checks.audit_permissions(trail).status == "WARN"  # not there yet
    trail.mkdir(mode=0o700)
    trail.chmod(0o700)
    (trail / "trail-000001.jsonl").write_text("")
    (trail / "trail-000001.jsonl").chmod(0o640)
    assert checks.audit_permissions(trail).status == "PASS"
    trail.chmod(0o750)
    assert checks.audit_permissions(trail).status == "PASS"
    trail.chmod(0o755)
    assert checks.audit_permissions(trail).status == "WARN"  # readable by everyone
    trail.chmod(0o770)
    assert checks.audit_permissions(trail).status == "WARN"
    trail.chmod(0o777)
    failed = checks.audit_permissions(trail)
    assert (failed.status, failed.ok) == ("FAIL", False)
    assert "chmod 0700" in failed.remediation
    trail.chmod(0o700)
    (trail / "trail-000001.jsonl").chmod(0o666)
    assert checks.audit_permissions(trail).status == "FAIL"
    (trail / "trail-000001.jsonl").chmod(0o640)
    other = os.stat(trail).st_uid + 1
    owned = checks.audit_permissions(trail, euid=other)
    assert owned.status == ("PASS" if os.stat(trail).st_uid == 0 else "WARN")


def test_audit_permissions_refuse_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert checks.audit_permissions(link).status == "FAIL"
    assert stat.S_ISLNK(os.lstat(link).st_mode)


def test_to_dict_keeps_the_first_doctors_keys() -> None:
    found = checks.Check("x", "WARN", "d", "r").to_dict()
    assert found == {"name": "x", "ok": True, "status": "WARN", "detail": "d", "remediation": "r"}


_ON_DISK = {"directory": "/var/lib/agent-gateway/workspaces", "file_system": "ext4", "free": 10 << 30}


def test_workspaces_fail_only_when_a_policy_allows_them_and_the_host_cannot_make_them() -> None:
    assert checks.workspaces([], allowed=True, ceiling=1 << 30, **_ON_DISK).status == "PASS"
    lacking = ["loop devices (/dev/loop-control; modprobe loop)"]
    warned = checks.workspaces(lacking, allowed=False, ceiling=0, **_ON_DISK)
    assert (warned.status, "loop devices" in warned.detail) == ("WARN", True)
    failed = checks.workspaces(lacking, allowed=True, ceiling=1 << 30, **_ON_DISK)
    assert (failed.status, failed.ok) == ("FAIL", False)
    assert "modprobe loop" in failed.remediation


@pytest.mark.parametrize("file_system", ["tmpfs", "ramfs"])
def test_workspaces_in_ram_are_a_warning_naming_the_setting(file_system: str) -> None:
    found = checks.workspaces([], allowed=True, ceiling=1 << 30, **{**_ON_DISK, "file_system": file_system})
    assert found.status == "WARN"
    assert f"held in RAM ({file_system})" in found.detail
    assert "GATEWAY_WORKSPACE_DIR" in found.remediation


def test_workspaces_warn_when_one_workspace_at_the_ceiling_does_not_fit() -> None:
    assert checks.workspaces([], allowed=True, ceiling=10 << 30, **_ON_DISK).status == "PASS"
    found = checks.workspaces([], allowed=True, ceiling=(10 << 30) + 1, **_ON_DISK)
    assert found.status == "WARN"
    assert "10240 MiB free" in found.detail
    assert "less room than one workspace" in found.detail

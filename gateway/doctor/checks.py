"""The daemon and host checks of ``gateway doctor``, as pure functions of what the engine reported.

Each check takes the parsed answers of ``GET /info`` and ``GET /version`` (docker-py's ``client.info()`` /
``client.version()``), or a path, and returns a :class:`Check` with a status and the remediation text. No
check talks to the engine itself, so the unit tests run them on recorded answers; ``gateway doctor`` (the CLI)
fetches the answers once and calls them. Statuses:

``PASS`` the setting is as it should be;
``WARN`` a hardening layer is missing, but the gateway's own per-container options (or its preconditions)
         keep the sandbox safe without it;
``FAIL`` the gateway cannot keep its promises on this host: ``gateway doctor`` exits 1.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from gateway.doctor.vulns import Finding, match

if TYPE_CHECKING:
    from gateway.policy.model import ImagesRule

__all__ = [
    "Check",
    "Status",
    "audit_permissions",
    "authz_plugin",
    "default_bridge",
    "engine_version",
    "images",
    "live_restore",
    "named_images",
    "no_new_privileges",
    "runc_version",
    "runsc_host_uds",
    "sboms",
    "seccomp_default",
    "security_options",
    "userns_remap",
    "workspaces",
]

Status = Literal["PASS", "WARN", "FAIL"]

_DAEMON_JSON: Final = "/etc/docker/daemon.json"


@dataclass(frozen=True, slots=True)
class Check:
    """One line of ``gateway doctor``."""

    name: str
    status: Status
    detail: str
    remediation: str = ""
    """What to do; empty for PASS."""

    @property
    def ok(self) -> bool:
        """Kept from the first doctor's JSON: ``False`` exactly when the check FAILs (the exit status's rule)."""
        return self.status != "FAIL"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "status": self.status,
            "detail": self.detail,
            "remediation": self.remediation,
        }


def security_options(info: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """``SecurityOptions`` (``["name=seccomp,profile=default", "name=userns"]``) as ``{name: {key: value}}``."""
    out: dict[str, dict[str, str]] = {}
    for item in info.get("SecurityOptions") or ():
        if not isinstance(item, str):
            continue
        fields = dict(part.split("=", 1) for part in item.split(",") if "=" in part)
        name = fields.pop("name", None)
        if name is not None:
            out[name] = fields
    return out


def live_restore(info: Mapping[str, Any]) -> Check:
    if info.get("LiveRestoreEnabled") is True:
        return Check("live_restore", "PASS", "live restore is enabled: sandboxes survive a daemon restart")
    return Check(
        "live_restore",
        "WARN",
        "live restore is disabled: restarting dockerd kills every running sandbox (CIS Docker 2.15)",
        f'set "live-restore": true in {_DAEMON_JSON} and reload dockerd (SIGHUP); running runs then end by '
        "their own deadline instead of with the daemon",
    )


def userns_remap(info: Mapping[str, Any]) -> Check:
    if "userns" in security_options(info):
        return Check("userns_remap", "PASS", "user namespace remapping is enabled")
    return Check(
        "userns_remap",
        "WARN",
        "no user namespace remapping: uid 0 in a container is uid 0 on the host (CIS Docker 2.10); the gateway's "
        "sandboxes run as 65534 with every capability dropped, other containers on this engine may not",
        f'set "userns-remap": "default" in {_DAEMON_JSON} and restart dockerd (images and volumes then live under '
        "a new, remapped root)",
    )


def no_new_privileges(info: Mapping[str, Any]) -> Check:
    if "no-new-privileges" in security_options(info):
        return Check("no_new_privileges", "PASS", "containers get no-new-privileges by default")
    return Check(
        "no_new_privileges",
        "WARN",
        "the daemon does not default to no-new-privileges (CIS Docker 2.18); the gateway sets it on each sandbox, "
        "containers started by others may still gain privileges through setuid binaries",
        f'set "no-new-privileges": true in {_DAEMON_JSON} and restart dockerd',
    )


def default_bridge(bridge: Mapping[str, Any] | None) -> Check:
    """``bridge``: the inspected network named ``bridge`` (``GET /networks/bridge``), or ``None`` without one."""
    if bridge is None:
        return Check(
            "default_bridge", "PASS", "no default bridge (dockerd --bridge=none): containers get no network by default"
        )
    options = bridge.get("Options") or {}
    if str(options.get("com.docker.network.bridge.enable_icc", "true")).lower() == "false":
        return Check("default_bridge", "PASS", "default bridge with inter-container communication disabled (icc=false)")
    return Check(
        "default_bridge",
        "WARN",
        "the default bridge lets containers on it reach each other (icc=true, CIS Docker 2.2); the gateway's "
        "sandboxes use network none unless a policy names a network",
        f'set "icc": false in {_DAEMON_JSON} (or start dockerd with --bridge=none) and restart dockerd',
    )


def authz_plugin(info: Mapping[str, Any]) -> Check:
    plugins = (info.get("Plugins") or {}).get("Authorization") or []
    if plugins:
        return Check("authz_plugin", "PASS", f"authorization plugin(s): {', '.join(map(str, plugins))}")
    return Check(
        "authz_plugin",
        "WARN",
        "no authorization plugin: every client of the Docker socket can start privileged containers (CIS Docker "
        "2.11); the gateway's guard covers only the containers it creates",
        "keep the Docker socket to root and the gateway's user, or add an authorization plugin "
        f'("authorization-plugins" in {_DAEMON_JSON}); mind CVE-2024-41110 (engine_version) when you do',
    )


def seccomp_default(info: Mapping[str, Any], *, policy_seccomp: Collection[str] = ("gateway",)) -> Check:
    """``policy_seccomp``: the seccomp settings of the configured policies (``gateway`` or ``engine-default``)."""
    options = security_options(info)
    engine_default = "engine-default" in policy_seccomp
    if "seccomp" not in options:
        return Check(
            "seccomp",
            "FAIL",
            "the engine reports no seccomp support: no seccomp profile (the gateway's included) can be applied",
            "run dockerd on a kernel with seccomp (CONFIG_SECCOMP_FILTER) and a dockerd built with seccomp",
        )
    profile = options["seccomp"].get("profile", "default")
    if profile == "unconfined":
        status: Status = "FAIL" if engine_default else "WARN"
        why = (
            "a policy uses seccomp: engine-default, so its sandboxes run without any syscall filter"
            if engine_default
            else "the gateway applies its own profile to its sandboxes; other containers run unfiltered"
        )
        return Check(
            "seccomp",
            status,
            f"the engine's default seccomp profile is unconfined (CIS Docker 5.21): {why}",
            f'remove "seccomp-profile": "unconfined" from {_DAEMON_JSON} (or --seccomp-profile) and restart dockerd',
        )
    shown = "Docker's default" if profile in ("default", "builtin") else profile
    return Check("seccomp", "PASS", f"default seccomp profile: {shown}")


def _versions(findings: list[Finding], what: str) -> tuple[Status, str, str]:
    vulnerable = [f for f in findings if f.verdict == "vulnerable"]
    unknown = [f for f in findings if f.verdict == "unknown"]
    dormant = [f for f in findings if f.verdict == "not_exploitable"]
    parts = []
    if vulnerable:
        parts.append(
            "vulnerable to " + "; ".join(f"{f.vulnerability.cve} ({f.vulnerability.summary})" for f in vulnerable)
        )
    if unknown:
        parts.append(
            "a distribution build that may carry the fix for "
            + ", ".join(f.vulnerability.cve for f in unknown)
            + " (the engine does not report the package revision)"
        )
    if dormant:
        parts.append(
            "in the affected range of "
            + ", ".join(f.vulnerability.cve for f in dormant)
            + ", exploitable only with an authorization plugin (none is configured)"
        )
    fixes = "; ".join(f"{f.vulnerability.cve}: {f.vulnerability.fixed}" for f in findings)
    status: Status = "FAIL" if vulnerable else "WARN"
    return status, f"{what}: " + "; ".join(parts), f"upgrade: {fixes} (docs/doctor.md lists the sources)"


def engine_version(version: Mapping[str, Any], info: Mapping[str, Any]) -> Check:
    reported = str(version.get("Version") or info.get("ServerVersion") or "")
    plugins = bool((info.get("Plugins") or {}).get("Authorization"))
    findings = match("engine", reported, authz_plugin=plugins)
    if not reported:
        return Check("engine_version", "WARN", "the engine did not report its version", "check `docker version`")
    if not findings:
        return Check("engine_version", "PASS", f"Docker Engine {reported}: no known-vulnerable range (docs/doctor.md)")
    status, detail, remediation = _versions(findings, f"Docker Engine {reported}")
    return Check("engine_version", status, detail, remediation)


def runc_version(info: Mapping[str, Any], *, runtimes: Collection[str] = ("runc",)) -> Check:
    """``runtimes``: the runtimes the configured policies allow; runc flaws FAIL only when runc can be used."""
    reported = str((info.get("RuncCommit") or {}).get("ID") or "")
    if not reported:
        return Check("runc_version", "WARN", "the engine did not report its runc version", "check `runc --version`")
    findings = match("runc", reported, authz_plugin=False)
    if not findings:
        return Check("runc_version", "PASS", f"runc {reported}: no known-vulnerable range (docs/doctor.md)")
    status, detail, remediation = _versions(findings, f"runc {reported}")
    if status == "FAIL" and "runc" not in runtimes:
        status = "WARN"
        detail += "; the configured policies allow only " + ", ".join(sorted(runtimes)) + ", not runc"
    return Check("runc_version", status, detail, remediation)


def _connects_to_host_sockets(args: Sequence[str]) -> bool:
    """Do runsc's ``args`` let a sandbox connect to a host unix socket? ``--host-uds=open`` or ``all`` (also as
    ``--host-uds open``), or the older ``--fsgofer-host-uds``; the last such flag wins, as in runsc."""
    found = False
    for i, arg in enumerate(args):
        name, eq, value = arg.lstrip("-").partition("=")
        if name == "host-uds":
            found = (value if eq else (args[i + 1] if i + 1 < len(args) else "")) in ("open", "all")
        elif name == "fsgofer-host-uds":
            found = not eq or value.lower() in ("1", "t", "true")
    return found


def runsc_host_uds(info: Mapping[str, Any]) -> Check:
    """Is runsc registered so that a sandbox may connect to a host unix socket bound into it? Egress goes
    through one (the proxy's per-run socket); gVisor refuses them unless runsc runs with ``--host-uds``."""
    remediation = (
        'run scripts/setup-engine.sh as root (it adds the flag and reloads dockerd), or add "--host-uds=open" '
        f"to runtimes.runsc.runtimeArgs in {_DAEMON_JSON} and reload dockerd (SIGHUP)"
    )
    runsc = (info.get("Runtimes") or {}).get("runsc")
    if not isinstance(runsc, Mapping):
        return Check(
            "runsc_host_uds",
            "WARN",
            "runsc is not registered (see the gvisor check), so no sandbox under gVisor can reach the egress proxy",
            remediation,
        )
    args = [str(a) for a in runsc.get("runtimeArgs") or ()]
    if _connects_to_host_sockets(args):
        return Check("runsc_host_uds", "PASS", "runsc lets a sandbox connect to a host unix socket bound into it")
    return Check(
        "runsc_host_uds",
        "WARN",
        "runsc is registered without --host-uds=open: a sandbox under gVisor cannot connect to the egress proxy's "
        "unix socket, so network egress under runsc will not work (runc is unaffected)",
        remediation,
    )


def named_images(rules: Collection[ImagesRule]) -> dict[str, bool]:
    """Every image the policies' ``images`` rules name, each once: first each default image (``True``), then
    each allowlisted ``repository:tag`` that is no policy's default (``False``). A digest-only entry names no
    image to look for (the runner checks a pin at run time)."""
    named = dict.fromkeys((rule.default for rule in rules), True)
    for rule in rules:
        for entry in rule.allow:
            for tag in entry.tags:
                named.setdefault(f"{entry.repository}:{tag}", False)
    return named


def images(named: Mapping[str, bool], ids: Mapping[str, str | None], build: Callable[[str], str]) -> Check:
    """Are the images the policies name (:func:`named_images`) on the engine (``ids``: image → id, ``None``
    when missing)? A missing default image FAILs (requests that name no image are refused); a missing
    allowlisted one WARNs (only requests naming it are). ``build`` gives the command that builds an image."""
    if not named:
        return Check("image", "FAIL", "no policy loaded, so no image to check", "fix the policy, then re-run")
    present = ", ".join(f"{image} {ids[image]}" for image in named if ids.get(image))
    missing = [image for image in named if not ids.get(image)]
    if not missing:
        return Check("image", "PASS", present)
    status: Status = "FAIL" if any(named[image] for image in missing) else "WARN"
    detail = "; ".join(
        f"{image} is missing ({'the default image' if named[image] else 'allowlisted'}): requests for it are refused"
        for image in missing
    )
    return Check("image", status, detail + (f"; present: {present}" if present else ""), "; ".join(map(build, missing)))


def sboms(
    named: Mapping[str, bool], ids: Mapping[str, str | None], recorded: Mapping[str, str | None], where: str
) -> Check:
    """Is an SBOM recorded (``recorded``: image id → the SBOM's digest, ``None`` when none is, in ``where``)
    for each image the policies name? As :func:`images`: FAIL for a default image without one (missing or
    unrecorded), WARN for an allowlisted one; an allowlisted image that is missing is the image check's."""
    if not named:
        return Check("sbom", "FAIL", "no policy loaded, so no image to check", "fix the policy, then re-run")
    found = [f"{image} SBOM {recorded[i]}" for image in named if (i := ids.get(image)) and recorded.get(i)]
    lacking = [image for image in named if (i := ids.get(image)) and not recorded.get(i)]
    gone = [image for image in named if named[image] and not ids.get(image)]
    if not lacking and not gone:
        return Check("sbom", "PASS", ", ".join(found) or "no allowlisted image is present")
    problems = [f"{image} is missing, so it has no SBOM" for image in gone]
    problems += [
        f"no SBOM recorded for {image} ({ids[image]}) in {where}; record it with "
        f"`gateway sbom --image {image} --record`"
        for image in lacking
    ]
    status: Status = "FAIL" if gone or any(named[image] for image in lacking) else "WARN"
    return Check(
        "sbom",
        status,
        "; ".join(problems) + (f"; recorded: {', '.join(found)}" if found else ""),
        "`gateway sbom --image IMAGE --record` records an image's SBOM (scripts/build-image.sh does for each "
        "image it builds); a missing image: see the image check",
    )


def audit_permissions(
    directory: Path, *, euid: int | None = None, lstat: Callable[[Path], os.stat_result] = os.lstat
) -> Check:
    """The trail directory and its files: owned by this user (or root), not writable by group or others."""
    me = os.geteuid() if euid is None else euid
    try:
        st = lstat(directory)
    except FileNotFoundError:
        return Check(
            "audit_permissions",
            "WARN",
            f"{directory} does not exist yet: the first run creates it with this process's umask",
            f"create it first: install -d -m 0700 {directory}",
        )
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return Check(
            "audit_permissions",
            "FAIL",
            f"{directory} is not a plain directory (a symlink or a file)",
            f"point the trail at a real directory: install -d -m 0700 DIR (not {directory})",
        )
    problems: list[tuple[Status, str]] = []
    if st.st_uid not in (me, 0):
        problems.append(("WARN", f"owned by uid {st.st_uid}, not by this user ({me}) or root"))
    if st.st_mode & stat.S_IWOTH:
        problems.append(
            ("FAIL", f"writable by everyone (mode {stat.S_IMODE(st.st_mode):04o}): anyone can delete records")
        )
    elif st.st_mode & stat.S_IWGRP:
        problems.append(("WARN", f"writable by its group (mode {stat.S_IMODE(st.st_mode):04o})"))
    if st.st_mode & stat.S_IROTH:
        problems.append(("WARN", "readable by everyone: records name principals, images and rule messages"))
    try:
        entries = sorted(directory.iterdir())
    except OSError as exc:
        problems.append(("FAIL", f"cannot list it: {exc.strerror}"))
        entries = []
    writable = [
        e.name for e in entries if e.name.endswith(".jsonl") and lstat(e).st_mode & (stat.S_IWOTH | stat.S_IWGRP)
    ]
    if writable:
        problems.append(("FAIL", f"segments writable by group or others: {', '.join(writable[:5])}"))
    if not problems:
        return Check(
            "audit_permissions",
            "PASS",
            f"{directory}: mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}, segments not writable by others",
        )
    status: Status = "FAIL" if any(s == "FAIL" for s, _ in problems) else "WARN"
    return Check(
        "audit_permissions",
        status,
        f"{directory}: " + "; ".join(text for _s, text in problems),
        f"chown {me} {directory} && chmod 0700 {directory} && chmod 0640 {directory}/*.jsonl",
    )


def workspaces(
    lacking: Collection[str], *, allowed: bool, directory: str, file_system: str, free: int, ceiling: int
) -> Check:
    """What sessions need on this host (``gateway.runner.docker.workspace.missing``): root, loop devices,
    ``mkfs.ext4`` and ``losetup`` (every session's ``/workspace`` on Docker is a workspace, a kernel's too).
    Without them sessions fail closed: a FAIL when a configured policy allows them (``allowed``), else a WARN.
    Then where the images live (``directory``, ``GATEWAY_WORKSPACE_DIR``): a WARN when that is a tmpfs or
    ramfs (the images would be held in RAM) or has less ``free`` than one workspace at the policies' largest
    ``sessions.workspace_size`` ceiling (``ceiling``, bytes; 0 without sessions)."""
    if lacking:
        status: Status = "FAIL" if allowed else "WARN"
        detail = "sessions will be refused: missing " + ", ".join(lacking)
        if not allowed:
            detail += " (no configured policy allows them)"
        return Check(
            "workspaces",
            status,
            detail,
            "run the gateway as root on the engine's host with loop devices (modprobe loop) and e2fsprogs, or "
            "remove spec.sessions from the policies",
        )
    where = f"{directory} ({file_system or 'file system unknown'}, {free >> 20} MiB free)"
    problems = []
    if file_system in ("tmpfs", "ramfs"):
        problems.append(f"the images would be held in RAM ({file_system})")
    if free < ceiling:
        problems.append(f"less room than one workspace at the policies' ceiling ({ceiling >> 20} MiB)")
    if not problems:
        return Check("workspaces", "PASS", f"session workspaces can be made (root, loop devices, e2fsprogs) in {where}")
    return Check(
        "workspaces",
        "WARN",
        f"session workspaces in {where}: " + "; ".join(problems),
        "set GATEWAY_WORKSPACE_DIR to a directory on a disk with room for the live sessions' workspace_size (the "
        "images are sparse: each takes what its session writes, up to its size)",
    )

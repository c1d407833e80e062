"""deploy/agent-gateway.service: the hardening it promises is in the file, and systemd accepts it.

The unit is parsed the way systemd reads it (sections, ``Key=value``, a key may repeat; an empty assignment
resets the list), so a directive that is misspelt, commented out or moved out of ``[Service]`` fails here.
``systemd-analyze verify`` checks the unit (and the unit with the mounts drop-in applied) when it is installed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
UNIT = DEPLOY / "agent-gateway.service"
MOUNTS = DEPLOY / "agent-gateway.service.d" / "mounts.conf"
EXEC = "/opt/agent-gateway/.venv/bin/gateway"


def parse(*texts: str) -> dict[str, dict[str, list[str]]]:
    """systemd's unit syntax, enough for these files: ``[Section]``, ``Key=value``, ``#``/``;`` comments;
    a key's values accumulate across lines and files (drop-ins come later), an empty value resets them."""
    units: dict[str, dict[str, list[str]]] = {}
    for text in texts:
        section: dict[str, list[str]] | None = None
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("[") and line.endswith("]"):
                section = units.setdefault(line[1:-1], {})
                continue
            assert section is not None, f"a directive outside any section: {line!r}"
            assert "=" in line, f"not a Key=value line: {line!r}"
            assert not line.endswith("\\"), f"no continuation lines in these files: {line!r}"
            key, value = (part.strip() for part in line.split("=", 1))
            section[key] = [] if value == "" else [*section.get(key, []), value]
    return units


def last(service: dict[str, list[str]], key: str) -> str:
    assert service.get(key), f"{key}= is not set"
    return service[key][-1]


def words(service: dict[str, list[str]], key: str) -> set[str]:
    return {word for value in service.get(key, []) for word in value.split()}


def test_the_unit_serves_reloads_on_sighup_and_runs_after_the_engine() -> None:
    unit = parse(UNIT.read_text())
    service = unit["Service"]
    assert last(service, "ExecStart").split()[:2] == [EXEC, "serve"]
    assert last(service, "ExecReload") == "/bin/kill -HUP $MAINPID"
    assert "docker.service" in words(unit["Unit"], "After") & words(unit["Unit"], "Requires")
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]


def test_the_unit_carries_the_hardening_directives() -> None:
    service = parse(UNIT.read_text())["Service"]
    for key in (
        "NoNewPrivileges",
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectControlGroups",
        "RestrictSUIDSGID",
        "RestrictNamespaces",
        "LockPersonality",
    ):
        assert last(service, key) == "yes", key
    assert last(service, "ProtectSystem") == "strict"
    # Writable: only the audit trail and the runtime dir (host slots), both also created 0700 by systemd.
    assert words(service, "ReadWritePaths") == {"/var/lib/agent-gateway/audit", "/run/agent-gateway"}
    assert "GATEWAY_AUDIT_DIR=/var/lib/agent-gateway/audit" in service["Environment"]
    assert "GATEWAY_RUNTIME_DIR=/run/agent-gateway" in service["Environment"]
    assert last(service, "RuntimeDirectoryMode") == last(service, "StateDirectoryMode") == "0700"
    # No capability at all without mounts; the socket families the gateway uses and nothing else.
    assert "CapabilityBoundingSet" in service, "an empty CapabilityBoundingSet= (no capability) must be set"
    assert service["CapabilityBoundingSet"] == []
    assert words(service, "RestrictAddressFamilies") == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert service["SystemCallFilter"][0] == "@system-service"
    assert {"~@privileged", "@resources"} <= words(service, "SystemCallFilter")
    assert last(service, "SystemCallArchitectures") == "native"


def test_the_mounts_drop_in_returns_to_the_host_mount_namespace_with_exactly_what_staging_needs() -> None:
    merged = parse(UNIT.read_text(), MOUNTS.read_text())["Service"]
    # Every directive that would give the service its own mount namespace is off: the engine resolves the
    # staging paths in the host's namespace.
    for key in (
        "ProtectHome",
        "PrivateTmp",
        "PrivateDevices",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectKernelLogs",
        "ProtectControlGroups",
        "ProtectSystem",
    ):
        assert last(merged, key) == "no", key
    assert "ReadWritePaths" in merged
    assert merged["ReadWritePaths"] == []
    assert last(merged, "ProtectProc") == "default"
    assert words(merged, "CapabilityBoundingSet") == {"CAP_SYS_ADMIN", "CAP_SYS_PTRACE"}
    assert merged["SystemCallFilter"][-1] == "@mount"
    # What does not depend on the mount namespace stays.
    assert last(merged, "NoNewPrivileges") == "yes"
    assert words(merged, "RestrictAddressFamilies") == {"AF_UNIX", "AF_INET", "AF_INET6"}


def _verify(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here; the parse tests above still check the directives")
    exe = shutil.which("true") or "/bin/true"  # the real ExecStart is not installed on a test machine
    unit = tmp_path / "agent-gateway.service"
    unit.write_text(text.replace(EXEC, exe))
    return subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False)


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    done = _verify(tmp_path, UNIT.read_text())
    assert done.returncode == 0, done.stderr + done.stdout
    assert "agent-gateway.service" not in done.stderr, done.stderr


def test_systemd_analyze_verify_accepts_the_unit_with_the_mounts_drop_in(tmp_path: Path) -> None:
    done = _verify(tmp_path, UNIT.read_text() + "\n" + MOUNTS.read_text())
    assert done.returncode == 0, done.stderr + done.stdout
    assert "agent-gateway.service" not in done.stderr, done.stderr

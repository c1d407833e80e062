"""``gateway doctor``: is this machine ready to run requests? Each check says PASS, WARN or FAIL, why, and what
to do; the exit status is 1 if and only if some check FAILs.

The checks, in order: the policy, the trail, the engine, gVisor, mounts, the images every loaded policy names
(its own and the principals': each default image and allowlisted tag) and their recorded SBOMs, then the daemon
settings (live restore, user namespace remapping, default no-new-privileges, the default bridge, an
authorization plugin, the default seccomp profile), the engine and runc versions against the table of
known-vulnerable ranges (:mod:`gateway.doctor.vulns`), whether runsc lets a sandbox connect to a host unix
socket (the egress proxy's), the trail directory's owner and permissions, and every configured file: the
server configuration (``--config``), the principals file (``--principals``, as ``gateway serve`` finds it)
and each principal's policy. The daemon checks are :mod:`gateway.doctor.checks`, pure
functions of ``docker info`` / ``docker version``; this module fetches those once.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.audit import key_from_env, resolve_directory, verify_trail
from gateway.doctor import checks
from gateway.doctor.checks import Check
from gateway.errors import GatewayError
from gateway.policy import Policy, load_policy
from gateway.resources import policy_path_from_env
from gateway.runner import DockerRunner
from gateway.runner.docker.mounts import STAGING_ROOT
from gateway.runner.docker.runner import build_command
from gateway.runner.docker.workspace import backing, default_root
from gateway.runner.docker.workspace import missing as workspace_missing
from gateway.sbom import sbom_digest_for_image, sbom_path_for_image

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "doctor",
        help="check the policy, the trail, the engine and its settings, gVisor, the image and its SBOM, the files",
        description="Check this machine: PASS / WARN / FAIL per check, with what to do. Exit 1 if and only if "
        "some check FAILs.",
    )
    p.add_argument("--policy", help="policy file (default: $GATEWAY_POLICY, then the shipped default policy)")
    p.add_argument("--audit-dir", help="audit trail directory (default: $GATEWAY_AUDIT_DIR, then ./audit)")
    p.add_argument("--config", metavar="FILE", help="the `gateway serve` configuration file to check")
    p.add_argument(
        "--principals",
        metavar="FILE",
        help="principals file (default: as `gateway serve`: the --config file's, "
        "$GATEWAY_PRINCIPALS, then ./principals.yaml if it exists)",
    )
    p.add_argument("--json", action="store_true", help="print the checks as one JSON object")
    p.set_defaults(func=_doctor)


def _failure(exc: BaseException) -> str:
    if isinstance(exc, GatewayError):
        return exc.diagnostics().replace("\n", " | ")
    return f"{type(exc).__name__}: {exc}"


def _run_check(name: str, fn: Callable[[], str], remediation: str) -> Check:
    """A check of the first doctor's kind: PASS with ``fn``'s detail, FAIL with what it raised."""
    try:
        return Check(name, "PASS", fn())
    except Exception as exc:  # noqa: BLE001 - a doctor reports every failure instead of stopping at one
        return Check(name, "FAIL", _failure(exc), remediation)


def _guarded(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - as above: the engine may be gone, the answer malformed
        return Check(name, "FAIL", _failure(exc), "make the engine answer (see the engine check) and re-run")


class _Configured:
    """The configured files: the server configuration, the principals and every policy they name."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.config: Any = None
        self.policies: list[Policy] = []

    def check_config(self) -> Check:
        if not self.args.config:
            return Check("config", "PASS", "no server configuration given (--config FILE checks one)")
        from gateway.service.config import load_server_config  # noqa: PLC0415 - only when one is given

        try:
            self.config = load_server_config(self.args.config)
        except Exception as exc:  # noqa: BLE001
            return Check("config", "FAIL", _failure(exc), f"fix {self.args.config} (schemas/server.schema.json)")
        return Check("config", "PASS", f"{self.args.config} is valid")

    def policy_path(self) -> str | None:
        if self.args.policy:
            return str(self.args.policy)
        if self.config is not None and self.config.policy is not None:
            return str(self.config.policy)
        return None

    def audit_dir(self) -> Path:
        if self.args.audit_dir:
            return resolve_directory(self.args.audit_dir)
        if self.config is not None and self.config.audit_dir is not None:
            return Path(self.config.audit_dir)
        return resolve_directory(None)

    def check_principals(self) -> Check:
        from gateway.service.principals import load_principals, principals_path_from_env  # noqa: PLC0415

        explicit = self.args.principals or (self.config.principals if self.config is not None else None)
        given = explicit is not None or bool(os.environ.get("GATEWAY_PRINCIPALS"))
        path = principals_path_from_env(explicit)
        if not given and not path.exists():
            return Check("principals", "PASS", f"no principals file ({path} does not exist): not a service host")
        try:
            principals = load_principals(path)
        except Exception as exc:  # noqa: BLE001
            return Check("principals", "FAIL", _failure(exc), f"fix {path} (`gateway principals list` reads it)")
        bad: list[str] = []
        seen: dict[Path, None] = {}
        for principal in principals:
            if principal.policy in seen:
                continue
            seen[principal.policy] = None
            try:
                self.policies.append(load_policy(principal.policy))
            except Exception as exc:  # noqa: BLE001
                bad.append(f"{principal.name}: {_failure(exc)}")
        if bad:
            return Check(
                "principals",
                "FAIL",
                f"{path}: policies that do not load: " + " || ".join(bad),
                "fix each policy (`gateway policy validate FILE`) or point the principal at a valid one",
            )
        return Check("principals", "PASS", f"{path}: {len(principals)} principal(s), {len(seen)} policy file(s) valid")


def _bridge(runner: DockerRunner) -> Mapping[str, Any] | None:
    """The network named ``bridge`` (the default bridge), or ``None`` when the daemon runs without one."""
    for network in runner.client.networks.list(names=["bridge"]):
        if network.name == "bridge":
            attrs: Mapping[str, Any] = network.attrs
            return attrs
    return None


def _image_checks(runner: DockerRunner, policies: list[Policy]) -> tuple[Check, Check]:
    """The image and sbom checks: every image the policies name, present, with its SBOM recorded."""
    named = checks.named_images([p.images for p in policies])
    try:
        ids = {image: runner.image_id(image) for image in named}
    except Exception as exc:  # noqa: BLE001 - as _guarded: the engine may be gone
        remediation = "make the engine answer (see the engine check) and re-run"
        return Check("image", "FAIL", _failure(exc), remediation), Check("sbom", "FAIL", _failure(exc), remediation)
    recorded = {i: sbom_digest_for_image(i) for i in ids.values() if i is not None}
    where = str(sbom_path_for_image("0" * 64).parent)
    return checks.images(named, ids, build_command), checks.sboms(named, ids, recorded, where)


def _doctor(args: argparse.Namespace) -> int:
    configured = _Configured(args)
    config_check = configured.check_config()
    found: list[Check] = []
    policy: list[Policy] = []

    def check_policy() -> str:
        policy.append(load_policy(policy_path_from_env(configured.policy_path())))
        return f"{policy[0].name} sha256:{policy[0].sha256[:16]}… from {policy[0].source}"

    def check_audit() -> str:
        directory = configured.audit_dir()
        os.makedirs(directory, mode=0o750, exist_ok=True)  # as the writer creates it (AuditIO.mkdir)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".doctor-"):
            pass
        report = verify_trail(directory, key=key_from_env())
        if not report.ok:
            raise RuntimeError(f"trail in {directory} is broken: {report.to_dict().get('first_break')}")
        return f"{directory} writable, {report.records_checked} record(s) verify"

    runner = DockerRunner()
    answers: dict[str, Mapping[str, Any]] = {}

    def check_engine() -> str:
        answers["version"] = runner.client.version()
        answers["info"] = runner.client.info()
        return (
            f"Docker {answers['version'].get('Version', '?')} at {os.environ.get('DOCKER_HOST', 'the default socket')}"
        )

    def check_runsc() -> str:
        runtimes = (
            answers["info"].get("Runtimes", {}) if "info" in answers else runner.client.info().get("Runtimes", {})
        )
        if "runsc" not in runtimes:
            raise RuntimeError("runsc (gVisor) is not registered with the engine; scripts/setup-engine.sh registers it")
        runtime_args = [str(a) for a in runtimes["runsc"].get("runtimeArgs") or []]
        if not any(a.lstrip("-").startswith("oci-seccomp") for a in runtime_args):
            raise RuntimeError(
                "runsc is registered without --oci-seccomp: gVisor ignores the policy's seccomp profile and a "
                "program can signal its supervisor; add --oci-seccomp to its runtimeArgs in /etc/docker/daemon.json"
            )
        return "runsc registered, applies seccomp profiles (--oci-seccomp)"

    def check_mounts() -> str:
        if os.geteuid() != 0:
            raise RuntimeError(
                "not root: requests with mounts will fail, since staging a judged mount needs root on the "
                "engine's host (requests without mounts are unaffected)"
            )
        return f"root: judged mounts can be staged under {STAGING_ROOT}"

    for name, fn, remediation in (
        ("policy", check_policy, "fix the policy (`gateway policy validate FILE`) or pass --policy"),
        ("audit", check_audit, "`gateway audit verify` locates the break, `gateway audit repair` seals it"),
        ("engine", check_engine, "start dockerd or set DOCKER_HOST (scripts/setup-engine.sh)"),
        ("gvisor", check_runsc, "register runsc with --oci-seccomp (scripts/setup-engine.sh)"),
        ("mounts", check_mounts, "run the gateway as root on the engine's host, or use no mounts"),
    ):
        found.append(_run_check(name, fn, remediation))

    principals_check = configured.check_principals()
    policies = policy + configured.policies
    found.extend(_image_checks(runner, policies))
    runtimes = {r for p in policies for r in p.runtime.allowed} or {"runc"}
    seccomp = {p.seccomp for p in policies} or {"gateway"}
    if "info" in answers:
        info, version = answers["info"], answers["version"]
        found.extend(
            _guarded(name, fn)
            for name, fn in (
                ("live_restore", lambda: checks.live_restore(info)),
                ("userns_remap", lambda: checks.userns_remap(info)),
                ("no_new_privileges", lambda: checks.no_new_privileges(info)),
                ("default_bridge", lambda: checks.default_bridge(_bridge(runner))),
                ("authz_plugin", lambda: checks.authz_plugin(info)),
                ("seccomp", lambda: checks.seccomp_default(info, policy_seccomp=seccomp)),
                ("engine_version", lambda: checks.engine_version(version, info)),
                ("runc_version", lambda: checks.runc_version(info, runtimes=runtimes)),
                ("runsc_host_uds", lambda: checks.runsc_host_uds(info)),
            )
        )
    else:
        found.append(Check("daemon", "FAIL", "the engine did not answer: its settings were not checked", "see engine"))
    found.append(_guarded("audit_permissions", lambda: checks.audit_permissions(configured.audit_dir())))
    found.append(_guarded("workspaces", lambda: _workspaces(policies)))
    found.extend((config_check, principals_check))

    ok = all(c.ok for c in found)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [c.to_dict() for c in found]}))
    else:
        for c in found:
            print(f"{c.status} {c.name:<17} {c.detail}")
            if c.remediation:
                print(f"     {'':<17} fix: {c.remediation}")
    return 0 if ok else 1


def _workspaces(policies: list[Policy]) -> Check:
    """The ``workspaces`` check for these policies (a kernel session's ``/workspace`` is a workspace too)."""
    sizes = [int(p.sessions.workspace_size.max) for p in policies if p.sessions is not None]
    directory = default_root()
    file_system, free = backing(directory)
    return checks.workspaces(
        workspace_missing(), allowed=bool(sizes), directory=directory, file_system=file_system, free=free,
        ceiling=max(sizes, default=0),
    )  # fmt: skip

"""``gateway doctor``: is this machine ready to run requests? Each check says what is wrong and what to do."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from gateway.audit import key_from_env, resolve_directory, verify_trail
from gateway.errors import GatewayError
from gateway.policy import Policy, load_policy
from gateway.resources import policy_path_from_env
from gateway.runner import DockerRunner
from gateway.runner.docker.mounts import STAGING_ROOT
from gateway.sbom import sbom_digest_for_image, sbom_path_for_image

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser(
        "doctor", help="check the policy, the audit trail, the engine, gVisor, the sandbox image and its SBOM"
    )
    p.add_argument("--policy", help="policy file (default: $GATEWAY_POLICY, then the shipped default policy)")
    p.add_argument("--audit-dir", help="audit trail directory (default: $GATEWAY_AUDIT_DIR, then ./audit)")
    p.add_argument("--json", action="store_true", help="print the checks as one JSON object")
    p.set_defaults(func=_doctor)


Check = tuple[str, bool, str]


def _run_check(name: str, fn: Callable[[], str]) -> Check:
    try:
        return name, True, fn()
    except GatewayError as exc:
        return name, False, exc.diagnostics().replace("\n", " | ")
    except Exception as exc:  # noqa: BLE001 - a doctor reports every failure instead of stopping at one
        return name, False, f"{type(exc).__name__}: {exc}"


def _doctor(args: argparse.Namespace) -> int:
    checks: list[Check] = []
    policy: list[Policy] = []

    def check_policy() -> str:
        policy.append(load_policy(policy_path_from_env(args.policy)))
        return f"{policy[0].name} sha256:{policy[0].sha256[:16]}… from {policy[0].source}"

    def check_audit() -> str:
        directory = resolve_directory(args.audit_dir)
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".doctor-"):
            pass
        report = verify_trail(directory, key=key_from_env())
        if not report.ok:
            raise RuntimeError(f"trail in {directory} is broken: {report.to_dict().get('first_break')}")
        return f"{directory} writable, {report.records_checked} record(s) verify"

    runner = DockerRunner()

    def check_engine() -> str:
        version = runner.client.version()
        return f"Docker {version.get('Version', '?')} at {os.environ.get('DOCKER_HOST', 'the default socket')}"

    def check_runsc() -> str:
        runtimes = runner.client.info().get("Runtimes", {})
        if "runsc" not in runtimes:
            raise RuntimeError("runsc (gVisor) is not registered with the engine; scripts/setup-engine.sh registers it")
        args = [str(a) for a in runtimes["runsc"].get("runtimeArgs") or []]
        if not any(a.lstrip("-").startswith("oci-seccomp") for a in args):
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

    def check_image() -> str:
        if not policy:
            raise RuntimeError("no policy loaded, so no image to check")
        image = policy[0].images.default
        found = runner.image_id(image)
        if found is None:
            raise RuntimeError(f"{image} is missing; build it with scripts/build-image.sh")
        return f"{image} {found}"

    def check_sbom() -> str:
        if not policy:
            raise RuntimeError("no policy loaded, so no image to check")
        image = policy[0].images.default
        found = runner.image_id(image)
        if found is None:
            raise RuntimeError(f"{image} is missing, so it has no SBOM")
        digest = sbom_digest_for_image(found)
        if digest is None:
            raise RuntimeError(
                f"no SBOM recorded for {image} ({found}) in {sbom_path_for_image(found).parent}; record it with "
                f"`gateway sbom --image {image} --record` (scripts/build-image.sh does)"
            )
        return f"{image} SBOM {digest}"

    for name, fn in (
        ("policy", check_policy),
        ("audit", check_audit),
        ("engine", check_engine),
        ("gvisor", check_runsc),
        ("mounts", check_mounts),
        ("image", check_image),
        ("sbom", check_sbom),
    ):
        checks.append(_run_check(name, fn))
    ok = all(c[1] for c in checks)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [{"name": n, "ok": o, "detail": d} for n, o, d in checks]}))
    else:
        for name, good, detail in checks:
            print(f"{'ok  ' if good else 'FAIL'} {name:<7} {detail}", file=sys.stdout)
    return 0 if ok else 1

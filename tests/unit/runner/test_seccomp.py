"""The gateway's seccomp profile: derived reproducibly from the pinned moby profile, and what it refuses."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.policy import load_policy_text
from gateway.request import parse_request
from gateway.resources import policies_dir
from gateway.runner.docker.seccomp import (
    AS_MISSING,
    AT_INIT,
    NEVER,
    PROFILE_FILE,
    SOURCE,
    checked_profile,
    derive,
    gateway_profile,
    profile_problems,
)
from gateway.testing import assemble

ROOT = Path(__file__).resolve().parents[3]
PINNED = ROOT / "scripts" / "seccomp" / "moby-default.json"
SHIPPED = ROOT / "gateway" / "runner" / "docker" / PROFILE_FILE


def test_pinned_source_is_the_one_named() -> None:
    assert hashlib.sha256(PINNED.read_bytes()).hexdigest() == SOURCE["sha256"]


def test_shipped_profile_is_regenerated_byte_for_byte() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-seccomp.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_profile_refuses_by_default_and_allows_none_of_the_never_list() -> None:
    profile = json.loads(gateway_profile())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert profile_problems(profile) == []
    allowed = {n for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" for n in rule["names"]}
    assert allowed.isdisjoint(NEVER)
    assert not [r for r in profile["syscalls"] if r.get("includes", {}).get("caps")]


def test_a_profile_is_checked_when_read() -> None:
    # What gateway_profile() does with the shipped file: an unfit one is never handed out (the guard then
    # trusts exactly the shipped text and parses every other inline profile).
    assert checked_profile(SHIPPED.read_text()) == gateway_profile()
    loose = json.loads(gateway_profile())
    loose["syscalls"].append({"names": ["ptrace"], "action": "SCMP_ACT_ALLOW"})
    with pytest.raises(ValueError, match="lets through ptrace"):
        checked_profile(json.dumps(loose))


def test_the_source_allowed_some_of_them_and_everything_else_is_kept() -> None:
    moby = json.loads(PINNED.read_text())
    unconditional = {
        n for r in moby["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and not r.get("includes") for n in r["names"]
    }
    kept = {n for r in json.loads(gateway_profile())["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" for n in r["names"]}
    allowed_without_caps = {
        n
        for r in moby["syscalls"]
        if r["action"] == "SCMP_ACT_ALLOW" and not r.get("includes", {}).get("caps")
        for n in r["names"]
    }
    assert {"ptrace", "process_vm_readv", "process_vm_writev", "name_to_handle_at"} <= allowed_without_caps
    assert unconditional - set(NEVER) <= kept  # nothing else a program may use was taken away


def test_every_entry_says_why() -> None:
    assert all(len(reason) > 20 for reason in NEVER.values())
    assert {"ptrace", "process_vm_readv", "process_vm_writev", "io_uring_setup", "userfaultfd", "bpf",
            "perf_event_open", "keyctl", "add_key", "request_key"} <= set(NEVER)  # fmt: skip


def test_derive_refuses_a_source_that_allows_by_default() -> None:
    with pytest.raises(ValueError, match="defaultAction"):
        derive({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []})


def _policy(seccomp: str | None) -> str:
    text = (policies_dir() / "default.yaml").read_text()
    text = text.replace("\n  seccomp: gateway\n", "\n")
    return text + (f"  seccomp: {seccomp}\n" if seccomp else "")


@pytest.mark.parametrize(("seccomp", "expected"), [(None, True), ("gateway", True), ("engine-default", False)])
def test_policy_selects_the_profile(seccomp: str | None, expected: bool) -> None:
    policy = load_policy_text(_policy(seccomp))
    options = assemble(policy, parse_request({"code": "pass"}), decision_id="d", request_id="r")
    assert options["security_opt"][0] == "no-new-privileges"
    assert (f"seccomp={gateway_profile()}" in options["security_opt"]) is expected
    assert len(options["security_opt"]) == (2 if expected else 1)


def test_policy_cannot_ask_for_unconfined() -> None:
    from gateway.errors import PolicyError

    with pytest.raises(PolicyError) as info:
        load_policy_text(_policy("unconfined"))
    assert any("seccomp" in p.path for p in info.value.problems)


def test_signal_calls_reach_everything_but_pid_1() -> None:
    profile = json.loads(gateway_profile())
    for name in AT_INIT:
        rules = [r for r in profile["syscalls"] if name in r["names"] and r["action"] == "SCMP_ACT_ALLOW"]
        assert len(rules) == 1, name
        assert rules[0]["args"] == [{"index": 0, "value": 1, "valueTwo": 0, "op": "SCMP_CMP_NE"}], name
    loose = {**profile, "syscalls": [*profile["syscalls"], {"names": ["kill"], "action": "SCMP_ACT_ALLOW"}]}
    assert any("kill reach PID 1" in p for p in profile_problems(loose))


def test_clone3_answers_enosys_by_trace_on_both_runtimes() -> None:
    # moby answers clone3 ENOSYS with SCMP_ACT_ERRNO/errnoRet 38, which runsc 20221219 turns into EPERM (no thread
    # can start); SCMP_ACT_TRACE with no tracer is ENOSYS under Linux and gVisor alike.
    moby = json.loads(PINNED.read_text())
    assert [r["action"] for r in moby["syscalls"] if r.get("errnoRet") == 38] == ["SCMP_ACT_ERRNO"]
    profile = json.loads(gateway_profile())
    rules = [r for r in profile["syscalls"] if "clone3" in r["names"]]
    assert [(r["action"], "errnoRet" in r) for r in rules] == [(AS_MISSING, False)]
    assert not [r for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ERRNO"]
    assert {"clone3", "ptrace"} <= set(NEVER)  # ptrace: nothing in the sandbox can become the tracer


def test_a_profile_that_lets_clone3_through_is_refused() -> None:
    # clone3's flags are out of seccomp's reach: allowing it would let a program make namespaces.
    loose = json.loads(gateway_profile())
    loose["syscalls"].append({"names": ["clone3"], "action": "SCMP_ACT_ALLOW"})
    assert any("lets through clone3" in p for p in profile_problems(loose))

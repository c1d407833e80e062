"""The gateway's seccomp profile: the engine's default profile minus what a code sandbox never needs.

Derived, never hand-edited: ``scripts/gen-seccomp.py`` reads the pinned copy of moby's default profile
(``scripts/seccomp/moby-default.json``, see ``SOURCE``) and applies :func:`derive`, which

1. drops every rule that only applies with a capability (``includes.caps``): the gateway drops all
   capabilities and its guard refuses ``cap_add``, so these rules can never match (this is where moby keeps
   ``bpf``, ``perf_event_open``, ``unshare``/``setns``/``mount``, ``kcmp``, ``pidfd_getfd``, ...);
2. removes each name of :data:`NEVER` from every remaining allow rule (a rule left without names is dropped);
3. takes the calls that send a signal to a process named by number (:data:`AT_INIT`) out of every
   unconditional allow rule and allows them again only when that number is not 1: the program may signal
   its own processes, never the container's PID 1 (the supervisor). Under runc the kernel already protects a
   namespace's init; gVisor does not, so this rule is what keeps a program there from stopping its supervisor;
4. turns each rule that answers ENOSYS (moby's ``clone3`` rule, see :data:`AS_MISSING`) into
   ``SCMP_ACT_TRACE``, which both runtimes answer with ENOSYS, the call not run;
5. checks that no allow rule names any of :data:`NEVER` any more, that the calls of :data:`AT_INIT` are
   allowed only with that condition, and that the default action still refuses.

The result is shipped as ``gateway-seccomp.json`` next to this module and given to the engine as
``security_opt: seccomp=<profile JSON>`` when the policy says ``seccomp: gateway`` (the default). Records and
responses name it by digest instead (:func:`profile_reference`: ``seccomp=gateway@sha256:<hex>``), so that
7 KB of identical JSON is not written into every decision record.
``tests/unit/runner/test_seccomp.py`` regenerates it and compares, so the shipped file cannot drift.

Under gVisor (runsc) the sentry, not the host kernel, implements these calls (it has no ``process_vm_*``,
``userfaultfd`` or ``bpf`` at all; its ``io_uring``, ``ptrace`` and keyring are its own code), and runsc applies
the OCI profile inside the sandbox only when registered with ``--oci-seccomp``.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

__all__ = [
    "AS_MISSING",
    "AT_INIT",
    "NEVER",
    "PROFILE_FILE",
    "SOURCE",
    "checked_profile",
    "derive",
    "gateway_profile",
    "profile_problems",
    "profile_reference",
]

SOURCE = {
    "repository": "github.com/moby/moby",
    "commit": "b985e2313a8676e18072b442911fc8f64f17d440",
    "path": "vendor/github.com/moby/profiles/seccomp/default.json",
    "module": "github.com/moby/profiles/seccomp v0.2.3",
    "sha256": "536529b665dd0972c37bfb569f5d4ac8a53592e7b00752bc39ff063ca9864c74",
}
"""Where ``scripts/seccomp/moby-default.json`` comes from (byte for byte; its sha256)."""

PROFILE_FILE = "gateway-seccomp.json"

NEVER: Mapping[str, str] = {
    # Reaching other processes. The program may only act on its own process tree; these read, write or stop
    # any same-uid process it can name, which is how a program froze the container's init (issue 14).
    "ptrace": "traces, stops and rewrites other processes (froze PID 1 under runc); no debugger runs here",
    "process_vm_readv": "reads another process's memory (the supervisor's frame key) without ptrace",
    "process_vm_writev": "writes another process's memory",
    "kcmp": "compares kernel objects of two processes: a probe of other processes (capability rule anyway)",
    "pidfd_getfd": "copies a file descriptor out of another process (capability rule anyway)",
    "process_madvise": "advises on another process's memory (capability rule anyway)",
    # Kernel attack surface a Python snippet never uses, each with a long record of privilege escalations.
    "io_uring_setup": "io_uring: a second system-call interface that bypasses seccomp filtering of its ops",
    "io_uring_enter": "io_uring (see io_uring_setup)",
    "io_uring_register": "io_uring (see io_uring_setup)",
    "userfaultfd": "lets a program stall the kernel on its own page faults: the standard race widener",
    "bpf": "loads programs into the kernel (capability rule in moby's profile; listed so it can never return)",
    "perf_event_open": "hardware and kernel performance counters: side channels and kernel bugs",
    "keyctl": "the kernel keyring is not namespaced: keys of other containers and the host share it",
    "add_key": "the kernel keyring (see keyctl)",
    "request_key": "the kernel keyring (see keyctl)",
    "name_to_handle_at": "exposes file handles (inode, generation) usable with open_by_handle_at to leave a mount",
    "open_by_handle_at": "opens a file by handle, bypassing the mount (the 'shocker' escape; capability rule)",
    "modify_ldt": "x86 16-bit segment tables: only old DOS/Wine code needs them; a history of kernel bugs",
    "unshare": "new namespaces (capability rule): a sandbox never makes its own",
    "setns": "joins namespaces (capability rule)",
    "mount": "mounts (capability rule)",
    # Answered ENOSYS (moby too), never allowed: its flags are in a struct seccomp cannot read (see AS_MISSING).
    "clone3": "would make namespaces with flags the profile cannot filter (clone's flags it can)",
}
"""Every system call the gateway's profile refuses beyond the engine's, with the reason."""

AT_INIT: Mapping[str, str] = {
    "kill": "kill(1, ...) would stop or kill the supervisor (gVisor delivers it to init)",
    "tkill": "tkill(1, ...), the thread form of kill",
    "tgkill": "tgkill(1, ...), the thread-group form of kill",
    "rt_sigqueueinfo": "rt_sigqueueinfo(1, ...), kill with a payload",
    "rt_tgsigqueueinfo": "rt_tgsigqueueinfo(1, ...), its thread form",
    "pidfd_open": "pidfd_open(1) hands pidfd_send_signal a handle on the supervisor",
}
"""Calls allowed only when their first argument (the target pid) is not 1, with the reason."""

AS_MISSING = "SCMP_ACT_TRACE"
"""The action of every rule that must answer ENOSYS ("no such call"), the call not run: moby's ``clone3`` rule.

``clone3`` takes its flags in a struct that seccomp cannot read, so moby answers it ENOSYS (``SCMP_ACT_ERRNO``
with ``errnoRet: 38``): glibc (2.34+) then falls back to ``clone``, whose flags the profile filters (no
namespace flags), and threads start. glibc falls back on ENOSYS only: on EPERM ``pthread_create`` fails ("can't
start new thread"; node aborts at start). Debian's runsc 0.0~20221219 ignores ``errnoRet`` and
``defaultErrnoRet`` and answers every ``SCMP_ACT_ERRNO`` with EPERM (newer gVisor honours them), so there no
thread could start. ``SCMP_ACT_TRACE`` instead hands the call to a ptrace tracer and, with none attached,
answers ENOSYS without running it: so the Linux kernel (seccomp(2)) and gVisor's sentry
(``pkg/sentry/kernel/seccomp.go``) alike, whatever ``errnoRet`` says. None can be attached: ``ptrace`` is in
:data:`NEVER`. This keeps one profile for both runtimes, and unlike allowing ``clone3`` under runsc (this gVisor
has no ``clone3`` and answers ENOSYS itself) it still holds the day gVisor implements ``clone3``.
``tests/integration/test_seccomp_engine.py`` pins both: ``clone3`` answers ENOSYS, threads start, no namespace
can be made."""

_NOT_INIT = [{"index": 0, "value": 1, "valueTwo": 0, "op": "SCMP_CMP_NE"}]

_ENOSYS = 38

_REFUSING = frozenset({"SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL_THREAD"})

_REFUSING_RULE = _REFUSING | {AS_MISSING}
"""What a rule may do with a call of :data:`NEVER`: refuse it, or (:data:`AS_MISSING`) answer ENOSYS."""


def derive(moby: Mapping[str, Any]) -> dict[str, Any]:
    """The gateway's profile from moby's default profile (a pure function of it)."""
    profile = copy.deepcopy(dict(moby))
    rules: list[dict[str, Any]] = []
    for rule in profile["syscalls"]:
        if rule.get("includes", {}).get("caps"):
            continue  # applies only with a capability the gateway never grants
        if rule["action"] == "SCMP_ACT_ALLOW":
            unconditional = not rule.get("args")
            rule["names"] = [n for n in rule["names"] if n not in NEVER and not (unconditional and n in AT_INIT)]
            if not rule["names"]:
                continue
        elif rule["action"] == "SCMP_ACT_ERRNO" and rule.get("errnoRet") == _ENOSYS:
            rule["action"] = AS_MISSING
            del rule["errnoRet"]
        rules.append(rule)
    rules.append({"names": sorted(AT_INIT), "action": "SCMP_ACT_ALLOW", "args": copy.deepcopy(_NOT_INIT)})
    profile["syscalls"] = rules
    problems = profile_problems(profile)
    if problems:
        raise ValueError("the derived profile is not safe: " + "; ".join(problems))
    return profile


def profile_problems(profile: Any) -> list[str]:
    """What makes ``profile`` unfit for a sandbox: a default that allows, or an allow rule for a call of
    :data:`NEVER`. Empty when it is fit. Used by the generator and by the options guard."""
    if not isinstance(profile, Mapping) or not isinstance(profile.get("syscalls"), list):
        return ["a seccomp profile must be a JSON object with a syscalls list"]
    problems: list[str] = []
    if profile.get("defaultAction") not in _REFUSING:
        problems.append(f"defaultAction {profile.get('defaultAction')!r} does not refuse unlisted calls")
    for index, rule in enumerate(profile["syscalls"]):
        if not isinstance(rule, Mapping):
            problems.append(f"syscalls[{index}] is not an object")
            continue
        if rule.get("action") in _REFUSING_RULE:
            continue
        names = rule.get("names") or ([rule["name"]] if "name" in rule else [])
        listed = sorted(set(names) & set(NEVER))
        if listed:
            problems.append(f"syscalls[{index}] ({rule.get('action')}) lets through {', '.join(listed)}")
        at_init = sorted(set(names) & set(AT_INIT))
        if at_init and rule.get("args") != _NOT_INIT:
            problems.append(f"syscalls[{index}] ({rule.get('action')}) lets {', '.join(at_init)} reach PID 1")
    return problems


def checked_profile(text: str) -> str:
    """``text`` (a seccomp profile's JSON) as the compact, key-sorted JSON given to the engine, once
    :func:`profile_problems` finds nothing wrong with it; raises :class:`ValueError` listing what it found."""
    profile = json.loads(text)
    problems = profile_problems(profile)
    if problems:
        raise ValueError("the seccomp profile is not fit for a sandbox: " + "; ".join(problems))
    return json.dumps(profile, separators=(",", ":"), sort_keys=True)


@cache
def gateway_profile() -> str:
    """The shipped profile as compact JSON: the value of ``security_opt: seccomp=...``.

    Checked when it is read (:func:`checked_profile`): a shipped file that lets a call of :data:`NEVER`
    through, or PID 1 be signalled, is refused here, so no decision is ever assembled with it. The options
    guard therefore knows exactly this text to be fit and parses only other inline profiles."""
    return checked_profile(resources.files(__package__).joinpath(PROFILE_FILE).read_text(encoding="utf-8"))


def profile_reference(profile: str) -> str:
    """How records and responses name an inline profile: ``gateway@sha256:<hex>`` for the shipped one,
    ``sha256:<hex>`` for any other; ``<hex>`` is the sha256 of ``profile`` exactly as given to the engine (for
    the shipped one, :func:`gateway_profile`: the compact, key-sorted JSON of ``gateway-seccomp.json``)."""
    if profile == gateway_profile():
        return _shipped_reference()
    return "sha256:" + hashlib.sha256(profile.encode("utf-8")).hexdigest()


@cache
def _shipped_reference() -> str:
    return "gateway@sha256:" + hashlib.sha256(gateway_profile().encode("utf-8")).hexdigest()

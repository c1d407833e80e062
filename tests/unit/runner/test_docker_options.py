"""Assembly produces exactly the hardened options; the guard refuses every unsafe variant."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.canonical import options_bytes
from gateway.errors import UnsafeOptionsError
from gateway.policy import Policy
from gateway.request import parse_request
from gateway.runner.docker.mounts import STAGING_ROOT
from gateway.runner.docker.options import (
    ASSEMBLED_OPTION_KEYS,
    CONTAINER_CONFIG_KEYS,
    DECISION_LABEL,
    HOST_CONFIG_KEYS,
    LABEL_PREFIX,
    MANAGED_LABEL,
    RUNNER_OPTION_KEYS,
    guard,
    recorded_options,
)
from gateway.runner.docker.seccomp import gateway_profile
from gateway.testing import assemble, decide

MiB = 1024**2


def test_exact_options_for_the_default_policy(default_policy: Policy) -> None:
    req = parse_request({"code": "print(2+2)", "env": {"APP_NAME": "value"}})
    options = assemble(default_policy, req, decision_id="d-1", request_id="r-1")
    assert options == {
        "image": "gateway/sandbox-python:3.11-bookworm",
        "user": "65534:65534",
        "working_dir": "/workspace",
        "network_mode": "none",
        "network_disabled": True,
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges", f"seccomp={gateway_profile()}"],
        "mem_limit": 256 * MiB,
        "memswap_limit": 256 * MiB,
        "nano_cpus": 1_000_000_000,
        "pids_limit": 64,
        "tmpfs": {
            "/tmp": "rw,noexec,nosuid,nodev,size=67108864",
            "/workspace": "rw,noexec,nosuid,nodev,size=67108864,uid=65534,gid=65534,mode=0700",
        },
        "ulimits": [
            {"name": "nofile", "soft": 256, "hard": 256},
            {"name": "core", "soft": 0, "hard": 0},
            {"name": "fsize", "soft": 67108864, "hard": 67108864},
        ],
        "init": False,
        "ipc_mode": "private",
        "cgroupns": "private",
        "hostname": "sandbox",
        "environment": {"APP_NAME": "value"},
        "runtime": "runc",
        "labels": {
            "io.agent-gateway.managed": "true",
            "io.agent-gateway.decision": "d-1",
            "io.agent-gateway.request": "r-1",
            "io.agent-gateway.policy": f"default@sha256:{default_policy.sha256}",
        },
    }
    guard(options)
    assert set(options) <= ASSEMBLED_OPTION_KEYS
    assert MANAGED_LABEL.startswith(LABEL_PREFIX)


def test_the_record_names_the_seccomp_profile_the_runner_receives_whole(default_policy: Policy) -> None:
    decision = decide(default_policy, parse_request({"code": "print(2+2)"}))
    assert decision.run is not None
    profile = f"seccomp={gateway_profile()}"
    assert list(decision.run.options["security_opt"]) == ["no-new-privileges", profile]  # what the engine gets
    recorded = decision.to_dict()["options"]
    digest = hashlib.sha256(gateway_profile().encode()).hexdigest()
    assert recorded["security_opt"] == ["no-new-privileges", f"seccomp=gateway@sha256:{digest}"]
    # An auditor who puts the shipped profile back gets the exact options the record's digest names.
    restored = {**recorded, "security_opt": ["no-new-privileges", profile]}
    assert hashlib.sha256(options_bytes(restored)).hexdigest() == decision.options_sha256
    assert {k: v for k, v in recorded.items() if k != "security_opt"} == {
        k: v for k, v in decision.run.options.items() if k != "security_opt"
    }


def test_recorded_options_name_any_other_inline_profile_by_its_digest_only() -> None:
    other = json.dumps({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []})
    options = {"security_opt": ["no-new-privileges", f"seccomp={other}", "seccomp=unconfined"]}
    digest = hashlib.sha256(other.encode()).hexdigest()
    assert recorded_options(options)["security_opt"] == [
        "no-new-privileges", f"seccomp=sha256:{digest}", "seccomp=unconfined",
    ]  # fmt: skip
    assert options["security_opt"][1] == f"seccomp={other}"  # a copy: the exact options are untouched


def test_requested_limits_flow_into_options(default_policy: Policy) -> None:
    req = parse_request({"code": "x", "limits": {"memory": "300m", "cpus": 0.5, "pids": 100, "tmpfs": "16m"}})
    o = assemble(default_policy, req, decision_id="d", request_id="r")
    assert (o["mem_limit"], o["memswap_limit"], o["nano_cpus"], o["pids_limit"]) == (
        300 * MiB,
        300 * MiB,
        500_000_000,
        100,
    )
    assert o["tmpfs"]["/tmp"].endswith(f"size={16 * MiB}")
    assert not any(u["name"] == "nproc" for u in o["ulimits"])  # pids_limit bounds processes, per container


@pytest.fixture
def safe(default_policy: Policy) -> dict[str, Any]:
    return assemble(default_policy, parse_request({"code": "x"}), decision_id="d", request_id="r")


UNSAFE: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("privileged", lambda o: o.update(privileged=True), "$.privileged"),
    ("privileged false is still not on the list", lambda o: o.update(privileged=False), "$.privileged"),
    ("cap_add", lambda o: o.update(cap_add=["SYS_ADMIN"]), "$.cap_add"),
    ("unknown key", lambda o: o.update(shm_size="1g"), "$.shm_size"),
    ("host network", lambda o: o.update(network_mode="host"), "$.network_mode"),
    ("container network", lambda o: o.update(network_mode="container:abc"), "$.network_mode"),
    ("missing network", lambda o: o.pop("network_mode"), "$.network_mode"),
    ("shared nproc ulimit", lambda o: o["ulimits"].append({"name": "nproc", "soft": 64, "hard": 64}), "$.ulimits"),
    ("network stack left on", lambda o: o.update(network_disabled=False), "$.network_disabled"),
    ("network stack flag dropped", lambda o: o.pop("network_disabled"), "$.network_disabled"),
    ("network_disabled not a bool", lambda o: o.update(network_disabled="yes"), "$.network_disabled"),
    ("host pid", lambda o: o.update(pid_mode="host"), "$.pid_mode"),
    ("host ipc", lambda o: o.update(ipc_mode="host"), "$.ipc_mode"),
    ("host uts", lambda o: o.update(uts_mode="host"), "$.uts_mode"),
    ("host userns", lambda o: o.update(userns_mode="host"), "$.userns_mode"),
    ("host cgroupns", lambda o: o.update(cgroupns="host"), "$.cgroupns"),
    ("devices", lambda o: o.update(devices=["/dev/sda:/dev/sda"]), "$.devices"),
    ("device requests", lambda o: o.update(device_requests=[{}]), "$.device_requests"),
    ("volumes_from", lambda o: o.update(volumes_from=["other"]), "$.volumes_from"),
    ("seccomp unconfined", lambda o: o["security_opt"].append("seccomp=unconfined"), "$.security_opt[2]"),
    ("seccomp unconfined colon", lambda o: o["security_opt"].append("seccomp:unconfined"), "$.security_opt[2]"),
    ("apparmor unconfined", lambda o: o["security_opt"].append("apparmor=unconfined"), "$.security_opt[2]"),
    ("label disable", lambda o: o["security_opt"].append("label=disable"), "$.security_opt[2]"),
    ("no-new-privileges missing", lambda o: o.update(security_opt=[]), "$.security_opt"),
    (
        "seccomp profile allowing ptrace",
        lambda o: o["security_opt"].__setitem__(1, _profile_allowing("ptrace")),
        "$.security_opt[1]",
    ),
    (
        "seccomp profile allowing io_uring",
        lambda o: o["security_opt"].__setitem__(1, _profile_allowing("io_uring_setup")),
        "$.security_opt[1]",
    ),
    (
        "seccomp default allow",
        lambda o: o["security_opt"].__setitem__(1, 'seccomp={"defaultAction":"SCMP_ACT_ALLOW","syscalls":[]}'),
        "$.security_opt[1]",
    ),
    ("seccomp file path", lambda o: o["security_opt"].__setitem__(1, "seccomp=/etc/profile.json"), "$.security_opt[1]"),
    ("two seccomp profiles", lambda o: o["security_opt"].append(o["security_opt"][1]), "$.security_opt"),
    ("docker-init as PID 1", lambda o: o.update(init=True), "$.init"),
    ("cap_drop without ALL", lambda o: o.update(cap_drop=["NET_RAW"]), "$.cap_drop"),
    ("read_only false", lambda o: o.update(read_only=False), "$.read_only"),
    ("read_only missing", lambda o: o.pop("read_only"), "$.read_only"),
    (
        "tmpfs exec",
        lambda o: o["tmpfs"].update({"/tmp": o["tmpfs"]["/tmp"].replace("noexec", "exec")}),
        "$.tmpfs['/tmp']",
    ),
    (
        "workspace suid",
        lambda o: o["tmpfs"].update({"/workspace": o["tmpfs"]["/workspace"].replace("nosuid,", "")}),
        "$.tmpfs['/workspace']",
    ),
    ("tmpfs dev", lambda o: o["tmpfs"].update({"/tmp": o["tmpfs"]["/tmp"].replace("nodev", "dev")}), "$.tmpfs['/tmp']"),
    ("no workspace tmpfs", lambda o: o["tmpfs"].pop("/workspace"), "$.tmpfs"),
    ("extra exec tmpfs", lambda o: o["tmpfs"].update({"/data": "rw,size=1024"}), "$.tmpfs['/data']"),
    ("user missing", lambda o: o.pop("user"), "$.user"),
    ("user root", lambda o: o.update(user="root"), "$.user"),
    ("uid 0", lambda o: o.update(user="0:65534"), "$.user"),
    ("gid 0", lambda o: o.update(user="65534:0"), "$.user"),
    ("swap allowed", lambda o: o.update(memswap_limit=-1), "$.memswap_limit"),
    ("missing mem_limit", lambda o: o.pop("mem_limit"), "$.mem_limit"),
    ("missing pids_limit", lambda o: o.pop("pids_limit"), "$.pids_limit"),
    ("unlimited pids", lambda o: o.update(pids_limit=-1), "$.pids_limit"),
    ("missing nano_cpus", lambda o: o.pop("nano_cpus"), "$.nano_cpus"),
    ("tmpfs without size", lambda o: o["tmpfs"].update({"/tmp": "rw,noexec"}), "$.tmpfs['/tmp']"),
    (
        "docker socket volume",
        lambda o: o.update(volumes={"/var/run/docker.sock": {"bind": "/data", "mode": "ro"}}),
        None,
    ),
    ("containerd socket list", lambda o: o.update(volumes=["/run/containerd/containerd.sock:/data:ro"]), None),
    ("etc volume", lambda o: o.update(volumes={"/etc": {"bind": "/data", "mode": "ro"}}), None),
    ("volume without mode", lambda o: o.update(volumes={"/srv/x": {"bind": "/data"}}), None),
    ("volume list without mode", lambda o: o.update(volumes=["/srv/x:/data"]), None),
    ("volume onto /etc", lambda o: o.update(volumes={"/srv/x": {"bind": "/etc", "mode": "ro"}}), None),
    ("named volume", lambda o: o.update(volumes={"myvol": {"bind": "/data", "mode": "rw"}}), None),
    ("unknown runtime", lambda o: o.update(runtime="nvidia"), "$.runtime"),
    ("unlabelled", lambda o: o["labels"].pop(MANAGED_LABEL), "$.labels"),
]


def _profile_allowing(name: str) -> str:
    profile = json.loads(gateway_profile())
    profile["syscalls"].append({"names": [name], "action": "SCMP_ACT_ALLOW"})
    return "seccomp=" + json.dumps(profile)


def _shipped_form(profile: dict[str, Any]) -> str:
    """``profile`` written exactly as the shipped one is given to the engine (compact, keys sorted)."""
    return "seccomp=" + json.dumps(profile, separators=(",", ":"), sort_keys=True)


def _tampered_in_place(profile: dict[str, Any]) -> None:
    """ptrace slipped into the first allow rule: the same form and nearly the same bytes as the shipped text."""
    rule = next(r for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args"))
    rule["names"] = sorted([*rule["names"], "ptrace"])


@pytest.mark.parametrize(
    ("case", "tamper", "found"),
    [
        ("ptrace added to an allow rule", _tampered_in_place, "lets through ptrace"),
        ("default action allows", lambda p: p.update(defaultAction="SCMP_ACT_ALLOW"), "does not refuse"),
        ("kill of PID 1", lambda p: p["syscalls"].append({"names": ["kill"], "action": "SCMP_ACT_ALLOW"}), "PID 1"),
    ],
)
def test_guard_refuses_a_tampered_copy_of_the_shipped_profile(
    safe: dict[str, Any], case: str, tamper: Callable[[dict[str, Any]], None], found: str
) -> None:
    # The guard knows the shipped profile's exact text to be fit (checked when read) and parses every other
    # inline profile: one written in the very same form with one rule changed is refused.
    profile = json.loads(gateway_profile())
    tamper(profile)
    options = copy.deepcopy(safe)
    options["security_opt"][1] = _shipped_form(profile)
    assert options["security_opt"][1] != f"seccomp={gateway_profile()}", case
    with pytest.raises(UnsafeOptionsError) as info:
        guard(options)
    messages = [p.message for p in info.value.problems if p.path == "$.security_opt[1]"]
    assert messages, case
    assert all(m.startswith("seccomp profile refused:") for m in messages), messages
    assert any(found in m for m in messages), messages
    untouched = copy.deepcopy(safe)
    untouched["security_opt"][1] = _shipped_form(json.loads(gateway_profile()))
    guard(untouched)  # the shipped profile re-serialised the same way is the same text: accepted


@pytest.mark.parametrize(("case", "mutate", "path"), UNSAFE, ids=[u[0] for u in UNSAFE])
def test_guard_refuses(
    safe: dict[str, Any], case: str, mutate: Callable[[dict[str, Any]], None], path: str | None
) -> None:
    options = copy.deepcopy(safe)
    mutate(options)
    with pytest.raises(UnsafeOptionsError) as info:
        guard(options)
    assert info.value.problems, case
    if path is not None:
        assert path in {p.path for p in info.value.problems}


@pytest.mark.parametrize("key", sorted(RUNNER_OPTION_KEYS))
def test_guard_refuses_the_runners_own_keys_in_assembled_options(safe: dict[str, Any], key: str) -> None:
    # One list of runner-owned keys: the runner adds them after the guard; an assembler never may.
    with pytest.raises(UnsafeOptionsError) as info:
        guard(dict(safe, **{key: ["sh"]}))
    assert [p.path for p in info.value.problems] == [f"$.{key}"]
    assert "runner's own key" in info.value.problems[0].message


def test_guard_reports_every_problem(safe: dict[str, Any]) -> None:
    options = dict(safe, privileged=True, network_mode="host", read_only=False, user="root")
    with pytest.raises(UnsafeOptionsError) as info:
        guard(options)
    assert {p.path for p in info.value.problems} >= {"$.privileged", "$.network_mode", "$.read_only", "$.user"}


def _staged(safe: dict[str, Any], **change: Any) -> dict[str, Any]:
    decision = safe["labels"][DECISION_LABEL]
    mount = {
        "Type": "bind",
        "Source": f"{STAGING_ROOT}/{decision}/0",
        "Target": "/data",
        "ReadOnly": True,
        "BindOptions": {"NonRecursive": True, "Propagation": "rprivate"},
    }
    mount.update(change)
    return dict(safe, mounts=[{k: v for k, v in mount.items() if v is not None}])


def test_guard_accepts_a_staged_non_recursive_bind(safe: dict[str, Any]) -> None:
    guard(_staged(safe))


MOUNT_UNSAFE: list[tuple[str, dict[str, Any]]] = [
    ("host path as source", {"Source": "/srv/data"}),
    ("another run's staging path", {"Source": f"{STAGING_ROOT}/other-decision/0"}),
    ("wrong index", {"Source": f"{STAGING_ROOT}/d/1"}),
    ("recursive bind", {"BindOptions": {"Propagation": "rprivate"}}),
    ("shared propagation", {"BindOptions": {"NonRecursive": True, "Propagation": "rshared"}}),
    ("volume type", {"Type": "volume"}),
    ("ReadOnly not a bool", {"ReadOnly": "yes"}),
    ("ReadOnly missing", {"ReadOnly": None}),
    ("onto /etc", {"Target": "/etc"}),
    ("onto the workspace", {"Target": "/workspace/x"}),
    ("extra key", {"VolumeOptions": {}}),
]


@pytest.mark.parametrize(("case", "change"), MOUNT_UNSAFE, ids=[m[0] for m in MOUNT_UNSAFE])
def test_guard_refuses_every_mount_but_this_runs_staged_non_recursive_binds(
    safe: dict[str, Any], case: str, change: dict[str, Any]
) -> None:
    with pytest.raises(UnsafeOptionsError) as info:
        guard(_staged(safe, **change))
    assert [p.path for p in info.value.problems] == ["$.mounts[0]"], case


def test_guard_refuses_two_mounts_on_one_target(safe: dict[str, Any]) -> None:
    options = _staged(safe)
    second = dict(options["mounts"][0], Source=options["mounts"][0]["Source"][:-1] + "1")
    options["mounts"].append(second)
    with pytest.raises(UnsafeOptionsError, match="refused"):
        guard(options)


# --- property: nothing an arbitrary request asks for yields options the guard refuses -------------------

_size = st.one_of(st.integers(min_value=0, max_value=2**40), st.sampled_from(["1m", "6m", "64m", "256m", "512m", "1g"]))
_requests = st.fixed_dictionaries(
    {"code": st.text(min_size=1, max_size=50)},
    optional={
        "image": st.sampled_from(["gateway/sandbox-python:3.11-bookworm", "python:3", "gateway/sandbox-python"]),
        "limits": st.fixed_dictionaries(
            {},
            optional={
                "memory": _size,
                "cpus": st.floats(min_value=0.001, max_value=1024),
                "pids": st.integers(min_value=1, max_value=1_000_000),
                "timeout_s": st.floats(min_value=0.001, max_value=86400),
                "output_bytes": _size,
                "tmpfs": _size,
            },
        ),
        "network": st.sampled_from(["none", "host", "bridge", "container:x", "sandbox-net"]),
        "runtime": st.sampled_from(["runc", "runsc", "kata"]),
        "env": st.dictionaries(
            st.sampled_from(["APP_X", "LANG", "LD_PRELOAD", "PYTHONPATH", "PATH", "X"]),
            st.text(max_size=20),
            max_size=4,
        ),
        "files": st.dictionaries(
            st.sampled_from(["a.txt", "../x", "d/e.py", "/abs"]), st.text(max_size=20), max_size=3
        ),
        "mounts": st.lists(
            st.fixed_dictionaries(
                {
                    "source": st.sampled_from(["/srv/agent-data", "/var/run/docker.sock", "/etc", "/", "/tmp"]),
                    "target": st.sampled_from(["/data", "/etc", "/workspace", "/data/x", "/"]),
                },
                optional={"mode": st.sampled_from(["ro", "rw"])},
            ),
            max_size=3,
        ),
    },
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=_requests, which=st.sampled_from(["default", "strict", "mounts"]))
def test_allowed_decisions_always_pass_the_guard(  # noqa: PLR0917 - fixtures plus hypothesis arguments
    default_policy: Policy,
    strict_policy: Policy,
    mount_policy: Policy,
    data_root: Path,
    doc: dict[str, Any],
    which: str,
) -> None:
    policy = {"default": default_policy, "strict": strict_policy, "mounts": mount_policy}[which]
    for m in doc.get("mounts", []):
        if m["source"] == "/srv/agent-data":
            m["source"] = str(data_root)
    decision = decide(policy, parse_request(doc))
    if decision.allowed:
        guard(decision.options or {})
        assert decision.violations == ()
    else:
        assert decision.options is None
        assert decision.violations


def test_assembled_keys_are_real_docker_py_arguments() -> None:
    from docker.models.containers import RUN_CREATE_KWARGS, RUN_HOST_CONFIG_KWARGS

    known = set(RUN_CREATE_KWARGS) | set(RUN_HOST_CONFIG_KWARGS) | {"image", "command", "volumes", "network_mode"}
    assert known >= ASSEMBLED_OPTION_KEYS
    # Our two allow-lists sort the keys exactly as docker-py's own do.
    assert set(RUN_CREATE_KWARGS) | {"image"} >= CONTAINER_CONFIG_KEYS
    assert set(RUN_HOST_CONFIG_KWARGS) | {"volumes", "network_mode"} >= HOST_CONFIG_KEYS
    assert not CONTAINER_CONFIG_KEYS & HOST_CONFIG_KEYS

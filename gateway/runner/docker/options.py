"""Docker run options: built from resolved settings by the backend's assembler, re-checked by its guard.

:class:`DockerAssembler` is what the Gateway hands the decision: ``build`` turns the decision's
:class:`~gateway.decision.SandboxSettings` into docker-py ``containers.create`` keyword arguments, using only
names from two explicit allow-lists (container config and host config, as docker-py sorts them) with the
hardened baseline always on; ``guard`` re-checks *any* options dict against the invariants, so a bug in a rule
can never produce an unsafe container. The runner calls the guard again right before it creates a container.

The options are built in two parts: :func:`profile_options`, everything that depends only on the sandbox
profile (policy, image, runtime, limits: what a warm pool can prepare ahead of a request), and
:func:`run_options`, what belongs to one run (environment, mounts, the labels that name the request).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gateway.canonical import options_bytes
from gateway.decision.model import copy_json
from gateway.decision.settings import BackendLimits, SandboxProfile, SandboxSettings
from gateway.errors import Problem, UnsafeOptionsError
from gateway.policy.model import EGRESS
from gateway.policy.paths import target_problem
from gateway.runner.docker.mounts import STAGING_ROOT, engine_mounts
from gateway.runner.docker.seccomp import gateway_profile, profile_problems, profile_reference
from gateway.runner.supervisor import INTERPRETERS, WORKSPACE

__all__ = [
    "ASSEMBLED_OPTION_KEYS",
    "CONTAINER_CONFIG_KEYS",
    "DEADLINE_LABEL",
    "DECISION_LABEL",
    "EGRESS_LABEL",
    "HOST_CONFIG_KEYS",
    "INSTANCE_LABEL",
    "INTERPRETER_LABEL",
    "LABEL_PREFIX",
    "MANAGED_LABEL",
    "POLICY_LABEL",
    "POOL_LABEL",
    "REQUEST_LABEL",
    "RUNNER_OPTION_KEYS",
    "RUN_LABELS",
    "RUN_OPTION_KEYS",
    "SANDBOX_HOSTNAME",
    "DockerAssembler",
    "build_options",
    "guard",
    "pool_key",
    "profile_options",
    "profile_part",
    "recorded_options",
    "run_options",
    "security_options",
]

LABEL_PREFIX = "io.agent-gateway."
MANAGED_LABEL = "io.agent-gateway.managed"
DECISION_LABEL = "io.agent-gateway.decision"
REQUEST_LABEL = "io.agent-gateway.request"
POLICY_LABEL = "io.agent-gateway.policy"
INSTANCE_LABEL = "io.agent-gateway.instance"
"""The gateway instance (runner) that created the container: ``gateway reap`` removes its own by default."""
DEADLINE_LABEL = "io.agent-gateway.deadline"
"""Unix time (seconds) after which the container is expired whoever created it: any reaper may remove it."""
INTERPRETER_LABEL = "io.agent-gateway.interpreter"
"""The interpreter the container's supervisor starts ahead (``SandboxProfile.interpreter``), when not ``python``:
part of the profile's options, so a pooled container serves only requests of its language."""
POOL_LABEL = "io.agent-gateway.pool"
"""On a warm pool's container: the digest of the profile options it was created with (:func:`pool_key`)."""
EGRESS_LABEL = "io.agent-gateway.egress"
"""On the options of a run the decision allowed network ``egress``: it has no network (``network_mode: none``)
and reaches its hosts through the run's own proxy, whose directory the runner binds at ``EGRESS_TARGET``
(``gateway.runner.docker.egress``); the runner refuses these options without the run's egress plan."""
SANDBOX_HOSTNAME = "sandbox"
_TMPFS_FLAGS = "rw,noexec,nosuid,nodev"
_TMPFS_REQUIRED_FLAGS = ("noexec", "nosuid", "nodev")
_TMPFS_FORBIDDEN_FLAGS = frozenset({"exec", "suid", "dev"})
_TMPFS_TARGETS = ("/tmp", WORKSPACE)  # noqa: S108 - container paths

CONTAINER_CONFIG_KEYS: frozenset[str] = frozenset(
    {"image", "user", "working_dir", "environment", "labels", "hostname", "network_disabled"}
)
"""Assembled keys that go to ``create_container`` itself."""
HOST_CONFIG_KEYS: frozenset[str] = frozenset(
    {
        "network_mode",
        "read_only",
        "cap_drop",
        "security_opt",
        "mem_limit",
        "memswap_limit",
        "nano_cpus",
        "pids_limit",
        "tmpfs",
        "ulimits",
        "init",
        "ipc_mode",
        "cgroupns",
        "mounts",
        "runtime",
    }
)
"""Assembled keys that go to ``create_host_config``."""
ASSEMBLED_OPTION_KEYS: frozenset[str] = CONTAINER_CONFIG_KEYS | HOST_CONFIG_KEYS
"""Every key the assembler may produce, and the only keys the guard lets through."""

RUNNER_OPTION_KEYS: frozenset[str] = frozenset(
    {"command", "entrypoint", "stdin_open", "stdin_once", "detach", "tty", "log_config", "auto_remove"}
)
"""Keys the runner adds itself (how the payload gets in, where logs go). Assembled options never contain them:
the guard refuses them there. ``log_config`` is ``none``: output travels only through the attached, capped
stream, never into an uncapped engine log on the host disk. ``auto_remove``: a container that ends while no
gateway is there to remove it (the supervisor's own deadline, or the gateway gone) is removed by the engine."""

_FORBIDDEN_KEYS: Mapping[str, str] = {
    "privileged": "privileged containers are never allowed",
    "cap_add": "adding capabilities is never allowed",
    "devices": "host devices are never passed in",
    "device_requests": "device requests (GPUs, ...) are never allowed",
    "device_cgroup_rules": "device cgroup rules are never allowed",
    "volumes_from": "volumes_from would import another container's mounts",
    "pid_mode": "the host (or another container's) pid namespace is never shared",
    "uts_mode": "the host uts namespace is never shared",
    "userns_mode": "the host user namespace is never used",
    "volumes": "host paths are never bound directly: judged mounts are staged and given as non-recursive mounts",
    "binds": "host paths are never bound directly: judged mounts are staged and given as non-recursive mounts",
    "network": "networks are only set through network_mode",
    "sysctls": "sysctls are never set by a request",
    "oom_kill_disable": "the OOM killer is never disabled",
    "links": "links to other containers are never allowed",
    "extra_hosts": "extra hosts are never injected",
    "cgroup_parent": "the cgroup parent is never overridden",
}
_UNSAFE_SECURITY_OPTS = frozenset(
    {"seccomp:unconfined", "apparmor:unconfined", "label:disable", "systempaths:unconfined", "no-new-privileges:false"}
)
_NO_NEW_PRIVS = frozenset({"no-new-privileges", "no-new-privileges:true"})
_LIST_OR_TUPLE = (list, tuple)


def profile_options(profile: SandboxProfile) -> dict[str, Any]:
    """The options that depend only on the sandbox profile: identical for every run of that profile."""
    options: dict[str, Any] = {
        "image": profile.image,
        "user": f"{profile.uid}:{profile.gid}",
        "working_dir": WORKSPACE,
        "network_mode": profile.network,
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": security_options(profile.seccomp),
        "mem_limit": profile.memory,
        "memswap_limit": profile.memory,
        "nano_cpus": round(profile.cpus * 1_000_000_000),
        "pids_limit": profile.pids,
        "tmpfs": {
            "/tmp": f"{_TMPFS_FLAGS},size={profile.tmpfs}",  # noqa: S108 - the container's own tmpfs
            WORKSPACE: f"{_TMPFS_FLAGS},size={profile.tmpfs},uid={profile.uid},gid={profile.gid},mode=0700",
        },
        # No nproc ulimit: RLIMIT_NPROC counts every process of the uid on the host, so all sandboxes (same
        # uid, no user namespace) would share one count and one fork bomb would stop the others from
        # forking. The per-container pids cgroup limit (pids_limit) is the bound.
        "ulimits": [
            {"name": "nofile", "soft": profile.nofile, "hard": profile.nofile},
            {"name": "core", "soft": 0, "hard": 0},
            {"name": "fsize", "soft": profile.tmpfs, "hard": profile.tmpfs},
        ],
        # No docker-init: the supervisor is the container's PID 1, which the program (same uid) can neither
        # signal nor, being non-dumpable, trace. docker-init as PID 1 was dumpable: the program could
        # ptrace-stop it and freeze the container, and read its environment.
        "init": False,
        "ipc_mode": "private",
        "cgroupns": "private",
        "hostname": SANDBOX_HOSTNAME,
        "runtime": profile.runtime,
        "labels": {MANAGED_LABEL: "true", POLICY_LABEL: profile.policy},
    }
    if profile.interpreter != "python" and profile.interpreter in INTERPRETERS:
        # (A language no sandbox runs, which no loaded policy allows, keeps Python's: the payload refuses it.)
        options["labels"][INTERPRETER_LABEL] = profile.interpreter
    if profile.network == EGRESS:
        # Egress goes through the gateway's proxy only: the sandbox itself keeps no network but loopback.
        options["network_mode"] = "none"
        options["labels"][EGRESS_LABEL] = "proxy"
    if options["network_mode"] == "none":
        # No network stack wiring at all (still a private namespace with only lo). Besides removing the
        # engine's network set-up from the attack surface, it makes container start about 2x faster here.
        options["network_disabled"] = True
    return options


def security_options(seccomp: str) -> list[str]:
    """``no-new-privileges`` and, for ``seccomp: gateway``, the gateway's profile (the engine applies its own
    default profile when none is given)."""
    if seccomp == "gateway":
        return ["no-new-privileges", f"seccomp={gateway_profile()}"]
    if seccomp == "engine-default":
        return ["no-new-privileges"]
    raise UnsafeOptionsError(f"unknown seccomp setting {seccomp!r}: expected gateway or engine-default")


def recorded_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as decision records and responses show them: a copy in which an inline seccomp profile
    (``seccomp=<JSON>``) is named by its digest (``seccomp=gateway@sha256:<hex>``, see
    :func:`~gateway.runner.docker.seccomp.profile_reference`). Everything else is unchanged, so putting the
    profile back gives the exact options again, whose canonical digest is the record's ``options_sha256``."""
    out: dict[str, Any] = copy_json(dict(options))
    opts = out.get("security_opt")
    if isinstance(opts, list):
        out["security_opt"] = [_named_profile(opt) for opt in opts]
    return out


def _named_profile(opt: Any) -> Any:
    if isinstance(opt, str) and opt.startswith("seccomp=") and opt[len("seccomp=") :].lstrip().startswith("{"):
        return "seccomp=" + profile_reference(opt[len("seccomp=") :])
    return opt


def run_options(settings: SandboxSettings, *, decision_id: str, request_id: str) -> dict[str, Any]:
    """The options that belong to one run: its environment, its mounts and the labels that name it."""
    options: dict[str, Any] = {
        "environment": dict(settings.env),
        "labels": {DECISION_LABEL: decision_id, REQUEST_LABEL: request_id},
    }
    if settings.mounts:
        # Never the host path: the runner binds the judged directory at the staging path (see ``mounts.py``).
        options["mounts"] = engine_mounts([(m.target, m.mode == "ro") for m in settings.mounts], decision_id)
    return options


RUN_OPTION_KEYS: frozenset[str] = frozenset({"environment", "mounts"})
"""The keys :func:`run_options` adds: what belongs to one run and is never in a pooled container."""
RUN_LABELS: frozenset[str] = frozenset({DECISION_LABEL, REQUEST_LABEL})
"""The labels that name one run (:func:`run_options`): a pooled container is created without them."""


def profile_part(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` without what :func:`run_options` adds: for a decision's options, exactly
    ``profile_options`` of its profile. A warm pool's claim compares this with what its container was made
    with."""
    out = {k: v for k, v in options.items() if k not in RUN_OPTION_KEYS}
    out["labels"] = {k: v for k, v in dict(options.get("labels") or {}).items() if k not in RUN_LABELS}
    return out


def pool_key(profile: SandboxProfile) -> str:
    """The sha256 of a profile's options in canonical JSON: names a warm pool and labels its containers."""
    return hashlib.sha256(options_bytes(profile_options(profile))).hexdigest()


def build_options(settings: SandboxSettings, *, decision_id: str, request_id: str) -> dict[str, Any]:
    """The ``containers.create`` keyword arguments for ``settings``: the profile's plus the run's."""
    options = profile_options(settings.profile)
    run = run_options(settings, decision_id=decision_id, request_id=request_id)
    options["labels"] = {**options["labels"], **run.pop("labels")}
    options.update(run)
    leftovers = set(options) - ASSEMBLED_OPTION_KEYS
    if leftovers:  # a programming error; the guard would refuse it too
        raise UnsafeOptionsError(f"assembly produced keys outside the allow-list: {sorted(leftovers)}")
    return options


class DockerAssembler:
    """The Docker backend's assembler: what the Gateway hands the decision (see ``gateway.decision.Assembler``)."""

    backend = "docker"

    RETRY_S = 5.0
    """Without an answer, the engine is asked again at most this often: a dry run while the engine is down
    must not pay for a failed connection each time (nothing runs then anyway)."""

    def __init__(
        self, capacity: Callable[[], BackendLimits] | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._capacity = capacity
        self._clock = clock
        self._limits: BackendLimits | None = None
        self._next_ask = float("-inf")

    @property
    def limits(self) -> BackendLimits:
        """What the engine can give one container (its host's CPUs), asked once; unknown without an engine
        (judged on the policy alone), and asked again after :attr:`RETRY_S`: the engine may be up by then."""
        if self._limits is not None:
            return self._limits
        now = self._clock()
        if self._capacity is None or now < self._next_ask:
            return BackendLimits()
        found = self._capacity()
        if found.max_cpus is None:
            self._next_ask = now + self.RETRY_S
            return found
        self._limits = found
        return found

    def build(self, settings: SandboxSettings, *, decision_id: str, request_id: str) -> dict[str, Any]:
        return build_options(settings, decision_id=decision_id, request_id=request_id)

    def guard(self, options: Mapping[str, Any], *, denied_paths: Sequence[str] = ()) -> None:
        guard(options, denied_paths=denied_paths)

    def recorded(self, options: Mapping[str, Any]) -> dict[str, Any]:
        return recorded_options(options)


# --- the invariant guard --------------------------------------------------------------------------------
#
# Each check is a small generator of (path, message) for one invariant; the guard runs them all and reports
# every problem. ``_Checks`` is the registry, in the order problems are reported.

_Issues = Iterable[tuple[str, str]]


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _check_keys(options: Mapping[str, Any]) -> _Issues:
    for key in options:
        if key in _FORBIDDEN_KEYS:
            yield f"$.{key}", _FORBIDDEN_KEYS[key]
        elif key in RUNNER_OPTION_KEYS:
            yield f"$.{key}", f"{key!r} is the runner's own key; assembled options never set it"
        elif key not in ASSEMBLED_OPTION_KEYS:
            yield f"$.{key}", f"{key!r} is not on the allow-list of docker-py arguments"


def _check_image(options: Mapping[str, Any]) -> _Issues:
    image = options.get("image")
    if not isinstance(image, str) or not image:
        yield "$.image", "image is missing"


def _check_network(options: Mapping[str, Any]) -> _Issues:
    network = options.get("network_mode")
    if not isinstance(network, str) or not network:
        yield "$.network_mode", "network_mode must be set explicitly (Docker's default is a bridge)"
    elif network == "host" or network.startswith("container:"):
        yield "$.network_mode", f"network_mode {network!r} is never allowed"
    disabled = options.get("network_disabled", False)
    if not isinstance(disabled, bool):
        yield "$.network_disabled", "network_disabled must be a boolean"
    elif network == "none" and disabled is not True:
        yield "$.network_disabled", "a container without network must also have its network stack disabled"


def _check_privileges(options: Mapping[str, Any]) -> _Issues:
    if options.get("read_only") is not True:
        yield "$.read_only", "the root filesystem must be read-only"
    cap_drop = options.get("cap_drop")
    if not isinstance(cap_drop, _LIST_OR_TUPLE) or "ALL" not in [str(c).upper() for c in cap_drop]:
        yield "$.cap_drop", "cap_drop must include ALL"
    security_opt = options.get("security_opt")
    if not isinstance(security_opt, _LIST_OR_TUPLE):
        yield "$.security_opt", "security_opt must be a list including no-new-privileges"
        return
    normal = [_security_opt_head(o) for o in security_opt]
    if _NO_NEW_PRIVS.isdisjoint(normal):
        yield "$.security_opt", "no-new-privileges is missing"
    for index, opt in enumerate(normal):
        if opt in _UNSAFE_SECURITY_OPTS:
            yield f"$.security_opt[{index}]", f"{_short(security_opt[index])!r} disables a kernel protection"
        elif opt.startswith("seccomp:"):
            yield from _check_seccomp(
                f"$.security_opt[{index}]", str(security_opt[index]).strip()[len("seccomp") + 1 :]
            )
    if sum(opt.startswith("seccomp:") for opt in normal) > 1:
        yield "$.security_opt", "at most one seccomp profile"


def _security_opt_head(opt: object) -> str:
    """``key:value`` lower-cased for the short options; a seccomp profile's JSON is kept as it is."""
    text = str(opt).strip()
    key, _, value = text.replace("=", ":", 1).partition(":")
    if key.lower() == "seccomp" and value.strip().lower() not in ("unconfined", ""):
        return "seccomp:" + value
    return text.lower().replace("=", ":")


def _short(opt: object) -> str:
    text = str(opt)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_seccomp(where: str, value: str) -> _Issues:
    """A seccomp profile given inline must be one that refuses by default and lets none of the calls a
    sandbox never needs through (the gateway's own profile passes; a path or anything else does not).

    The gateway's own profile, byte for byte, was checked when it was read (``gateway_profile``); any other
    text, a single byte changed included, is parsed and checked in full here."""
    if value == gateway_profile():
        return
    try:
        profile = json.loads(value)
    except ValueError:
        yield where, "seccomp must be an inline JSON profile (the engine's API takes no file path)"
        return
    for problem in profile_problems(profile):
        yield where, f"seccomp profile refused: {problem}"


def _check_user(options: Mapping[str, Any]) -> _Issues:
    user = options.get("user")
    parts = user.split(":") if isinstance(user, str) else []
    if len(parts) != 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        yield "$.user", f"user must be numeric 'uid:gid', got {user!r}"
    elif int(parts[0]) == 0 or int(parts[1]) == 0:
        yield "$.user", f"user {user!r} is root (uid or gid 0)"


def _check_limits(options: Mapping[str, Any]) -> _Issues:
    mem = options.get("mem_limit")
    if not _is_positive_int(mem):
        yield "$.mem_limit", "mem_limit must be a positive number of bytes"
    elif options.get("memswap_limit") != mem:
        yield "$.memswap_limit", "memswap_limit must equal mem_limit (no swap)"
    if not _is_positive_int(options.get("pids_limit")):
        yield "$.pids_limit", "pids_limit must be a positive integer"
    if not _is_positive_int(options.get("nano_cpus")):
        yield "$.nano_cpus", "nano_cpus must be a positive integer"
    ulimits = options.get("ulimits", [])
    if isinstance(ulimits, list) and any(isinstance(u, Mapping) and u.get("name") == "nproc" for u in ulimits):
        yield "$.ulimits", "an nproc ulimit is shared by every sandbox of the uid: one sandbox could starve the others"


def _check_init(options: Mapping[str, Any]) -> _Issues:
    if options.get("init", False) is not False:
        yield "$.init", "init must be false: the supervisor is the container's PID 1 (a separate init is traceable)"


def _check_namespaces(options: Mapping[str, Any]) -> _Issues:
    if "ipc_mode" in options and options["ipc_mode"] not in ("private", "none"):
        yield "$.ipc_mode", f"ipc_mode {options['ipc_mode']!r} is not allowed (only private, none)"
    if "cgroupns" in options and options["cgroupns"] != "private":
        yield "$.cgroupns", f"cgroupns {options['cgroupns']!r} is not allowed (only private)"
    if "runtime" in options and options["runtime"] not in ("runc", "runsc"):
        yield "$.runtime", f"runtime {options['runtime']!r} is not runc or runsc"


def _tmpfs_size(opts: object) -> int | None:
    """The one ``size=`` option of a tmpfs option string, in bytes, or None unless there is exactly one."""
    sizes = [part[len("size=") :] for part in str(opts).split(",") if part.startswith("size=")]
    if len(sizes) != 1 or not sizes[0].isdigit():
        return None
    return int(sizes[0])


def _check_tmpfs(options: Mapping[str, Any]) -> _Issues:
    tmpfs = options.get("tmpfs", {})
    if not isinstance(tmpfs, Mapping):
        yield "$.tmpfs", "tmpfs must be a mapping of path to options"
        return
    for target, opts in tmpfs.items():
        size = _tmpfs_size(opts)
        if size is None or size <= 0:
            yield f"$.tmpfs[{target!r}]", "every tmpfs needs a positive size= in bytes"
        flags = set(str(opts).split(","))
        for flag in _TMPFS_REQUIRED_FLAGS:
            if flag not in flags:
                yield f"$.tmpfs[{target!r}]", f"every tmpfs must be mounted {flag} (nothing written there runs)"
        for flag in sorted(flags & _TMPFS_FORBIDDEN_FLAGS):
            yield f"$.tmpfs[{target!r}]", f"tmpfs option {flag!r} would undo {'no' + flag}"
    for needed in _TMPFS_TARGETS:
        if needed not in tmpfs:
            yield "$.tmpfs", f"{needed} must be a size-capped tmpfs (the root filesystem is read-only)"


def _check_labels(options: Mapping[str, Any]) -> _Issues:
    labels = options.get("labels")
    if not isinstance(labels, Mapping) or labels.get(MANAGED_LABEL) != "true":
        yield "$.labels", f"the {MANAGED_LABEL} label is missing"
    elif labels.get(INTERPRETER_LABEL, "python") not in INTERPRETERS:
        yield "$.labels", f"the {INTERPRETER_LABEL} label names no interpreter (expected one of {INTERPRETERS})"
    elif EGRESS_LABEL in labels and (labels[EGRESS_LABEL] != "proxy" or options.get("network_mode") != "none"):
        yield "$.labels", f"the {EGRESS_LABEL} label is for a sandbox without network (network_mode none) only"


_MOUNT_KEYS = frozenset({"Type", "Source", "Target", "ReadOnly", "BindOptions"})
_BIND_OPTIONS = {"NonRecursive": True, "Propagation": "rprivate"}


def _check_mounts(options: Mapping[str, Any]) -> _Issues:
    """Every mount is a non-recursive, private bind of this run's own staging path, onto an allowed target."""
    if "mounts" not in options:
        return
    mounts = options["mounts"]
    if not isinstance(mounts, list):
        yield "$.mounts", "mounts must be a list"
        return
    labels = options.get("labels")
    decision = labels.get(DECISION_LABEL) if isinstance(labels, Mapping) else None
    seen: set[str] = set()
    for index, m in enumerate(mounts):
        where = f"$.mounts[{index}]"
        if not isinstance(m, Mapping) or set(m) != _MOUNT_KEYS:
            yield where, f"a mount must have exactly the keys {sorted(_MOUNT_KEYS)}"
            continue
        if m["Type"] != "bind":
            yield where, f"mount type {m['Type']!r} is not allowed (only bind)"
        if m["BindOptions"] != _BIND_OPTIONS:
            yield where, f"bind options must be {_BIND_OPTIONS} (non-recursive: no submount comes along)"
        if not isinstance(m["ReadOnly"], bool):
            yield where, "ReadOnly must be a boolean"
        expected = f"{STAGING_ROOT}/{decision}/{index}"
        if not isinstance(decision, str) or m["Source"] != expected:
            yield where, f"mount source {m['Source']!r} is not this run's staging path {expected!r}"
        target = m["Target"]
        problem = target_problem(target) if isinstance(target, str) else "mount target must be a string"
        if problem is None and target in seen:
            problem = f"target {target} is used by more than one mount"
        if problem is not None:
            yield where, problem
        seen.add(str(target))


_CHECKS = (
    _check_keys,
    _check_image,
    _check_network,
    _check_privileges,
    _check_user,
    _check_limits,
    _check_init,
    _check_namespaces,
    _check_tmpfs,
    _check_labels,
    _check_mounts,
)


def guard(options: Mapping[str, Any], *, denied_paths: Sequence[str] = ()) -> None:
    """Refuse ``options`` (raise :class:`UnsafeOptionsError` listing every problem) unless all invariants hold.

    No assembled mount may be below ``/run`` (``target_problem``), so none at ``EGRESS_TARGET``: the runner binds a
    run's egress directory there itself, after this guard, and checks the started container has exactly that
    directory there (``gateway.runner.docker.egress``).

    ``denied_paths`` (deployment paths such as the audit sink's directory) needs no check here any more: no
    host path reaches the options, only this run's staging paths (``_check_mounts``); the judged host paths
    are checked by the decision's ``mounts.*`` rules and again, on the opened directory, when staged.
    """
    issues = [issue for check in _CHECKS for issue in check(options)]
    if issues:
        problems = [Problem(message, path=path, code="decision.unsafe_options") for path, message in issues]
        raise UnsafeOptionsError(f"refused unsafe run options ({len(problems)} problem(s))", problems=problems)

"""Assembly: the policy, not the caller, builds docker-py ``containers.create`` arguments, and a guard re-checks them.

``resolve`` turns a policy plus a request into a :class:`RunSpec` (every value decided: request value or
policy default, mount sources canonicalised). The decision's rules judge that spec; ``build_options`` turns
the same spec into options using only names from an explicit allow-list, with the hardened baseline always
on. ``guard`` re-checks *any* options dict against the invariants, so a bug in a rule can never produce an
unsafe container; the runner calls it again right before ``containers.create``.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from gateway.errors import Problem, UnsafeOptionsError
from gateway.policy.loader import RUNSC_MIN_PIDS
from gateway.policy.model import Policy
from gateway.policy.paths import denied_host_reason, target_problem
from gateway.request import ExecutionRequest

__all__ = [
    "ALLOWED_OPTION_KEYS",
    "ASSEMBLED_OPTION_KEYS",
    "DECISION_LABEL",
    "LABEL_PREFIX",
    "MANAGED_LABEL",
    "POLICY_LABEL",
    "REQUEST_LABEL",
    "RUNNER_OPTION_KEYS",
    "SANDBOX_HOSTNAME",
    "WORKSPACE",
    "ResolvedMount",
    "RunSpec",
    "assemble",
    "build_options",
    "guard",
    "resolve",
]

LABEL_PREFIX = "io.agent-gateway."
MANAGED_LABEL = "io.agent-gateway.managed"
DECISION_LABEL = "io.agent-gateway.decision"
REQUEST_LABEL = "io.agent-gateway.request"
POLICY_LABEL = "io.agent-gateway.policy"
WORKSPACE = "/workspace"
SANDBOX_HOSTNAME = "sandbox"
_TMPFS_FLAGS = "rw,noexec,nosuid,nodev"

ASSEMBLED_OPTION_KEYS: frozenset[str] = frozenset(
    {
        # docker-py create (container config) arguments
        "image",
        "user",
        "working_dir",
        "environment",
        "labels",
        "hostname",
        "network_disabled",
        # docker-py host-config arguments
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
        "volumes",
        "runtime",
    }
)
"""Every key ``build_options`` may produce."""

RUNNER_OPTION_KEYS: frozenset[str] = frozenset(
    {"command", "entrypoint", "stdin_open", "stdin_once", "detach", "tty", "name", "stop_signal", "auto_remove"}
)
"""Transport keys the runner adds (how the payload gets in), never security-relevant."""

ALLOWED_OPTION_KEYS: frozenset[str] = ASSEMBLED_OPTION_KEYS | RUNNER_OPTION_KEYS
"""The only keys the guard lets through to ``containers.create``."""

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
    "mounts": "mounts are only assembled from the policy as volumes",
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


@dataclass(frozen=True, slots=True)
class ResolvedMount:
    source: str
    """As the request wrote it."""
    canonical: str
    """``realpath`` of the source: what is judged and what is bound."""
    target: str
    """Container path as requested; the ``mounts.target`` rule denies it unless it is already normalised."""
    mode: str


class RunSpec(NamedTuple):
    """Every setting of one execution, decided from the request and the policy defaults.

    A NamedTuple (immutable, cheap to build: one per decision on the hot path).
    """

    image: str
    language: str
    runtime: str
    network: str
    memory: int
    cpus: float
    pids: int
    timeout_s: float
    output_bytes: int
    output_files_bytes: int
    tmpfs: int
    nofile: int
    uid: int
    gid: int
    env: tuple[tuple[str, str], ...]
    mounts: tuple[ResolvedMount, ...]
    pull: str
    code_bytes: int
    files_bytes: int

    @property
    def nano_cpus(self) -> int:
        return round(self.cpus * 1_000_000_000)


def _canonical(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return posixpath.normpath(path)


_new_spec = tuple.__new__
"""``_new_spec(RunSpec, (image, language, ...))`` is exactly ``RunSpec(image, language, ...)``, without the
NamedTuple's Python-level ``__new__`` (binding nineteen keyword arguments cost ~2.5 µs a decision)."""

if RunSpec._fields != (
    "image", "language", "runtime", "network", "memory", "cpus", "pids", "timeout_s", "output_bytes",
    "output_files_bytes", "tmpfs", "nofile", "uid", "gid", "env", "mounts", "pull", "code_bytes", "files_bytes",
):  # fmt: skip
    raise ImportError("RunSpec's fields changed: update resolve(), which builds it positionally")


def resolve(policy: Policy, request: ExecutionRequest) -> RunSpec:
    """Decide every setting: the request's value where it gave one, otherwise the policy default."""
    lim = policy.limits
    req = request.limits
    runtime = request.runtime or policy.runtime.default
    pids = req.pids
    if pids is None:
        pids = int(lim.pids.default)
        if runtime == "runsc" and pids < RUNSC_MIN_PIDS:
            pids = min(RUNSC_MIN_PIDS, int(lim.pids.max))
    mounts = request.mounts
    # Every field, in RunSpec's field order.
    return _new_spec(
        RunSpec,
        (
            request.image or policy.images.default,
            request.language or policy.languages.default,
            runtime,
            request.network or policy.network.default,
            int(req.memory if req.memory is not None else lim.memory.default),
            float(req.cpus if req.cpus is not None else lim.cpus.default),
            pids,
            float(req.timeout_s if req.timeout_s is not None else lim.timeout_s.default),
            int(req.output_bytes if req.output_bytes is not None else lim.output_bytes.default),
            int(req.output_files_bytes if req.output_files_bytes is not None else lim.output_files_bytes.default),
            int(req.tmpfs if req.tmpfs is not None else lim.tmpfs.default),
            lim.nofile,
            policy.user.uid,
            policy.user.gid,
            tuple(request.env.items()),
            tuple(ResolvedMount(m.source, _canonical(m.source), m.target, m.mode) for m in mounts) if mounts else (),
            policy.pull,
            request.code_bytes,
            request.files_bytes,
        ),
    )


def build_options(spec: RunSpec, *, policy_ref: str, decision_id: str, request_id: str) -> dict[str, Any]:
    """The ``containers.create`` keyword arguments for ``spec``, hardened baseline always on."""
    uid_gid = f"{spec.uid}:{spec.gid}"
    options: dict[str, Any] = {
        "image": spec.image,
        "user": uid_gid,
        "working_dir": WORKSPACE,
        "network_mode": spec.network,
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "mem_limit": spec.memory,
        "memswap_limit": spec.memory,
        "nano_cpus": round(spec.cpus * 1_000_000_000),  # spec.nano_cpus
        "pids_limit": spec.pids,
        "tmpfs": {
            "/tmp": f"{_TMPFS_FLAGS},size={spec.tmpfs}",  # noqa: S108 - the container's own tmpfs
            WORKSPACE: f"{_TMPFS_FLAGS},size={spec.tmpfs},uid={spec.uid},gid={spec.gid},mode=0700",
        },
        # No nproc ulimit: RLIMIT_NPROC counts every process of the uid on the host, so all sandboxes (same
        # uid, no user namespace) would share one count and one fork bomb would stop the others from
        # forking. The per-container pids cgroup limit (pids_limit) is the bound.
        "ulimits": [
            {"name": "nofile", "soft": spec.nofile, "hard": spec.nofile},
            {"name": "core", "soft": 0, "hard": 0},
            {"name": "fsize", "soft": spec.tmpfs, "hard": spec.tmpfs},
        ],
        "init": True,
        "ipc_mode": "private",
        "cgroupns": "private",
        "hostname": SANDBOX_HOSTNAME,
        "environment": dict(spec.env),
        "runtime": spec.runtime,
        "labels": {
            MANAGED_LABEL: "true",
            DECISION_LABEL: decision_id,
            REQUEST_LABEL: request_id,
            POLICY_LABEL: policy_ref,
        },
    }
    if spec.network == "none":
        # No network stack wiring at all (still a private namespace with only lo). Besides removing the
        # engine's network set-up from the attack surface, it makes container start about 2x faster here.
        options["network_disabled"] = True
    if spec.mounts:
        options["volumes"] = {m.canonical: {"bind": m.target, "mode": m.mode} for m in spec.mounts}
    if not ASSEMBLED_OPTION_KEYS.issuperset(options):  # a programming error; the guard would refuse it too
        leftovers = set(options) - ASSEMBLED_OPTION_KEYS
        raise UnsafeOptionsError(f"assembly produced keys outside the allow-list: {sorted(leftovers)}")
    return options


def assemble(policy: Policy, request: ExecutionRequest, *, decision_id: str, request_id: str) -> dict[str, Any]:
    """``build_options(resolve(policy, request))``. It does not judge the request: use ``decision.evaluate``."""
    return build_options(
        resolve(policy, request), policy_ref=policy.ref, decision_id=decision_id, request_id=request_id
    )


# --- the invariant guard --------------------------------------------------------------------------------


def _volume_entries(volumes: Any, bad: Any) -> Iterable[tuple[str, str, str | None]]:
    if isinstance(volumes, Mapping):
        for source, spec in volumes.items():
            if not isinstance(spec, Mapping) or not isinstance(spec.get("bind"), str):
                bad(f"$.volumes[{source!r}]", "volume must be {'bind': target, 'mode': 'ro'|'rw'}")
                continue
            mode = spec.get("mode")
            yield str(source), spec["bind"], mode if isinstance(mode, str) else None
    elif isinstance(volumes, Sequence) and not isinstance(volumes, str):
        for index, item in enumerate(volumes):
            parts = item.split(":") if isinstance(item, str) else []
            if len(parts) != 3:
                bad(f"$.volumes[{index}]", "volume must be 'source:target:mode' with an explicit mode")
                continue
            yield parts[0], parts[1], parts[2]
    else:
        bad("$.volumes", "volumes must be a mapping or a list")


def guard(options: Mapping[str, Any], *, denied_paths: Sequence[str] = ()) -> None:
    """Refuse ``options`` (raise :class:`UnsafeOptionsError` listing every problem) unless all invariants hold.

    ``denied_paths`` adds deployment paths (the audit directory) to the never-mountable list.

    It runs on every decision (and again in the runner), so each check is written to be cheap on the common,
    valid path (set operations on precomputed frozensets, one lookup per key); every check still runs.
    """
    problems: list[Problem] = []

    def bad(path: str, message: str) -> None:
        problems.append(Problem(message, path=path, code="decision.unsafe_options"))

    if not ALLOWED_OPTION_KEYS.issuperset(options):
        for key in options:
            if key in _FORBIDDEN_KEYS:
                bad(f"$.{key}", _FORBIDDEN_KEYS[key])
            elif key not in ALLOWED_OPTION_KEYS:
                bad(f"$.{key}", f"{key!r} is not on the allow-list of docker-py arguments")

    get = options.get
    image = get("image")
    if not isinstance(image, str) or not image:
        bad("$.image", "image is missing")

    network = get("network_mode")
    if not isinstance(network, str) or not network:
        bad("$.network_mode", "network_mode must be set explicitly (Docker's default is a bridge)")
    elif network == "host" or network.startswith("container:"):
        bad("$.network_mode", f"network_mode {network!r} is never allowed")
    disabled = get("network_disabled", False)
    if not isinstance(disabled, bool):
        bad("$.network_disabled", "network_disabled must be a boolean")
    elif network == "none" and disabled is not True:
        bad("$.network_disabled", "a container without network must also have its network stack disabled")

    if get("read_only") is not True:
        bad("$.read_only", "the root filesystem must be read-only")

    cap_drop = get("cap_drop")
    if not isinstance(cap_drop, _LIST_OR_TUPLE) or "ALL" not in [str(c).upper() for c in cap_drop]:
        bad("$.cap_drop", "cap_drop must include ALL")

    security_opt = get("security_opt")
    if not isinstance(security_opt, _LIST_OR_TUPLE):
        bad("$.security_opt", "security_opt must be a list including no-new-privileges")
    else:
        normal = [str(o).strip().lower().replace("=", ":") for o in security_opt]
        if _NO_NEW_PRIVS.isdisjoint(normal):
            bad("$.security_opt", "no-new-privileges is missing")
        if not _UNSAFE_SECURITY_OPTS.isdisjoint(normal):
            for index, opt in enumerate(normal):
                if opt in _UNSAFE_SECURITY_OPTS:
                    bad(f"$.security_opt[{index}]", f"{security_opt[index]!r} disables a kernel protection")

    user = get("user")
    parts = user.split(":") if isinstance(user, str) else []
    if len(parts) != 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        bad("$.user", f"user must be numeric 'uid:gid', got {user!r}")
    elif int(parts[0]) == 0 or int(parts[1]) == 0:
        bad("$.user", f"user {user!r} is root (uid or gid 0)")

    mem = get("mem_limit")
    if not (isinstance(mem, int) and not isinstance(mem, bool) and mem > 0):
        bad("$.mem_limit", "mem_limit must be a positive number of bytes")
    elif get("memswap_limit") != mem:
        bad("$.memswap_limit", "memswap_limit must equal mem_limit (no swap)")
    value = get("pids_limit")
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        bad("$.pids_limit", "pids_limit must be a positive integer")
    value = get("nano_cpus")
    if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        bad("$.nano_cpus", "nano_cpus must be a positive integer")

    if "ipc_mode" in options and options["ipc_mode"] not in ("private", "none"):
        bad("$.ipc_mode", f"ipc_mode {options['ipc_mode']!r} is not allowed (only private, none)")
    if "cgroupns" in options and options["cgroupns"] not in ("private",):
        bad("$.cgroupns", f"cgroupns {options['cgroupns']!r} is not allowed (only private)")
    if "runtime" in options and options["runtime"] not in ("runc", "runsc"):
        bad("$.runtime", f"runtime {options['runtime']!r} is not runc or runsc")

    tmpfs = get("tmpfs", {})
    if type(tmpfs) is not dict and not isinstance(tmpfs, Mapping):
        bad("$.tmpfs", "tmpfs must be a mapping of path to options")
    else:
        for target, opts in tmpfs.items():
            # Exactly one comma-separated option starting with ``size=``, a positive number of bytes.
            text = "," + (opts if type(opts) is str else str(opts))
            start = text.find(",size=") + 6
            end = text.find(",", start)
            size = text[start:end] if end >= 0 else text[start:]
            if start < 6 or text.count(",size=") != 1 or not size.isdigit() or int(size) <= 0:
                bad(f"$.tmpfs[{target!r}]", "every tmpfs needs a positive size= in bytes")

    ulimits = get("ulimits", [])
    if isinstance(ulimits, list) and any(isinstance(u, Mapping) and u.get("name") == "nproc" for u in ulimits):
        bad("$.ulimits", "an nproc ulimit is shared by every sandbox of the uid: one sandbox could starve the others")

    labels = get("labels")
    if (type(labels) is not dict and not isinstance(labels, Mapping)) or labels.get(MANAGED_LABEL) != "true":
        bad("$.labels", f"the {MANAGED_LABEL} label is missing")

    if "volumes" in options:
        extra = tuple(os.path.realpath(p) for p in denied_paths)
        for source, target, mode in _volume_entries(options["volumes"], bad):
            where = f"$.volumes[{source!r}]"
            if mode not in ("ro", "rw"):
                bad(where, "every volume needs an explicit mode ro or rw")
            if any(ch in source + target for ch in ":,\x00\n"):
                bad(where, "volume source and target must not contain ':', ',', NUL or line breaks")
                continue
            if not source.startswith("/"):
                bad(where, "volume source must be an absolute host path (named volumes are not allowed)")
                continue
            reason = denied_host_reason(_canonical(source), extra=extra)
            if reason is not None:
                bad(where, reason)
            problem = target_problem(target)
            if problem is not None:
                bad(where, problem)

    if problems:
        raise UnsafeOptionsError(f"refused unsafe run options ({len(problems)} problem(s))", problems=problems)

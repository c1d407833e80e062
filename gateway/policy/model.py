"""The compiled policy: frozen objects built once from a validated document, read by every decision.

Nothing downstream reads the raw YAML mapping; every default is filled in here, so a rule never has to
guess what an omitted field means.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    # gateway.egress loads its proxy (asyncio, ssl) with it: only a policy with egress pays for that import.
    from gateway.egress.addresses import Destination
    from gateway.egress.secrets import SecretRule

__all__ = [
    "BURST_RESPONSES",
    "DEFAULT_LANGUAGE",
    "DEFAULT_OUTPUT_FILES",
    "DEFAULT_PACKAGES_SIZE",
    "EGRESS",
    "MAX_ENV_TOTAL_BYTES",
    "MAX_ENV_VALUE_BYTES",
    "MIN_CPUS",
    "MIN_MEMORY",
    "MIN_WORKSPACE",
    "RELAXABLE_LIMITS",
    "RUNSC_MIN_PIDS",
    "SESSION_MODES",
    "EgressRule",
    "EnvRule",
    "FilesRule",
    "ImageEntry",
    "ImagesRule",
    "LanguagesRule",
    "Limit",
    "Limits",
    "Mode",
    "MountRoot",
    "MountsRule",
    "NetworkRule",
    "NpmRule",
    "PackagesRule",
    "Policy",
    "PolicyException",
    "PoolConfig",
    "RuntimeRule",
    "SessionsRule",
    "UserSpec",
]

Mode = Literal["enforce", "audit", "approve"]
"""``enforce``: a failure denies; ``audit``: it warns; ``approve``: it holds the request for an operator's
approval (``gateway.audit.approvals``) and never denies on its own."""
DEFAULT_LANGUAGE = "python"

MIN_MEMORY = 6 * 1024 * 1024
"""The smallest memory limit a sandbox can be given (Docker refuses less than 6 MiB); the loader and the
limits rule both use it."""
MIN_CPUS = 0.01
"""The smallest CPU quota a sandbox can be given: the kernel's CFS quota is at least 1 ms per 100 ms period, so
an engine refuses (or fails to start) anything below 0.01 CPU. The loader and the limits rule both use it."""
MAX_ENV_VALUE_BYTES = 128 * 1024 - 256
"""Largest value of one environment variable a sandbox can be started with: the kernel refuses an exec whose
``NAME=value`` string is longer than 128 KiB (MAX_ARG_STRLEN; "argument list too long"), and a name may have
up to 128 bytes. The loader and the env.limits rule both use it."""
MAX_ENV_TOTAL_BYTES = 1024 * 1024
"""Largest total environment (names and values): well below the kernel's limit on an exec's arguments and
environment together (a quarter of the 8 MiB default stack), leaving room for the supervisor's command line."""
RUNSC_MIN_PIDS = 256
"""gVisor's own threads count against the pids limit; below this a runsc sandbox dies (see DESIGN). The loader,
the settings resolver and the limits rule all use it."""


@dataclass(frozen=True, slots=True)
class ImageEntry:
    repository: str
    tags: tuple[str, ...] = ()
    """Allowed tags; empty means no tag is allowed on its own (digests only)."""
    digests: tuple[str, ...] = ()
    """Allowed ``sha256:...`` digests."""


@dataclass(frozen=True, slots=True)
class ImagesRule:
    default: str
    allow: tuple[ImageEntry, ...]
    mode: Mode = "enforce"


@dataclass(frozen=True, slots=True)
class LanguagesRule:
    """Which languages a request may name (``spec.languages``), and per language the images it runs in."""

    allowed: tuple[str, ...]
    default: str
    mode: Mode = "enforce"
    images: tuple[tuple[str, ImagesRule], ...] = ()
    """``(language, its default image and allowlist)`` for the languages with an entry in
    ``spec.languages.images``; a language without one runs in ``spec.images``' default and any image it allows.
    The entry's ``mode`` is the languages' mode (rule ``language.image``)."""

    def images_of(self, language: str) -> ImagesRule | None:
        """The images of ``language``'s entry, or ``None`` when it has none (``spec.images`` alone applies)."""
        return dict(self.images).get(language)


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit: what an omitted request value becomes, and the ceiling a request may not pass."""

    default: int | float
    max: int | float
    mode: Mode = "enforce"
    """``audit``: a request above ``max`` is a warning and gets ``max`` (clamped), never its own value."""
    hard_max: int | float | None = None
    """Only in audit or approve mode: a request above this is denied in that mode too (None: no such bound)."""


DEFAULT_OUTPUT_FILES = Limit(default=256, max=256)
"""``limits.output_files`` of a policy that does not say: at most 256 files come back from a run."""


@dataclass(frozen=True, slots=True)
class Limits:
    memory: Limit
    cpus: Limit
    pids: Limit
    timeout_s: Limit
    output_bytes: Limit
    output_files_bytes: Limit
    tmpfs: Limit
    code_size: Limit
    """Only ``max`` matters; ``default`` equals it."""
    files_size: Limit
    """Only ``max`` matters; ``default`` equals it."""
    nofile: int = 256
    output_files: Limit = DEFAULT_OUTPUT_FILES
    """How many files a run returns at most (``/workspace/out``); the rest are left out, marked truncated."""


EGRESS = "egress"
"""The network a request names to reach the policy's egress list through the gateway's proxy (no network of
its own: the sandbox keeps only loopback)."""


@dataclass(frozen=True, slots=True)
class EgressRule:
    """``spec.network.egress``: the destinations a run with network ``egress`` may reach, and its proxy's limits.

    The entries are the proxy's own :class:`~gateway.egress.Destination` objects, built once here, so what the
    decision records is exactly what the proxy will enforce."""

    allow: tuple[Destination, ...]
    connections: Limit = Limit(default=256, max=256)
    """Connections one run may open in all."""
    bytes_out: Limit = Limit(default=256 * 1024 * 1024, max=256 * 1024 * 1024)
    """Bytes one run may send upstream in all."""
    bytes_in: Limit = Limit(default=1024 * 1024 * 1024, max=1024 * 1024 * 1024)
    """Bytes one run may receive from upstreams in all."""
    rate: Limit = Limit(default=32, max=32)
    """Connection attempts allowed within any second."""
    mode: Mode = "enforce"
    """The mode of the ``network.egress`` rule (a requested destination outside the list)."""
    secrets: tuple[SecretRule, ...] = ()
    """``spec.network.egress.secrets``: secrets the proxy injects, by name, for hosts of ``allow``."""


@dataclass(frozen=True, slots=True)
class NetworkRule:
    default: str = "none"
    allowed: tuple[str, ...] = ("none",)
    mode: Mode = "enforce"
    egress: EgressRule | None = None
    """``spec.network.egress``; ``None``: no destinations, so network ``egress`` is never allowed."""


DEFAULT_PACKAGES_SIZE = 256 * 1024 * 1024
"""Bytes a request's installed packages may take when ``spec.packages.size`` says nothing."""


@dataclass(frozen=True, slots=True)
class PackagesRule:
    """``spec.packages``: the index requests may install Python packages from, and which projects.

    A request's ``packages`` are installed in a phase of their own whose only destination is :attr:`index_egress`;
    every resolved distribution (dependencies too) must match :attr:`allow` and, when :attr:`hashes` is set, be
    listed there with its archive's sha256."""

    index: str
    """The PEP 503 simple index URL (``http://mirror.internal:18089/simple/``)."""
    index_egress: Destination
    """The index's host and port, with the CIDRs of the ``spec.network.egress`` entry that covers it: the install
    phase's only destination."""
    allow: tuple[str, ...]
    """Project names or fnmatch patterns, in PEP 503 normal form (:func:`gateway.policy.packages.canonical_name`)."""
    binary_only: bool = True
    """Wheels only: no source distribution is ever built (building runs the package's own code)."""
    hashes: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    """``(name==version, sha256 of each allowed archive)``, names canonical, sorted; ``None``: not required. When
    set, a resolved distribution not listed, or whose archive has another digest, is refused."""
    max: int = 16
    """Requirements one request may list."""
    size: int = DEFAULT_PACKAGES_SIZE
    """Bytes the installed tree may take (the install phase's workspace)."""

    def allowed_hashes(self, name: str, version: str) -> tuple[str, ...] | None:
        """The digests listed for ``name==version`` (canonical name); ``()`` when it is not listed; ``None`` when
        the policy requires no hashes."""
        if self.hashes is None:
            return None
        key = f"{name}=={version}"
        return next((digests for listed, digests in self.hashes if listed == key), ())


@dataclass(frozen=True, slots=True)
class NpmRule:
    """``spec.packages.npm``: the registry JavaScript requests may install npm packages from, and which.

    A request's ``packages`` (language ``javascript``) are installed with ``npm install --ignore-scripts`` in a
    phase whose only destination is :attr:`registry_egress`; every package of the lock file (dependencies too)
    must match :attr:`allow`, come from the registry's host and, when :attr:`hashes` is set, carry a listed
    integrity."""

    registry: str
    """The npm registry URL (``http://mirror.internal:18089/npm/``)."""
    registry_egress: Destination
    """The registry's host and port, with the CIDRs of the ``spec.network.egress`` entry that covers it."""
    allow: tuple[str, ...]
    """Package names or fnmatch patterns (``@types/*``)."""
    hashes: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    """``(name@version, the allowed ``sha512-...`` integrity strings)``, sorted; ``None``: not required."""
    max: int = 16
    """Specs one request may list."""
    size: int = DEFAULT_PACKAGES_SIZE
    """Bytes the installed tree may take (the install phase's workspace)."""

    def allowed_integrity(self, name: str, version: str) -> tuple[str, ...] | None:
        """The integrity strings listed for ``name@version``; ``()`` when it is not listed; ``None`` when the
        policy requires none."""
        if self.hashes is None:
            return None
        key = f"{name}@{version}"
        return next((listed for spec, listed in self.hashes if spec == key), ())


@dataclass(frozen=True, slots=True)
class UserSpec:
    uid: int
    gid: int


@dataclass(frozen=True, slots=True)
class RuntimeRule:
    allowed: tuple[str, ...] = ("runc",)
    default: str = "runc"
    required: str | None = None
    mode: Mode = "enforce"


@dataclass(frozen=True, slots=True)
class MountRoot:
    root: str
    """Canonical (realpath) absolute host directory."""
    modes: tuple[str, ...]
    targets: tuple[str, ...]
    """Normalised absolute container paths."""


@dataclass(frozen=True, slots=True)
class MountsRule:
    allow: tuple[MountRoot, ...] = ()
    """Empty means no mounts at all (the section was omitted)."""
    max_count: int = 4
    mode: Mode = "enforce"


@dataclass(frozen=True, slots=True)
class EnvRule:
    allowed: tuple[str, ...] = ()
    """Exact names or globs; empty means no variables at all (the section was omitted)."""
    allow_dangerous: frozenset[str] = frozenset()
    max_count: int = 32
    max_value_bytes: int = 4096
    max_total_bytes: int = 32768
    mode: Mode = "enforce"


@dataclass(frozen=True, slots=True)
class FilesRule:
    max_count: int = 64
    mode: Mode = "enforce"


BURST_RESPONSES = ("cold", "wait")
"""What a request does when its warm pool is empty: run cold at once, or wait (bounded) for a refill."""


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """The warm pool of a policy (``spec.pool``): single-use sandboxes created and started ahead of requests.

    A gateway keeps a pool only when it is asked to (``Gateway(..., pool=True)``, ``pool: true`` in the
    ``gateway serve`` configuration): a one-shot CLI run never starts containers it will not use. The pool is
    kept per *sandbox profile* (this policy, the image, the runtime and the resolved limits: what the options
    depend on before a request arrives); the policy's defaults are warmed from the start, other profiles once
    a request asked for them (at most ``profiles`` of them)."""

    size: int = 0
    """Containers kept ready per profile; 0 disables the pool for this policy."""
    min: int = 0
    """The pool never shrinks below this on idle expiry."""
    max: int = 0
    """The most containers a profile's pool grows to when requests find it empty (burst); 0 means ``size``."""
    idle_s: float = 300.0
    """A ready container unused this long is destroyed (down to ``min``); the pool grows back on demand."""
    burst: Literal["cold", "wait"] = "cold"
    """A request that finds its pool empty runs cold at once (``cold``) or waits for a refill (``wait``)."""
    burst_wait_s: float = 1.0
    """How long a ``wait`` burst response waits for a ready container before running cold."""
    profiles: int = 4
    """The most sandbox profiles this policy keeps warm (its defaults count as one)."""

    @property
    def enabled(self) -> bool:
        return self.size > 0

    @property
    def ceiling(self) -> int:
        """The most containers one profile's pool holds (``max``, or ``size`` when ``max`` is 0)."""
        return max(self.max, self.size)


MIN_WORKSPACE = 1024 * 1024
"""The smallest workspace a session can be given (the floor of a tmpfs); the loader and the
``sessions.workspace_size`` rule both use it."""
SESSION_MODES = ("workspace", "kernel")
"""The session modes: a persistent workspace under fresh single-use containers, or a live interpreter."""


@dataclass(frozen=True, slots=True)
class SessionsRule:
    """What sessions a policy allows (``spec.sessions``); a policy without the section allows none.

    A session's profile (image, runtime, network, limits, mounts) is decided by the execution rules; this
    holds only what belongs to a session: its modes, how many a principal may hold, and how long and how
    large one may be. Each bound is a :class:`Limit` (default, ceiling, mode, hard_max) like ``spec.limits``."""

    modes: tuple[str, ...]
    """The modes a session request may name (of :data:`SESSION_MODES`)."""
    max_per_principal: int
    """The most live sessions one principal holds; always enforced (live sessions hold containers and disk)."""
    idle_s: Limit
    """Seconds a session may stay unused before it is removed."""
    lifetime_s: Limit
    """Seconds a session lives, counted from the moment it became ready, used or not."""
    workspace_size: Limit
    """Bytes: the hard bound of the session's ``/workspace``."""
    mode: Mode = "enforce"
    """The mode of the ``sessions.mode`` rule (which modes); the bounds carry their own."""
    pool_size: int = 0
    """Ready kernels kept for a kernel session with the policy's defaults (``pool.size``; 0: none), by a gateway
    that keeps a pool (``gateway.runner.pool``)."""


RELAXABLE_LIMITS = (
    "memory", "cpus", "pids", "timeout_s", "output_bytes", "output_files_bytes", "output_files", "tmpfs",
    "code_size", "files_size",
)  # fmt: skip
"""The limits whose ceiling (``max``) an exception may raise."""


@dataclass(frozen=True, slots=True)
class PolicyException:
    """A time-boxed, approved widening of the policy for some principals (``spec.exceptions[]``).

    It only ever raises ceilings and adds allowlist entries; it never changes a default, and whatever a rule
    denies even in audit mode (a backend's capacity, the smallest values a sandbox can be given) and every
    invariant of the backend's guard stay as they are."""

    id: str
    principals: tuple[str, ...]
    """Principal names or shell-style globs (``ml-bot-*``); a request without a principal matches none."""
    reason: str
    approved_by: str
    expires: datetime
    """Timezone-aware; from this moment on the exception is ignored."""
    limits: tuple[tuple[str, int | float], ...] = ()
    """``(limit name, raised ceiling)`` pairs, the name one of :data:`RELAXABLE_LIMITS`."""
    images: tuple[ImageEntry, ...] = ()
    """Entries added to the image allowlist."""
    source: str = ""
    """The file the exception was written in (a base file, for an inherited one)."""
    line: int | None = None
    """Its line there."""


@dataclass(frozen=True, slots=True)
class Policy:
    """A loaded, validated, compiled policy. Build it with :func:`gateway.policy.load_policy`."""

    name: str
    description: str
    api_version: str
    sha256: str
    """sha256 of the canonical JSON form of the parsed document (sorted keys, compact separators)."""
    source: str
    """Where it was loaded from (a path, or ``<string>``)."""
    languages: LanguagesRule
    images: ImagesRule
    limits: Limits
    network: NetworkRule
    user: UserSpec
    runtime: RuntimeRule
    mounts: MountsRule
    env: EnvRule
    files: FilesRule
    pull: Literal["never", "if-missing"] = "never"
    seccomp: Literal["gateway", "engine-default"] = "gateway"
    """The system-call filter: the gateway's profile (engine default minus what a sandbox never needs) or
    the engine's own default. Never unconfined."""
    labels: tuple[tuple[str, str], ...] = field(default=())
    exceptions: tuple[PolicyException, ...] = ()
    """Approved, expiring widenings for some principals (applied by the decision, per request)."""
    pool: PoolConfig = field(default_factory=PoolConfig)
    """The warm pool (``spec.pool``); used only by a gateway that keeps one."""
    sessions: SessionsRule | None = None
    """What sessions the policy allows (``spec.sessions``); ``None``: none at all."""
    packages: PackagesRule | None = None
    """Python packages a request may install (``spec.packages``); ``None``: a request with packages is denied."""
    npm: NpmRule | None = None
    """npm packages a JavaScript request may install (``spec.packages.npm``); ``None``: such a request is
    denied."""
    audit_policy: Policy | None = None
    """The stricter shadow policy (``spec.audit_policy``) judged on every request; its failures are warnings."""

    @property
    def ref(self) -> str:
        """``name@sha256:<hex>``: how labels and logs name this exact policy content."""
        return f"{self.name}@sha256:{self.sha256}"

    @property
    def default_images(self) -> tuple[str, ...]:
        """Every image a request that names none may run in (``spec.images.default`` and each language's default),
        sorted: what must be present for the policy's defaults to run."""
        return tuple(sorted({self.images.default, *(rule.default for _, rule in self.languages.images)}))

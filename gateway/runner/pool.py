"""The warm pool: single-use sandboxes created and started ahead of requests, never reused.

Agents call code tools in tight loops and the container's create and start dominate their wait. A
:class:`WarmPool` keeps, per *sandbox profile* (``gateway.decision.SandboxProfile``: the policy and its exact
content, the image, the runtime and the resolved limits, i.e. what the options depend on before a request
arrives), a few containers already created and started with the full hardening, each running the supervisor
that waits for one framed payload (code, files, environment) on stdin. A request whose decision resolved to a
warm profile *claims* one (the runner re-runs its guard on the options the container was created with and
checks they are exactly the profile part of the decision's options); the container serves that request only
and is destroyed after it, like a cold one; a replacement is started in the background at once.

Why this is as safe as a cold start: nothing of a request is in a pooled container before it is claimed (its
environment travels in the payload, its files too; a request with host mounts never uses the pool, since the
judged directory is staged and bound at create), the container is never reused, and the deadline, the output
cap, the OOM report, cleanup, audit and the guard all hold as on the cold path.

Sizing is the policy's (``spec.pool``, :class:`~gateway.policy.model.PoolConfig`): ``size`` ready per
profile (0: no pool), ``min`` kept through idle expiry (``idle_s``), ``max`` reached when requests find the
pool empty, and the burst response (``cold``: run cold at once; ``wait``: wait up to ``burst_wait_s`` for a
refill). A pool is rebuilt when the policies change (:meth:`WarmPool.configure`): the profile names the
policy's sha256, so a container made under an old policy version never serves a request of the new one, and
the old profiles' containers are destroyed.

The profiles' pools share the host's slots by how busy each is lately (its claims, halved every
``_BUSY_HALF_LIFE_S``): the fillers refill the busiest pool first, and when the host is full, the pool of a
profile at least twice as busy takes the slot of an idle container of the quieter one (removed; the margin
keeps two pools used alike from taking each other's slots in turn). A policy whose pool is never used thus
never keeps the slots its busiest neighbour needs.

Ready kernels (``spec.sessions.pool``, :class:`KernelProfile`): the same pool keeps, per policy, kernels opened
ahead for a kernel session asking for nothing (the policy's defaults: its kernel spec, assembled for the default
lifetime, and on Docker its workspace's size, uid and gid), on a runner that can (:class:`ReadyKernelRunner`).
The session manager claims one (:meth:`WarmPool.claim_kernel`) only when its session's kernel spec and workspace
are exactly those (the runner's key of them, then the guard and the option check of a pooled run's claim);
anything else (another lifetime, image or limits) opens its kernel on request. A ready kernel's deadline is the
spec's plus ``idle_s`` (how long it may wait), so a claimed one still has the session's whole deadline; it
expires after ``idle_s`` and is replaced, like a claimed one, at once. It is handed to one session and never
reused; nothing of a request is in it before the claim (the payload that opened it holds the policy's
environment, no code, no files). It counts against the host's slots, yields them and is drained, reaped and
destroyed (with its workspace) like a pooled container.

Every pooled container holds one of the host's execution slots (``gateway.slots``) from its creation until
the request that claimed it has finished, so the pool counts against the host's bound. An idle pooled
container never holds a slot a live run needs: a cold run that finds every slot taken removes an idle
container of its own pool first; a run that still waits (in this process or another one on the host, see
:meth:`HostSlots.wanted`) makes every pool on the host remove an idle container (at most one every
quarter second) and refill nothing until no run waits. Pooled containers carry the
gateway's managed, instance, deadline (``ttl``: idle expiry plus the policy's longest timeout) and pool
labels, so ``gateway reap`` and the service's start-up reap treat them like any other; a gateway that exits
destroys its pool (:meth:`WarmPool.close`), and a gateway that dies leaves none running: each supervisor ends
when its stdin (the gateway's attach connection) closes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from gateway.decision.sessions import decide_session
from gateway.decision.settings import SandboxProfile, SandboxSettings, resolve
from gateway.errors import GatewayError
from gateway.policy.model import Policy, PoolConfig
from gateway.request import ExecutionRequest, SessionRequest
from gateway.runner.interface import Kernel, PoolingRunner, PoolStatus, RunSpec, Sandbox
from gateway.runner.workspace import Workspace
from gateway.slots import HostSlots, Slot

__all__ = [
    "KernelProfile", "Lease", "PoolConfig", "PoolObserver", "PoolStats", "ReadyKernelRunner", "WarmPool",
    "WorkspaceShape", "default_profile", "kernel_profile",
]  # fmt: skip

_log = logging.getLogger("gateway.pool")

PoolObserver = Callable[[PoolStatus, float], None]
"""Called after every claim with its status and how long the claim took (seconds): the service's metrics."""

TTL_GRACE_S = 60.0
"""Added to a pooled container's deadline label beyond idle expiry plus the policy's longest timeout."""
_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Waits after consecutive failures to prepare a profile's container (a missing image, the engine down)."""
_SLOT_POLL_S = 0.05
_YIELD_POLL_S = 0.1
"""How often a pool with idle containers asks whether a run on the host waits for a slot."""
_YIELD_GAP_S = 0.25
"""After giving an idle container's slot up, the pool waits this long before giving up another (the waiting
run takes the freed slot within its own poll, at most 0.2 s: one run waiting costs one container)."""
_FILLERS = 2
_BUSY_HALF_LIFE_S = 60.0
"""A profile's claims count half as much for sharing the host's slots after this long."""


WorkspaceShape = tuple[int, int, int]
"""A session workspace's size (bytes), uid and gid: what a ready kernel's workspace is made with."""


@runtime_checkable
class ReadyKernelRunner(Protocol):
    """A runner that can open kernels ahead of sessions (Docker): :meth:`prepare_kernel` opens one for a kernel
    spec (and a workspace of the shape), :meth:`claim_kernel` hands it to a session whose spec is exactly that
    (the guard again, like a pooled run's claim), :meth:`discard_kernel` destroys one never claimed."""

    def kernel_key(self, spec: RunSpec, workspace: WorkspaceShape | None) -> str | None: ...

    def prepare_kernel(self, spec: RunSpec, *, workspace: WorkspaceShape | None, slot: Slot, wait_s: float) -> Any: ...

    def claim_kernel(self, kernel: Any, spec: RunSpec) -> tuple[Kernel, Workspace | None] | None: ...

    def discard_kernel(self, kernel: Any) -> None: ...


def default_profile(policy: Policy) -> SandboxProfile:
    """The profile of a request that asks for nothing: what a policy's pool warms from the start."""
    return resolve(policy, ExecutionRequest(code="")).profile


@dataclass(frozen=True)
class KernelProfile:
    """What a policy's ready kernels are opened for: the kernel spec of a session created with the policy's
    defaults (:func:`kernel_profile`), named by the runner's key of it; equal keys, equal kernels."""

    policy: str
    """``name@sha256:<hex>`` of the policy."""
    key: str
    """The runner's :meth:`~ReadyKernelRunner.kernel_key` of ``spec`` and ``workspace``."""
    spec: RunSpec = field(compare=False)
    workspace: WorkspaceShape | None = field(compare=False)


def kernel_profile(policy: Policy, runner: ReadyKernelRunner, assembler: Any) -> KernelProfile | None:
    """The kernel profile a policy's ready kernels are opened for: a kernel session asking for nothing, decided
    under ``policy`` (its kernel spec, for the default lifetime); None when the policy keeps none
    (``spec.sessions.pool``) or such a session is not allowed or cannot be served ahead (mounts)."""
    sessions = policy.sessions
    if sessions is None or sessions.pool_size <= 0:
        return None
    decided = decide_session(policy, SessionRequest(mode="kernel"), live_sessions=0, assembler=assembler)
    if not decided.allowed or decided.settings is None or decided.decision.run is None:
        _log.warning("no ready kernels for %s: a kernel session with its defaults is not allowed", policy.ref)
        return None
    spec = decided.decision.run
    profile = decided.settings.sandbox.profile
    workspace: WorkspaceShape | None = (decided.settings.workspace_size, profile.uid, profile.gid)
    if getattr(runner, "workspaces", None) is None:
        workspace = None  # the backend keeps no workspaces: its kernels keep their own
    key = runner.kernel_key(spec, workspace)
    return None if key is None else KernelProfile(policy.ref, key, spec, workspace)


@dataclass
class _Ready:
    sandbox: Any
    """A pooled sandbox, or a ready kernel (its pool's ``kernel``)."""
    slot: Slot
    since: float
    kernel: bool = False


@dataclass
class _Pool:
    """The pool of one profile (guarded by the WarmPool's lock)."""

    profile: SandboxProfile | KernelProfile
    config: PoolConfig
    ttl_s: float
    target: int
    ready: deque[_Ready] = field(default_factory=deque)
    creating: int = 0
    failures: int = 0
    retry_at: float = 0.0
    last_error: str | None = None
    closed: bool = False
    busy: float = 0.0
    """The profile's claims as of ``busy_at``, each halved every ``_BUSY_HALF_LIFE_S`` since it was made."""
    busy_at: float = 0.0

    @property
    def kernel(self) -> KernelProfile | None:
        return self.profile if isinstance(self.profile, KernelProfile) else None

    @property
    def deficit(self) -> int:
        return self.target - len(self.ready) - self.creating

    def busyness(self, now: float) -> float:
        """How busy the profile is lately: its claims, each halved every ``_BUSY_HALF_LIFE_S`` since."""
        return self.busy * math.pow(0.5, (now - self.busy_at) / _BUSY_HALF_LIFE_S)

    def claimed(self, now: float) -> None:
        self.busy, self.busy_at = self.busyness(now) + 1.0, now


@dataclass
class Lease:
    """What :meth:`WarmPool.claim` gives a request: its pool status and, on a hit, the claimed sandbox (bound
    to the request's run specification) with the host slot it holds. Release the lease when the run ends."""

    status: PoolStatus
    sandbox: Sandbox | None = None
    slot: Slot | None = None
    claim_s: float = 0.0

    def release(self) -> None:
        if self.slot is not None:
            self.slot.release()
            self.slot = None


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of the pool (``gateway_pool_*`` metrics, ``gateway doctor``)."""

    ready: int
    """Containers ready now, over every profile."""
    creating: int
    target: int
    """The ready containers every profile aims for, summed."""
    profiles: int
    hits: int
    misses: int
    cold: int
    errors: tuple[str, ...] = ()
    """The last preparation failure of each profile that has one."""
    kernels: int = 0
    """Ready kernels now (``spec.sessions.pool``); not counted in ``ready``, ``creating``, ``target``, ``profiles``."""
    kernel_hits: int = 0
    """Kernel sessions served by a ready kernel."""
    kernel_misses: int = 0
    """Kernel sessions of a kernel profile kept ready that found none ready (they opened their kernel on request)."""


class WarmPool:
    """Warm single-use sandboxes per profile, refilled by background threads (see the module).

    ``override``: one :class:`PoolConfig` for every policy instead of each policy's own ``spec.pool`` (a
    benchmark, a test). ``fillers``: how many containers are prepared at once.
    """

    def __init__(
        self,
        runner: PoolingRunner,
        slots: HostSlots,
        *,
        override: PoolConfig | None = None,
        fillers: int = _FILLERS,
        observer: PoolObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runner = runner
        self.slots = slots
        self.override = override
        self.observer = observer
        self._clock = clock
        self._cond = threading.Condition()
        self._pools: dict[SandboxProfile | KernelProfile, _Pool] = {}
        self._policies: dict[str, Policy] = {}
        """Policy ref → policy, for every policy the pool serves now."""
        self._closed = False
        self._paused = 0
        self._waiting = 0
        """Cold runs waiting for a host slot now (the fillers wait for them)."""
        self._yield_at = 0.0
        """When the pool may next give an idle container's slot up to a run waiting on the host."""
        self._threads: list[threading.Thread] = []
        self._fillers = max(1, fillers)
        self.hits = 0
        self.misses = 0
        self.cold = 0
        self.kernel_hits = 0
        self.kernel_misses = 0

    # -- configuration ---------------------------------------------------------------------------------

    def config_for(self, policy: Policy) -> PoolConfig:
        return self.override if self.override is not None else policy.pool

    def configure(self, policies: Iterable[Policy]) -> None:
        """Serve exactly ``policies`` from now on: warm each enabled policy's default profile and its ready
        kernels, and drain the profiles of policies no longer served (a reload, a policy edit: the sha256 is in
        the profile)."""
        served = list(policies)
        kernels = {p.ref: k for p in served if (k := self._kernel_profile(p)) is not None}
        wanted = {p.ref: p for p in served if self.config_for(p).enabled or p.ref in kernels}
        drained: list[_Ready] = []
        with self._cond:
            if self._closed:
                return
            self._policies = wanted
            for profile, pool in list(self._pools.items()):
                if profile.policy not in wanted or (pool.kernel is not None and kernels.get(profile.policy) != profile):
                    drained.extend(self._drop(profile, pool))
            for ref, kernel in kernels.items():
                if kernel not in self._pools:
                    self._pools[kernel] = self._kernel_pool(kernel, wanted[ref])
            for ref, policy in wanted.items():
                if not self.config_for(policy).enabled:
                    continue
                try:
                    profile = default_profile(policy)
                except Exception as exc:  # noqa: BLE001 - a policy whose defaults do not resolve has no warm default
                    _log.warning("no warm pool for %s: its defaults do not resolve (%s)", ref, exc)
                    continue
                self._add(profile, policy)
            self._start_fillers()
            self._cond.notify_all()
        self._discard_all(drained)

    def _kernel_profile(self, policy: Policy) -> KernelProfile | None:
        """The kernel profile of ``policy``'s ready kernels, or None (none asked for, no kernels on this backend)."""
        if not isinstance(self.runner, ReadyKernelRunner):
            return None
        try:
            return kernel_profile(policy, self.runner, self.runner.assembler)
        except Exception as exc:  # noqa: BLE001 - a policy whose kernel session does not resolve keeps none ready
            _log.warning("no ready kernels for %s: its kernel session does not resolve (%s)", policy.ref, exc)
            return None

    def _kernel_pool(self, kernel: KernelProfile, policy: Policy) -> _Pool:
        """The pool of a policy's ready kernels: ``spec.sessions.pool.size`` of them, each expiring after the warm
        pool's ``idle_s`` (its deadline runs from its opening) and replaced at once."""
        size = policy.sessions.pool_size if policy.sessions is not None else 0
        idle_s = self.config_for(policy).idle_s
        config = PoolConfig(size=size, min=size, idle_s=idle_s, profiles=1)
        return _Pool(profile=kernel, config=config, ttl_s=idle_s, target=size)

    def _add(self, profile: SandboxProfile, policy: Policy) -> _Pool | None:
        """The pool of ``profile``, added when the policy allows one more profile (lock held)."""
        pool = self._pools.get(profile)
        if pool is not None:
            return pool
        config = self.config_for(policy)
        if not config.enabled:
            return None
        if sum(1 for p, q in self._pools.items() if p.policy == profile.policy and q.kernel is None) >= config.profiles:
            return None
        ttl = config.idle_s + float(policy.limits.timeout_s.max) + TTL_GRACE_S
        pool = _Pool(profile=profile, config=config, ttl_s=ttl, target=config.size)
        self._pools[profile] = pool
        return pool

    def _drop(self, profile: SandboxProfile | KernelProfile, pool: _Pool) -> list[_Ready]:
        pool.closed = True
        del self._pools[profile]
        ready = list(pool.ready)
        pool.ready.clear()
        return ready

    # -- claiming --------------------------------------------------------------------------------------

    def claim(self, settings: SandboxSettings, spec: RunSpec) -> Lease:
        """A lease for one request: ``hit`` with a claimed sandbox, or ``miss`` / ``cold`` without one.

        Raises what the runner's claim raises (the guard refusing the pooled container's options, or options
        that are not the decision's): the container is destroyed and the request fails closed."""
        started = time.perf_counter()
        lease = self._claim(settings, spec)
        lease.claim_s = time.perf_counter() - started
        with self._cond:
            if lease.status == "hit":
                self.hits += 1
            elif lease.status == "miss":
                self.misses += 1
            else:
                self.cold += 1
        if self.observer is not None:
            with contextlib.suppress(Exception):
                self.observer(lease.status, lease.claim_s)
        return lease

    def _claim(self, settings: SandboxSettings, spec: RunSpec) -> Lease:
        profile = settings.profile
        if settings.mounts or spec.mounts or spec.workspace is not None or settings.egress is not None:
            # a judged directory, a workspace or (issue 31) a run's own egress socket is bound at create: never pooled
            return Lease("cold")
        while True:
            with self._cond:
                policy = self._policies.get(profile.policy)
                if self._closed or policy is None:
                    return Lease("cold")
                pool = self._add(profile, policy)
                if pool is None:
                    return Lease("cold")
                ready = self._take_ready(pool)
            if ready is None:
                return Lease("miss")
            try:
                claimed = self.runner.claim(ready.sandbox, spec)
            except BaseException:
                self._discard(ready)
                raise
            if claimed is not None:
                return Lease("hit", sandbox=claimed, slot=ready.slot)
            self._discard(ready)  # it died while waiting (an engine restart, a reaper): try the next one

    def claim_kernel(
        self, spec: RunSpec, policy: str, workspace: WorkspaceShape | None
    ) -> tuple[Kernel, Workspace | None] | None:
        """A ready kernel for a kernel session of ``policy`` (its ref) whose kernel spec is ``spec`` and whose
        workspace has the shape ``workspace``, with that workspace; None when no ready kernel was opened for
        exactly that (the session opens its kernel on request). The kernel is the session's alone from now on
        (it holds its host slot until it is closed); a replacement is opened in the background at once.

        Raises what the runner's claim raises (the guard refusing the kernel's options, or options that are not
        the decision's): the kernel is destroyed and the session fails closed."""
        runner = self.runner
        if not isinstance(runner, ReadyKernelRunner):
            return None
        key = runner.kernel_key(spec, workspace)
        if key is None:
            return None
        wanted = KernelProfile(policy, key, spec, workspace)
        while True:
            with self._cond:
                pool = self._pools.get(wanted)
                if self._closed or pool is None:
                    return None
                pool.claimed(self._clock())
                ready = self._pop(pool)
                self._cond.notify_all()  # a filler replaces what was taken
                if ready is None:
                    self.kernel_misses += 1
                    return None
            try:
                claimed = runner.claim_kernel(ready.sandbox, spec)
            except BaseException:
                self._discard(ready)
                raise
            if claimed is not None:
                with self._cond:
                    self.kernel_hits += 1
                return claimed
            self._discard(ready)  # it ended while waiting, or waited too long to have the session's deadline

    def _take_ready(self, pool: _Pool) -> _Ready | None:
        """A ready container of ``pool``, after the burst response when there is none (lock held)."""
        pool.target = max(pool.target, pool.config.size)
        pool.claimed(self._clock())
        ready = self._pop(pool)
        if ready is None:
            # Burst: grow towards max, and wait for a refill when the policy says so.
            pool.target = min(pool.target + 1, pool.config.ceiling)
            self._cond.notify_all()
            if pool.config.burst == "wait" and pool.config.burst_wait_s > 0:
                give_up = self._clock() + pool.config.burst_wait_s
                while ready is None and not pool.closed and not self._closed:
                    left = give_up - self._clock()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                    ready = self._pop(pool)
        self._cond.notify_all()  # a filler replaces what was taken
        return ready

    def _pop(self, pool: _Pool) -> _Ready | None:
        """The oldest ready container of ``pool`` (the one closest to idle expiry), or None (lock held)."""
        return pool.ready.popleft() if pool.ready else None

    def cold_slot(self) -> Slot:
        """A host slot for a cold run: a free one, else one freed by removing an idle container of this pool,
        else the slots' usual bounded wait, during which every pool on the host gives one of its idle
        containers up (:meth:`HostSlots.wanted`). While a cold run waits, the fillers take no slot: a refill
        never wins a freed slot over a waiting request."""
        with self._cond:
            self._waiting += 1
        try:
            while True:
                slot = self.slots.try_take()
                if slot is not None:
                    return slot
                victim = self._take_idle(self._clock())
                if victim is None:
                    return self.slots.take()
                self._discard(victim)
        finally:
            with self._cond:
                self._waiting -= 1
                self._cond.notify_all()

    def _take_idle(self, now: float, below: float = float("inf")) -> _Ready | None:
        """The idle container to give up: the oldest of the quietest pool less busy than ``below`` (taken out
        of its pool), or None."""
        with self._cond:
            pools = [p for p in self._pools.values() if p.ready and p.busyness(now) < below]
            if not pools:
                return None
            return min(pools, key=lambda p: (p.busyness(now), p.ready[0].since)).ready.popleft()

    # -- filling ---------------------------------------------------------------------------------------

    def _start_fillers(self) -> None:
        """Start the background threads once (lock held)."""
        if self._threads:
            return
        for n in range(self._fillers):
            thread = threading.Thread(target=self._fill_loop, name=f"gateway-pool-{n}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _fill_loop(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return
            pool, slot = job
            kernel = pool.kernel
            try:
                sandbox = self._prepare(pool, slot)
            except Exception as exc:  # noqa: BLE001 - a failed refill is retried with back-off, never fatal
                slot.release()
                message = exc.message if isinstance(exc, GatewayError) else f"{type(exc).__name__}: {exc}"
                with self._cond:
                    pool.creating -= 1
                    pool.failures += 1
                    pool.last_error = message
                    pool.retry_at = self._clock() + _BACKOFF_S[min(pool.failures, len(_BACKOFF_S)) - 1]
                what = f"{pool.profile.image} container" if isinstance(pool.profile, SandboxProfile) else "ready kernel"
                _log.warning("warm pool: preparing a %s failed: %s", what, message)
                continue
            ready = _Ready(sandbox, slot, self._clock(), kernel=kernel is not None)
            with self._cond:
                pool.creating -= 1
                pool.failures = 0
                pool.last_error = None
                keep = not pool.closed and not self._closed
                if keep:
                    pool.ready.append(ready)
                    self._cond.notify_all()
            if not keep:
                self._discard(ready)

    def _prepare(self, pool: _Pool, slot: Slot) -> Any:
        """A pooled container of ``pool``'s profile, or a ready kernel of its kernel profile holding ``slot``."""
        if isinstance(pool.profile, SandboxProfile):
            return self.runner.prepare_idle(pool.profile, ttl_s=pool.ttl_s)
        if not isinstance(self.runner, ReadyKernelRunner):  # configure keeps no kernel profile for such a runner
            raise TypeError(f"{type(self.runner).__name__} cannot open ready kernels")
        kernel = pool.profile
        return self.runner.prepare_kernel(kernel.spec, workspace=kernel.workspace, slot=slot, wait_s=pool.config.idle_s)

    def _next_job(self) -> tuple[_Pool, Slot] | None:
        """Wait for a profile that needs a container and a free host slot; None once the pool is closed."""
        with self._cond:
            while not self._closed:
                expired = self._expire()
                if expired:
                    self._discard_unlocked(expired)
                    continue
                now = self._clock()
                if self._paused:
                    self._cond.wait(self._idle_wait(now))
                    continue
                if self._yield_slot(now):
                    continue
                pool = self._neediest(now)
                if self._waiting:
                    pool = None  # a cold run waits for a slot: it goes first
                if pool is None:
                    self._cond.wait(self._idle_wait(now))
                    continue
                slot = self.slots.try_take()
                if slot is not None:
                    pool.creating += 1
                    return pool, slot
                # The host is full: an idle container of a profile at most half as busy gives its slot to this
                # pool, else a run ends or another process frees one.
                victim = self._take_idle(now, below=pool.busyness(now) / 2)
                if victim is None:
                    self._cond.wait(_SLOT_POLL_S)
                    continue
                self._discard_unlocked([victim])
        return None

    def _neediest(self, now: float) -> _Pool | None:
        """The pool to refill next: the busiest lately of those short of their target, then the one with the
        fewest containers (lock held)."""
        short = [p for p in self._pools.values() if p.deficit > 0 and p.retry_at <= now]
        return max(short, key=lambda p: (p.busyness(now), -len(p.ready) - p.creating), default=None)

    def _yield_slot(self, now: float) -> bool:
        """When a run on the host waits for a slot: give the slot of an idle container up (remove it) unless
        one was given up in the last ``_YIELD_GAP_S``, and refill nothing. True when a run waits (lock held;
        released while the container is removed)."""
        if not any(p.ready for p in self._pools.values()) and not any(p.deficit > 0 for p in self._pools.values()):
            return False  # nothing to give up, nothing to refill: no need to ask
        if not self.slots.wanted():
            return False
        victim = self._take_idle(now) if now >= self._yield_at else None
        if victim is None:
            self._cond.wait(_YIELD_POLL_S)
            return True
        self._discard_unlocked([victim])
        self._yield_at = self._clock() + _YIELD_GAP_S
        return True

    def _expire(self) -> list[_Ready]:
        """Take the containers idle longer than their ``idle_s`` (lock held); the target shrinks to ``min``."""
        now = self._clock()
        out: list[_Ready] = []
        for pool in self._pools.values():
            while pool.ready and now - pool.ready[0].since >= pool.config.idle_s:
                out.append(pool.ready.popleft())
                pool.target = max(pool.config.min, pool.target - 1)
        return out

    def _idle_wait(self, now: float) -> float:
        """How long a filler may sleep: until the next expiry or retry, at most a second."""
        wake = now + 1.0
        for pool in self._pools.values():
            if pool.ready:
                wake = min(wake, pool.ready[0].since + pool.config.idle_s, now + _YIELD_POLL_S)
            if pool.deficit > 0:
                wake = min(wake, pool.retry_at)
        return max(wake - now, 0.01)

    # -- destroying ------------------------------------------------------------------------------------

    def _discard(self, ready: _Ready) -> None:
        try:
            if ready.kernel and isinstance(self.runner, ReadyKernelRunner):
                self.runner.discard_kernel(ready.sandbox)  # and its workspace
            else:
                self.runner.discard(ready.sandbox)
        finally:
            ready.slot.release()

    def _discard_all(self, items: Iterable[_Ready]) -> None:
        for ready in items:
            with contextlib.suppress(Exception):
                self._discard(ready)

    def _discard_unlocked(self, items: Iterable[_Ready]) -> None:
        """Destroy ``items`` with the lock released during the engine's calls (held before and after)."""
        self._cond.release()
        try:
            self._discard_all(items)
        finally:
            self._cond.acquire()

    @contextlib.contextmanager
    def paused(self, timeout_s: float = 60.0) -> Iterator[None]:
        """No refill inside the block, and none under way when it starts (``Gateway.reap`` removes this
        instance's containers: a container made meanwhile would be removed behind the pool's back)."""
        with self._cond:
            self._paused += 1
            give_up = time.monotonic() + timeout_s
            while any(p.creating for p in self._pools.values()) and time.monotonic() < give_up:
                self._cond.wait(0.05)
        try:
            yield
        finally:
            with self._cond:
                self._paused -= 1
                self._cond.notify_all()

    def drain(self) -> None:
        """Destroy every ready container (the pool refills afterwards)."""
        with self._cond:
            items = [r for pool in self._pools.values() for r in pool.ready]
            for pool in self._pools.values():
                pool.ready.clear()
            self._cond.notify_all()
        self._discard_all(items)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop refilling and destroy every pooled container (a gateway that exits leaves none behind)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            items = [r for pool in self._pools.values() for r in pool.ready]
            for pool in self._pools.values():
                pool.ready.clear()
                pool.closed = True
            self._cond.notify_all()
        self._discard_all(items)
        give_up = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(give_up - time.monotonic(), 0.0))

    # -- observing -------------------------------------------------------------------------------------

    def stats(self) -> PoolStats:
        with self._cond:
            pools = [p for p in self._pools.values() if p.kernel is None]
            kernels = [p for p in self._pools.values() if p.kernel is not None]
            return PoolStats(
                ready=sum(len(p.ready) for p in pools),
                creating=sum(p.creating for p in pools),
                target=sum(p.target for p in pools),
                profiles=len(pools),
                hits=self.hits,
                misses=self.misses,
                cold=self.cold,
                errors=tuple(p.last_error for p in (*pools, *kernels) if p.last_error),
                kernels=sum(len(p.ready) for p in kernels),
                kernel_hits=self.kernel_hits,
                kernel_misses=self.kernel_misses,
            )

    def ready_count(self) -> int:
        return self.stats().ready

    def wait_ready(self, count: int | None = None, timeout_s: float = 30.0) -> bool:
        """Wait (bounded) until every profile has ``count`` (default: its target) ready; True when it has."""
        give_up = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if all(len(p.ready) >= (p.target if count is None else count) for p in self._pools.values()):
                    return True
                left = give_up - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._cond.wait(min(left, 0.1))

    def __repr__(self) -> str:
        s = self.stats()
        return f"WarmPool(ready={s.ready}, profiles={s.profiles}, hits={s.hits}, misses={s.misses})"

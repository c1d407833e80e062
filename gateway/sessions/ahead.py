"""A workspace session's next container, made ahead: an execution claims a container started before it came.

Without it each execution in a workspace session is a cold container: created, attached, started, its mount
checked and, after the run, removed, all on the request's path (about 250 ms under runc), while a plain run
claims one the warm pool made ahead. :class:`NextContainers` keeps, for each workspace session, at most one
container prepared exactly as a pooled one (``prepare_idle``: the profile's options, guarded, the full
hardening, the supervisor waiting for its framed payload, nothing of a request) with the session's workspace
bound at ``/workspace`` and checked (device and inode) before anything could run in it. The session manager
uses it when its Gateway keeps a warm pool (``Gateway(pool=...)``), as it makes containers ahead for plain runs.

- :meth:`NextContainers.prepare`: after a workspace session is created (the session's profile), and as soon as
  an execution has its container, the next one's is begun in the background while this one runs (with the
  profile of this execution's decision: what the next one most likely asks for again).
- :meth:`NextContainers.execute`: the next execution claims it (:meth:`NextContainers.claim`; a preparation
  under way is waited for: it began earlier than a cold start would). It is handed over only if the decision's
  profile is the one it was made with; then the runner's claim re-runs the guard on the options it was created
  with and requires them to be exactly the profile part of the decision's, with the same workspace (a failure
  there fails the execution closed, as a pooled claim does). An execution that asks for other limits (or one
  under an edited policy: its sha256 is in the profile) finds another profile: the prepared container is
  removed and the execution runs cold, as before. Either way the result comes back once the program's outcome
  is in, and the container's removal is confirmed in the background (its slot freed then), as for a pooled run.
- :meth:`NextContainers.drop` when the session ends (close, expiry, the Gateway's stop): it waits for a
  preparation under way and removes the container made ahead; before the workspace is destroyed,
  :meth:`NextContainers.settle` waits for the removals of its executions' containers, so the workspace's file
  system is held by no container when it is unmounted. :meth:`NextContainers.close` drops them all.

Each container still serves exactly one execution and is removed after it, and ``out/`` is still emptied by the
runner before each payload (``prepare_for_run``). A program cannot reach the container made ahead beside it: a
container of its own (its own PID, mount and IPC namespaces) that takes no payload before the program
has ended. A run that reported its exit had every process of it killed by its supervisor first; one killed
from outside (deadline, flood, cancel) or ended by an error is waited for until its container is gone. The host
checks the workspace's device and inode in the new container after start, so nothing a program does to the
workspace can put anything else at ``/workspace``.

A prepared container holds a host slot (``gateway.slots``) from its creation to the end of the execution that
claims it, and never keeps one a live run needs: it takes its slot without waiting (none free: nothing is
prepared), nothing is prepared while a run on the host waits for a slot, and while one waits (in any process:
:meth:`HostSlots.wanted`) a watcher removes prepared containers, the oldest first, one every ``_YIELD_GAP_S``,
as the warm pool gives its idle ones up (the same check, kept here: the pool's is private to its profiles).
Idle sessions thus never hog the host. Its deadline label covers the session's idle time plus two of its
executions' deadlines (:func:`ttl_for`): reapers leave it alone while its session lives, and remove it after a
gateway that died.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from gateway.decision.sessions import SessionSettings
from gateway.decision.settings import SandboxProfile, SandboxSettings
from gateway.errors import GatewayError
from gateway.payload import Payload
from gateway.runner.interface import OnGone, OnOutput, Outcome, RunSpec, Sandbox
from gateway.runner.pool import TTL_GRACE_S
from gateway.runspec import Workspace
from gateway.slots import HostSlots, Slot

__all__ = ["AheadRunner", "AheadStats", "NextContainers", "Removal", "ttl_for"]

_log = logging.getLogger("gateway.sessions")

PREPARE_WAIT_S = 60.0
"""The longest a claim waits for a preparation under way, and a drop for it to end (the engine's own calls are
bounded too; past this the execution runs cold, and the container is removed when its preparation ends)."""
_YIELD_POLL_S = 0.1
"""How often the watcher asks whether a run on the host waits for a slot, while a container is prepared."""
_YIELD_GAP_S = 0.25
"""After giving one prepared container's slot up, the watcher waits this long before giving up another (the
waiting run takes the freed slot within its own poll, at most 0.2 s)."""


@runtime_checkable
class AheadRunner(Protocol):
    """A runner that can make a pooled container with a workspace bound (``DockerRunner``)."""

    def prepare_idle(self, profile: SandboxProfile, *, ttl_s: float, workspace: Workspace | None = None) -> Sandbox:
        """A container of ``profile`` alone, waiting for one payload, ``workspace`` bound at ``/workspace``."""
        ...

    def claim(self, sandbox: Sandbox, spec: RunSpec) -> Sandbox | None:
        """The guard again and the exact options (and the same workspace); None when it died while idle."""
        ...

    def discard(self, sandbox: Sandbox) -> None:
        """Remove a container that will never run (never raises)."""
        ...

    def run(
        self, sandbox: Sandbox, payload: Payload, *, on_output: OnOutput | None = None,
        cancel: threading.Event | None = None, on_gone: OnGone | None = None,
    ) -> Outcome:  # fmt: skip
        """``Runner.run``."""
        ...

    def execute(
        self, spec: RunSpec, payload: Payload, *, on_output: OnOutput | None = None,
        cancel: threading.Event | None = None, on_gone: OnGone | None = None,
    ) -> Outcome:  # fmt: skip
        """``Runner.execute``."""
        ...


def ttl_for(settings: SessionSettings) -> float:
    """How long a prepared container of a session with ``settings`` may exist (its deadline label): prepared
    when an execution begins, it waits through that execution, the session's idle time and the sweep, then
    serves one execution; each execution's deadline is at most the session's."""
    return settings.idle_s + 2 * settings.sandbox.timeout_s + TTL_GRACE_S


@dataclass(frozen=True)
class AheadStats:
    """A snapshot of the prepared containers (tests, diagnostics)."""

    ready: int
    """Prepared and waiting now."""
    preparing: int
    prepared: int
    """Made since the start."""
    hits: int
    """Executions served by a prepared container."""
    misses: int
    """Executions that ran cold: none prepared, or made for another profile, or one that died while idle."""
    yielded: int
    """Removed to free their slot for a run that waited."""
    failures: int
    """Preparations that failed (the executions then ran cold)."""


class Removal:
    """One execution's ``on_gone`` (``Runner.run``): frees its host slot once its container no longer exists
    and reports one that could not be removed (``on_left``); its session's end waits for it (:meth:`wait`), since
    the container holds the workspace. Called at most once to effect."""

    def __init__(self, slot: Slot, on_left: Callable[[GatewayError], None]) -> None:
        self._slot: Slot | None = slot
        self._on_left = on_left
        self._done = threading.Event()

    def __call__(self, error: GatewayError | None) -> None:
        slot, self._slot = self._slot, None
        if slot is None:
            return
        try:
            slot.release()
            if error is not None:
                with contextlib.suppress(Exception):
                    self._on_left(error)
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Wait (bounded) until the container is gone (or was left and reported); True when it is."""
        return self._done.wait(timeout_s)


@dataclass(eq=False)
class _Next:
    """One session's next container: under way (``preparing``), then ready (``sandbox``) until taken."""

    profile: SandboxProfile
    workspace: Workspace
    slot: Slot
    preparing: bool = True
    sandbox: Sandbox | None = None
    since: float = 0.0
    dropped: bool = False
    """Dropped while under way: its preparation removes it when it ends, then sets ``gone``."""
    gone: threading.Event = field(default_factory=threading.Event)


class NextContainers:
    """The next container of each workspace session of one session manager, made ahead (see the module).

    Keys are session ids. ``clock`` is monotonic (a test passes its own); ``wait_s``: :data:`PREPARE_WAIT_S`."""

    def __init__(
        self, runner: AheadRunner, slots: HostSlots, *, clock: Callable[[], float] = time.monotonic,
        wait_s: float = PREPARE_WAIT_S,
    ) -> None:  # fmt: skip
        self.runner = runner
        self.slots = slots
        self._clock = clock
        self._wait_s = wait_s
        self._cond = threading.Condition()
        self._next: dict[str, _Next] = {}
        self._removals: dict[str, list[Removal]] = {}
        """The containers of each session's executions whose removal is not confirmed yet (pruned as it goes)."""
        self._closed = False
        self._watching = False
        self._stop = threading.Event()
        self._yield_at = 0.0
        self._prepared = self._hits = self._misses = self._yielded = self._failures = 0

    def execute(
        self, key: str, settings: SandboxSettings, spec: RunSpec, payload: Payload, *, cold_slot: Callable[[], Slot],
        on_left: Callable[[GatewayError], None], then: Callable[[], None], on_output: OnOutput | None = None,
        cancel: threading.Event | None = None,
    ) -> Outcome:  # fmt: skip
        """One execution of ``key``'s session: in its next container when that was made for ``settings``' profile
        (the outcome's ``pool``: ``hit``), else in a cold one holding ``cold_slot()`` (``miss``). ``then`` is
        called once the execution has its container (it begins the next one).

        Returns with the program's outcome, as a pooled run does: the container's removal is confirmed in the
        background, its slot freed then, and a container left is reported to ``on_left``; :meth:`settle` waits
        for it. A run that was killed (no exit status of its own: deadline, flood, cancel) or failed waits for the
        removal here, so that nothing of it may still touch the workspace when the next execution begins; one
        that reported its exit has nothing left running (its supervisor killed every process first)."""
        claimed = self.claim(key, settings.profile, spec)
        sandbox, slot = claimed if claimed is not None else (None, cold_slot())
        gone = Removal(slot, on_left)
        with self._cond:
            self._removals[key] = [r for r in self._removals.get(key, ()) if not r.done] + [gone]
        try:
            then()
            if sandbox is not None:
                outcome = self.runner.run(sandbox, payload, on_output=on_output, cancel=cancel, on_gone=gone)
            else:
                outcome = self.runner.execute(spec, payload, on_output=on_output, cancel=cancel, on_gone=gone)
        except GatewayError:
            gone.wait(self._wait_s)  # the runner calls on_gone whatever ended the run
            raise
        except BaseException:
            gone(None)  # a runner bug may never call it: the slot is freed (a later call does nothing)
            raise
        if outcome.exit_code is None:
            gone.wait(self._wait_s)
        return replace(outcome, pool="hit" if sandbox is not None else "miss")

    def prepare(self, key: str, profile: SandboxProfile, workspace: Workspace, *, ttl_s: float) -> bool:
        """Begin preparing ``key``'s next container in the background; True when begun. Nothing is begun when
        ``key`` has one (ready or under way), after :meth:`close`, while a run on the host waits for a slot, or
        when no slot is free now (or the slots cannot be used: the execution is not failed for it)."""
        with self._cond:
            if self._closed or key in self._next:
                return False
        try:
            slot = None if self.slots.wanted() else self.slots.try_take()
        except GatewayError as exc:
            _log.warning("no workspace session's next container is made: %s", exc.message)
            return False
        if slot is None:
            return False
        entry = _Next(profile, workspace, slot)
        with self._cond:
            if self._closed or key in self._next:
                slot.release()
                return False
            self._next[key] = entry
        thread = threading.Thread(
            target=self._prepare, args=(key, entry, ttl_s), name="gateway-session-next", daemon=True
        )
        thread.start()
        return True

    def _prepare(self, key: str, entry: _Next, ttl_s: float) -> None:
        try:
            sandbox = self.runner.prepare_idle(entry.profile, ttl_s=ttl_s, workspace=entry.workspace)
        except Exception as exc:  # noqa: BLE001 - a failed preparation only means the next execution runs cold
            message = exc.message if isinstance(exc, GatewayError) else f"{type(exc).__name__}: {exc}"
            _log.warning("preparing a workspace session's next container failed: %s", message)
            with self._cond:
                self._failures += 1
                entry.preparing = False
                if self._next.get(key) is entry:
                    del self._next[key]
                self._cond.notify_all()
            entry.slot.release()
            entry.gone.set()
            return
        with self._cond:
            entry.sandbox, entry.since, entry.preparing = sandbox, self._clock(), False
            keep = not entry.dropped
            if keep:
                self._prepared += 1
                self._watch()
            self._cond.notify_all()
        if not keep:
            self._discard(entry)

    def claim(self, key: str, profile: SandboxProfile, spec: RunSpec) -> tuple[Sandbox, Slot] | None:
        """``key``'s prepared container bound to ``spec`` (see ``AheadRunner.claim``) with the slot it holds,
        for one execution whose decision's profile is ``profile``; None when there is none to claim (run cold).
        Raises what the runner's claim raises (the container is removed)."""
        with self._cond:
            entry = self._next.get(key)
            give_up = self._clock() + self._wait_s
            while entry is not None and entry.preparing and self._next.get(key) is entry:
                left = give_up - self._clock()
                if left <= 0:
                    break
                self._cond.wait(left)
            if entry is None or entry.preparing or self._next.get(key) is not entry:
                self._misses += 1
                return None  # none, or taken for a run that waits, or still under way (it serves a later one)
            del self._next[key]
        sandbox = entry.sandbox
        if sandbox is None or entry.profile != profile:  # made for other limits: this execution runs cold
            self._discard(entry)
            self._count_miss()
            return None
        try:
            claimed = self.runner.claim(sandbox, spec)
        except BaseException:
            self._discard(entry)
            raise
        if claimed is None:  # it died while it waited (an engine restart, a reaper)
            self._discard(entry)
            self._count_miss()
            return None
        with self._cond:
            self._hits += 1
        return claimed, entry.slot

    def drop(self, key: str) -> None:
        """Remove ``key``'s next container, waiting (bounded) for a preparation under way: when this returns it is
        gone, unless its preparation is still under way ``wait_s`` later (then it is removed when that ends)."""
        with self._cond:
            entry = self._next.pop(key, None)
            if entry is None:
                return
            entry.dropped = entry.preparing
        if entry.dropped:
            entry.gone.wait(self._wait_s)
        else:
            self._discard(entry)

    def settle(self, key: str) -> None:
        """Wait (bounded: ``wait_s`` each) for the removal of the containers of ``key``'s executions, and forget
        them; call it once no execution of ``key`` runs. With :meth:`drop` before it, no container of ``key``'s
        holds its workspace when this returns."""
        with self._cond:
            removals = self._removals.pop(key, [])
        for removal in removals:
            removal.wait(self._wait_s)

    def close(self) -> None:
        """Prepare nothing more, stop the watcher and remove every prepared container (as :meth:`drop`)."""
        with self._cond:
            self._closed = True
            keys = list(self._next)
        self._stop.set()
        for key in keys:
            self.drop(key)

    def stats(self) -> AheadStats:
        with self._cond:
            return AheadStats(
                ready=sum(1 for e in self._next.values() if not e.preparing),
                preparing=sum(1 for e in self._next.values() if e.preparing),
                prepared=self._prepared, hits=self._hits, misses=self._misses, yielded=self._yielded,
                failures=self._failures,
            )  # fmt: skip

    # -- giving slots up -------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Start the watcher unless it runs (lock held): it ends when no container is ready."""
        if self._watching or self._closed:
            return
        self._watching = True
        threading.Thread(target=self._watch_loop, name="gateway-session-next-yield", daemon=True).start()

    def _watch_loop(self) -> None:
        while not self._stop.wait(_YIELD_POLL_S):
            with self._cond:
                if not any(not e.preparing for e in self._next.values()):
                    self._watching = False
                    return
            try:
                wanted = self.slots.wanted()
            except GatewayError:  # the slots cannot be used now: asked again at the next poll
                wanted = False
            if not wanted:
                continue
            victim: _Next | None = None
            with self._cond:
                now = self._clock()
                ready = [(e.since, k) for k, e in self._next.items() if not e.preparing]
                if ready and now >= self._yield_at:
                    victim = self._next.pop(min(ready)[1])
                    self._yield_at = now + _YIELD_GAP_S
                    self._yielded += 1
            if victim is not None:
                self._discard(victim)
        with self._cond:
            self._watching = False

    # -- removing --------------------------------------------------------------------------------------

    def _count_miss(self) -> None:
        with self._cond:
            self._misses += 1

    def _discard(self, entry: _Next) -> None:
        try:
            if entry.sandbox is not None:
                with contextlib.suppress(Exception):
                    self.runner.discard(entry.sandbox)
        finally:
            entry.slot.release()
            entry.gone.set()

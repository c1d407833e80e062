"""The proxies of one runner's runs: one asyncio event-loop thread hosts them all, each on a unix socket of its own.

A run with egress gets an `EgressRun` from `EgressHost.open`: a fresh private directory below the host's root, and
the run's `EgressProxy` listening on ``proxy.sock`` in it; the runner binds that directory into the run's sandbox.
`EgressRun.close` ends every connection, removes the directory and returns the run's `EgressReport`. A kernel (one
proxy for a session's whole life) takes each cell's part with `EgressRun.take`; the limits stay the whole life's.

Who can reach a run's socket: the root directory is the gateway user's own, mode 0700, so no other host user gets
past it, and each run's directory has a random name (128 bits). A gateway running as root also gives the run's
directory (0700) and socket (0600) to the sandbox's user, the one user that needs them (through the bind). A
gateway not running as root cannot give files away: the run's directory is then 0711 and the socket 0666, still
closed to other host users by the root directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from gateway.egress.addresses import EgressRules
from gateway.egress.proxy import ConnectionRecord, EgressPlan, EgressProxy, EgressReport, Resolver
from gateway.egress.secrets import injections

__all__ = ["MAX_EGRESS_RECORDS", "SOCKET_NAME", "EgressHost", "EgressRun"]

MAX_EGRESS_RECORDS = 1000
"""Connection records a run's report keeps; the ones past it are counted in ``EgressReport.dropped``."""
SOCKET_NAME = "proxy.sock"
"""The proxy's socket in a run's directory."""
_WAIT_S = 30.0
"""How long a caller waits for the event loop to start or close a run's proxy (a loop that never answers is a bug)."""

_T = TypeVar("_T")


class _Records:
    """A run's connection records, appended on the loop thread and read by the run's thread."""

    def __init__(self, most: int) -> None:
        self._lock = threading.Lock()
        self._most = most
        self.kept: list[ConnectionRecord] = []
        self.dropped = 0

    def add(self, record: ConnectionRecord) -> None:
        with self._lock:
            if len(self.kept) < self._most:
                self.kept.append(record)
            else:
                self.dropped += 1

    def take(self) -> tuple[tuple[ConnectionRecord, ...], int]:
        """The records kept and the number dropped since the last take; the cap counts afresh from here."""
        with self._lock:
            taken = tuple(self.kept), self.dropped
            self.kept, self.dropped = [], 0
            return taken


class EgressRun:
    """One run's proxy and directory: what the runner binds (``directory``) and closes when the run ends."""

    def __init__(
        self,
        host: EgressHost,
        directory: Path,
        proxy: EgressProxy,
        records: _Records,
        values: Mapping[str, str] | None = None,
    ) -> None:
        self.directory = directory
        """The run's private directory, holding ``proxy.sock``; the runner binds it into the sandbox."""
        self.values: Mapping[str, str] = dict(values or {})
        """The values of the secrets the proxy injects, by name: the runner erases them from the run's output."""
        self._host = host
        self._proxy = proxy
        self._records = records
        self._lock = threading.Lock()
        self._report: EgressReport | None = None
        self._taken = (0, 0, 0, 0)
        """The totals (connections, denied, bytes out, bytes in) at the last take."""

    def take(self) -> EgressReport:
        """What the proxy saw since the last take (or since it opened): the records of the connections that ended
        meanwhile (a connection is recorded when it ends) and the totals' growth. A kernel takes one per cell; the
        proxy's limits are not reset, they bound the kernel's whole life. After `close`, nothing is left to take."""
        with self._lock:
            return self._take()

    def _take(self) -> EgressReport:
        stats = self._proxy.stats
        now = (stats.connections, stats.denied, stats.bytes_out, stats.bytes_in)
        before, self._taken = self._taken, now
        records, dropped = self._records.take()
        connections, denied, bytes_out, bytes_in = (a - b for a, b in zip(now, before, strict=True))
        return EgressReport(records, connections, denied, bytes_out, bytes_in, dropped=dropped)

    def close(self) -> EgressReport:
        """End every connection (each records ``run-ended``), remove the directory, and return what is left to
        take (the run's whole report when it never took one); idempotent (a second call returns the same report)."""
        with self._lock:
            if self._report is None:
                try:
                    self._host.call(self._proxy.close())
                finally:
                    self._host.forget(self)
                    _remove(self.directory)
                self._report = self._take()
            return self._report


class EgressHost:
    """The event-loop thread of one runner's proxies: started by the first `open`, ended by `close`.

    ``root`` is where runs' directories are made (created 0700 if missing); ``resolver`` is every proxy's (None:
    the system resolver); ``clock`` measures durations and rates (tests may pass their own); ``max_records``: the
    records a run's report keeps."""

    def __init__(
        self,
        root: Path,
        *,
        resolver: Resolver | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_records: int = MAX_EGRESS_RECORDS,
    ) -> None:
        self.root = root
        self._max_records = max_records
        self._resolver = resolver
        self._clock = clock
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runs: set[EgressRun] = set()

    def open(self, plan: EgressPlan, *, uid: int, gid: int) -> EgressRun:
        """A fresh directory and the run's proxy listening in it, allowing exactly ``plan``; ``uid``/``gid``: the
        sandbox's user (owner of the directory and socket when the gateway runs as root)."""
        injected = injections(plan.secrets, plan.values)  # a secret without its value raises here, before anything
        directory = self._make_directory(uid, gid)
        records = _Records(self._max_records)
        proxy = EgressProxy(
            EgressRules(plan.destinations),
            on_record=records.add,
            limits=plan.limits,
            resolver=self._resolver,
            clock=self._clock,
            injections=injected,
        )
        try:
            path = directory / SOCKET_NAME
            self.call(proxy.start(path))
            if os.geteuid() == 0:
                os.chown(path, uid, gid, follow_symlinks=False)
                os.chmod(path, 0o600)
            else:
                os.chmod(path, 0o666)  # noqa: S103 -- within the root directory only the gateway's user passes
        except BaseException:
            with contextlib.suppress(Exception):
                self.call(proxy.close())
            _remove(directory)
            raise
        run = EgressRun(self, directory, proxy, records, plan.values)
        with self._lock:
            self._runs.add(run)
        return run

    def close(self) -> None:
        """Close every run still open (their connections end), then stop the loop thread; idempotent."""
        with self._lock:
            runs = list(self._runs)
        for run in runs:
            with contextlib.suppress(Exception):
                run.close()
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(_WAIT_S)
            if not thread.is_alive():
                loop.close()

    def call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coroutine`` on the loop thread (started if need be) and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._running_loop()).result(_WAIT_S)

    def forget(self, run: EgressRun) -> None:
        with self._lock:
            self._runs.discard(run)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="gateway-egress", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _make_directory(self, uid: int, gid: int) -> Path:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = self.root.lstat()
        if self.root.is_symlink() or not self.root.is_dir() or info.st_uid != os.geteuid():
            raise PermissionError(f"egress root {self.root} is not a directory of the gateway's own user")
        os.chmod(self.root, 0o700)
        directory = self.root / secrets.token_hex(16)
        directory.mkdir(mode=0o700)
        if os.geteuid() == 0:
            os.chown(directory, uid, gid, follow_symlinks=False)
        else:
            os.chmod(directory, 0o711)  # noqa: S103 -- the sandbox's user traverses it; the root is 0700
        return directory


def _remove(directory: Path) -> None:
    """Remove a run's directory and what is left in it (its socket, once the proxy stopped listening)."""
    with contextlib.suppress(FileNotFoundError):
        for entry in directory.iterdir():
            entry.unlink(missing_ok=True)
        directory.rmdir()

"""The service's life: in-flight runs at SIGTERM, start-up reaping, the anchor writer (the reload on SIGHUP is
:meth:`gateway.service.service.Service.reload`).

* :class:`Inflight` holds a cancel event per running execution: at shutdown the server first waits (uvicorn's
  graceful shutdown, ``grace_s``) for the runs to finish, then :meth:`Inflight.cancel_all` kills and removes
  the rest (each ends as ``gateway.cancelled`` in its ``execution.outcome`` record) before the stop record.
* :func:`reap_stale` removes, at start-up, only the containers of gateway instances that are no longer alive
  (an instance id names its host and process: same host and no such process) or that are past their
  deadline plus the grace, and the workspaces of those dead instances; another live instance's sandboxes and
  workspaces are left alone. Audited as ``containers.reaped`` (``workspaces``: the names of those removed).
  (The runs such an instance left without an outcome are marked ``gateway.interrupted`` by the Gateway's own
  start, before this: :mod:`gateway.audit.interrupted`.)
* :func:`anchor_writer` is the :class:`~gateway.audit.anchor.AnchorWriter` the configuration asks for
  (``audit_anchor``): started with the service, stopped after its stop record (a last anchor).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gateway.audit.anchor import AnchorWriter
from gateway.errors import GatewayError
from gateway.slots import instance_dead

if TYPE_CHECKING:
    from gateway import Gateway
    from gateway.audit.interface import AuditSink
    from gateway.service.config import ServerConfig

__all__ = ["Inflight", "anchor_writer", "instance_dead", "reap_stale"]

_log = logging.getLogger("gateway.service")


class Inflight:
    """The cancel events of the executions running now."""

    def __init__(self) -> None:
        self._events: set[threading.Event] = set()
        self._idle = threading.Condition()

    @contextlib.contextmanager
    def run(self, event: threading.Event | None = None) -> Iterator[threading.Event]:
        """A cancel event for one execution (``event``, or a new one), registered while it runs."""
        event = event if event is not None else threading.Event()
        with self._idle:
            self._events.add(event)
        try:
            yield event
        finally:
            with self._idle:
                self._events.discard(event)
                self._idle.notify_all()

    def __len__(self) -> int:
        with self._idle:
            return len(self._events)

    def cancel_all(self) -> int:
        """Cancel every running execution; how many there were."""
        with self._idle:
            for event in self._events:
                event.set()
            return len(self._events)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait (bounded) until no execution runs; True when none does."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._events, timeout=timeout_s)


def reap_stale(gateway: Gateway) -> list[str]:
    """At start-up: remove the containers of dead instances and expired ones (audited when any was found). An
    engine that does not answer is logged, not fatal: requests then fail with 503 until it is back."""
    runner: Any = gateway.runner
    instance = getattr(runner, "instance", None)
    try:
        found = runner.reap(expired_only=True, dead=instance_dead) if instance else runner.reap(expired_only=True)
    except Exception as exc:  # noqa: BLE001 - no engine at start: not fatal, requests answer 503 until it is back
        _log.warning("start-up reap skipped: %s", getattr(exc, "message", exc))
        return []
    ids = [str(i) for i in found]
    spaces = _reap_workspaces(runner)
    if ids or spaces:
        data = {"container_ids": ids, "everything": False, "expired_only": True, "instance": instance}
        if spaces:
            data["workspaces"] = spaces
        with contextlib.suppress(GatewayError):
            gateway.audit.append("containers.reaped", data)
    return ids


def _reap_workspaces(runner: Any) -> list[str]:
    """The workspaces of dead instances, removed (a runner without workspaces has none)."""
    reap = getattr(runner, "reap_workspaces", None)
    if reap is None:
        return []
    try:
        return [str(name) for name in reap(expired_only=True, dead=instance_dead)]
    except Exception as exc:  # noqa: BLE001 - not fatal at start, like the containers' reap
        _log.warning("start-up reap of workspaces skipped: %s", getattr(exc, "message", exc))
        return []


def anchor_writer(config: ServerConfig, sink: AuditSink) -> AnchorWriter | None:
    """The anchor writer of ``config.anchor_dir`` over the sink's trail directory (None when not configured, or
    when the sink keeps no directory)."""
    directory = getattr(sink, "directory", None)
    if config.anchor_dir is None or directory is None:
        return None
    return AnchorWriter(
        directory,
        config.anchor_dir,
        key=getattr(sink, "key", None),
        every_records=config.anchor_every_records,
        every_seconds=config.anchor_every_seconds,
    )

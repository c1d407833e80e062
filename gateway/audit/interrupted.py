"""Runs a dead gateway left open: at start, each gets an ``execution.outcome`` with ``gateway.interrupted``.

A run's ``policy.decision`` is recorded before its sandbox starts and its ``execution.outcome`` after; a gateway
killed in between (SIGKILL, the OOM killer, a power cut) leaves the decision without an outcome.

:func:`mark_interrupted` runs when a gateway starts (:meth:`gateway.Gateway.__enter__`, after the start record:
the service, ``gateway run``, ``gateway mcp`` and every other writer). It finds each decision that allowed a
real run (not a dry run), has no outcome and was written by a process that is gone (:func:`writer_gone`), and
appends for it an ``execution.outcome`` with the decision's request id, principal and policy, ``exit_code``
null, ``duration_ms`` 0 (unknown), the error ``gateway.interrupted`` and ``interrupted``: the decision
(``seq``, ``event_id``, ``hash``) and the instance that wrote it (``host``, ``pid``); the record's own
``timestamp`` and ``gateway`` say when and by whom it was found. Reports count it among the error codes, the
OCSF export as a failed API activity correlated with the decision by request id.

Bound: only the trail's last :data:`SCAN_SEGMENTS` segments are read (at most twice ``segment_max_bytes``,
128 MiB by default), a line at a time, each line's kind, request id, dry run and verdict read from its bytes;
a line is parsed only when it is a decision of a real run still without an outcome at the end of that window
(on this machine: 40 ms for a 64 MiB window of runs, 61 ms for 125 MiB of a dead writer's denials). A run
decided before the window (one that outlived a whole segment of records and then died) stays unmarked.

Sessions the same way: a ``session.created`` in the window with no end record (``session.expired``,
``session.closed``, ``session.killed`` naming its ``session_id``) whose writer is gone gets a ``session.killed``
with reason :data:`GATEWAY_GONE`, the session's id, mode and container, and ``instance`` (the dead writer). Its
kernel ended with that writer (its connection closed); the start-up reap removes a container left behind. (A
session's creation decision is closed by its ``session.created``, not by an outcome.)

Concurrent starts: the scan and its appends hold :data:`SCAN_LOCK_NAME` in the trail directory (``flock``), so
a second start sees the first one's outcomes and writes none twice. The trail's own lock file cannot serve:
the writer takes it for each append through its own descriptor, and two descriptors of one process exclude
each other.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from gateway.audit.records import PolicyDecisionView, view_record
from gateway.audit.segments import list_segments
from gateway.errors import AuditIntegrityError, AuditUnavailableError

if TYPE_CHECKING:
    from gateway.audit.interface import AuditReceipt
    from gateway.audit.jsonl import JsonlAuditTrail

__all__ = [
    "GATEWAY_GONE",
    "INTERRUPTED",
    "SCAN_LOCK_NAME",
    "SCAN_SEGMENTS",
    "mark_interrupted",
    "process_start",
    "writer_gone",
]

INTERRUPTED: Final = "gateway.interrupted"
"""The error code of the outcome written for a run whose gateway died before recording one."""
SCAN_SEGMENTS: Final = 2
"""How many of the trail's newest segments a start reads for open decisions."""
SCAN_LOCK_NAME: Final = ".interrupted.lock"
"""Lock file in the trail directory held (``flock``, exclusive) while a start scans and marks."""

_KIND: Final = b'"event_type":"'
_REQUEST: Final = b'"request_id":'
_DRY_RUN: Final = b'"dry_run":'
_DECIDED: Final = b'"decision":{"allowed":'
_DECISION: Final = b"policy.decision"
_OUTCOME: Final = b"execution.outcome"
_CREATED: Final = b"session.created"
"""A session's creation decision ends in this record (same request id), not in an outcome."""
_SESSION: Final = b"session."
GATEWAY_GONE: Final = "gateway_gone"
"""The reason of the ``session.killed`` written for a session whose gateway ended without ending it."""

WriterGone = Callable[[str, int, str], bool]
"""``(host, pid, timestamp of the record) -> bool``: whether the process that wrote the record is gone."""


@dataclass(frozen=True, slots=True)
class _OpenSession:
    """A session created in the window with no end record yet."""

    session_id: str
    mode: str
    container_id: Any
    principal: str | None
    policy: dict[str, str] | None
    host: str
    pid: int
    timestamp: str
    caller: Any


@dataclass(frozen=True, slots=True)
class _OpenRun:
    """What the interrupted outcome says of one open decision."""

    request_id: str
    principal: str | None
    policy: dict[str, str] | None
    decision: dict[str, Any]
    """``seq``, ``event_id`` and ``hash`` of the decision."""
    host: str
    pid: int
    timestamp: str
    image: str | None
    caller: Any


def mark_interrupted(trail: JsonlAuditTrail, *, gone: WriterGone | None = None) -> list[AuditReceipt]:
    """Append an interrupted ``execution.outcome`` for each open run of a gone writer (see the module); the
    receipts of the records written. ``gone``: the liveness rule (default :func:`writer_gone`).

    Raises :class:`~gateway.errors.AuditUnavailableError` when the trail cannot be read or written."""
    is_gone = gone if gone is not None else writer_gone
    directory = trail.directory
    try:
        lock_fd = os.open(directory / SCAN_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    except OSError as exc:
        raise AuditUnavailableError(f"cannot open {directory / SCAN_LOCK_NAME}: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        try:
            sessions: list[_OpenSession] = []
            runs = [run for run in _open_runs(directory, sessions) if is_gone(run.host, run.pid, run.timestamp)]
            ended = [session for session in sessions if is_gone(session.host, session.pid, session.timestamp)]
        except OSError as exc:
            raise AuditUnavailableError(f"cannot read the audit trail in {directory}: {exc.strerror or exc}") from exc
        built = [_outcome_of(trail, run) for run in runs] + [_killed_of(trail, session) for session in ended]
        return trail.append_built(built)
    finally:
        os.close(lock_fd)  # releases the lock


def _open_runs(directory: Path, sessions: list[_OpenSession]) -> Iterator[_OpenRun]:
    """The decisions of real runs in the window that no outcome follows, in trail order; ``sessions`` gets the
    sessions created in the window that no end record follows."""
    open_lines: dict[str, tuple[Path, int]] = {}  # request id -> where its decision line starts
    open_sessions: dict[str, _OpenSession] = {}
    for _index, path in list_segments(directory)[-SCAN_SEGMENTS:]:
        offset = 0
        with path.open("rb", buffering=1 << 20) as fh:
            for line in fh:
                kind, request_id = _kind_and_request(line)
                if kind.startswith(_SESSION):  # few: each parsed
                    _follow_session(line, kind, open_sessions)
                if request_id is not None:
                    if kind == _DECISION and _maybe_a_run(line):
                        open_lines[request_id] = (path, offset)
                    elif kind in (_OUTCOME, _CREATED):
                        open_lines.pop(request_id, None)
                offset += len(line)
    sessions.extend(open_sessions.values())
    for path, offset in open_lines.values():
        with path.open("rb") as fh:
            fh.seek(offset)
            line = fh.readline()
        run = _open_run(line)
        if run is not None:
            yield run


def _follow_session(line: bytes, kind: bytes, open_sessions: dict[str, _OpenSession]) -> None:
    """A ``session.*`` line: a creation opens its session, any end record closes it."""
    try:
        view = view_record(json.loads(line))
        session_id = view.data.get("session_id")
        if not isinstance(session_id, str):
            return
        if kind != _CREATED:
            open_sessions.pop(session_id, None)
            return
        writer = view.gateway
        if writer is None:
            return
        policy = None if view.policy is None else {"name": view.policy.name, "sha256": view.policy.sha256}
        open_sessions[session_id] = _OpenSession(
            session_id, str(view.data.get("mode", "kernel")), view.data.get("container_id"), view.principal, policy,
            writer.host, writer.pid, view.timestamp, view.data.get("caller"),
        )  # fmt: skip
    except (ValueError, AuditIntegrityError):  # not a well-formed record: verify names it
        return


def _open_run(line: bytes) -> _OpenRun | None:
    """The open run a decision's line records; None when it decided none, or is not a well-formed record
    (``gateway audit verify`` names that one; a start marks nothing for it)."""
    try:
        view = view_record(json.loads(line))
        if not isinstance(view, PolicyDecisionView) or not view.allowed or view.dry_run:
            return None
        writer = view.gateway
        if writer is None or view.request_id is None:
            return None
        policy = None if view.policy is None else {"name": view.policy.name, "sha256": view.policy.sha256}
        decision = {"seq": view.seq, "event_id": view.event_id, "hash": view.hash}
    except (ValueError, AuditIntegrityError):  # not JSON, or not the shape of a decision record
        return None
    return _OpenRun(
        view.request_id, view.principal, policy, decision, writer.host, writer.pid, view.timestamp, view.image,
        view.data.get("caller"),
    )  # fmt: skip


def _killed_of(trail: JsonlAuditTrail, session: _OpenSession) -> dict[str, Any]:
    """The ``session.killed`` (reason ``gateway_gone``) of a session whose gateway ended without ending it, built
    (not yet chained). Its kernel ended with that gateway's connection; a start-up reap removes what is left."""
    data: dict[str, Any] = {
        "session_id": session.session_id,
        "mode": session.mode,
        "reason": GATEWAY_GONE,
        "container_id": session.container_id if isinstance(session.container_id, str) else None,
        "instance": {"host": session.host, "pid": session.pid},
    }
    if isinstance(session.caller, Mapping):
        data["caller"] = session.caller
    return trail.build("session.killed", data, principal=session.principal, policy=session.policy)


def _kind_and_request(line: bytes) -> tuple[bytes, str | None]:
    """A line's ``event_type`` and ``request_id`` read from its bytes, without parsing it: in a canonical
    record both are top-level members after ``data`` whose later siblings hold no object with such a key (and
    a quote inside a JSON string is escaped), so their last occurrences are the top-level ones."""
    at = line.rfind(_KIND)
    if at < 0:
        return b"", None
    start = at + len(_KIND)
    kind = line[start : line.find(b'"', start)]
    at = line.rfind(_REQUEST)
    if at < 0 or line[at + len(_REQUEST) : at + len(_REQUEST) + 1] != b'"':
        return kind, None  # none, or null
    start = at + len(_REQUEST) + 1
    return kind, line[start : line.find(b'"', start)].decode("ascii", "replace")


def _maybe_a_run(line: bytes) -> bool:
    """False when a decision's line says it decided no run, read from its bytes: ``data.dry_run`` true (the
    last member of that name: those after it in ``data`` and the envelope hold no object with such a key) or
    ``data.decision.allowed`` false (the first member of the first ``decision`` object: ``data`` opens the
    record, and its only member before ``decision``, ``caller``, holds strings). The lines left are parsed."""
    at = line.rfind(_DRY_RUN)
    if at >= 0 and line.startswith(b"true", at + len(_DRY_RUN)):
        return False
    at = line.find(_DECIDED)
    return at < 0 or not line.startswith(b"false", at + len(_DECIDED))


def _outcome_of(trail: JsonlAuditTrail, run: _OpenRun) -> dict[str, Any]:
    """The interrupted ``execution.outcome`` of one open run, built (not yet chained)."""
    data: dict[str, Any] = {
        "exit_code": None,
        "timed_out": False,
        "oom_killed": False,
        "duration_ms": 0,
        "container_id": None,
        "pool": None,
        "image_id": None,
        "error": {
            "code": INTERRUPTED,
            "message": f"the gateway process that decided this run (pid {run.pid} on {run.host}) ended before it "
            "recorded the run's outcome: what the program did is unknown (its sandbox ended with it; `gateway "
            "reap` removes a container left behind)",
        },
        "interrupted": {"decision": run.decision, "instance": {"host": run.host, "pid": run.pid}},
    }
    if run.image is not None:
        data["image"] = run.image
    if isinstance(run.caller, Mapping):
        data["caller"] = run.caller
    return trail.build("execution.outcome", data, request_id=run.request_id, principal=run.principal, policy=run.policy)


def writer_gone(host: str, pid: int, written_at: str) -> bool:
    """Whether the process that wrote a record at ``written_at`` (the record's timestamp) as ``pid`` on ``host``
    is gone: the host is this one and ``pid`` names no process (or a zombie), or a process that started after
    the record was written (the pid was reused: a gateway restarted as PID 1 of its container). A writer on
    another host, or one whose start cannot be read, is never taken for gone."""
    if host != socket.gethostname():
        return False
    started = process_start(pid)
    if started is None:
        return True
    try:
        written = datetime.fromisoformat(written_at).timestamp()
    except ValueError:
        return False
    return started > written


def process_start(pid: int) -> float | None:
    """When process ``pid`` started (unix time, never later than the truth: the boot time is read in whole
    seconds); ``None`` when there is no such process or it is a zombie; ``-inf`` when it exists but its start
    cannot be read (no ``/proc``)."""
    if pid <= 0:
        return -math.inf  # not a process id: 0 and negative numbers name process groups
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # another user's process: it exists
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        boot = _boot_time()
    except (OSError, ValueError):
        return -math.inf
    fields = stat[stat.rindex(b")") + 2 :].split()  # after "pid (comm) ": the name may hold spaces
    if fields[0] == b"Z":
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _boot_time() -> int:
    with open("/proc/stat", "rb") as fh:
        for line in fh:
            if line.startswith(b"btime "):
                return int(line.split()[1])
    raise ValueError("no btime in /proc/stat")

"""Aggregate a report's segment tasks in several processes, then merge (the same result as in process).

The tasks are dealt into one share per process: this process aggregates the first share itself while worker
processes aggregate the others (with N processes, N - 1 workers: a worker interpreter costs its start-up and
imports, about as much CPU as aggregating 40,000 records). Like the parallel verify
(:mod:`gateway.audit.verify`), each worker is a fresh interpreter (``sys.executable -c``; never a fork of a
process that may run threads, never a re-run of the caller's ``__main__``). It reads the filters and its share
of the tasks as one JSON line on stdin, aggregates them one after the other into one
:class:`~gateway.report.aggregate.Aggregate` and writes it, pickled, to stdout; this process merges the
aggregates (a merge is independent of order, see :mod:`gateway.report.aggregate`).
The pickles come from processes this one started with its own code, over pipes only they hold.

When a worker fails for any reason, or this process's own share raises, everything is redone in process,
which then reports or raises exactly as it would have (the first malformed record in trail order names its
``seq``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Final

from gateway._workers import start_worker
from gateway.errors import GatewayError
from gateway.report.aggregate import Aggregate
from gateway.report.scan import ReportFilters, SegmentTask, aggregate_segment

if TYPE_CHECKING:
    from gateway.report.build import Progress

__all__ = ["PARALLEL_MIN_BYTES", "aggregate_tasks", "worker_main"]

PARALLEL_MIN_BYTES: Final = 96 << 20
"""Below this many bytes of tasks (or with one task) the report aggregates in process: a worker interpreter
costs ~0.3 s to start."""
_WORKER: Final = "from gateway.report._parallel import worker_main; raise SystemExit(worker_main())"


def _workers(tasks: Sequence[SegmentTask], workers: int | None) -> int:
    cpus = os.cpu_count() or 1
    if workers is None:
        total = 0
        for task in tasks:
            with contextlib.suppress(OSError):
                total += os.stat(task.path).st_size
        if total < PARALLEL_MIN_BYTES:
            return 1
        workers = cpus
    return max(1, min(workers, cpus, len(tasks)))


def _in_process(
    tasks: Sequence[SegmentTask], filters: ReportFilters, denied_cap: int, progress: Progress | None
) -> Aggregate:
    total = Aggregate(denied_cap=denied_cap)
    done = [0]

    def on_record(n: int) -> None:
        done[0] += n
        if progress is not None:
            progress.tick(done[0], 0, 0)

    for task in tasks:
        total.merge(aggregate_segment(task, filters, denied_cap, on_record))
    return total


def aggregate_tasks(
    tasks: Sequence[SegmentTask],
    filters: ReportFilters,
    denied_cap: int,
    *,
    progress: Progress | None = None,
    workers: int | None = None,
) -> Aggregate:
    """The merged aggregate of ``tasks``; in ``workers`` processes (``None``: one per CPU when the tasks hold
    at least :data:`PARALLEL_MIN_BYTES`, else in process)."""
    count = _workers(tasks, workers)
    if count <= 1:
        return _in_process(tasks, filters, denied_cap, progress)
    if progress is not None:
        progress.say(f"report: reading {len(tasks)} segments in {count} processes ...")
    shares: list[list[SegmentTask]] = [list(tasks[i::count]) for i in range(count)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for share in shares[1:]:  # the first share is this process's own
            # stderr discarded: a failure is redone in process, which reports it properly
            proc = start_worker(_WORKER, stderr=subprocess.DEVNULL)
            procs.append(proc)
            job = {"filters": asdict(filters), "denied_cap": denied_cap, "tasks": [asdict(t) for t in share]}
            if proc.stdin is not None:
                proc.stdin.write(json.dumps(job).encode("utf-8") + b"\n")
                proc.stdin.close()
        total = Aggregate(denied_cap=denied_cap)
        own, done = sum(task.lines for task in shares[0]), [0]

        def on_record(n: int) -> None:  # the shares are alike: this one's progress stands for the others'
            done[0] += n
            if progress is not None:
                progress.tick(done[0], done[0], own, others=count - 1)

        try:
            for task in shares[0]:
                total.merge(aggregate_segment(task, filters, denied_cap, on_record))
        except GatewayError:
            return _in_process(tasks, filters, denied_cap, progress)  # raises at the first bad record in order
        if progress is not None:
            progress.say(f"report: {own:,} records read here, waiting for {count - 1} worker process(es) ...")
        for proc in procs:
            out = proc.stdout.read() if proc.stdout is not None else b""
            if proc.wait() != 0 or not out:
                return _in_process(tasks, filters, denied_cap, progress)
            try:
                part = pickle.loads(out)  # noqa: S301 - our own worker's answer over our own pipe
            except Exception:  # noqa: BLE001 - e.g. a worker that imported another version of the package
                return _in_process(tasks, filters, denied_cap, progress)
            if not isinstance(part, Aggregate):
                return _in_process(tasks, filters, denied_cap, progress)
            total.merge(part)
    except OSError:
        return _in_process(tasks, filters, denied_cap, progress)
    else:
        return total
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def worker_main() -> int:
    """A report worker: one JSON job on stdin, one pickled :class:`Aggregate` on stdout."""
    job: dict[str, Any] = json.loads(sys.stdin.buffer.readline())
    filters = ReportFilters(**job["filters"])
    denied_cap = int(job["denied_cap"])
    total = Aggregate(denied_cap=denied_cap)
    for task in job["tasks"]:
        total.merge(aggregate_segment(SegmentTask(**task), filters, denied_cap))
    sys.stdout.buffer.write(pickle.dumps(total, protocol=pickle.HIGHEST_PROTOCOL))
    sys.stdout.buffer.flush()
    return 0

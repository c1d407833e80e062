"""Aggregate a report's segment tasks in several processes, then merge (the same result as in process).

The tasks are dealt into one share per process: this process aggregates the first share itself while worker
processes (:class:`gateway._workers.WorkerPool`) aggregate the others, one share each (with N processes, N - 1
workers: a worker interpreter costs its start-up and imports, about as much CPU as aggregating 40,000 records).
The pool's head gives every worker the filters; a worker aggregates its share's tasks one after the other into
one :class:`~gateway.report.aggregate.Aggregate` and answers it pickled; this process merges the aggregates (a
merge is independent of order, see :mod:`gateway.report.aggregate`). The pickles come from processes this one
started with its own code, over pipes only they hold.

When a worker fails for any reason, or this process's own share raises, everything is redone in process,
which then reports or raises exactly as it would have (the first malformed record in trail order names its
``seq``).
"""

from __future__ import annotations

import json
import pickle
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Final

from gateway._workers import WorkerError, WorkerPool, pool_size, serve
from gateway.errors import GatewayError
from gateway.report.aggregate import Aggregate
from gateway.report.progress import Progress
from gateway.report.scan import ReportFilters, SegmentTask, aggregate_segment

__all__ = ["aggregate_tasks", "worker_main"]

_WORKER: Final = "from gateway.report._parallel import worker_main; raise SystemExit(worker_main())"


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


def _load(data: bytes) -> Aggregate:
    """A worker's answer."""
    part = pickle.loads(data)  # noqa: S301 - our own worker's answer over our own pipe
    if not isinstance(part, Aggregate):
        raise TypeError(f"a {type(part).__name__}, not an Aggregate")  # e.g. another version of the package
    return part


def aggregate_tasks(
    tasks: Sequence[SegmentTask],
    filters: ReportFilters,
    denied_cap: int,
    *,
    progress: Progress | None = None,
    workers: int | None = None,
    worker_pool: Callable[..., WorkerPool] = WorkerPool,
) -> Aggregate:
    """The merged aggregate of ``tasks``; in ``workers`` processes (``None``: one per CPU when the tasks hold
    at least :data:`~gateway._workers.PARALLEL_MIN_BYTES`, else in process). ``worker_pool`` makes the pool of
    the other processes (:class:`~gateway._workers.WorkerPool`, or a test's own)."""
    count = pool_size(workers, [task.path for task in tasks])
    if count <= 1:
        return _in_process(tasks, filters, denied_cap, progress)
    if progress is not None:
        progress.say(f"report: reading {len(tasks)} segments in {count} processes ...")
    shares: list[list[SegmentTask]] = [list(tasks[i::count]) for i in range(count)]
    head = json.dumps({"filters": asdict(filters), "denied_cap": denied_cap}).encode("utf-8")
    jobs = [json.dumps([asdict(t) for t in share]).encode("utf-8") for share in shares[1:]]
    try:
        # stderr discarded: a failure is redone in process, which reports it properly
        with worker_pool(_WORKER, count - 1, head=head, stderr=subprocess.DEVNULL, name="report worker") as pool:
            parts = pool.map(jobs, _load)  # the first share is this process's own
            total = Aggregate(denied_cap=denied_cap)
            own, done = sum(task.lines for task in shares[0]), [0]

            def on_record(n: int) -> None:  # the shares are alike: this one's progress stands for the others'
                done[0] += n
                if progress is not None:
                    progress.tick(done[0], done[0], own, others=count - 1)

            for task in shares[0]:
                total.merge(aggregate_segment(task, filters, denied_cap, on_record))
            if progress is not None:
                progress.say(f"report: {own:,} records read here, waiting for {count - 1} worker process(es) ...")
            for part in parts:
                total.merge(part)
    except (WorkerError, OSError, GatewayError):  # the workers reaped first
        return _in_process(tasks, filters, denied_cap, progress)  # raises at the first bad record in order
    return total


def worker_main() -> int:
    """A report worker (:func:`gateway._workers.serve`): the head holds the filters, each task a share of
    segment tasks, answered with their :class:`Aggregate`, pickled."""

    def start(head: bytes) -> Callable[[bytes], bytes]:
        given = json.loads(head)
        filters = ReportFilters(**given["filters"])
        denied_cap = int(given["denied_cap"])

        def share(data: bytes) -> bytes:
            total = Aggregate(denied_cap=denied_cap)
            for task in json.loads(data):
                total.merge(aggregate_segment(SegmentTask(**task), filters, denied_cap))
            return pickle.dumps(total, protocol=pickle.HIGHEST_PROTOCOL)

        return share

    return serve(start)

"""Worker pools for the tests of the parallel paths (verify, report): the package's own pool, observed.

The parallel functions take the pool they map their tasks over (``worker_pool=``); a test passes
``partial(CountingPool, taken)`` to learn how many answers the parallel pass took from its workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from gateway._workers import WorkerPool

_T = TypeVar("_T")


class CountingPool(WorkerPool):
    """The package's :class:`WorkerPool`, counting the answers its caller took: ``taken`` gets one entry per pool
    started, the number of answers taken from it."""

    def __init__(self, taken: list[int], code: str, count: int, **options: Any) -> None:
        super().__init__(code, count, **options)
        self.counts = taken
        self.index = len(taken)
        taken.append(0)

    def map(self, tasks: Iterable[bytes], decode: Callable[[bytes], _T]) -> Iterator[_T]:
        return self._counted(super().map(tasks, decode))  # the first tasks go out now, as with the real pool

    def _counted(self, answers: Iterator[_T]) -> Iterator[_T]:
        for answer in answers:
            self.counts[self.index] += 1
            yield answer

"""What ``GET /readyz`` asks the engine (is it reachable, are the policies' images present), remembered for a
second: the endpoint is unauthenticated, so without this every call from anyone is a round trip to the engine.

The trail's check (:func:`trail_check`) is not remembered: it is local and cheap, and a full disk must show at
once. It fails while the trail cannot create a file, and while its file system is below the free-space
watermark, where every request is refused with 507 (``audit.low_space``): out of rotation until there is room.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from gateway.audit import AuditSink, JsonlAuditTrail
from gateway.errors import AuditUnavailableError

__all__ = ["Check", "EngineState", "ImageLookup", "ask_engine", "trail_check"]

Check = tuple[bool, str]
"""A check's outcome and, when it failed, why (for the log)."""


class ImageLookup(Protocol):
    """What readiness needs of a runner (:class:`gateway.runner.Runner` has it)."""

    def image_id(self, image: str) -> str | None: ...


def ask_engine(runner: ImageLookup, images: Sequence[str]) -> dict[str, Check]:
    """``engine``: the engine answers; ``image``: every one of ``images`` is present."""
    try:
        missing = [image for image in images if runner.image_id(image) is None]
    except Exception as exc:  # noqa: BLE001 - any failure to ask the engine means it is not reachable
        return {"engine": (False, f"{type(exc).__name__}: {exc}"), "image": (False, "the engine did not answer")}
    return {"engine": (True, ""), "image": (not missing, f"missing: {', '.join(missing)}" if missing else "")}


class EngineState:
    """:func:`ask_engine`'s answer for a set of images, asked again only after ``ttl_s`` (by ``clock``) or for
    other images (a reload changed the policies). Callers at the same time wait for one question to the engine."""

    def __init__(
        self,
        ask: Callable[[Sequence[str]], dict[str, Check]],
        *,
        ttl_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ask = ask
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: tuple[float, tuple[str, ...], dict[str, Check]] | None = None
        """When it was asked, for which images, and the answer."""

    def __call__(self, images: Sequence[str]) -> dict[str, Check]:
        """The engine's checks for ``images``, at most ``ttl_s`` old."""
        wanted = tuple(images)
        with self._lock:
            now = self._clock()
            if self._last is not None:
                asked_at, asked_for, answer = self._last
                if asked_for == wanted and now - asked_at < self._ttl_s:
                    return dict(answer)
            answer = self._ask(wanted)
            self._last = (now, wanted, answer)
            return dict(answer)


def trail_check(audit: AuditSink) -> Check:
    """``audit``: the trail can create a file in its directory, and its file system is at or above its
    watermark (below it, new work is refused). A sink without a directory (in memory) passes."""
    directory = getattr(audit, "directory", None)
    if directory is None:
        return True, ""
    try:
        with tempfile.NamedTemporaryFile(dir=os.fspath(directory), prefix=".readyz-"):
            pass
    except OSError as exc:
        return False, f"{directory}: {exc.strerror or exc}"
    if isinstance(audit, JsonlAuditTrail):
        try:
            free, watermark = audit.space()
        except AuditUnavailableError as exc:
            return False, exc.message
        if free < watermark:
            return False, (
                f"{directory}: {free} bytes free, below the trail's watermark of {watermark} bytes "
                f"({audit.min_free}): new work is refused (507) until there is room"
            )
    return True, ""

"""A fake runner for unit tests of the layers above the runner (Gateway, CLI, tool).

Deterministic and engine-free: it records every call and answers with scripted outcomes. It is never used for
a security test; containment is only ever tested against a real engine (``tests/integration``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from gateway.decision.engine import Assembler
from gateway.decision.settings import SandboxProfile
from gateway.errors import (
    CancelledRunError,
    GatewayError,
    ImageMissingError,
    OutputCallbackError,
    SandboxError,
    UnsafeOptionsError,
)
from gateway.runner.docker.options import POOL_LABEL, DockerAssembler, guard, pool_key, profile_options, profile_part
from gateway.runner.interface import NOTHING_RAN, OnGone, OnOutput, Outcome, Payload, RunSpec, prepare_and_run
from gateway.runspec import Workspace

__all__ = ["FakeRunner", "FakeSandbox", "make_outcome"]

OutcomeSource = Outcome | Callable[[RunSpec, Payload], Outcome] | Iterable[Outcome]


def make_outcome(**overrides: Any) -> Outcome:
    """An ``Outcome`` of a clean exit 0 with empty output; any field can be overridden."""
    base = replace(
        NOTHING_RAN, exit_code=0, duration_ms=1, container_id="fake-container", image_id="sha256:" + "0" * 64
    )
    if "stdout" in overrides and "stdout_bytes" not in overrides:
        overrides["stdout_bytes"] = len(overrides["stdout"])
    if "stderr" in overrides and "stderr_bytes" not in overrides:
        overrides["stderr_bytes"] = len(overrides["stderr"])
    return replace(base, **overrides)


def _default(spec: RunSpec, payload: Payload) -> Outcome:
    # ``print(2+2)`` answers 4, so the simplest end-to-end unit tests read naturally; everything else exits 0
    # with no output.
    stdout = b"4\n" if payload.code.strip() == "print(2+2)" else b""
    return make_outcome(stdout=stdout)


@dataclass(eq=False)
class FakeSandbox:
    spec: RunSpec
    container_id: str | None
    used: bool = False
    profile: SandboxProfile | None = None
    """Set for a pooled sandbox (``prepare_idle``): the profile it was made from."""


@dataclass(eq=False)
class FakeRunner:
    """Scripted runner.

    ``outcome``: one ``Outcome`` for every run, a function ``(spec, payload) -> Outcome``, or a sequence used
    in order. ``error``: raised by ``prepare`` instead (simulates engine failures). ``images``: image name →
    id for ``image_id``; an image not listed is missing, and with ``pull="never"`` ``prepare`` raises
    ``ImageMissingError`` like the real runner (when ``images`` is ``None`` every image is present).
    ``assembler``: the backend options it claims to run (the Docker assembler unless given), so decisions
    made for it look exactly like decisions made for the Docker runner.

    Streaming like the real runner: ``on_output`` gets the scripted outcome's stdout, then its stderr (each
    one chunk, when not empty); a callback that raises ends the run with ``OutputCallbackError`` carrying the
    outcome of the output delivered so far. ``cancel`` is checked before the run and after every chunk;
    once set the run ends with ``CancelledRunError`` (a callback that sets it cancels the rest of the run).
    """

    outcome: OutcomeSource | None = None
    error: GatewayError | None = None
    images: dict[str, str] | None = None
    calls: list[tuple[RunSpec, Payload]] = field(default_factory=list)
    """Every ``(spec, payload)`` that was run, in order."""
    prepared: list[RunSpec] = field(default_factory=list)
    """Every spec ``prepare`` accepted."""
    reaped: int = 0
    """How many times ``reap`` was called."""
    live: set[str] = field(default_factory=set)
    """Ids of sandboxes prepared and not yet destroyed (should be empty after every call)."""
    assembler: Assembler = field(default_factory=DockerAssembler)
    closed: bool = False
    """Whether ``close`` was called."""
    pooled: list[str] = field(default_factory=list)
    """Ids of the pooled sandboxes made (``prepare_idle``), in order."""
    claimed: list[str] = field(default_factory=list)
    discarded: list[str] = field(default_factory=list)
    _ids: Iterable[int] = field(default_factory=lambda: itertools.count(1), repr=False)
    _seq: Any = field(default=None, repr=False)

    def close(self) -> None:
        self.closed = True

    def image_id(self, image: str) -> str | None:
        if self.images is None:
            return "sha256:" + "0" * 64
        return self.images.get(image)

    def prepare(self, spec: RunSpec) -> FakeSandbox:
        if self.error is not None:
            raise self.error
        if self.image_id(spec.image) is None and spec.pull == "never":
            raise ImageMissingError(f"image {spec.image!r} is not present (fake runner)")
        self.prepared.append(spec)
        cid = f"fake-{next(iter(self._ids))}"
        self.live.add(cid)
        return FakeSandbox(spec=spec, container_id=cid)

    def run(
        self, sandbox: Any, payload: Payload, *, on_output: OnOutput | None = None,
        cancel: threading.Event | None = None, on_gone: OnGone | None = None,
    ) -> Outcome:  # fmt: skip
        if not isinstance(sandbox, FakeSandbox) or sandbox.used:
            raise SandboxError("a fake sandbox is used once")
        sandbox.used = True
        try:
            self.calls.append((sandbox.spec, payload))
            result = replace(self._next(sandbox.spec, payload), container_id=sandbox.container_id)
            _stream(result, on_output, cancel)
            return result
        finally:
            self.live.discard(sandbox.container_id or "")
            if on_gone is not None:
                on_gone(None)

    def execute(
        self, spec: RunSpec, payload: Payload, *, on_output: OnOutput | None = None,
        cancel: threading.Event | None = None, on_gone: OnGone | None = None,
    ) -> Outcome:  # fmt: skip
        return prepare_and_run(self, spec, payload, on_output=on_output, cancel=cancel, on_gone=on_gone)

    # -- the warm pool (``PoolingRunner``) -------------------------------------------------------------

    def pool_key(self, profile: SandboxProfile) -> str:
        return pool_key(profile)

    def prepare_idle(self, profile: SandboxProfile, *, ttl_s: float, workspace: Workspace | None = None) -> FakeSandbox:
        """A pooled fake sandbox of ``profile``, with ``workspace`` (``error`` raised instead, like ``prepare``)."""
        if self.error is not None:
            raise self.error
        options = profile_options(profile)
        options["labels"] = {**options["labels"], POOL_LABEL: pool_key(profile)}
        spec = RunSpec(options=options, timeout_s=ttl_s, output_bytes=0, pull=profile.pull, workspace=workspace)
        cid = f"fake-pool-{next(iter(self._ids))}"
        self.live.add(cid)
        self.pooled.append(cid)
        return FakeSandbox(spec=spec, container_id=cid, profile=profile)

    def claim(self, sandbox: Any, spec: RunSpec) -> FakeSandbox | None:
        """The Docker runner's checks (guard again, exactly the decision's profile part, the same workspace);
        None once the sandbox was discarded or reaped."""
        if not isinstance(sandbox, FakeSandbox) or sandbox.profile is None or sandbox.used:
            raise SandboxError("only an unused pooled fake sandbox can be claimed")
        guard(sandbox.spec.options)
        made = profile_part(sandbox.spec.options)
        made["labels"] = {k: v for k, v in made["labels"].items() if k != POOL_LABEL}
        if spec.mounts or spec.workspace != sandbox.spec.workspace or made != profile_part(spec.options):
            raise UnsafeOptionsError("the pooled fake sandbox was made with other options than the decision's")
        if sandbox.container_id not in self.live:
            return None
        sandbox.used = True
        self.claimed.append(str(sandbox.container_id))
        return FakeSandbox(spec=spec, container_id=sandbox.container_id, profile=sandbox.profile)

    def discard(self, sandbox: Any) -> None:
        if isinstance(sandbox, FakeSandbox):
            sandbox.used = True
            self.live.discard(sandbox.container_id or "")
            self.discarded.append(str(sandbox.container_id))

    def reap(self, *, everything: bool = False, expired_only: bool = False) -> list[str]:
        self.reaped += 1
        gone = sorted(self.live)
        self.live.clear()
        return gone

    def _next(self, spec: RunSpec, payload: Payload) -> Outcome:
        source = self.outcome
        if source is None:
            return _default(spec, payload)
        if isinstance(source, Outcome):
            return source
        if callable(source):
            return source(spec, payload)
        if self._seq is None:
            self._seq = iter(source)
        try:
            nxt: Outcome = next(self._seq)
        except StopIteration:
            raise SandboxError("the fake runner ran out of scripted outcomes") from None
        return nxt


def _stream(result: Outcome, on_output: OnOutput | None, cancel: threading.Event | None) -> None:
    """Deliver a scripted outcome's output the way the Docker runner does (see :class:`FakeRunner`)."""
    sent = {"stdout": b"", "stderr": b""}

    def so_far() -> Outcome:
        return replace(
            result, exit_code=None, stdout=sent["stdout"], stderr=sent["stderr"],
            stdout_bytes=len(sent["stdout"]), stderr_bytes=len(sent["stderr"]), files={},
        )  # fmt: skip

    def check_cancel() -> None:
        if cancel is not None and cancel.is_set():
            error = CancelledRunError("the run was cancelled by its caller; the sandbox was killed (fake runner)")
            error.outcome = so_far()
            raise error

    check_cancel()
    for name, data in (("stdout", result.stdout), ("stderr", result.stderr)):
        sent[name] = data  # kept before the callback sees it, as the Docker runner keeps it
        if data and on_output is not None:
            try:
                on_output(name, data)
            except Exception as exc:  # reported like the Docker runner reports it
                error = OutputCallbackError(f"the output callback raised {type(exc).__name__}: {exc} (fake)")
                error.outcome = so_far()
                raise error from exc
        check_cancel()

"""Fakes for the session manager's unit tests (tests/unit/sessions/, and the tool's and MCP's session tests): a
kernel that keeps a Python namespace, a kernel runner that opens it, a workspace store that keeps nothing on
disk, and a clock the test moves."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import SandboxError
from gateway.resources import default_policy_path
from gateway.runner.fake import FakeRunner, make_outcome
from gateway.runner.interface import CellResult, OnOutput, Outcome, RunSpec
from gateway.runner.workspace import Workspace
from gateway.slots import Slot

SESSIONS_POLICY = default_policy_path().parent / "examples" / "sessions.yaml"


class FakeKernel:
    """A kernel that keeps a Python namespace between cells (test code only). A cell ``kill:<reason>`` kills it;
    ``wait`` blocks until :attr:`release` is set."""

    def __init__(self, spec: RunSpec, slot: Slot | None, number: int) -> None:
        self.spec = spec
        self.slot = slot
        self.namespace: dict[str, Any] = {}
        self.killed: str | None = None
        self.container_id: str | None = f"fake-kernel-{number}"
        self.release = threading.Event()
        self.entered = threading.Event()
        self.cells: list[tuple[str, float]] = []
        self.given: list[tuple[dict[str, bytes], dict[str, str]]] = []
        """Each cell's ``files`` and ``env``."""

    def execute(
        self, code: str, *, timeout_s: float, files: Mapping[str, bytes] | None = None,
        env: Mapping[str, str] | None = None, on_output: OnOutput | None = None, cancel: threading.Event | None = None,
    ) -> CellResult:  # fmt: skip
        if self.killed is not None:
            raise SandboxError(f"kernel is gone ({self.killed})")
        self.cells.append((code, timeout_s))
        self.given.append((dict(files or {}), dict(env or {})))
        if code == "wait":
            self.entered.set()
            self.release.wait(10)
            return CellResult(make_outcome(), None, False, False, None)
        if code.startswith("kill:"):
            self._die(code.removeprefix("kill:"))
            return CellResult(make_outcome(exit_code=None), None, False, False, self.killed)
        try:
            try:
                value = repr(eval(code, self.namespace))  # noqa: S307 - the tests' own code, in a fake kernel
            except SyntaxError:
                exec(code, self.namespace)  # noqa: S102 - as above
                value = None
        except Exception as exc:  # noqa: BLE001 - a cell's exception is its traceback, as in a kernel
            return CellResult(make_outcome(exit_code=1, stderr=repr(exc).encode()), None, False, False, None)
        return CellResult(make_outcome(), value, False, False, None)

    def _die(self, reason: str) -> None:
        if self.killed is None:
            self.killed = reason
        slot, self.slot = self.slot, None
        if slot is not None:
            slot.release()

    def close(self) -> None:
        self._die("closed")


@dataclass
class KernelFakeRunner(FakeRunner):
    kernels: list[FakeKernel] = field(default_factory=list)

    def open_kernel(
        self, spec: RunSpec, *, files: Any = None, slot: Slot | None = None, grace_s: float = 2.0
    ) -> FakeKernel:
        kernel = FakeKernel(spec, slot, len(self.kernels))
        self.kernels.append(kernel)
        return kernel


class HeldRun:
    """A fake runner's ``outcome`` that holds each run until :attr:`release` is set (at most ``wait_s``);
    :attr:`entered` is set once a run has begun."""

    def __init__(self, wait_s: float = 10.0) -> None:
        self.wait_s = wait_s
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, spec: RunSpec, payload: Any) -> Outcome:
        self.entered.set()
        self.release.wait(self.wait_s)
        return make_outcome()


class FakeWorkspaces:
    """A workspace store that keeps nothing on disk: which workspaces exist."""

    instance = "fake-instance"

    def __init__(self) -> None:
        self.live: list[Workspace] = []
        self.destroyed: list[Workspace] = []

    def create(self, size: int, uid: int, gid: int) -> Workspace:
        workspace = Workspace(f"{len(self.live):016x}", self.instance, size, uid, gid, "/nowhere", 1, 2)
        self.live.append(workspace)
        return workspace

    def destroy(self, workspace: Workspace) -> None:
        self.live.remove(workspace)
        self.destroyed.append(workspace)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now

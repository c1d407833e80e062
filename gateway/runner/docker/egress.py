"""A Docker run's egress: its proxy's directory bound read-only at ``EGRESS_TARGET``, checked after start.

The runner opens the run's proxy (``gateway.egress.host``) before it creates the container, binds the run's
directory with :func:`bind_egress` (after the guard, which refuses any assembled mount there: the key is the
runner's own, as the workspace's is), and after start, before any payload, :func:`verify_egress` checks that the
container has exactly that directory there, by device and inode, read-only, under runc and runsc alike. The
container keeps ``network_mode: none``: the proxy's socket is its only way out, and the supervisor bridges
``127.0.0.1:EGRESS_PORT`` to it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.errors import SandboxError, UnsafeOptionsError
from gateway.runner.docker.mounts import _container_root
from gateway.runner.docker.options import EGRESS_LABEL
from gateway.runner.interface import OnOutput, Outcome, RunSpec
from gateway.runner.supervisor import EGRESS_TARGET

if TYPE_CHECKING:
    from gateway.egress.proxy import EgressPlan
    from gateway.egress.secrets import SecretStore

__all__ = [
    "OutputRedactor",
    "bind_egress",
    "bind_secrets",
    "reap_egress",
    "redact_outcome",
    "sandbox_user",
    "verify_egress",
    "wants_egress",
]

_ACCEPTING = 0x10000
"""``__SO_ACCEPTCON`` in ``/proc/net/unix``'s flags: a listening socket."""


def wants_egress(spec: RunSpec) -> bool:
    """Whether ``spec`` is a run with egress; options and plan must agree (a label without a plan, or a plan
    without the label, is a gateway bug: refused, nothing is created)."""
    labels = spec.options.get("labels") or {}
    labelled = isinstance(labels, Mapping) and EGRESS_LABEL in labels
    if labelled != (spec.egress is not None):
        raise UnsafeOptionsError(
            "the run's options and its egress plan disagree (the options "
            + ("ask for egress through the proxy, but the run has no egress plan" if labelled else "have no egress")
            + "); a pooled or ready container never has egress. Nothing was created"
        )
    return labelled


def bind_secrets(plan: EgressPlan, store: SecretStore) -> EgressPlan:
    """``plan`` with the values of the secrets it binds (``EgressPlan.values``, kept in the gateway process); a
    secret without a usable value refuses the run (fail closed: it would otherwise reach the host without its
    credential), before any container is made."""
    from gateway.egress.secrets import value_problem  # noqa: PLC0415 -- see the imports

    values: dict[str, str] = {}
    for rule in plan.secrets:
        value = store.value(rule.name)
        if value is None:
            raise SandboxError(store.missing(rule.name))
        problem = value_problem(value)
        if problem is not None:
            raise SandboxError(f"the value of secret {rule.name!r} {problem}; fix it in {store.source}; nothing ran")
        values[rule.name] = value
    return dataclasses.replace(plan, values=values)


def redact_outcome(outcome: Outcome, values: Mapping[str, str]) -> Outcome:
    """``outcome`` with the values of the run's secrets (and their base64 forms) erased from its stdout, stderr and
    returned files as ``[secret:<name>]``, each erasure listed in ``outcome.egress.redactions``. An upstream that
    echoes the credential it was sent must not hand it to the caller through the run's output."""
    if not values or outcome.egress is None:
        return outcome
    from gateway.egress.secrets import Redaction, redact  # noqa: PLC0415 -- see the imports

    found: list[Redaction] = []

    def erase(data: bytes, where: str) -> bytes:
        clean, counts = redact(data, values)
        found.extend(Redaction(name, where, count) for name, count in counts.items())
        return clean

    stdout, stderr = erase(outcome.stdout, "stdout"), erase(outcome.stderr, "stderr")
    files = {name: erase(data, f"file:{name}") for name, data in outcome.files.items()}
    if not found:
        return outcome
    return dataclasses.replace(
        outcome,
        stdout=stdout,
        stderr=stderr,
        stdout_bytes=outcome.stdout_bytes + len(stdout) - len(outcome.stdout),
        stderr_bytes=outcome.stderr_bytes + len(stderr) - len(outcome.stderr),
        files=files,
        egress=dataclasses.replace(outcome.egress, redactions=tuple(found)),
    )


class OutputRedactor:
    """An ``on_output`` callback that passes chunks on with the run's secret values erased, as ``redact_outcome``
    erases them from the outcome. A value may be split across chunks, so the last bytes of each stream (fewer than
    a value's longest form) are held back until more arrive, or until :meth:`flush` when the run has ended."""

    def __init__(self, on_output: OnOutput, values: Mapping[str, str]) -> None:
        from gateway.egress.secrets import longest_form  # noqa: PLC0415 -- see the imports

        self._on_output = on_output
        self._values = dict(values)
        self._hold = longest_form(values)
        self._pending: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def __call__(self, stream: str, data: bytes) -> None:
        from gateway.egress.secrets import redact  # noqa: PLC0415 -- see the imports

        with self._lock:
            clean, _counts = redact(self._pending.get(stream, b"") + data, self._values)
            cut = max(0, len(clean) - self._hold)
            self._pending[stream] = clean[cut:]
        if cut:
            self._on_output(stream, clean[:cut])

    def flush(self) -> None:
        """Pass on what was held back (the run ended: nothing more can complete a value)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for stream, data in pending.items():
            if data:
                self._on_output(stream, data)


def sandbox_user(spec: RunSpec) -> tuple[int, int]:
    """The sandbox's ``uid, gid`` (the guarded ``user`` option, numeric)."""
    uid, _, gid = str(spec.options["user"]).partition(":")
    return int(uid), int(gid)


def bind_egress(kwargs: Mapping[str, Any], directory: Path) -> dict[str, Any]:
    """``kwargs`` (guarded create options) with the run's egress ``directory`` bound read-only at ``EGRESS_TARGET``
    (a read-only bind: the program connects to the socket, and can create nothing there)."""
    out = dict(kwargs)
    out["mounts"] = [
        *list(out.get("mounts") or []),
        {
            "Type": "bind",
            "Source": str(directory),
            "Target": EGRESS_TARGET,
            "ReadOnly": True,
            "BindOptions": {"NonRecursive": True, "Propagation": "rprivate"},
        },
    ]
    return out


def verify_egress(inspect: Mapping[str, Any], runtime: str, directory: Path) -> dict[str, Any]:
    """After start, before the payload: the engine bound ``directory`` read-only at ``EGRESS_TARGET``, and the
    container's ``EGRESS_TARGET`` is that directory (device and inode). Returns ``inspect`` without that mount (for
    the staging's own check of the judged mounts)."""
    mounts = list(inspect.get("Mounts") or [])
    ours = [m for m in mounts if m.get("Destination") == EGRESS_TARGET]
    if [(m.get("Source"), m.get("RW"), m.get("Type")) for m in ours] != [(str(directory), False, "bind")]:
        raise SandboxError(f"the engine's {EGRESS_TARGET} mounts {ours} are not the run's egress directory")
    pid = int((inspect.get("State") or {}).get("Pid") or 0)
    inside = f"{_container_root(pid, runtime, str(inspect.get('Id') or ''))}{EGRESS_TARGET}"
    try:
        found, st = os.stat(inside), os.stat(directory)
    except OSError as exc:
        raise SandboxError(f"cannot check {EGRESS_TARGET} in the container: {exc.strerror}; nothing ran") from exc
    if (found.st_dev, found.st_ino) != (st.st_dev, st.st_ino):
        raise SandboxError(f"{EGRESS_TARGET} in the container is not the run's egress directory; nothing ran")
    return {**inspect, "Mounts": [m for m in mounts if m.get("Destination") != EGRESS_TARGET]}


def reap_egress(root: Path, *, grace_s: float) -> list[str]:
    """Remove the run directories below ``root`` in which no proxy listens any more (a gateway that died left them)
    and that are older than ``grace_s``; return their paths. A live run's proxy is never connected to: whether it
    listens is read from ``/proc/net/unix``."""
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    listening = _listening()
    now = time.time()
    removed = []
    for name in names:
        directory = root / name
        try:
            if now - directory.lstat().st_mtime < grace_s:
                continue
            entries = [directory / entry for entry in os.listdir(directory)]
            if any(str(entry) in listening for entry in entries):
                continue
            for entry in entries:
                entry.unlink()
            directory.rmdir()
        except OSError:
            continue
        removed.append(str(directory))
    return removed


def _listening() -> set[str]:
    """The paths of the unix sockets listening in this network namespace (``/proc/net/unix``)."""
    found = set()
    with contextlib.suppress(OSError), open("/proc/net/unix", encoding="utf-8", errors="surrogateescape") as f:
        next(f, None)
        for line in f:
            fields = line.split(None, 7)
            if len(fields) == 8 and int(fields[3], 16) & _ACCEPTING:
                found.add(fields[7].rstrip("\n"))
    return found

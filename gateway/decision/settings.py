"""Resolved sandbox settings: every value of one execution decided, in no backend's vocabulary.

:func:`resolve` takes the request's value where it gave one and the policy default otherwise. The rules judge
these settings, and the backend's assembler turns the very same object into its own options, so what was
judged is what runs. :class:`SandboxProfile` is the part that depends only on the policy and the resolved
limits (what a warm pool can prepare ahead of a request); the rest belongs to one run.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from typing import Any

from gateway.policy.model import RUNSC_MIN_PIDS, Policy
from gateway.request import ExecutionRequest

__all__ = ["BackendLimits", "ResolvedMount", "SandboxProfile", "SandboxSettings", "resolve"]


@dataclass(frozen=True, slots=True)
class BackendLimits:
    """What a backend says it can give one sandbox, besides the fixed minimums every backend shares (the policy
    model's ``MIN_CPUS``, ``MIN_MEMORY``, ...). The limits rules deny a request beyond them, even in audit mode,
    instead of letting the backend fail after a container was made. ``None``: the backend does not know."""

    max_cpus: float | None = None
    """The most CPUs one sandbox can be given (for an engine: the CPUs of its host)."""


@dataclass(frozen=True, slots=True)
class ResolvedMount:
    source: str
    """As the request wrote it."""
    canonical: str
    """``realpath`` of the source: what is judged and what is bound."""
    target: str
    """Container path as requested; the ``mounts.target`` rule denies it unless it is already normalised."""
    mode: str
    """``ro`` or ``rw``."""


@dataclass(frozen=True, slots=True)
class SandboxProfile:
    """What a sandbox is made of before any request arrives: the policy, the image, the runtime, the limits.

    Two requests with equal profiles can be served by identically prepared sandboxes (the warm pool's key).
    """

    policy: str
    """``name@sha256:<hex>`` of the policy that decided it."""
    image: str
    runtime: str
    network: str
    memory: int
    """Bytes; memory and memory+swap alike."""
    cpus: float
    pids: int
    tmpfs: int
    """Bytes of each of ``/tmp`` and the workspace."""
    nofile: int
    uid: int
    gid: int
    pull: str
    """``never`` or ``if-missing``."""


@dataclass(frozen=True, slots=True)
class SandboxSettings:
    """Every setting of one execution: its profile plus what belongs to this run alone."""

    profile: SandboxProfile
    language: str
    timeout_s: float
    output_bytes: int
    output_files_bytes: int
    output_files: int
    """How many files the run returns at most."""
    env: tuple[tuple[str, str], ...]
    mounts: tuple[ResolvedMount, ...]
    code_bytes: int
    files_bytes: int

    def plan(self) -> dict[str, Any]:
        """The ``plan`` object of the decision record (a contract: keys are added, never renamed)."""
        p = self.profile
        return {
            "image": p.image,
            "runtime": p.runtime,
            "network": p.network,
            "timeout_s": self.timeout_s,
            "output_bytes": self.output_bytes,
            "output_files_bytes": self.output_files_bytes,
            "output_files": self.output_files,
            "pull": p.pull,
            "language": self.language,
            "code_bytes": self.code_bytes,
            "files_bytes": self.files_bytes,
        }


def _canonical(path: str) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return posixpath.normpath(path)


def _pick(asked: float | None, default: float) -> float:
    return default if asked is None else asked


def resolve(policy: Policy, request: ExecutionRequest) -> SandboxSettings:
    """Decide every setting: the request's value where it gave one, otherwise the policy default."""
    lim = policy.limits
    req = request.limits
    runtime = request.runtime or policy.runtime.default
    pids = req.pids
    if pids is None:
        pids = int(lim.pids.default)
        if runtime == "runsc" and pids < RUNSC_MIN_PIDS:
            pids = min(RUNSC_MIN_PIDS, int(lim.pids.max))
    profile = SandboxProfile(
        policy=policy.ref,
        image=request.image or policy.images.default,
        runtime=runtime,
        network=request.network or policy.network.default,
        memory=int(_pick(req.memory, lim.memory.default)),
        cpus=float(_pick(req.cpus, lim.cpus.default)),
        pids=pids,
        tmpfs=int(_pick(req.tmpfs, lim.tmpfs.default)),
        nofile=lim.nofile,
        uid=policy.user.uid,
        gid=policy.user.gid,
        pull=policy.pull,
    )
    return SandboxSettings(
        profile=profile,
        language=request.language or policy.languages.default,
        timeout_s=float(_pick(req.timeout_s, lim.timeout_s.default)),
        output_bytes=int(_pick(req.output_bytes, lim.output_bytes.default)),
        output_files_bytes=int(_pick(req.output_files_bytes, lim.output_files_bytes.default)),
        output_files=int(_pick(req.output_files, lim.output_files.default)),
        env=tuple(request.env.items()),
        mounts=tuple(ResolvedMount(m.source, _canonical(m.source), m.target, m.mode) for m in request.mounts),
        code_bytes=request.code_bytes,
        files_bytes=request.files_bytes,
    )

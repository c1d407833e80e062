"""The Docker runner with every execution through a pooled container, for the containment suites' ``pooled`` mode:
made from the profile part of the run's options before the payload exists, idle for a moment, then claimed like the
warm pool claims one (guard again, exact profile match, and only then the payload; ``WarmPool`` adds only the
bookkeeping of many)."""

from __future__ import annotations

import time
from typing import Any

from gateway.runner.docker.options import profile_part
from gateway.runner.docker.runner import DockerRunner
from gateway.runner.interface import OnOutput, Outcome, Payload, RunSpec

MODES = ("cold", "pooled")


class PooledRunner(DockerRunner):
    """See the module."""

    def execute(
        self, spec: RunSpec, payload: Payload, *, on_output: OnOutput | None = None, **kw: Any
    ) -> Outcome:  # fmt: skip
        idle = self.prepare_pooled(profile_part(spec.options), ttl_s=spec.timeout_s + 60, pull=spec.pull)
        time.sleep(0.2)  # idle before the claim: the deadline must count from the hand-over, not from start
        claimed = self.claim(idle, spec)
        assert claimed is not None, "the pooled container died while idle"
        return self.run(claimed, payload, on_output=on_output, **kw)


def runner_for(mode: str, engine: Any) -> DockerRunner:
    """The runner of one mode of :data:`MODES`."""
    return PooledRunner(engine) if mode == "pooled" else DockerRunner(engine)

"""A fixed synthetic trail for report tests: a real Gateway (FakeRunner) writing through JsonlAuditTrail.

Deterministic: the trail's clock is fixed (one step per record) and ``uuid.uuid4`` (request, decision and
event ids) is replaced by a counter for the duration of the write, so the records, and every figure of the
report, are the same on every run. Only what the gateway stamps about its own process (pid, version, the
policy file's absolute path) varies, and with it the hashes.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gateway import Gateway
from gateway.audit import JsonlAuditTrail
from gateway.egress import ConnectionRecord, EgressReport
from gateway.errors import SandboxError
from gateway.policy import PolicySet, load_policy
from gateway.resources import default_policy_path, policies_dir
from gateway.runner.fake import FakeRunner
from gateway.runner.interface import Outcome, RunSpec

AUDIT_POLICY = Path(__file__).resolve().parents[1] / "policies" / "audit-warnings" / "policy.yaml"
EGRESS_POLICY = policies_dir() / "examples" / "egress-mirror.yaml"
START = datetime(2026, 3, 2, 9, 0, 0, tzinfo=UTC)


class FixedClock:
    """``start``, then ``step`` later at every call."""

    def __init__(self, start: datetime = START, step: timedelta = timedelta(seconds=7)) -> None:
        self._times = (start + i * step for i in itertools.count())

    def __call__(self) -> datetime:
        return next(self._times)


@contextmanager
def counted_uuids(prefix: int) -> Iterator[None]:
    """``uuid.uuid4`` returns ``<prefix>-...-<n>`` UUIDs while the block runs."""
    counter = itertools.count(1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=(prefix << 96) | next(counter)))
        yield


def _outcome(**kw: Any) -> Outcome:
    base: dict[str, Any] = {
        "exit_code": 0, "stdout": b"4\n", "stderr": b"", "stdout_truncated": False, "stderr_truncated": False,
        "stdout_bytes": 2, "stderr_bytes": 0, "timed_out": False, "oom_killed": False,
        "output_limit_killed": False, "resource_killed": False, "duration_ms": 120,
        "container_id": "c" * 64, "image_id": "sha256:" + "a" * 64,
    }  # fmt: skip
    base.update(kw)
    return Outcome(**base)


def _connection(host: str, port: int, method: str = "CONNECT", **kw: Any) -> ConnectionRecord:
    base: dict[str, Any] = {
        "method": method, "host": host, "port": port, "address": "127.0.0.1", "allowed": True,
        "rule": "network.egress.allowed", "message": "", "bytes_out": 517, "bytes_in": 4096, "duration": 0.05,
        "ended": "closed",
    }  # fmt: skip
    base.update(kw)
    return ConnectionRecord(**base)


def _denied(host: str, port: int, rule: str, message: str) -> ConnectionRecord:
    return _connection(
        host, port, address=None, allowed=False, rule=rule, message=message, bytes_out=0, bytes_in=0, duration=0.0,
        ended="denied",
    )  # fmt: skip


EGRESS = EgressReport(
    records=(
        _connection("mirror.internal", 18443),
        _connection("mirror.internal", 18089, "GET", bytes_out=90, bytes_in=20_480),
        _denied("pypi.org", 443, "network.egress.host", "pypi.org is not an allowed destination"),
        _denied("169.254.169.254", 80, "network.egress.literal", "an IP literal is never a destination"),
        _denied("mirror.internal", 22, "network.egress.port", "mirror.internal allows ports 18089, 18443 only"),
        _denied("files.pythonhosted.org", 443, "network.egress.host", "not an allowed destination"),
    ),
    connections=2,
    denied=4,
    bytes_out=607,
    bytes_in=24_576,
)
"""What the egress run's proxy saw: two connections to the mirror, four attempts denied by three rules."""

OUTCOMES: dict[str, Callable[[RunSpec], Outcome]] = {
    "ok": lambda _s: _outcome(),
    "exit1": lambda _s: _outcome(exit_code=1, duration_ms=250),
    "timeout": lambda _s: _outcome(exit_code=None, timed_out=True, duration_ms=10_000),
    "oom": lambda _s: _outcome(exit_code=137, oom_killed=True, duration_ms=800),
    "flood": lambda _s: _outcome(
        exit_code=None, stdout_truncated=True, stdout_bytes=2_000_000, output_limit_killed=True, duration_ms=1500
    ),
    "egress": lambda _s: _outcome(duration_ms=900, egress=EGRESS),
}


def _scripted(plan: list[str]) -> Callable[[RunSpec, Any], Outcome]:
    steps = iter(plan)

    def run(spec: RunSpec, _payload: Any) -> Outcome:
        step = next(steps)
        if step == "engine-error":
            raise SandboxError("the engine failed to start the container")
        return OUTCOMES[step](spec)

    return run


# (principal, request, outcome for allowed runs, dry run)
SCENARIO: list[tuple[str | None, Any, str | None, bool]] = [
    ("alice", {"code": "print(2+2)"}, "ok", False),
    ("alice", {"code": "import sys; sys.exit(1)"}, "exit1", False),
    ("bob", {"code": "while True: pass"}, "timeout", False),
    ("bob", {"code": "x = ' ' * 10**10"}, "oom", False),
    ("alice", {"code": "print('x' * 10**7)"}, "flood", False),
    ("bob", {"code": "print(1)", "image": "evil/miner:latest"}, None, False),
    ("alice", {"code": "print(1)", "limits": {"memory": "4g"}}, None, False),
    ("alice", b'{"code": 5}', None, False),
    ("alice", {"code": "print(1)"}, None, True),
    ("bob", {"code": "print(3)"}, "engine-error", False),
    ("carol", {"code": "print(1)", "limits": {"memory": "600m"}}, "ok", False),
    ("carol", {"code": "print(1)", "network": "host"}, None, False),
    ("alice", {"code": "print(5)"}, "ok", False),
]
EGRESS_SCENARIO = [*SCENARIO, ("dave", {"code": "import urllib.request", "network": "egress"}, "egress", False)]
"""The scenario and then a run with network egress (``dave``, under ``policies/examples/egress-mirror.yaml``):
the goldens' trail."""


def write_scenario(
    directory: Path,
    *,
    start: datetime = START,
    prefix: int = 0xA,
    key: bytes | None = None,
    scenario: list[tuple[str | None, Any, str | None, bool]] | None = None,
    segment_max_bytes: int = 64 << 20,
) -> Path:
    """Write the scenario's trail into ``directory`` (through the Gateway and the real writer)."""
    steps = SCENARIO if scenario is None else scenario
    plan = [outcome for principal, request, outcome, dry in steps if outcome is not None and not dry]
    by_principal = {"carol": load_policy(AUDIT_POLICY)}
    if any(principal == "dave" for principal, *_rest in steps):  # only then: its load is a record of the trail
        by_principal["dave"] = load_policy(EGRESS_POLICY)
    policies = PolicySet.of(load_policy(default_policy_path()), by_principal)
    trail = JsonlAuditTrail(
        directory, key=key, clock=FixedClock(start), host="report-test", segment_max_bytes=segment_max_bytes
    )
    with counted_uuids(prefix):
        runner = FakeRunner(outcome=_scripted(plan))
        with Gateway(policies, runner=runner, audit=trail) as gateway:
            for principal, raw, _outcome_name, dry in steps:
                request = {**raw, "principal": principal} if isinstance(raw, dict) else raw
                if dry:
                    gateway.decide(request)
                else:
                    gateway.execute(request)
    trail.close()
    return directory


def decision_dict(**changes: Any) -> dict[str, Any]:
    """A real allowed decision of the default policy as the trail stores it, its options changed by ``changes``
    (a key set to ``None`` is removed): what a record from a gateway without a control would hold."""
    from gateway.request import parse_request
    from gateway.testing import decide

    decision = decide(load_policy(default_policy_path()), parse_request({"code": "print(1)"}), request_id="r")
    data = decision.to_dict()
    options = dict(data["options"])
    for name, value in changes.items():
        if value is None:
            options.pop(name, None)
        else:
            options[name] = value
    return {**data, "options": options}


__all__ = [
    "AUDIT_POLICY",
    "EGRESS_SCENARIO",
    "START",
    "FixedClock",
    "counted_uuids",
    "decision_dict",
    "write_scenario",
]

"""A run that a gateway failure ended still reports what ran: the container, the output so far, the reason."""

from __future__ import annotations

import pytest

from gateway.errors import ContainerLeftError, InterruptedRunError, SandboxError
from gateway.policy import load_policy
from gateway.resources import policies_dir
from gateway.runner import FakeRunner
from gateway.runner.fake import make_outcome
from gateway.testing import capture_audit


def _failing(error: SandboxError | InterruptedRunError) -> FakeRunner:
    error.outcome = make_outcome(stdout=b"partial\n", container_id="c" * 64)
    return FakeRunner(error=error)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ContainerLeftError("its container could not be removed"), "runner.container_left"),
        (InterruptedRunError(15), "gateway.interrupted"),
    ],
)
def test_the_outcome_of_a_failed_run_is_kept_and_recorded(error: SandboxError, code: str) -> None:
    with capture_audit(load_policy(policies_dir() / "default.yaml"), _failing(error)) as (gw, sink):
        result = gw.execute({"code": "print(1)"})
    data = result.to_dict()
    assert data["error"]["code"] == code
    assert data["stdout"] == "partial\n"
    assert result.exit_status == 125  # a gateway failure, even though output came back
    (outcome,) = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    assert outcome["data"]["container_id"] == "c" * 64
    assert outcome["data"]["error"]["code"] == code


def test_interrupted_names_the_signal() -> None:
    assert "SIGTERM" in InterruptedRunError(15).message
    assert InterruptedRunError(15).signum == 15

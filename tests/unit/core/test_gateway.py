"""The Gateway's request path with a fake runner and an in-memory trail: ordering, fail-closed, exit statuses.

Containment itself is never tested here (see tests/integration); these tests pin down what the gateway does
around the runner: what is audited, in which order, and what never reaches the runner.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.errors import (
    EXIT_DENIED,
    EXIT_GATEWAY_FAILURE,
    EXIT_MEMORY,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    AuditUnavailableError,
    EngineUnavailableError,
)
from gateway.policy import load_policy
from gateway.resources import default_policy_path
from gateway.runner.fake import FakeRunner, make_outcome
from gateway.telemetry import get_tracer


class FlakySink(MemoryAuditSink):
    """Fails closed on one event type, to prove nothing runs past an unwritten record."""

    def __init__(self, fail_on: str) -> None:
        super().__init__()
        self.fail_on = fail_on

    def append(self, event_type: str, data: Any, **kw: Any) -> Any:
        if event_type == self.fail_on:
            raise AuditUnavailableError(f"simulated: cannot write {event_type}")
        return super().append(event_type, data, **kw)


@pytest.fixture
def policy() -> Any:
    return load_policy(default_policy_path())


def make_gateway(policy: Any, runner: FakeRunner | None = None, sink: MemoryAuditSink | None = None) -> Gateway:
    return Gateway(policy, runner=runner or FakeRunner(), audit=sink or MemoryAuditSink())


def events(sink: MemoryAuditSink) -> list[str]:
    return [r["event_type"] for r in sink.records]


def test_allowed_request_runs_once_with_the_policys_options_and_is_audited_in_order(policy: Any) -> None:
    runner, sink = FakeRunner(), MemoryAuditSink()
    gw = make_gateway(policy, runner, sink)
    result = gw.execute({"code": "print(2+2)", "principal": "agent-7"})

    assert result.allowed
    assert result.exit_status == 0
    assert result.to_dict()["stdout"] == "4\n"
    assert len(runner.calls) == 1
    spec, payload = runner.calls[0]
    assert payload.code == "print(2+2)"
    assert spec.options == result.decision.options  # type: ignore[union-attr]
    assert spec.options["network_mode"] == "none"
    assert spec.options["cap_drop"] == ["ALL"]
    assert events(sink) == ["request.received", "policy.decision", "execution.outcome"]
    assert {r["request_id"] for r in sink.records} == {result.request_id}
    assert {r["principal"] for r in sink.records} == {"agent-7"}
    decision_rec = sink.records[1]
    assert decision_rec["data"]["decision"]["allowed"] is True
    assert decision_rec["data"]["options_sha256"] == result.decision.options_sha256  # type: ignore[union-attr]
    assert decision_rec["policy"]["sha256"] == policy.sha256
    outcome_rec = sink.records[2]
    assert outcome_rec["data"]["exit_code"] == 0
    assert outcome_rec["data"]["stdout"]["bytes"] == 2


def test_denied_request_never_reaches_the_runner_and_names_every_rule(policy: Any) -> None:
    runner, sink = FakeRunner(), MemoryAuditSink()
    result = make_gateway(policy, runner, sink).execute(
        {"code": "print(1)", "image": "python:latest", "network": "host", "limits": {"memory": "64g"}}
    )
    assert not result.allowed
    assert result.exit_status == EXIT_DENIED
    assert runner.calls == []
    assert runner.prepared == []
    rules = {v["rule"] for v in result.to_dict()["violations"]}
    assert {"images.allowlist", "network.mode", "limits.memory"} <= rules
    assert events(sink) == ["request.received", "policy.decision"]
    assert sink.records[1]["data"]["decision"]["allowed"] is False
    assert sink.records[1]["data"]["options_sha256"] is None


def test_invalid_request_is_audited_and_exits_2(policy: Any) -> None:
    runner, sink = FakeRunner(), MemoryAuditSink()
    result = make_gateway(policy, runner, sink).execute(b'{"code": 42, "surprise": true}')
    assert result.exit_status == EXIT_USAGE
    assert result.decision is None
    assert runner.calls == []
    assert events(sink) == ["request.invalid"]
    paths = {p["path"] for p in sink.records[0]["data"]["problems"]}
    assert "$.code" in paths
    assert sink.records[0]["data"]["raw_bytes"] == len(b'{"code": 42, "surprise": true}')


@pytest.mark.parametrize("raw", [b"\xff\xfe not utf-8", b"{", b"[" * 100_000, b"null", "{}"])
def test_hostile_raw_input_never_raises(policy: Any, raw: bytes | str) -> None:
    runner = FakeRunner()
    result = make_gateway(policy, runner).execute(raw)
    assert result.exit_status == EXIT_USAGE
    assert runner.calls == []


@pytest.mark.parametrize("fail_on", ["request.received", "policy.decision"])
def test_audit_failure_before_the_run_denies_and_nothing_runs(policy: Any, fail_on: str) -> None:
    runner = FakeRunner()
    result = make_gateway(policy, runner, FlakySink(fail_on)).execute({"code": "print(2+2)"})
    assert not result.allowed
    assert result.exit_status == EXIT_GATEWAY_FAILURE
    assert result.error is not None
    assert result.error.code == "audit.unavailable"
    assert runner.calls == []
    assert runner.prepared == []


def test_audit_failure_after_the_run_is_reported_not_hidden(policy: Any) -> None:
    runner = FakeRunner()
    result = make_gateway(policy, runner, FlakySink("execution.outcome")).execute({"code": "print(2+2)"})
    assert len(runner.calls) == 1
    assert result.audit_ok is False
    assert result.exit_status == EXIT_GATEWAY_FAILURE
    assert result.to_dict()["stdout"] == "4\n"
    # the message says the program ran (it must not claim "nothing ran", the hint of a refused decision record)
    assert result.error is not None
    text = result.error.diagnostics()
    assert "the program ran, but its outcome could not be recorded" in text
    assert "nothing ran" not in text


def test_an_output_flood_kill_is_a_resource_kill_not_a_gateway_failure(policy: Any) -> None:
    flood = make_outcome(exit_code=None, stdout=b"x" * 10, stdout_truncated=True, output_limit_killed=True)
    result = make_gateway(policy, FakeRunner(outcome=flood)).execute({"code": "print('x' * 10**9)"})
    data = result.to_dict()
    assert (result.exit_status, data["exit_code"], data["output_limit_killed"], data["error"]) == (
        EXIT_MEMORY,
        None,
        True,
        None,
    )


def test_engine_failure_is_an_audited_outcome_with_exit_125(policy: Any) -> None:
    sink = MemoryAuditSink()
    runner = FakeRunner(error=EngineUnavailableError("no engine answers at unix:///var/run/docker.sock"))
    result = make_gateway(policy, runner, sink).execute({"code": "print(2+2)"})
    assert result.exit_status == EXIT_GATEWAY_FAILURE
    assert result.error is not None
    assert result.error.code == "runner.engine_unavailable"
    assert events(sink)[-1] == "execution.outcome"
    assert sink.records[-1]["data"]["error"]["code"] == "runner.engine_unavailable"


def test_unexpected_runner_exception_is_contained(policy: Any) -> None:
    def explode(spec: Any, payload: Any) -> Any:
        raise RuntimeError("bug in a runner")

    sink = MemoryAuditSink()
    result = make_gateway(policy, FakeRunner(outcome=explode), sink).execute({"code": "x"})
    assert result.exit_status == EXIT_GATEWAY_FAILURE
    assert result.error is not None
    assert result.error.code == "runner.sandbox_failed"
    assert sink.records[-1]["data"]["error"]["code"] == "runner.sandbox_failed"


@pytest.mark.parametrize(
    ("overrides", "status"),
    [
        ({"timed_out": True, "exit_code": None}, EXIT_TIMEOUT),
        ({"oom_killed": True, "exit_code": 137}, EXIT_MEMORY),
        ({"exit_code": 3}, 3),
        ({"resource_killed": True, "exit_code": None}, EXIT_MEMORY),
    ],
)
def test_exit_status_follows_docker_run_and_timeout(policy: Any, overrides: dict[str, Any], status: int) -> None:
    result = make_gateway(policy, FakeRunner(outcome=make_outcome(**overrides))).execute({"code": "x"})
    assert result.exit_status == status


def test_decide_audits_a_dry_run_and_runs_nothing(policy: Any) -> None:
    runner, sink = FakeRunner(), MemoryAuditSink()
    result = make_gateway(policy, runner, sink).decide({"code": "print(1)"})
    assert result.allowed
    assert runner.calls == []
    assert sink.records[-1]["data"]["dry_run"] is True


class FlushLog(MemoryAuditSink):
    """Notes whether each append asked to be waited for."""

    def __init__(self) -> None:
        super().__init__()
        self.durable: list[tuple[str, bool]] = []

    def append(self, event_type: str, data: Any, *, durable: bool = True, **kw: Any) -> Any:
        self.durable.append((event_type, durable))
        return super().append(event_type, data, durable=durable, **kw)


@pytest.mark.parametrize("run", [False, True])
def test_only_the_received_record_is_not_waited_for_and_a_durable_one_follows_before_anything_runs(
    policy: Any, run: bool
) -> None:
    sink = FlushLog()
    gw = make_gateway(policy, sink=sink)
    gw.execute({"code": "print(1)"}) if run else gw.decide({"code": "print(1)"})
    expected = [("request.received", False), ("policy.decision", True)] + ([("execution.outcome", True)] * run)
    assert sink.durable == expected


def test_context_manager_records_start_and_stop(policy: Any) -> None:
    sink = MemoryAuditSink()
    with make_gateway(policy, sink=sink) as gw:
        gw.execute({"code": "print(2+2)"})
    assert events(sink)[:2] == ["gateway.start", "policy.loaded"]
    assert sink.records[1]["data"]["sha256"] == policy.sha256
    assert events(sink)[-1] == "gateway.stop"
    # The sink was passed in: it stays its owner's (a service shares one sink between Gateways).
    assert not sink.closed


def test_result_json_has_the_contract_keys(policy: Any) -> None:
    data = make_gateway(policy).execute({"code": "print(2+2)"}).to_dict()
    for key in (
        "request_id", "allowed", "violations", "policy", "exit_code", "stdout", "stderr", "stdout_truncated",
        "stderr_truncated", "timed_out", "oom_killed", "duration_ms",
    ):  # fmt: skip
        assert key in data
    assert set(data["policy"]) == {"name", "sha256"}


def test_spans_form_a_tree_and_the_trace_id_lands_in_the_audit_record(policy: Any) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sink = MemoryAuditSink()
    gw = Gateway(policy, runner=FakeRunner(), audit=sink, tracer=get_tracer(provider))
    gw.execute({"code": "print(2+2)"})
    gw.execute({"code": "x", "network": "host"})
    spans = exporter.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    roots = by_name["gateway.execute"]
    assert len(roots) == 2
    allowed_root = roots[0]
    children = {s.name for s in spans if s.parent is not None and s.parent.span_id == allowed_root.context.span_id}
    assert children == {"policy.evaluate", "audit.append", "sandbox.run"}
    sandbox = by_name["sandbox.run"][0]
    assert sandbox.attributes["container.image.name"] == "gateway/sandbox-python:3.11-bookworm"
    assert sandbox.attributes["process.exit.code"] == 0
    denied_root = roots[1]
    denials = [e for e in denied_root.events if e.name == "gateway.denied"]
    assert denials
    assert "network.mode" in denials[0].attributes["security_rule.name"]
    trace_hex = f"{allowed_root.context.trace_id:032x}"
    assert any(r.get("trace_id") == trace_hex for r in sink.records)

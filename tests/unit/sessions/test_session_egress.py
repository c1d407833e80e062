"""A session execution's egress in the audit trail, as a run's: one ``network.connection`` record per connection its
outcome reports, with the execution's request id, right before its ``execution.outcome`` (workspace and kernel
sessions alike); the connections a kernel's end cut, right before the session's end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gateway import Gateway
from gateway.audit import MemoryAuditSink
from gateway.egress import ConnectionRecord, EgressReport
from gateway.policy.loader import load_policy_text
from gateway.resources import load_schema, policies_dir
from gateway.runner.fake import make_outcome
from gateway.runner.interface import CellResult, RunSpec
from gateway.slots import HostSlots, Slot
from tests.egress_support import ALLOWED, DENIED
from tests.unit.sessions_support import FakeKernel, FakeWorkspaces, KernelFakeRunner

POLICY = f"""\
apiVersion: gateway.agent-exec/v1
kind: Policy
extends: {policies_dir() / "examples" / "egress-mirror.yaml"}
metadata: {{name: egress-sessions}}
spec:
  sessions:
    modes: [workspace, kernel]
    max_per_principal: 2
    idle_s: {{default: 600, max: 1800}}
    lifetime_s: {{default: 600, max: 3600}}
    workspace_size: {{default: 16m, max: 64m}}
"""

REPORT = EgressReport(records=(ALLOWED, DENIED), connections=2, denied=1, bytes_out=517, bytes_in=4096)


CUT = ConnectionRecord(
    method="CONNECT", host="mirror.internal", port=18443, address="127.0.0.1", allowed=True,
    rule="network.egress.allowed", message="", bytes_out=10, bytes_in=20, duration=1.0, ended="run-ended",
)  # fmt: skip


class EgressKernel(FakeKernel):
    """A kernel whose every cell reports the connections of ``REPORT``, and whose end cuts one (``CUT``), as a
    Docker kernel's proxy does."""

    def execute(self, code: str, **kw: Any) -> CellResult:
        cell = super().execute(code, **kw)
        return CellResult(make_outcome(egress=REPORT), cell.value, False, False, None)

    cut: tuple[ConnectionRecord, ...] = (CUT,)

    def take_egress(self) -> EgressReport | None:
        if self.killed is None:
            return EgressReport((), 0, 0, 0, 0)
        cut, self.cut = self.cut, ()
        return EgressReport(cut, 0, 0, 0, 0)


class EgressKernelRunner(KernelFakeRunner):
    def open_kernel(self, spec: RunSpec, *, files: Any = None, slot: Slot | None = None, grace_s: float = 2.0) -> Any:
        kernel = EgressKernel(spec, slot, len(self.kernels))
        self.kernels.append(kernel)
        return kernel


def _gateway(tmp_path: Path, runner: KernelFakeRunner, sink: MemoryAuditSink) -> Gateway:
    policy = load_policy_text(POLICY, source=str(tmp_path / "policy.yaml"))
    return Gateway(policy, runner=runner, audit=sink, slots=HostSlots(tmp_path / "slots", 2, wait_s=0))


@pytest.mark.parametrize("mode", ["workspace", "kernel"])
def test_each_executions_connections_are_recorded_before_its_outcome(tmp_path: Path, mode: str) -> None:
    sink = MemoryAuditSink()
    runner = EgressKernelRunner(outcome=make_outcome(egress=REPORT))
    runner.workspaces = FakeWorkspaces()  # type: ignore[attr-defined]
    gw = _gateway(tmp_path, runner, sink)
    created = gw.sessions.create({"mode": mode, "principal": "alice", "network": "egress"})
    assert created.session is not None, created.to_dict()
    sid = created.session.session_id
    results = [gw.sessions.execute(sid, {"code": "1", "principal": "alice"}) for _ in range(2)]
    gw.sessions.close(sid, principal="alice")
    for result in results:
        assert (result.allowed, result.error) == (True, None)
        assert result.to_dict()["egress"] == {"connections": 2, "denied": 1, "bytes_out": 517, "bytes_in": 4096}
        own = [r for r in sink.records if r["request_id"] == result.request_id]
        assert [r["event_type"] for r in own] == [
            "request.received", "policy.decision", "network.connection", "network.connection", "execution.outcome",
        ]  # fmt: skip
        assert [(r["data"]["host"], r["data"]["decision"]) for r in own[2:4]] == [
            ("mirror.internal", "allowed"), ("evil.example", "denied"),
        ]  # fmt: skip
        assert all(r["principal"] == "alice" and r["policy"] == own[1]["policy"] for r in own[2:4])
        assert own[-1]["data"]["session_id"] == sid
        assert own[-1]["data"]["egress"]["connections"] == 2
    if mode == "kernel":  # the connection the kernel's end cut: no execution's, recorded before the session's end
        cut, end = sink.records[-2:]
        assert (cut["event_type"], cut["request_id"], cut["principal"]) == ("network.connection", None, "alice")
        assert (cut["data"]["ended"], end["event_type"]) == ("run-ended", "session.closed")
    else:
        assert sink.records[-1]["event_type"] == "session.closed"
    assert [r["event_type"] for r in sink.records].count("network.connection") == (5 if mode == "kernel" else 4)
    validator = jsonschema.Draft202012Validator(load_schema("audit-record"))
    for record in sink.records:
        assert not list(validator.iter_errors(record)), record["event_type"]


def test_a_session_execution_without_egress_writes_no_connection(tmp_path: Path) -> None:
    sink = MemoryAuditSink()
    runner = KernelFakeRunner()
    runner.workspaces = FakeWorkspaces()  # type: ignore[attr-defined]
    gw = _gateway(tmp_path, runner, sink)
    created = gw.sessions.create({"mode": "workspace", "principal": "alice"})
    assert created.session is not None, created.to_dict()
    result = gw.sessions.execute(created.session.session_id, {"code": "1", "principal": "alice"})
    assert result.error is None
    assert "egress" not in result.to_dict()
    assert "network.connection" not in [r["event_type"] for r in sink.records]

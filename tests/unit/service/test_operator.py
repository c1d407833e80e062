"""The operator-role check of the operator endpoints (gateway/service/operator.py ``require_operator``),
without a server: an agent, and a principal the store no longer knows, are refused and audited."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from gateway import Caller
from gateway.audit import MemoryAuditSink
from gateway.errors import ForbiddenError
from gateway.resources import default_policy_path
from gateway.service.authlog import ForbiddenCalls
from gateway.service.operator import require_operator
from gateway.service.principals import PrincipalsStore

PATH = "/v1/audit/records"


@pytest.fixture
def service(tmp_path: Path) -> SimpleNamespace:
    store = PrincipalsStore(tmp_path / "principals.yaml")
    store.add("agent-1", policy=default_policy_path())
    store.add("ops", policy=default_policy_path(), role="operator")
    audit = MemoryAuditSink()
    return SimpleNamespace(
        principals=store.load(), gateway=SimpleNamespace(audit=audit), forbidden=ForbiddenCalls(audit)
    )


def test_an_operator_passes_and_nothing_is_recorded(service: SimpleNamespace) -> None:
    require_operator(service, Caller("ops", "0000000a"), PATH, "req-1")  # type: ignore[arg-type]
    assert service.gateway.audit.records == []


@pytest.mark.parametrize(("principal", "role"), [("agent-1", "agent"), ("gone", "unknown")])
def test_anyone_else_is_forbidden_and_audited(service: SimpleNamespace, principal: str, role: str) -> None:
    with pytest.raises(ForbiddenError) as info:
        require_operator(service, Caller(principal, "0000000b"), PATH, "req-2")  # type: ignore[arg-type]
    assert info.value.message == f"{PATH} is for operators; principal {principal!r} has role {role!r}"
    (record,) = service.gateway.audit.records
    assert (record["event_type"], record["principal"], record["request_id"]) == ("auth.forbidden", principal, "req-2")
    assert record["data"] == {
        "role": role, "required_role": "operator", "token_id": "0000000b", "path": PATH,
        "count": 1, "summary": False, "interval_ms": 60000,
    }  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_forbidden_calls_are_summarised_per_principal_and_path() -> None:
    """The first call of an interval is recorded at once, the rest counted: a second one after the interval
    writes the count of the first interval, then opens the next one; stop writes what is left."""
    audit, clock = MemoryAuditSink(), Clock()
    calls = ForbiddenCalls(audit, interval_s=60.0, clock=clock)

    def call(principal: str, path: str, times: int) -> None:
        for n in range(times):
            calls.note(principal=principal, role="agent", token_id="0000000b", path=path, request_id=f"r{n}")

    call("agent-1", PATH, 5)
    call("agent-1", "/metrics", 3)
    call("agent-2", PATH, 1)
    assert len(audit.records) == 3  # one per principal and path
    clock.now += 60.0
    call("agent-1", PATH, 2)
    calls.stop()
    seen = [(r["principal"], r["data"]["path"], r["data"]["count"], r["data"]["summary"]) for r in audit.records]
    assert seen == [
        ("agent-1", PATH, 1, False), ("agent-1", "/metrics", 1, False), ("agent-2", PATH, 1, False),
        ("agent-1", PATH, 4, True), ("agent-1", PATH, 1, False),
        ("agent-1", PATH, 1, True), ("agent-1", "/metrics", 2, True),
    ]  # fmt: skip
    assert audit.records[3]["data"]["since"] == "1970-01-01T00:16:40.000000Z"  # the interval it covers
    assert audit.records[3]["request_id"] is None

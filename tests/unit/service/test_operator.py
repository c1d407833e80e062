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
from gateway.service.operator import require_operator
from gateway.service.principals import PrincipalsStore

PATH = "/v1/audit/records"


@pytest.fixture
def service(tmp_path: Path) -> SimpleNamespace:
    store = PrincipalsStore(tmp_path / "principals.yaml")
    store.add("agent-1", policy=default_policy_path())
    store.add("ops", policy=default_policy_path(), role="operator")
    return SimpleNamespace(principals=store.load(), gateway=SimpleNamespace(audit=MemoryAuditSink()))


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
    assert record["data"] == {"role": role, "required_role": "operator", "token_id": "0000000b", "path": PATH}

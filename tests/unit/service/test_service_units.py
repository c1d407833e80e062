"""The service's parts that need no server: the authenticated caller in the Gateway, the server
configuration file, and the bounded log of failed authentication."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import Caller, Gateway
from gateway.audit import MemoryAuditSink
from gateway.errors import PrincipalMismatchError, ServerConfigError, http_status_for
from gateway.policy import load_policy
from gateway.resources import load_schema, policies_dir
from gateway.service.authlog import AuthFailures, presented_token_id
from gateway.service.config import DEFAULT_MAX_BODY_BYTES, ServerConfig, load_server_config
from gateway.testing import FakeRunner

ALICE = Caller("alice", "0123abcd")


@pytest.fixture
def gateway_and_sink() -> tuple[Gateway, MemoryAuditSink]:
    sink = MemoryAuditSink()
    return Gateway(load_policy(policies_dir() / "default.yaml"), runner=FakeRunner(), audit=sink), sink


# --- the caller ----------------------------------------------------------------------------------------


def test_every_record_of_a_request_names_the_caller_and_its_token_id(
    gateway_and_sink: tuple[Gateway, MemoryAuditSink],
) -> None:
    gateway, sink = gateway_and_sink
    result = gateway.execute({"code": "print(1)"}, caller=ALICE)
    assert result.allowed
    mine = [r for r in sink.records if r["request_id"] == result.request_id]
    assert [r["event_type"] for r in mine] == ["request.received", "policy.decision", "execution.outcome"]
    for record in mine:
        assert record["principal"] == "alice"
        assert record["data"]["caller"] == {"principal": "alice", "token_id": "0123abcd"}
    assert mine[0]["data"]["request"]["principal"] == "alice"  # attributed, although the body named nobody


def test_a_request_naming_another_principal_is_refused_and_audited(
    gateway_and_sink: tuple[Gateway, MemoryAuditSink],
) -> None:
    gateway, sink = gateway_and_sink
    result = gateway.execute({"code": "print(1)", "principal": "bob"}, caller=ALICE)
    assert isinstance(result.error, PrincipalMismatchError)
    assert http_status_for(result.error) == 403
    assert result.decision is None
    assert result.error.problems[0].path == "$.principal"
    (record,) = sink.records
    assert record["event_type"] == "request.invalid"
    assert record["principal"] == "alice"
    assert record["data"]["caller"]["token_id"] == "0123abcd"
    same = gateway.decide({"code": "print(1)", "principal": "alice"}, caller=ALICE)
    assert same.allowed


def test_without_a_caller_nothing_changes(gateway_and_sink: tuple[Gateway, MemoryAuditSink]) -> None:
    gateway, sink = gateway_and_sink
    gateway.decide({"code": "print(1)", "principal": "bob"})
    assert {r["principal"] for r in sink.records} == {"bob"}
    assert all("caller" not in r["data"] for r in sink.records)


# --- the configuration file ----------------------------------------------------------------------------------


def test_the_embedded_defaults() -> None:
    config = ServerConfig()
    assert (config.host, config.port, config.max_body_bytes, config.grace_s) == ("127.0.0.1", 8787, 4 << 20, 30.0)
    assert config.principals is None  # GATEWAY_PRINCIPALS, then ./principals.yaml
    assert load_schema("server")["properties"]["max_body_bytes"]["default"] == DEFAULT_MAX_BODY_BYTES


def test_a_config_file_with_relative_paths_and_flags_over_it(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "server.yaml"
    path.parent.mkdir()
    path.write_text(
        "apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\nhost: 192.0.2.7\nport: 9000\n"
        "principals: principals.yaml\naudit_dir: /var/lib/gateway/audit\nmax_body_bytes: 65536\n"
        "quotas: {max_concurrent: 2}\ngrace_s: 5\nauth_failure_interval_s: 10\n"
    )
    config = load_server_config(path)
    assert config.principals == path.parent / "principals.yaml"  # relative to the file, not the cwd
    assert config.audit_dir == Path("/var/lib/gateway/audit")
    assert (config.host, config.port, config.max_body_bytes) == ("192.0.2.7", 9000, 65536)
    assert (config.quotas.max_concurrent, config.quotas.rpm) == (2, 600)
    assert (config.grace_s, config.auth_failure_interval_s) == (5.0, 10.0)
    flagged = config.with_overrides(host=None, port=8080, principals="p.yaml", audit_dir=None)
    assert (flagged.host, flagged.port, flagged.principals) == ("192.0.2.7", 8080, Path("p.yaml"))


def test_every_problem_of_a_config_file_with_its_line_and_path(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(
        "apiVersion: gateway.agent-exec/v1\nkind: Server\nport: 70000\n"
        "quotas:\n  rpm: 0\n  burst: 3\nmax_body_bytes: 1\n"
    )
    with pytest.raises(ServerConfigError) as caught:
        load_server_config(path)
    shown = [str(p) for p in caught.value.problems]
    for line, json_path in (
        (2, "$.kind"),
        (3, "$.port"),
        (5, "$.quotas.rpm"),
        (6, "$.quotas"),
        (7, "$.max_body_bytes"),
    ):
        assert any(s.startswith(f"{path}:{line}: {json_path}") for s in shown), (line, json_path, shown)


def test_a_duplicate_key_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text("apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\nport: 1\nport: 2\n")
    with pytest.raises(ServerConfigError, match="problem"):
        load_server_config(path)
    with pytest.raises(ServerConfigError, match="does not exist"):
        load_server_config(tmp_path / "nope.yaml")


# --- failed authentication ----------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_failures_are_recorded_at_most_twice_per_interval() -> None:
    sink, clock = MemoryAuditSink(), Clock()
    log = AuthFailures(sink, interval_s=60, clock=clock)
    for _ in range(1000):
        log.note("unknown", token_id="0123abcd", client="10.0.0.1", path="/v1/policy")
    assert [r["data"]["count"] for r in sink.records] == [1]
    clock.now += 59
    log.flush()
    assert len(sink.records) == 1  # the interval is still open
    clock.now += 1
    log.flush()
    assert [(r["data"]["count"], r["data"]["summary"]) for r in sink.records] == [(1, False), (999, True)]
    log.note("missing", token_id=None, client=None, path="/v1/tools")  # a new interval: recorded at once
    assert sink.records[-1]["data"]["reason"] == "missing"
    log.flush(final=True)  # only the first of this interval: no summary to write
    assert len(sink.records) == 3
    assert all(r["event_type"] == "auth.failed" and r["principal"] is None for r in sink.records)


def test_stop_writes_the_count_of_the_open_interval() -> None:
    sink, clock = MemoryAuditSink(), Clock()
    log = AuthFailures(sink, interval_s=3600, clock=clock)
    log.start()
    for _ in range(5):
        log.note("malformed", token_id=None, client="127.0.0.1", path="/v1/policy")
    log.stop()
    assert [r["data"]["count"] for r in sink.records] == [1, 4]


def test_an_unavailable_trail_does_not_break_authentication() -> None:
    sink = MemoryAuditSink()
    sink.available = False
    log = AuthFailures(sink, interval_s=1)
    log.note("unknown", token_id=None, client=None, path="/")  # refused either way; nothing raises


def test_only_the_public_id_of_a_presented_token_is_kept() -> None:
    assert presented_token_id("agw_0123abcd_" + "x" * 43) == "0123abcd"
    for token in ("", "agw_0123abcd_short", "agw_0123ABCD_" + "x" * 43, "Bearer agw_0123abcd_" + "x" * 43):
        assert presented_token_id(token) is None


def test_max_connections_is_read_and_checked_and_defaults_to_a_share_of_the_open_file_limit() -> None:
    import resource

    from gateway.service.config import load_server_config_text
    from gateway.service.deadlines import default_max_connections

    head = "apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\n"
    assert load_server_config_text(head + "max_connections: 200\n").max_connections == 200
    assert load_server_config_text(head).max_connections is None  # the protocol then takes the default
    for bad in ("0", "-1", "many", "1.5"):
        with pytest.raises(ServerConfigError) as refused:
            load_server_config_text(head + f"max_connections: {bad}\n")
        assert [p.path for p in refused.value.problems] == ["$.max_connections"]
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert 64 <= default_max_connections() <= 4096
    assert default_max_connections() <= max(64, soft // 4)

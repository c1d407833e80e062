"""Admission control (gateway/service/quotas.py): the rpm window, the queue, the global bound, fairness,
cancellation, the bounded refusal records and the principals' quota defaults."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.audit import MemoryAuditSink
from gateway.errors import BodyTooLargeError, OverQuotaError, ServerConfigError, http_status_for
from gateway.resources import policies_dir
from gateway.runner.fake import FakeRunner
from gateway.service.app import build_app
from gateway.service.config import ServerConfig
from gateway.service.principals import DEFAULT_QUOTAS, PrincipalsStore, Quotas, load_principals_text
from gateway.service.quotas import QuotaGate, Refusals
from gateway.service.service import Service


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_over_quota_is_429_with_at_least_one_second() -> None:
    assert http_status_for(OverQuotaError) == 429
    assert OverQuotaError("x", retry_after_s=0, quota="queue").retry_after_s == 1


def test_rpm_is_a_sliding_minute_and_retry_after_is_when_it_frees() -> None:
    clock = Clock()
    gate = QuotaGate(4, clock=clock)
    quotas = Quotas(rpm=2)
    gate.count_request("a", quotas)
    clock.now += 20
    gate.count_request("a", quotas)
    clock.now += 10.5
    with pytest.raises(OverQuotaError) as info:
        gate.count_request("a", quotas)
    assert (info.value.quota, info.value.retry_after_s) == ("rpm", 30)  # the first leaves at +60 s
    gate.count_request("b", quotas)  # another principal's minute is its own
    clock.now += 29.5
    gate.count_request("a", quotas)  # the first left the window
    with pytest.raises(OverQuotaError) as info:
        gate.count_request("a", quotas)
    assert info.value.retry_after_s == 20  # now the second one (at +20 s) has to leave


def test_queue_then_refusal_and_release_in_order() -> None:
    async def scenario() -> None:
        gate = QuotaGate(8)
        quotas = Quotas(max_concurrent=1, queue=1)
        order: list[str] = []
        release = asyncio.Event()

        async def run(name: str) -> None:
            async with gate.execution("a", quotas):
                order.append(name)
                await release.wait()

        first = asyncio.create_task(run("first"))
        await asyncio.sleep(0)
        second = asyncio.create_task(run("second"))
        await asyncio.sleep(0)
        assert (gate.running_of("a"), gate.waiting_of("a")) == (1, 1)
        assert gate.waiting() == 1  # what GET /metrics reports as gateway_queue_depth
        with pytest.raises(OverQuotaError) as info:
            async with gate.execution("a", quotas):
                pass
        assert info.value.quota == "queue"
        release.set()
        await asyncio.gather(first, second)
        assert order == ["first", "second"]
        assert gate.running == 0
        assert gate.waiting() == 0

    asyncio.run(scenario())


def test_queue_zero_means_run_now_or_refuse() -> None:
    async def scenario() -> None:
        gate = QuotaGate(1)
        async with gate.execution("a", Quotas(queue=0)):
            with pytest.raises(OverQuotaError):
                async with gate.execution("b", Quotas(queue=0)):
                    pass

    asyncio.run(scenario())


def test_a_freed_slot_goes_to_the_principal_with_fewest_running() -> None:
    async def scenario() -> None:
        gate = QuotaGate(3)  # mallory's share: 2; bob holds the third slot
        order: list[str] = []
        gates = {name: asyncio.Event() for name in ("b", "m1", "m2", "m3", "m4", "v")}

        async def run(principal: str, name: str) -> None:
            async with gate.execution(principal, Quotas(max_concurrent=2, queue=8)):
                order.append(name)
                await gates[name].wait()

        tasks = [asyncio.create_task(run("bob", "b"))]
        tasks += [asyncio.create_task(run("mallory", n)) for n in ("m1", "m2", "m3", "m4")]
        await asyncio.sleep(0)
        tasks.append(asyncio.create_task(run("victim", "v")))  # arrives after mallory's two waiters
        await asyncio.sleep(0)
        assert order == ["b", "m1", "m2"]
        gates["m1"].set()
        for _ in range(3):
            await asyncio.sleep(0)
        assert order == ["b", "m1", "m2", "v"]  # not m3, although m3 waited longer
        for gate in gates.values():
            gate.set()
        await asyncio.gather(*tasks)
        assert order == ["b", "m1", "m2", "v", "m3", "m4"]

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_the_queue_and_a_slot_is_never_lost() -> None:
    async def scenario() -> None:
        gate = QuotaGate(1)
        hold = asyncio.Event()

        async def run() -> None:
            async with gate.execution("a", Quotas(queue=4)):
                await hold.wait()

        running = asyncio.create_task(run())
        await asyncio.sleep(0)
        waiting = asyncio.create_task(run())
        await asyncio.sleep(0)
        assert gate.waiting_of("a") == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert gate.waiting_of("a") == 0
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert gate.running == 0
        async with gate.execution("a", Quotas(queue=0)):
            assert gate.running == 1

    asyncio.run(scenario())


def test_a_waiter_cancelled_as_it_is_granted_gives_the_slot_back() -> None:
    async def scenario() -> None:
        gate = QuotaGate(1)
        quotas = Quotas(queue=4)
        held = contextlib.AsyncExitStack()
        await held.enter_async_context(gate.execution("a", quotas))

        async def waiter() -> None:
            async with gate.execution("b", quotas):
                raise AssertionError("the cancelled waiter must not run")

        waiting = asyncio.create_task(waiter())
        await asyncio.sleep(0)  # the waiter queues
        assert gate.waiting_of("b") == 1
        await held.aclose()  # frees the slot: granted to the waiter at once, before its task runs again
        assert (gate.running_of("b"), gate.waiting_of("b")) == (1, 0)
        waiting.cancel()  # its client went away at that very moment
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert gate.running == 0
        async with gate.execution("c", Quotas(queue=0)):  # with a global bound of 1, a lost slot admits nothing
            assert gate.running == 1

    asyncio.run(scenario())


def test_refusals_are_bounded_per_principal_and_interval() -> None:
    sink = MemoryAuditSink()
    clock = Clock()
    refusals = Refusals(sink, interval_s=60, clock=clock)
    error = OverQuotaError("over", retry_after_s=5, quota="rpm")
    for _ in range(100):
        refusals.note(error, principal="m", token_id="0123abcd", request_id="r", path="/v1/executions")
    refusals.note(error, principal="v", token_id="89abcdef", request_id="r2", path="/v1/decisions")
    clock.now += 61
    refusals.note(error, principal="m", token_id="0123abcd", request_id="r3", path="/v1/executions")
    refusals.stop()
    got = [(r["principal"], r["data"]["count"], r["data"]["summary"]) for r in sink.records]
    assert got == [("m", 1, False), ("v", 1, False), ("m", 99, True), ("m", 1, False)]
    assert sink.records[0]["data"]["retry_after_s"] == 5
    assert sink.records[0]["data"]["caller"] == {"principal": "m", "token_id": "0123abcd"}


def test_body_refusals_are_summarised_apart_from_quota_refusals() -> None:
    """Each error code has its own interval: a flood of bad bodies neither hides a quota refusal nor is
    counted as one, and the summary says which code it counts."""
    sink = MemoryAuditSink()
    refusals = Refusals(sink, interval_s=60, clock=Clock())
    too_large = BodyTooLargeError("the body is more than 1024 bytes")
    for _ in range(5):
        refusals.note(too_large, principal="m", token_id="0123abcd", request_id="r", path="/mcp")
    refusals.note(OverQuotaError("over", retry_after_s=5, quota="rpm"), principal="m", token_id="0123abcd",
                  request_id="r2", path="/v1/executions")  # fmt: skip
    refusals.stop()
    got = [(r["data"]["code"], r["data"]["count"], r["data"]["summary"]) for r in sink.records]
    assert got == [("request.too_large", 1, False), ("service.over_quota", 1, False), ("request.too_large", 4, True)]
    first = sink.records[0]["data"]
    assert first["message"] == "the body is more than 1024 bytes"
    assert "quota" not in first


def test_quota_fields_a_principal_does_not_set_come_from_the_server(tmp_path: Path) -> None:
    policy = str(policies_dir() / "default.yaml")
    text = f"""\
apiVersion: gateway.agent-exec/v1
kind: Principals
principals:
  - name: a
    role: agent
    policy: {policy}
    tokens: []
  - name: b
    role: agent
    policy: {policy}
    quotas: {{rpm: 5}}
    tokens: []
"""
    principals = load_principals_text(text)
    server = Quotas(max_concurrent=2, rpm=100, queue=0)
    assert principals.get("a").effective_quotas(server) == server
    assert principals.get("b").effective_quotas(server) == Quotas(max_concurrent=2, rpm=5, queue=0)
    store = PrincipalsStore(tmp_path / "p.yaml")
    store.add("c", policy=policy, quotas=Quotas(queue=3), quotas_set=frozenset({"queue"}))
    store.rotate("c")  # a rewrite keeps the file's choice: only queue is set
    assert "queue: 3" in (tmp_path / "p.yaml").read_text()
    assert "rpm" not in (tmp_path / "p.yaml").read_text()
    assert store.load().get("c").effective_quotas(DEFAULT_QUOTAS) == Quotas(queue=3)


def test_the_global_bound_is_a_config_key_with_a_machine_sized_default() -> None:
    from gateway.service.config import ServerConfig, load_server_config_text
    from gateway.service.quotas import default_global_bound

    head = "apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\n"
    assert load_server_config_text(head + "max_concurrent_executions: 3\n").max_concurrent_executions == 3
    assert ServerConfig().max_concurrent_executions is None  # the service uses default_global_bound()
    assert default_global_bound() >= 2
    with pytest.raises(ServerConfigError) as info:
        load_server_config_text(head + "max_concurrent_executions: 0\n")
    assert [p.path for p in info.value.problems] == ["$.max_concurrent_executions"]


def test_principals_add_stores_only_the_quota_flags_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.cli import main

    path = tmp_path / "p.yaml"
    policy = str(policies_dir() / "default.yaml")
    assert main(["principals", "add", "a", "--policy", policy, "--principals", str(path)]) == 0
    assert main(["principals", "add", "b", "--policy", policy, "--rpm", "7", "--principals", str(path)]) == 0
    loaded = PrincipalsStore(path).load()
    server = Quotas(max_concurrent=1, rpm=2, queue=3)
    assert loaded.get("a").effective_quotas(server) == server
    assert loaded.get("b").effective_quotas(server) == Quotas(max_concurrent=1, rpm=7, queue=3)
    capsys.readouterr()
    assert main(["principals", "list", "--principals", str(path)]) == 0
    out = capsys.readouterr().out
    assert "quotas: the server defaults" in out
    assert "quotas: rpm=7 (the rest: the server's defaults)" in out


def test_a_queued_execution_waits_at_most_queue_wait_s_then_429_and_leaves_the_queue() -> None:
    async def scenario() -> None:
        gate = QuotaGate(8, queue_wait_s=0.05)
        quotas = Quotas(max_concurrent=1, queue=4)
        release = asyncio.Event()

        async def holder() -> None:
            async with gate.execution("a", quotas):
                await release.wait()

        held = asyncio.create_task(holder())
        await asyncio.sleep(0)
        ran = False
        with pytest.raises(OverQuotaError) as info:
            async with gate.execution("a", quotas):
                ran = True
        assert not ran
        assert info.value.quota == "queue_wait"
        assert info.value.retry_after_s >= 1
        assert "waited 0.05 s" in info.value.message
        assert (gate.running_of("a"), gate.waiting_of("a")) == (1, 0)  # it left the queue
        release.set()
        await held
        assert gate.running == 0
        async with gate.execution("a", quotas):  # the slot it never got is free for the next one
            assert gate.running == 1

    asyncio.run(scenario())


def test_queue_wait_must_be_positive() -> None:
    with pytest.raises(ValueError, match="queue_wait_s"):
        QuotaGate(4, queue_wait_s=0)


def test_dry_runs_count_against_the_rpm_like_executions(tmp_path: Path) -> None:
    """The real application and service, on the fake runner with decisions in process: no engine, no worker."""
    principals = tmp_path / "principals.yaml"
    token = PrincipalsStore(principals).add("alice", policy=policies_dir() / "default.yaml", quotas=Quotas(rpm=2))
    config = ServerConfig(principals=principals, audit_dir=tmp_path / "audit", decision_workers=0)
    service = Service.from_config(config, runner=FakeRunner)
    headers = {"Authorization": f"Bearer {token}"}
    with TestClient(build_app(service)) as client:
        answers = [client.post("/v1/decisions", json={"code": "print(1)"}, headers=headers) for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 429]
        assert answers[2].json()["quota"] == "rpm"
        over = client.post("/v1/executions", json={"code": "print(1)"}, headers=headers)
        assert (over.status_code, over.json()["quota"]) == (429, "rpm")  # the dry runs spent the minute
    records = [json.loads(line) for path in sorted((tmp_path / "audit").glob("trail-*.jsonl"))
               for line in path.read_text().splitlines()]  # fmt: skip
    assert [r["data"]["dry_run"] for r in records if r["event_type"] == "policy.decision"] == [True, True]
    refused = [r["data"] for r in records if r["event_type"] == "request.refused"]
    assert [(d["summary"], d["count"], d["code"]) for d in refused] == [
        (False, 1, "service.over_quota"),
        (True, 1, "service.over_quota"),  # the execution, counted with the first refusal's interval
    ]
    assert (refused[0]["quota"], refused[0]["path"]) == ("rpm", "/v1/decisions")


def test_one_principal_never_holds_every_slot_so_another_starts_at_once() -> None:
    """M6: under the default quotas a principal's max_concurrent (8) is above the service's bound (4). It holds
    at most bound - 1 slots however much it sends, so another principal's run starts without waiting for one of
    its runs to end; a third principal gets the next slot that frees, ahead of the flood's backlog."""

    async def scenario() -> None:
        gate = QuotaGate(4)
        held: dict[str, list[asyncio.Event]] = {"mallory": [], "victim": [], "third": []}

        async def run(principal: str) -> None:
            release = asyncio.Event()
            async with gate.execution(principal, DEFAULT_QUOTAS):
                held[principal].append(release)
                await release.wait()

        flood = [asyncio.create_task(run("mallory")) for _ in range(10)]
        await asyncio.sleep(0)
        assert (gate.running_of("mallory"), gate.waiting_of("mallory")) == (3, 7)
        victim = asyncio.create_task(run("victim"))
        await asyncio.sleep(0)
        assert gate.running_of("victim") == 1  # at once: no run of mallory had to end
        third = asyncio.create_task(run("third"))
        await asyncio.sleep(0)
        assert (gate.running, gate.waiting_of("third")) == (4, 1)
        held["mallory"][0].set()
        for _ in range(3):
            await asyncio.sleep(0)
        assert (gate.running_of("third"), gate.running_of("mallory")) == (1, 2)  # not mallory's oldest waiter
        while gate.running:  # everything ends; the flood's backlog runs three at a time at most
            assert gate.running_of("mallory") <= 3
            for release in (*held["mallory"], *held["victim"], *held["third"]):
                release.set()
            await asyncio.sleep(0)
        await asyncio.gather(*flood, victim, third)
        assert gate.running == 0

    asyncio.run(scenario())


def test_with_a_global_bound_of_one_a_principal_still_gets_its_slot() -> None:
    async def scenario() -> None:
        gate = QuotaGate(1)
        async with gate.execution("a", DEFAULT_QUOTAS):
            assert gate.running_of("a") == 1

    asyncio.run(scenario())


def _share_warnings(tmp_path: Path, caplog: pytest.LogCaptureFixture, config_quotas: Quotas) -> list[str]:
    """The share warnings of a service with a bound of 2 over alice (no quota of her own), bob (max_concurrent 1)
    and carol (max_concurrent 5), whose config file's quotas are ``config_quotas``."""
    principals = tmp_path / "principals.yaml"
    store = PrincipalsStore(principals)
    policy = policies_dir() / "default.yaml"
    store.add("alice", policy=policy, quotas_set=frozenset())  # as `gateway principals add` with no quota flag
    store.add("bob", policy=policy, quotas=Quotas(max_concurrent=1), quotas_set=frozenset({"max_concurrent"}))
    store.add("carol", policy=policy, quotas=Quotas(max_concurrent=5), quotas_set=frozenset({"max_concurrent"}))
    config = ServerConfig(
        principals=principals,
        audit_dir=tmp_path / "audit",
        decision_workers=0,
        max_concurrent_executions=2,
        quotas=config_quotas,
    )
    service = Service.from_config(config, runner=FakeRunner)
    with caplog.at_level("WARNING", logger="gateway.service"), TestClient(build_app(service)):
        pass
    return [r.getMessage() for r in caplog.records if "max_concurrent" in r.getMessage()]


def test_start_warns_of_a_configured_max_concurrent_the_share_cuts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (warning,) = _share_warnings(tmp_path, caplog, DEFAULT_QUOTAS)
    assert "principal(s) carol is at or above the service's bound of 2" in warning  # not alice: the default
    assert "each runs at most 1 at once" in warning
    assert QuotaGate(2).share_warning({"bob": Quotas(max_concurrent=1)}) is None


def test_a_max_concurrent_set_in_the_config_file_is_named_for_whoever_takes_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (warning,) = _share_warnings(tmp_path, caplog, Quotas(max_concurrent=3))
    assert "principal(s) alice, carol is at or above" in warning


def test_all_rpm_is_a_window_of_its_own_beside_rpm() -> None:
    clock = Clock()
    gate = QuotaGate(4, clock=clock)
    quotas = Quotas(rpm=1, all_rpm=3)
    gate.count_authenticated("a", quotas)
    gate.count_request("a", quotas)  # a run: one request and one run
    with pytest.raises(OverQuotaError) as info:
        gate.count_request("a", quotas)
    assert info.value.quota == "rpm"
    clock.now += 15
    gate.count_authenticated("a", quotas)
    gate.count_authenticated("a", quotas)
    with pytest.raises(OverQuotaError) as info:
        gate.count_authenticated("a", quotas)
    assert (info.value.quota, info.value.retry_after_s) == ("all_rpm", 45)  # the first leaves at +60 s
    assert "made 3 requests in the last minute; its quota (all_rpm) is 3" in info.value.message
    gate.count_authenticated("b", quotas)  # another principal's minute is its own


def test_every_authenticated_request_counts_against_all_rpm(tmp_path: Path) -> None:
    """The real application, no engine: reads, /metrics and /mcp count; over all_rpm, 429 with Retry-After,
    one request.refused record for the interval; the runs window (rpm) is untouched by the reads."""
    principals = tmp_path / "principals.yaml"
    quotas = Quotas(rpm=2, all_rpm=4)
    token = PrincipalsStore(principals).add("alice", policy=policies_dir() / "default.yaml", quotas=quotas)
    config = ServerConfig(principals=principals, audit_dir=tmp_path / "audit", decision_workers=0)
    service = Service.from_config(config, runner=FakeRunner)
    headers = {"Authorization": f"Bearer {token}"}
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {}}
    mcp_headers = {**headers, "Accept": "application/json, text/event-stream"}
    with TestClient(build_app(service)) as client:
        answers = [
            client.get("/v1/policy", headers=headers),
            client.get("/metrics", headers=headers),  # an agent: 403, a request all the same
            client.post("/mcp", json=ping, headers=mcp_headers),
            client.get("/v1/tools", headers=headers),
            client.get("/v1/tools", headers=headers),
            client.post("/mcp", json=ping, headers=mcp_headers),
        ]
        assert [a.status_code for a in answers] == [200, 403, 200, 200, 429, 429]
        over = answers[-1]
        assert (over.json()["code"], over.json()["quota"]) == ("service.over_quota", "all_rpm")
        assert over.headers["Retry-After"] == str(over.json()["retry_after_s"])
        assert service.quota_gate.waiting() == 0
    records = [json.loads(line) for path in sorted((tmp_path / "audit").glob("trail-*.jsonl"))
               for line in path.read_text().splitlines()]  # fmt: skip
    refused = [(r["data"]["count"], r["data"]["summary"], r["data"].get("quota")) for r in records
               if r["event_type"] == "request.refused"]  # fmt: skip
    assert refused == [(1, False, "all_rpm"), (1, True, None)]


def test_an_all_rpm_below_rpm_counts_as_rpm() -> None:
    """A principal whose rpm was lifted (a benchmark, a batch user) is not held back by the default all_rpm."""
    gate = QuotaGate(4, clock=Clock())
    quotas = Quotas(rpm=5, all_rpm=2)
    for _ in range(5):
        gate.count_authenticated("a", quotas)
    with pytest.raises(OverQuotaError) as info:
        gate.count_authenticated("a", quotas)
    assert info.value.quota == "all_rpm"

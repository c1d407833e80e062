"""Dry runs decided in worker processes (``decision_workers``), against a real server on a loopback port.

The answers and the records must be those of the in-process path: each principal's own policy, one trail whose
chain stays intact while the service and its workers write to it, a reload that reaches the workers, a worker
that dies replaced while the service keeps answering, and no worker left once the service has stopped. At the
end, the decision workers alone (real worker processes, the fake runner): the order in which several principals'
dry runs are answered, and a share held until its dry run leaves the worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway import Caller, Gateway
from gateway.audit import JsonlAuditTrail, verify_trail
from gateway.policy import load_policy
from gateway.request import MAX_VALUES
from gateway.resources import default_policy_path, policies_dir
from gateway.runner.fake import FakeRunner
from gateway.service.decisions import DecisionWorkers
from gateway.service.principals import PrincipalsStore, Quotas
from gateway.service.shares import WORKER_MS
from tests.integration.conftest import Server

pytestmark = pytest.mark.integration


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _workers(server: Server, count: int) -> list[int]:
    """Wait until ``count`` workers are ready; their pids."""
    _wait(lambda: server.service.decisions.ready == count, f"{count} ready decision workers")
    return server.service.decisions.pids()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_workers_decide_each_principals_policy_into_the_one_trail(serve: Callable[..., Server]) -> None:
    server = serve(decision_workers=2)
    pids = _workers(server, 2)
    assert os.getpid() not in pids
    request = {"code": "print(1)", "limits": {"timeout_s": 30}}
    with server.client(server.tokens["alice"]) as alice, server.client(server.tokens["bob"]) as bob:
        for _ in range(20):
            allowed = alice.post("/v1/decisions", json=request)
            assert allowed.status_code == 200
            assert allowed.json()["allowed"] is True
            assert allowed.json()["decision"]["policy"]["name"] == "default"
            assert allowed.headers["content-type"] == "application/json"
            assert allowed.headers["x-request-id"] == allowed.json()["request_id"]
            denied = bob.post("/v1/decisions", json=request)
            assert denied.status_code == 200
            assert denied.json()["allowed"] is False
            assert [v["rule"] for v in denied.json()["decision"]["violations"]] == ["limits.timeout"]
        invalid = alice.post("/v1/decisions", json={"code": 5})
        assert invalid.status_code == 422
        assert invalid.json()["code"] == "request.invalid"
        assert invalid.json()["errors"][0]["path"] == "$.code"
    decisions = server.records("policy.decision")
    assert len(decisions) == 40
    assert {r["gateway"]["pid"] for r in decisions} <= set(pids)
    assert {r["principal"]: r["policy"]["name"] for r in decisions} == {"alice": "default", "bob": "tight"}
    for record in decisions:
        assert record["data"]["dry_run"] is True
        assert record["data"]["caller"]["principal"] == record["principal"]
    (received_invalid,) = server.records("request.invalid")
    assert received_invalid["gateway"]["pid"] in pids
    assert len(server.records("request.received")) == 40
    assert server.records("gateway.start")[0]["gateway"]["pid"] == os.getpid()  # the service's own, once
    server.stop()
    assert verify_trail(server.audit_dir).ok
    assert [r["gateway"]["pid"] for r in server.records("gateway.stop")] == [os.getpid()]


def test_denials_decided_by_workers_are_counted_by_rule(serve: Callable[..., Server], tmp_path: Path) -> None:
    server = serve(decision_workers=1)
    _workers(server, 1)
    with server.client(server.tokens["bob"]) as bob:
        assert bob.post("/v1/decisions", json={"code": "print(1)", "limits": {"timeout_s": 30}}).status_code == 200
    text = server.service.metrics.render().decode()
    assert 'gateway_denials_total{dry_run="true",rule="limits.timeout"} 1.0' in text


def test_a_reload_reaches_the_workers(serve: Callable[..., Server], tmp_path: Path) -> None:
    server = serve(decision_workers=2)
    _workers(server, 2)
    request = {"code": "print(1)", "limits": {"timeout_s": 9}}
    with server.client(server.tokens["bob"]) as bob:
        assert bob.post("/v1/decisions", json=request).json()["allowed"] is True  # tight: at most 10 s
        tight = tmp_path / "tight.yaml"
        text = tight.read_text().replace("timeout_s: {default: 5, max: 10}", "timeout_s: {default: 5, max: 8}")
        tight.write_text(text)
        assert server.service.reload()
        new_sha = server.service.gateway.policies.for_principal("bob").policy.sha256
        for _ in range(10):  # whichever worker decides
            answer = bob.post("/v1/decisions", json=request).json()
            assert answer["allowed"] is False
            assert answer["decision"]["policy"]["sha256"] == new_sha
            assert [v["rule"] for v in answer["decision"]["violations"]] == ["limits.timeout"]


def test_a_dead_worker_is_replaced_and_the_service_keeps_answering(serve: Callable[..., Server]) -> None:
    server = serve(decision_workers=1)
    (pid,) = _workers(server, 1)
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: server.service.decisions.ready == 0, "the dead worker to be noticed")
    with server.client(server.tokens["alice"]) as alice:
        answered = alice.post("/v1/decisions", json={"code": "print(1)"})  # in process, meanwhile
        assert answered.status_code == 200
        assert answered.json()["allowed"] is True
        (replacement,) = _workers(server, 1)
        assert replacement != pid
        again = alice.post("/v1/decisions", json={"code": "print(1)"})
        assert again.status_code == 200
    pids = [r["gateway"]["pid"] for r in server.records("policy.decision")]
    assert pids == [os.getpid(), replacement]


def test_a_dry_run_whose_worker_dies_under_it_is_a_503_and_is_audited(serve: Callable[..., Server]) -> None:
    """A worker that ends while it holds a dry run (a body that crashes it, the OOM killer) takes the records it
    built for its batch with it: the service answers 503 and records the refusal itself (``request.refused``,
    summarised per principal and code like every refusal), so the trail shows the request."""
    server = serve(decision_workers=1)
    (pid,) = _workers(server, 1)
    os.kill(pid, signal.SIGSTOP)  # the job reaches the worker's pipe and stays there
    answers: list[Any] = []
    with server.client(server.tokens["alice"]) as alice:
        sender = threading.Thread(target=lambda: answers.append(alice.post("/v1/decisions", json={"code": "1"})))
        sender.start()
        _wait(lambda: any(w.jobs for w in server.service.decisions._workers), "the job in flight on the worker")
        os.kill(pid, signal.SIGKILL)
        sender.join(60)
    (answer,) = answers
    assert answer.status_code == 503
    assert answer.json()["code"] == "service.decision_failed"
    (refused,) = server.records("request.refused")
    assert refused["request_id"] == answer.json()["request_id"]
    assert refused["principal"] == "alice"
    assert refused["data"]["code"] == "service.decision_failed"
    assert refused["data"]["path"] == "/v1/decisions"
    assert server.records("policy.decision") == []


def test_a_worker_outlasts_the_signals_sent_to_the_services_group(serve: Callable[..., Server]) -> None:
    """A stop or reload signalled to the whole group (systemd, a terminal) is the service's to handle: the
    workers go on deciding the requests in flight and end when the service closes their stdin."""
    server = serve(decision_workers=1)
    (pid,) = _workers(server, 1)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        os.kill(pid, sig)
    time.sleep(0.5)
    assert _alive(pid)
    assert server.service.decisions.pids() == [pid]
    with server.client(server.tokens["alice"]) as alice:
        assert alice.post("/v1/decisions", json={"code": "print(1)"}).status_code == 200
    assert [r["gateway"]["pid"] for r in server.records("policy.decision")] == [pid]


EXPENSIVE_TO_PARSE = ('{"code": "print(1)", "x": [' + ",".join(["[]"] * 200_000) + "]}").encode()
"""Cheap to send, expensive to parse (200,000 JSON arrays, 600 KB; 1.3 million in 3.9 MB took ~470 ms): the request
schema refuses it (``$.x`` is not a field) only once it is parsed."""


@pytest.fixture
def parsed_here(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the bodies the service's own process checks as JSON (none, with decision workers)."""
    from gateway.service import bodies

    sizes: list[int] = []
    real = bodies.check_json_body

    def watched(body: bytes, **kw: Any) -> None:
        sizes.append(len(body))
        real(body, **kw)

    monkeypatch.setattr(bodies, "check_json_body", watched)
    return sizes


@pytest.mark.parametrize("path", ["/v1/executions", "/v1/decisions"])
def test_a_body_is_parsed_by_a_decision_worker_never_by_the_service_s_event_loop(
    serve: Callable[..., Server], path: str, parsed_here: list[int]
) -> None:
    """Every principal shares the service's event loop: a body expensive to parse must cost a worker (against its
    principal's share), not the loop. Before, the loop parsed every body to check it was JSON, and an execution
    parsed it again in its thread; the execution's request.invalid record named the service's own process."""
    server = serve(decision_workers=1, max_body_bytes=4 << 20)
    (pid,) = _workers(server, 1)
    headers = {"Content-Type": "application/json"}
    with server.client(server.tokens["alice"]) as alice:
        refused = alice.post(path, content=EXPENSIVE_TO_PARSE, headers=headers)
        assert refused.status_code == 422, refused.text
        (problem,) = refused.json()["errors"]  # more values than any valid request: refused before the schema
        assert problem["path"] == "$"
        assert f"more than {MAX_VALUES} JSON values" in problem["message"]
        malformed = alice.post(path, content=b'{"code": ', headers=headers)
        assert malformed.status_code == 400
        assert malformed.json()["code"] == "request.malformed"
        assert malformed.json()["message"].startswith("the body is not JSON: ")
    assert not parsed_here  # the service's process checked no body
    (invalid,) = server.records("request.invalid")
    assert invalid["gateway"]["pid"] == pid  # the worker parsed it and recorded it
    _wait(lambda: len(server.records("request.refused")) >= 1, "the malformed body's refusal record")
    assert server.records("request.refused")[0]["data"]["code"] == "request.malformed"


def test_an_mcp_body_expensive_to_parse_is_refused_by_a_worker_before_the_sdk_parses_it(
    serve: Callable[..., Server], parsed_here: list[int]
) -> None:
    """/mcp hands its body to the MCP SDK, which parses it in the service's event loop. Before, the loop also
    checked it was JSON itself, whatever its cost: 200,000 empty arrays in a JSON-RPC message's params stalled
    every principal's requests. Now a worker checks it (JSON, at most MESSAGE_MAX_VALUES values) first."""
    from gateway.service.replies import MESSAGE_MAX_VALUES

    server = serve(decision_workers=1, max_body_bytes=4 << 20)
    _workers(server, 1)
    expensive = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"x": [' + b",".join([b"[]"] * 200_000)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    with server.client(server.tokens["alice"]) as alice:
        refused = alice.post("/mcp", content=expensive + b"]}}", headers=headers)
        assert refused.status_code == 400, refused.text
        assert refused.json()["code"] == "request.malformed"
        assert f"more than {MESSAGE_MAX_VALUES} JSON values" in refused.json()["message"]
        listed = alice.post(
            "/mcp", json={"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}, headers=headers
        )
    assert listed.status_code == 200, listed.text
    assert "execute_python" in listed.text  # a message of a few values goes on to the SDK
    assert not parsed_here  # the service's process checked no body
    (refusal,) = server.records("request.refused")
    assert (refusal["principal"], refusal["data"]["code"], refusal["data"]["path"]) == (
        "alice", "request.malformed", "/mcp",
    )  # fmt: skip


def test_no_worker_outlives_the_service(serve: Callable[..., Server]) -> None:
    server = serve(decision_workers=2)
    pids = _workers(server, 2)
    server.stop()
    _wait(lambda: not any(_alive(p) for p in pids), "the workers to end", timeout_s=15)


def test_a_runner_factory_that_cannot_reach_a_worker_decides_in_process(serve: Callable[..., Server]) -> None:
    from gateway.runner.docker.runner import DockerRunner

    def runner() -> DockerRunner:  # a local function: it cannot be pickled for a worker
        return DockerRunner()

    server = serve(runner, decision_workers=2)
    with server.client(server.tokens["alice"]) as alice:
        assert alice.post("/v1/decisions", json={"code": "print(1)"}).status_code == 200
    assert server.service.decisions.count == 0
    assert [r["gateway"]["pid"] for r in server.records("policy.decision")] == [os.getpid()]


# Just under the intake's bound on values (MAX_VALUES): refused by the schema only after it has walked every entry.
HEAVY = json.dumps({"code": "print(1)", "env": {f"V{i}": "v" * 100 for i in range(19_990)}}).encode()
"""A body the request schema refuses only after checking each of its 20,000 entries: ~300 ms of a worker."""


@pytest.mark.parametrize("hostile", [["mallory"], ["mallory", "trudy", "eve"]], ids=["one", "three-together"])
def test_principals_sending_expensive_dry_runs_do_not_hold_back_another_ones(
    serve: Callable[..., Server], tmp_path: Path, hostile: list[str]
) -> None:
    """The hostile principals flood the one worker with expensive dry runs from four connections in all; victim's cheap
    ones each wait for at most the expensive one on the worker, not for every hostile connection's or principal's
    (first come, first served on the worker: about four answered per victim dry run). Ordering, not time:
    counted in the hostile answers."""
    path = tmp_path / "share-principals.yaml"
    store = PrincipalsStore(path)
    lifted = Quotas(max_concurrent=8, rpm=1_000_000, queue=32)  # the rate quota is not what is tested
    tokens = {
        name: store.add(name, policy=str(policies_dir() / "default.yaml"), quotas=lifted)
        for name in [*hostile, "victim"]
    }
    server = serve(principals=path, decision_workers=1, max_body_bytes=4 << 20)
    _workers(server, 1)
    answered: list[str] = []
    unexpected: list[int] = []
    stop = threading.Event()

    def flood(name: str) -> None:
        with server.client(tokens[name]) as client:
            while not stop.is_set():
                response = client.post("/v1/decisions", content=HEAVY, headers={"Content-Type": "application/json"})
                if response.status_code == 422:
                    answered.append(name)
                else:
                    unexpected.append(response.status_code)

    threads = [threading.Thread(target=flood, args=(hostile[n % len(hostile)],)) for n in range(4)]
    for thread in threads:
        thread.start()
    try:
        _wait(lambda: all(answered.count(n) >= 2 for n in hostile), "each hostile principal's cost to be learnt")
        before = len(answered)
        with server.client(tokens["victim"]) as victim:
            for _ in range(3):
                response = victim.post("/v1/decisions", json={"code": "print(1)"})
                assert response.status_code == 200
                assert response.json()["allowed"] is True
        during = len(answered) - before
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    assert not unexpected
    assert during <= 5, f"the hostile principals had {during} dry runs answered while victim made 3"


# --- the decision workers alone (no server): which principal's dry runs are answered first --------------------

CALLER = Caller("alice", "gw_id_test")


def _gateway(directory: Path) -> Gateway:
    return Gateway(load_policy(default_policy_path()), runner=FakeRunner(), audit=JsonlAuditTrail(directory))


async def _ready(workers: DecisionWorkers, count: int) -> None:
    deadline = time.monotonic() + 60
    while workers.ready < count:
        assert time.monotonic() < deadline, "the workers did not get ready"
        await asyncio.sleep(0.05)


def _answer_order(tmp_path: Path, heavies: list[Caller], expensive_each: int) -> list[str]:
    """One worker: each principal of ``heavies`` has an expensive dry run timed (its cost is known), then sends
    ``expensive_each`` at once, then another principal sends one cheap dry run: the order they were answered in."""
    gateway = _gateway(tmp_path / "audit")
    light = Caller("light", "gw_id_l")

    async def scenario() -> list[str]:
        workers = DecisionWorkers(gateway, FakeRunner, 1)
        await workers.start()
        try:
            await _ready(workers, 1)
            for heavy in heavies:
                assert (await workers.decide(HEAVY, heavy)).status == 422
            order: list[str] = []

            async def one(name: str, body: bytes, caller: Caller) -> None:
                answer = await workers.decide(body, caller)
                assert answer.status == (200 if caller is light else 422)
                order.append(name)

            tasks = [
                asyncio.ensure_future(one(f"{h.principal}.{n}", HEAVY, h))
                for n in range(expensive_each)
                for h in heavies
            ]
            await asyncio.sleep(0.05)
            tasks.append(asyncio.ensure_future(one("light", b'{"code": "print(1)"}', light)))
            await asyncio.gather(*tasks)
            return order
        finally:
            await workers.close()

    try:
        return asyncio.run(scenario())
    finally:
        gateway.close()


def test_a_principal_sending_expensive_dry_runs_does_not_hold_back_another_ones(tmp_path: Path) -> None:
    """One worker; a principal whose dry runs each cost a worker hundreds of ms sends five at once, then another
    principal sends one cheap dry run: it is answered before most of the expensive ones (first come, first served on
    the worker, it was answered last)."""
    order = _answer_order(tmp_path, [Caller("heavy", "gw_id_h")], 5)
    assert order.index("light") <= 2, order


def test_principals_sending_expensive_dry_runs_together_do_not_hold_back_another_ones(tmp_path: Path) -> None:
    """One worker; three principals whose dry runs each cost it hundreds of ms send two each at once (their
    shares let one each on the worker), then another principal sends one cheap dry run: it is answered right
    after the expensive one the worker holds, not after one of each of the three (they wait in the service, and the
    next dry run sent is the one of the principal that used the workers least lately)."""
    order = _answer_order(tmp_path, [Caller(f"heavy{n}", f"gw_id_h{n}") for n in range(3)], 2)
    assert order.index("light") <= 1, order


def test_a_dry_run_abandoned_by_its_client_holds_its_share_until_it_leaves_the_worker(tmp_path: Path) -> None:
    """A client that leaves does not free its principal's share while the worker still decides its dry run:
    else sending expensive bodies and hanging up would get round the share."""
    gateway = _gateway(tmp_path / "audit")

    async def scenario() -> None:
        workers = DecisionWorkers(gateway, FakeRunner, 1)
        await workers.start()
        try:
            await _ready(workers, 1)
            (worker,) = workers._workers
            task = asyncio.ensure_future(workers.decide(HEAVY, CALLER))
            while not worker.jobs:
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert workers._shares[CALLER.principal].in_flight == 1  # still on the worker
            deadline = time.monotonic() + 60
            while workers._shares[CALLER.principal].in_flight:
                assert time.monotonic() < deadline, "the abandoned dry run never left the worker"
                await asyncio.sleep(0.01)
            assert not worker.jobs
            share = workers._shares[CALLER.principal]
            assert share.timed  # its cost was learnt all the same
            assert share.cost_ms > 3 * WORKER_MS
        finally:
            await workers.close()

    try:
        asyncio.run(scenario())
    finally:
        gateway.close()

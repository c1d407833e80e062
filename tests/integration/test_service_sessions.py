"""Sessions over HTTP (``/v1/sessions``) and through ``gateway.client``: a real server on a loopback port, the
real engine (runc; gVisor for one kernel case) and the real trail.

alice and bob run under ``policies/examples/sessions.yaml``, dave under the shipped default (no sessions), olga
is an operator under the sessions policy. A kernel session's state persists from one execution to the next, its
container is gone once it is closed, another principal's id is the 404 of an unknown one, a second execution
while one runs is 409, a session execution counts against rpm and holds an execution slot like a run, and
streams like one.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker.errors
import httpx
import pytest

from gateway.client import AsyncClient, Client
from gateway.errors import SessionGoneError, SessionNotFoundError
from gateway.resources import policies_dir
from gateway.service.principals import DEFAULT_QUOTAS, PrincipalsStore, Quotas

if TYPE_CHECKING:
    from conftest import Server

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("engine")]

SESSIONS_POLICY = policies_dir() / "examples" / "sessions.yaml"
KERNEL = {"mode": "kernel"}
UNKNOWN_ID = "A" * 32
SSE = {"Accept": "text/event-stream"}


@pytest.fixture
def served(serve: Callable[..., Server], tmp_path: Path) -> Callable[..., tuple[Server, dict[str, str]]]:
    """A server for alice, bob (sessions policy), dave (default policy: no sessions), olga (operator, sessions
    policy) and one more principal per keyword with that policy, and their tokens; ``quotas``: the quota fields
    set per principal."""

    def make(quotas: dict[str, dict[str, int]] | None = None, **extra: Path) -> tuple[Server, dict[str, str]]:
        tokens: dict[str, str] = {}
        path = tmp_path / "session-principals.yaml"
        store = PrincipalsStore(path)
        policies = {"alice": SESSIONS_POLICY, "bob": SESSIONS_POLICY, "dave": policies_dir() / "default.yaml", **extra}
        for name, policy in policies.items():
            given = (quotas or {}).get(name, {})
            full = Quotas(**{**DEFAULT_QUOTAS.to_dict(), **given})
            tokens[name] = store.add(name, policy=str(policy), quotas=full, quotas_set=frozenset(given))
        tokens["olga"] = store.add("olga", policy=str(SESSIONS_POLICY), role="operator")
        return serve(principals=path, max_body_bytes=64 * 1024), tokens

    return make


@pytest.fixture
def clients() -> Iterator[Callable[[Server, str], httpx.Client]]:
    made: list[httpx.Client] = []

    def make(server: Server, token: str) -> httpx.Client:
        client = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def _create(client: httpx.Client, body: dict[str, Any] | None = None) -> dict[str, Any]:
    response = client.post("/v1/sessions", json=body or KERNEL)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    assert created["mode"] == (body or KERNEL)["mode"]
    assert created["state"] == "ready"
    return created


def _container_gone(engine: Any, container_id: str) -> bool:
    try:
        engine.containers.get(container_id)
    except docker.errors.NotFound:
        return True
    return False


def test_a_kernel_session_keeps_its_state_and_its_container_is_gone_once_closed(
    served: Callable[..., tuple[Server, dict[str, str]]], clients: Callable[..., httpx.Client], engine: Any
) -> None:
    server, tokens = served()
    alice = clients(server, tokens["alice"])
    created = _create(alice)
    sid = created["session_id"]
    assert created["principal"] == "alice"
    assert created["expires_at"].endswith("Z")
    assert created["allowed"] is True
    first = alice.post(f"/v1/sessions/{sid}/executions", json={"code": "x = 1\nprint('set')"})
    assert first.status_code == 200, first.text
    assert (first.json()["stdout"], first.json()["session_id"]) == ("set\n", sid)
    second = alice.post(f"/v1/sessions/{sid}/executions", json={"code": "x + 1", "limits": {"timeout_s": 5}})
    assert second.status_code == 200, second.text
    assert second.json()["value"] == "2"
    listed = alice.get("/v1/sessions").json()["sessions"]
    assert [s["session_id"] for s in listed] == [sid]
    got = alice.get(f"/v1/sessions/{sid}")
    assert got.status_code == 200
    assert (got.json()["executions"], got.json()["state"]) == (2, "ready")
    container_id = server.service.gateway.sessions.get(sid, principal="alice").container_id
    assert container_id is not None
    assert not _container_gone(engine, container_id)

    closed = alice.delete(f"/v1/sessions/{sid}")
    assert closed.status_code == 204
    assert closed.content == b""
    assert _container_gone(engine, container_id)
    assert alice.get("/v1/sessions").json() == {"sessions": []}
    gone = alice.get(f"/v1/sessions/{sid}")
    assert (gone.status_code, gone.json()["code"]) == (410, "session.gone")
    again = alice.post(f"/v1/sessions/{sid}/executions", json={"code": "x"})
    assert (again.status_code, again.json()["code"]) == (410, "session.gone")
    # Audited through the manager, naming the caller's principal and token.
    (made,) = server.records("session.created")
    (ended,) = server.records("session.closed")
    assert made["principal"] == ended["principal"] == "alice"
    assert made["data"]["session_id"] == ended["data"]["session_id"] == sid
    assert ended["data"]["reason"] == "owner"
    outcomes = [r for r in server.records("execution.outcome") if r["data"].get("session_id") == sid]
    assert len(outcomes) == 2
    assert all(r["principal"] == "alice" and r["data"]["caller"]["token_id"] for r in outcomes)


def test_another_principals_session_is_the_404_of_an_unknown_one(
    served: Callable[..., tuple[Server, dict[str, str]]], clients: Callable[..., httpx.Client]
) -> None:
    server, tokens = served()
    alice, bob = clients(server, tokens["alice"]), clients(server, tokens["bob"])
    sid = _create(alice)["session_id"]
    answers = {}
    for name, target in (("foreign", sid), ("unknown", UNKNOWN_ID)):
        answers[name] = [
            bob.get(f"/v1/sessions/{target}"),
            bob.post(f"/v1/sessions/{target}/executions", json={"code": "print(1)"}),
            bob.delete(f"/v1/sessions/{target}"),
        ]
    for foreign, unknown in zip(answers["foreign"], answers["unknown"], strict=True):
        assert foreign.status_code == unknown.status_code == 404
        assert foreign.json()["code"] == unknown.json()["code"] == "session.not_found"
        assert foreign.json()["message"].replace(sid, UNKNOWN_ID) == unknown.json()["message"]
    assert bob.get("/v1/sessions").json() == {"sessions": []}
    assert alice.get(f"/v1/sessions/{sid}").status_code == 200  # untouched by bob's attempts
    # An agent may not list everyone's; an operator may, and may close any session.
    refused = alice.get("/v1/sessions", params={"all": "true"})
    assert (refused.status_code, refused.json()["code"]) == (403, "auth.forbidden")
    olga = clients(server, tokens["olga"])
    assert [s["session_id"] for s in olga.get("/v1/sessions", params={"all": "true"}).json()["sessions"]] == [sid]
    assert olga.get("/v1/sessions").json() == {"sessions": []}  # without all: her own
    assert olga.get(f"/v1/sessions/{sid}").json()["principal"] == "alice"
    assert olga.delete(f"/v1/sessions/{sid}").status_code == 204
    (ended,) = server.records("session.closed")
    assert ended["data"]["reason"] == "operator"
    bad = alice.get("/v1/sessions", params={"all": "yes", "mine": "1"})
    assert bad.status_code == 422
    assert sorted(e["path"] for e in bad.json()["errors"]) == ["$.query.all", "$.query.mine"]


def test_a_policy_without_sessions_denies_with_the_sessions_rule_and_bad_bodies_are_refused(
    served: Callable[..., tuple[Server, dict[str, str]]], clients: Callable[..., httpx.Client]
) -> None:
    server, tokens = served()
    dave, alice = clients(server, tokens["dave"]), clients(server, tokens["alice"])
    denied = dave.post("/v1/sessions", json=KERNEL)
    assert denied.status_code == 403, denied.text
    body = denied.json()
    assert body["code"] == "policy.denied"
    assert "sessions.enabled" in {v["rule"] for v in body["violations"]}
    assert body["decision_id"]
    invalid = alice.post("/v1/sessions", json={"mode": "sideways", "colour": "blue"})
    assert (invalid.status_code, invalid.json()["code"]) == (422, "request.invalid")
    assert {e["path"] for e in invalid.json()["errors"]} >= {"$.mode"}
    malformed = alice.post("/v1/sessions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert (malformed.status_code, malformed.json()["code"]) == (400, "request.malformed")
    other = alice.post("/v1/sessions", json={**KERNEL, "principal": "bob"})
    assert (other.status_code, other.json()["code"]) == (403, "auth.principal_mismatch")
    assert alice.get("/v1/sessions").json() == {"sessions": []}
    assert server.service.gateway.sessions.list(principal=None, operator=True) == []
    # An execution in a session with an invalid body is refused by its intake (in a decision worker), 422.
    sid = _create(alice)["session_id"]
    refused = alice.post(f"/v1/sessions/{sid}/executions", json={"code": 42})
    assert (refused.status_code, refused.json()["code"]) == (422, "request.invalid")
    assert alice.get(f"/v1/sessions/{sid}").json()["executions"] == 0  # never reached the session


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60  # a hang fails the test instead of blocking the suite
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def _slow_cell(server: Server, token: str, sid: str, clients: Callable[..., httpx.Client]) -> tuple[
    threading.Thread, list[httpx.Response]
]:  # fmt: skip
    """A cell of five seconds in session ``sid``, sent from a thread; its answer lands in the list."""
    answers: list[httpx.Response] = []
    client = clients(server, token)
    code = {"code": "import time\ntime.sleep(5)\n'slept'"}
    thread = threading.Thread(target=lambda: answers.append(client.post(f"/v1/sessions/{sid}/executions", json=code)))
    thread.start()
    manager = server.service.gateway.sessions
    _wait_for(lambda: manager.get(sid, principal="alice").state == "busy" or bool(answers), "the cell running")
    assert not answers, f"the slow cell was answered before it ran: {answers[0].text}"
    return thread, answers


def test_a_busy_session_refuses_a_second_execution_with_409(
    served: Callable[..., tuple[Server, dict[str, str]]], clients: Callable[..., httpx.Client]
) -> None:
    server, tokens = served()
    alice = clients(server, tokens["alice"])
    sid = _create(alice)["session_id"]
    thread, answers = _slow_cell(server, tokens["alice"], sid, clients)
    try:
        busy = alice.post(f"/v1/sessions/{sid}/executions", json={"code": "1"})
        assert not answers, "the slow cell ended before the second was answered"
        assert (busy.status_code, busy.json()["code"]) == (409, "session.busy")
    finally:
        thread.join(timeout=120)
    assert answers[0].status_code == 200, answers[0].text
    assert answers[0].json()["value"] == "'slept'"
    assert alice.post(f"/v1/sessions/{sid}/executions", json={"code": "1"}).json()["value"] == "1"  # free again


def test_a_session_execution_holds_an_execution_slot_like_a_run(
    served: Callable[..., tuple[Server, dict[str, str]]], clients: Callable[..., httpx.Client]
) -> None:
    server, tokens = served(quotas={"alice": {"max_concurrent": 1, "queue": 0}})
    alice = clients(server, tokens["alice"])
    sid = _create(alice)["session_id"]  # a session, even a kernel's live container, holds no execution slot
    gate = server.service.quota_gate
    assert gate.running_of("alice") == 0
    thread, answers = _slow_cell(server, tokens["alice"], sid, clients)
    try:
        assert gate.running_of("alice") == 1
        refused = alice.post("/v1/executions", json={"code": "print(1)"})
        assert not answers, "the slow cell ended before the run was answered"
        assert (refused.status_code, refused.json()["quota"]) == (429, "queue")
    finally:
        thread.join(timeout=120)
    assert answers[0].status_code == 200, answers[0].text
    assert (gate.running, gate.waiting()) == (0, 0)
    assert alice.post("/v1/executions", json={"code": "print(1)"}).status_code == 200  # the slot is back


def test_session_creation_and_executions_count_against_rpm(
    served: Callable[..., tuple[Server, dict[str, str]]], clients: Callable[..., httpx.Client]
) -> None:
    server, tokens = served(quotas={"alice": {"rpm": 2}})
    alice = clients(server, tokens["alice"])
    sid = _create(alice)["session_id"]  # 1
    assert alice.post(f"/v1/sessions/{sid}/executions", json={"code": "1"}).status_code == 200  # 2
    over = alice.post(f"/v1/sessions/{sid}/executions", json={"code": "2"})
    assert (over.status_code, over.json()["code"], over.json()["quota"]) == (429, "service.over_quota", "rpm")
    assert over.headers["Retry-After"].isdigit()
    assert alice.post("/v1/sessions", json=KERNEL).status_code == 429
    assert alice.get(f"/v1/sessions/{sid}").json()["executions"] == 1  # reads are not counted against rpm
    assert alice.delete(f"/v1/sessions/{sid}").status_code == 204


def _events(response: httpx.Response) -> list[tuple[str, Any]]:
    events, name = [], ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            events.append((name, json.loads(line.removeprefix("data: "))))
    return events


def test_a_session_execution_streams_server_sent_events(
    served: Callable[..., tuple[Server, dict[str, str]]], clients: Callable[..., httpx.Client]
) -> None:
    server, tokens = served()
    alice = clients(server, tokens["alice"])
    sid = _create(alice)["session_id"]
    code = "import time\nprint('first', flush=True)\ntime.sleep(1)\nprint('second', flush=True)\n6 * 7"
    with alice.stream("POST", f"/v1/sessions/{sid}/executions", json={"code": code}, headers=SSE) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _events(response)
    names = [name for name, _ in events]
    assert names[-1] == "result"
    assert "stdout" in names[:-1]
    result = events[-1][1]
    assert (result["stdout"], result["value"], result["session_id"]) == ("first\nsecond\n", "42", sid)
    assert "".join(data for name, data in events if name == "stdout") == result["stdout"]
    # A refusal before the run is a plain JSON error, not a stream.
    with alice.stream("POST", f"/v1/sessions/{UNKNOWN_ID}/executions", json={"code": "1"}, headers=SSE) as missing:
        missing.read()
        assert (missing.status_code, missing.json()["code"]) == (404, "session.not_found")


def test_the_client_creates_executes_lists_and_closes_sessions(
    served: Callable[..., tuple[Server, dict[str, str]]], engine: Any
) -> None:
    server, tokens = served()
    with Client(server.url, tokens["alice"]) as alice, Client(server.url, tokens["bob"]) as bob:
        created = alice.sessions.create(KERNEL)
        assert created.allowed, created
        assert created.status == 201
        session = created.session
        assert session is not None
        sid = session.session_id
        assert alice.sessions.execute(sid, {"code": "x = 1"}).exit_code == 0
        result = alice.sessions.execute(sid, {"code": "x + 1"})
        assert (result.value, result.session_id, result.error) == ("2", sid, None)
        assert [s.session_id for s in alice.sessions.list()] == [sid]
        assert alice.sessions.get(sid).mode == "kernel"
        foreign = bob.sessions.execute(sid, {"code": "x"})
        assert isinstance(foreign.error, SessionNotFoundError)
        assert not foreign.allowed
        with pytest.raises(SessionNotFoundError):
            bob.sessions.get(sid)
        with pytest.raises(SessionNotFoundError):
            bob.sessions.close(sid)
        container_id = server.service.gateway.sessions.get(sid, principal="alice").container_id
        alice.sessions.close(sid)
        assert container_id is not None
        assert _container_gone(engine, container_id)
        with pytest.raises(SessionGoneError):
            alice.sessions.get(sid)
        assert isinstance(alice.sessions.execute(sid, {"code": "x"}).error, SessionGoneError)
        with pytest.raises(ValueError, match="not a session id"):
            alice.sessions.get("../executions")
    with Client(server.url, tokens["dave"]) as dave:
        denied = dave.sessions.create(KERNEL)
        assert (denied.allowed, denied.status, denied.session) == (False, 403, None)
        assert "sessions.enabled" in {v["rule"] for v in denied.violations}


def test_the_async_client_runs_a_kernel_session(served: Callable[..., tuple[Server, dict[str, str]]]) -> None:
    server, tokens = served()

    async def steps() -> tuple[str | None, str | None, int]:
        async with AsyncClient(server.url, tokens["alice"]) as alice:
            created = await alice.sessions.create(KERNEL)
            sid = created.session_id
            assert sid is not None
            await alice.sessions.execute(sid, {"code": "import math\nr = 3"})
            result = await alice.sessions.execute(sid, {"code": "math.floor(math.pi * r * r)"})
            listed = len(await alice.sessions.list())
            await alice.sessions.close(sid)
            return result.value, (await alice.sessions.list() or [None])[0], listed

    value, left, listed = asyncio.run(steps())
    assert (value, left, listed) == ("28", None, 1)


def test_a_kernel_session_under_gvisor_keeps_its_state(
    served: Callable[..., tuple[Server, dict[str, str]]],
    clients: Callable[..., httpx.Client],
    runtimes: tuple[str, ...],
    tmp_path: Path,
) -> None:
    if "runsc" not in runtimes:
        pytest.skip("gVisor (runsc) is not installed in this engine")
    policy = tmp_path / "sessions-runsc.yaml"
    policy.write_text(
        "apiVersion: gateway.agent-exec/v1\nkind: Policy\n"
        f"extends: {policies_dir() / 'strict.yaml'}\n"
        "metadata:\n  name: sessions-runsc\n"
        "spec:\n  sessions:\n    modes: [kernel]\n    max_per_principal: 1\n"
        "    idle_s: {default: 600, max: 1800}\n    lifetime_s: {default: 3600, max: 14400}\n"
        "    workspace_size: {default: 64m, max: 256m}\n"
    )
    server, tokens = served(gina=policy)
    gina = clients(server, tokens["gina"])
    created = _create(gina)
    assert created["settings"]["profile"]["runtime"] == "runsc"
    sid = created["session_id"]
    assert gina.post(f"/v1/sessions/{sid}/executions", json={"code": "x = 1"}).status_code == 200
    assert gina.post(f"/v1/sessions/{sid}/executions", json={"code": "x + 1"}).json()["value"] == "2"
    assert gina.delete(f"/v1/sessions/{sid}").status_code == 204


def test_a_workspace_session_keeps_its_files_across_executions(
    served: Callable[..., tuple[Server, dict[str, str]]], clients: Callable[..., httpx.Client]
) -> None:
    server, tokens = served()
    alice = clients(server, tokens["alice"])
    response = alice.post("/v1/sessions", json={"mode": "workspace", "workspace_size": "16m"})
    if response.status_code == 501:
        pytest.skip(f"workspace sessions need root, loop devices and mkfs.ext4: {response.json()['message']}")
    assert response.status_code == 201, response.text
    sid = response.json()["session_id"]
    wrote = alice.post(f"/v1/sessions/{sid}/executions", json={"code": "open('notes.txt', 'w').write('step 1')"})
    assert (wrote.status_code, wrote.json()["exit_code"]) == (200, 0), wrote.text
    read = alice.post(f"/v1/sessions/{sid}/executions", json={"code": "print(open('notes.txt').read())"})
    assert read.json()["stdout"] == "step 1\n", read.text
    assert read.json()["value"] is None  # no value outside a kernel
    assert alice.delete(f"/v1/sessions/{sid}").status_code == 204
    (ended,) = server.records("session.closed")
    assert (ended["data"]["mode"], ended["data"]["executions"]) == ("workspace", 2)
    assert "workspace_left" not in ended["data"]

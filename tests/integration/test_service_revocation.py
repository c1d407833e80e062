"""A principal removed or revoked by a reload, on a real server, a real engine and a real trail: its requests
waiting for an execution slot are refused at once (401 ``auth.failed``, audited as ``request.refused``) and
never decided, least of all under the service's default policy (issue 28, H1).

The principal ``strict`` is under its own policy, holds its one slot with a long run and has two runs queued;
the reload happens while they wait (``Service.reload``, what SIGHUP calls). No test asserts a duration.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from jsonschema import Draft202012Validator, FormatChecker
from serve_process import ServeProcess, serve_env

from gateway.resources import load_schema, policies_dir
from gateway.service.principals import DEFAULT_QUOTAS, PrincipalsStore, Quotas
from tests.integration.conftest import default_policy_variant

if TYPE_CHECKING:
    from conftest import Server

pytestmark = pytest.mark.usefixtures("engine")

LONG = {"code": "import time; time.sleep(5); print('long')"}
QUICK = {"code": "print(2 + 2)"}


@pytest.fixture
def principals(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """``strict`` (its own policy, one run at a time, two may wait) and ``other`` (so that a token remains)."""
    path = tmp_path / "revocation-principals.yaml"
    store = PrincipalsStore(path)
    one_at_a_time = Quotas(**{**DEFAULT_QUOTAS.to_dict(), "max_concurrent": 1, "queue": 2})
    strict = store.add(
        "strict", policy=str(default_policy_variant(tmp_path, "strict")), quotas=one_at_a_time,
        quotas_set=frozenset({"max_concurrent", "queue"}),
    )  # fmt: skip
    other = store.add("other", policy=str(policies_dir() / "default.yaml"))
    return path, {"strict": strict, "other": other}


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as executor:
        yield executor


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60  # generous: a hang fails the test instead of blocking the suite
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def _post(server: Server, token: str, body: dict[str, Any]) -> httpx.Response:
    with server.client(token) as client:
        return client.post("/v1/executions", json=body)


def _two_queued_behind_a_long_run(
    server: Server, token: str, pool: ThreadPoolExecutor
) -> tuple[Future[httpx.Response], list[Future[httpx.Response]]]:
    gate = server.service.quota_gate
    long = pool.submit(_post, server, token, LONG)
    _wait_for(lambda: gate.running_of("strict") == 1, "strict's long run holding its slot")
    queued = [pool.submit(_post, server, token, QUICK) for _ in range(2)]
    _wait_for(lambda: gate.waiting_of("strict") == 2, "two of strict's runs queued")
    return long, queued


@pytest.mark.parametrize("remove", [True, False], ids=["removed", "revoked"])
def test_queued_requests_of_a_principal_gone_at_reload_are_refused_never_run(
    serve: Callable[..., Server],
    principals: tuple[Path, dict[str, str]],
    pool: ThreadPoolExecutor,
    remove: bool,
) -> None:
    path, tokens = principals
    server = serve(principals=path)
    long, queued = _two_queued_behind_a_long_run(server, tokens["strict"], pool)
    PrincipalsStore(path).revoke("strict", remove=remove)
    assert server.service.reload() is True
    refused = [run.result(timeout=60) for run in queued]
    assert not long.done()  # refused at the reload, not when the slot came free
    for response in refused:
        assert response.status_code == 401, response.text
        body = response.json()
        assert body["code"] == "auth.failed"
        assert "strict" in body["message"]
        assert "nothing ran" in body["message"]
    assert long.result(timeout=60).status_code == 200  # the run that had started is not this finding's business
    decisions = [r for r in server.records("policy.decision") if r["principal"] == "strict"]
    assert len(decisions) == 1  # the long run's only: the queued ones were never decided, under any policy
    assert decisions[0]["policy"]["name"] == "strict"
    assert len(server.records("execution.outcome")) == 1
    (record,) = [r for r in server.records("request.refused") if r["principal"] == "strict"]
    assert record["data"]["code"] == "auth.failed"
    assert record["data"]["caller"]["principal"] == "strict"
    server.stop()
    counted = [r["data"]["count"] for r in server.records("request.refused") if r["principal"] == "strict"]
    assert sum(counted) == 2  # the second refusal in the summary written at stop


@pytest.mark.parametrize("endpoint", ["/v1/executions", "/v1/decisions"])
def test_a_request_of_a_principal_gone_while_its_body_was_read_is_refused(
    serve: Callable[..., Server], principals: tuple[Path, dict[str, str]], endpoint: str
) -> None:
    """Removed between authentication and the decision (no queue involved): refused, not defaulted. The
    request is held at its body: the reload happens while the service still reads it."""
    file, tokens = principals
    server = serve(principals=file)
    store = PrincipalsStore(file)

    def body() -> Iterator[bytes]:
        yield b'{"code": '
        store.revoke("strict", remove=True)
        assert server.service.reload() is True
        yield b'"print(1)"}'

    with server.client(tokens["strict"]) as client:
        response = client.post(endpoint, content=body(), headers={"Content-Type": "application/json"})
    assert response.status_code == 401, response.text
    assert response.json()["code"] == "auth.failed"
    assert [r for r in server.records("policy.decision") if r["principal"] == "strict"] == []
    (record,) = server.records("request.refused")
    assert (record["principal"], record["data"]["code"], record["data"]["path"]) == ("strict", "auth.failed", endpoint)


def test_a_reload_that_revokes_every_token_applies(
    serve: Callable[..., Server], principals: tuple[Path, dict[str, str]]
) -> None:
    """Issue 28, M1: revoking every token is an incident response, not a mistake to refuse: everyone gets 401."""
    file, tokens = principals
    server = serve(principals=file)
    store = PrincipalsStore(file)
    store.revoke("strict")
    store.revoke("other")
    assert server.service.reload() is True
    for token in tokens.values():
        with server.client(token) as client:
            assert client.get("/v1/policy").status_code == 401
    (reloaded,) = server.records("policy.reloaded")
    assert reloaded["data"]["ok"] is True


def test_a_revocation_applies_even_when_another_policy_file_fails(
    serve: Callable[..., Server], principals: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """Issue 28, M1: a typo in strict's policy file does not keep other's revoked token working; strict keeps
    its last good policy (never the default)."""
    file, tokens = principals
    server = serve(principals=file)
    PrincipalsStore(file).revoke("other")
    (tmp_path / "strict.yaml").write_text("apiVersion: nonsense\n")
    assert server.service.reload() is True
    with server.client(tokens["other"]) as client:
        assert client.get("/v1/policy").status_code == 401
    with server.client(tokens["strict"]) as client:
        answer = client.get("/v1/policy")
    assert answer.status_code == 200, answer.text
    assert answer.json()["policy"]["name"] == "strict"  # its last good policy
    (reloaded,) = server.records("policy.reloaded")
    assert reloaded["data"]["ok"] is True
    assert reloaded["data"]["kept"] == [{"principal": "strict", "source": str(tmp_path / "strict.yaml")}]
    (rejected,) = server.records("policy.rejected")
    assert rejected["data"]["source"] == str(tmp_path / "strict.yaml")


# --- `gateway principals revoke --service`: says whether the running service applied it (issue 28, M1) ---------


def _revoke(operator: str, *argv: str) -> tuple[int, dict[str, Any]]:
    """``gateway principals revoke ... --json`` in a subprocess, as an operator runs it (its token in
    ``$GATEWAY_OPERATOR_TOKEN``): its status and its JSON."""
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "principals", "revoke", *argv, "--json"],
        check=False, capture_output=True, text=True, timeout=120, env=serve_env({"GATEWAY_OPERATOR_TOKEN": operator}),
    )  # fmt: skip
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture
def served(serve_process: Callable[..., ServeProcess], tmp_path: Path) -> tuple[ServeProcess, dict[str, str]]:
    """A real ``gateway serve`` with an operator ``ops`` and an agent ``agent``, both answered 200."""
    store = PrincipalsStore(tmp_path / "principals.yaml")
    tokens = {
        "ops": store.add("ops", policy=str(policies_dir() / "default.yaml"), role="operator"),
        "agent": store.add("agent", policy=str(policies_dir() / "default.yaml")),
    }
    process = serve_process()
    for token in tokens.values():
        assert _policy_status(process.url, token) == 200
    return process, tokens


def _policy_status(url: str, token: str) -> int:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        return client.get("/v1/policy").status_code


def test_revoke_tells_the_running_service_and_confirms_it_applied(served: tuple[ServeProcess, dict[str, str]]) -> None:
    process, tokens = served
    status, report = _revoke(tokens["ops"], "agent", "--principals", str(process.principals), "--service", process.url)
    assert status == 0, report
    assert report["applied"] is True
    assert report["service"] == process.url
    assert report["revoked_token_ids"] == [tokens["agent"].split("_")[1]]
    assert report["reloaded_at"]
    assert _policy_status(process.url, tokens["agent"]) == 401  # what "applied" claims
    assert _policy_status(process.url, tokens["ops"]) == 200
    (reloaded,) = process.events("policy.reloaded")
    assert reloaded["data"]["ok"] is True


def test_revoke_without_a_service_says_it_is_not_applied_yet(served: tuple[ServeProcess, dict[str, str]]) -> None:
    process, tokens = served
    status, report = _revoke(tokens["ops"], "agent", "--principals", str(process.principals))
    assert status == 3, report
    assert report["applied"] is False
    assert "no running service was told" in report["reason"]
    assert _policy_status(process.url, tokens["agent"]) == 200  # true: nothing told the service


def test_revoke_in_a_file_the_service_does_not_serve_is_not_applied(
    served: tuple[ServeProcess, dict[str, str]], tmp_path: Path
) -> None:
    """The operator revoked in a copy (another path than the service's): the service reloads its own file and
    still accepts the token; the CLI says so instead of "applied"."""
    process, tokens = served
    copy = tmp_path / "elsewhere.yaml"
    copy.write_bytes(process.principals.read_bytes())
    status, report = _revoke(tokens["ops"], "agent", "--principals", str(copy), "--service", process.url)
    assert status == 4, report
    assert report["applied"] is False
    assert "still accepts" in report["reason"]
    assert _policy_status(process.url, tokens["agent"]) == 200


def test_revoke_with_no_service_listening_says_not_applied(served: tuple[ServeProcess, dict[str, str]]) -> None:
    process, tokens = served
    url = process.url
    assert process.stop() == 0
    status, report = _revoke(tokens["ops"], "agent", "--principals", str(process.principals), "--service", url)
    assert status == 4, report
    assert report["applied"] is False
    assert "could not reach" in report["reason"]


def test_only_an_operator_may_reload_over_http(served: tuple[ServeProcess, dict[str, str]]) -> None:
    process, tokens = served
    with httpx.Client(base_url=process.url, headers={"Authorization": f"Bearer {tokens['agent']}"}) as agent:
        refused = agent.post("/v1/reload")
    assert refused.status_code == 403, refused.text
    assert refused.json()["code"] == "auth.forbidden"
    with httpx.Client(base_url=process.url) as anonymous:
        assert anonymous.post("/v1/reload").status_code == 401
    assert process.events("policy.reloaded") == []  # neither reloaded anything
    with httpx.Client(base_url=process.url, headers={"Authorization": f"Bearer {tokens['ops']}"}) as operator:
        answered = operator.post("/v1/reload")
    assert answered.status_code == 200, answered.text
    api = load_schema("api")
    Draft202012Validator({**api, "$ref": "#/$defs/reloadAnswer"}, format_checker=FormatChecker()).validate(
        answered.json()
    )  # the documented shape (GET /openapi.json references it)
    ids = {token.split("_")[1] for token in tokens.values()}
    assert (answered.json()["applied"], set(answered.json()["token_ids"])) == (True, ids)

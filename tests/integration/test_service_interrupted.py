"""``gateway serve`` killed with SIGKILL mid-run: the next start marks each run it left open as interrupted.

A run whose service dies leaves a ``policy.decision`` without an ``execution.outcome``; the next gateway to start
on the trail writes one ``execution.outcome`` with ``gateway.interrupted`` for each such decision of a dead
instance, none for a run that finished, none twice at a later start, and the trail still verifies."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from serve_process import ServeProcess, serve_env, until

from gateway.cli import main
from gateway.resources import policies_dir
from gateway.service.principals import PrincipalsStore

DEFAULT_POLICY = str(policies_dir() / "default.yaml")
INTERRUPTED = "gateway.interrupted"


def _execute(url: str, token: str, code: str) -> httpx.Response:
    body = {"code": code, "limits": {"timeout_s": 30}}
    return httpx.post(url + "/v1/executions", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=120)


def _interrupted(server: ServeProcess) -> list[dict[str, Any]]:
    return [r for r in server.events("execution.outcome") if (r["data"].get("error") or {}).get("code") == INTERRUPTED]


def test_a_killed_service_s_open_runs_are_marked_interrupted_once(
    tmp_path: Path, serve_process: Callable[..., ServeProcess], engine: Any, managed_containers: Callable[[], list[str]]
) -> None:
    try:
        _kill_then_restart_twice(tmp_path, serve_process)
    finally:
        for cid in managed_containers():  # a sandbox created, not yet started, when its service was killed
            with contextlib.suppress(Exception):  # already gone
                engine.api.remove_container(cid, force=True)


def _kill_then_restart_twice(tmp_path: Path, serve_process: Callable[..., ServeProcess]) -> None:
    token = PrincipalsStore(tmp_path / "principals.yaml").add("alice", policy=DEFAULT_POLICY, role="agent")
    first = serve_process()
    finished = _execute(first.url, token, "print('done')")
    assert finished.status_code == 200, finished.text
    calls = [threading.Thread(target=_call_ignoring_errors, args=(first.url, token), daemon=True) for _ in range(2)]
    for call in calls:
        call.start()
    until(lambda: len(first.events("policy.decision")) == 3, "both long runs to be decided")
    first.proc.kill()
    first.proc.wait(timeout=30)
    for call in calls:
        call.join(60)
    decisions = {r["request_id"]: r for r in first.events("policy.decision")}
    done = {r["request_id"] for r in first.events("execution.outcome")}
    open_ids = set(decisions) - done
    assert len(open_ids) == 2, (decisions.keys(), done)

    second = serve_process()
    marked = _interrupted(second)
    assert sorted(r["request_id"] for r in marked) == sorted(open_ids)
    for record in marked:
        decision = decisions[record["request_id"]]
        assert record["principal"] == "alice"
        assert record["data"]["interrupted"]["decision"] == {
            "seq": decision["seq"], "event_id": decision["event_id"], "hash": decision["hash"],
        }  # fmt: skip
        assert record["data"]["interrupted"]["instance"] == {
            "host": decision["gateway"]["host"], "pid": first.proc.pid,
        }  # fmt: skip
        assert record["gateway"]["pid"] == second.proc.pid
    assert second.stop() == 0

    third = serve_process()
    assert len(_interrupted(third)) == 2
    assert third.stop() == 0
    assert main(["audit", "verify", "--audit-dir", str(first.audit)]) == 0


def _call_ignoring_errors(url: str, token: str) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the service is killed under it
        _execute(url, token, "import time; time.sleep(60)")


def test_a_killed_gateway_run_is_marked_by_the_next_one_shot_start(
    tmp_path: Path, engine: Any, managed_containers: Callable[[], list[str]]
) -> None:
    """``gateway run`` killed mid-run; the next command on the trail (``gateway check``, a dry run) marks it."""
    audit = tmp_path / "audit"
    cli = [sys.executable, "-m", "gateway"]
    env = serve_env()
    run = subprocess.Popen(
        [*cli, "run", "--audit-dir", str(audit), "--timeout", "30", "--code", "import time; time.sleep(60)"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        until(lambda: _events(audit, "policy.decision"), "the run's decision")
    finally:
        run.kill()
        run.wait(timeout=30)
        for cid in managed_containers():  # a sandbox created, not yet started, when its gateway was killed
            with contextlib.suppress(Exception):  # already gone
                engine.api.remove_container(cid, force=True)
    (decision,) = _events(audit, "policy.decision")
    check = [*cli, "check", "--audit-dir", str(audit), "-"]
    subprocess.run(check, input=b'{"code": "print(1)"}', env=env, check=True, capture_output=True, timeout=120)
    (marked,) = _events(audit, "execution.outcome")
    assert marked["request_id"] == decision["request_id"]
    assert marked["data"]["error"]["code"] == INTERRUPTED
    assert marked["data"]["interrupted"]["instance"]["pid"] == run.pid


def _events(audit: Path, kind: str) -> list[dict[str, Any]]:
    return [
        record
        for segment in sorted(audit.glob("trail-*.jsonl"))
        for line in segment.read_text().splitlines()
        if (record := json.loads(line))["event_type"] == kind
    ]

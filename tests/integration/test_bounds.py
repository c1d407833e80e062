"""Bounds on the real engine (issue 14, items 5, 6, 9, 11): what a program returns, what the trail keeps, how
the trail's disk is protected, what the verifier says without its key, and limits the engine would refuse.

Each test is an attack that worked on the code before it: the docstring says how it failed there.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from tests.integration.conftest import MANAGED_LABEL, gateway_containers

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "GATEWAY_POLICY", "GATEWAY_AUDIT_DIR", "GATEWAY_AUDIT_KEY", "GATEWAY_AUDIT_KEY_FILE", "GATEWAY_AUDIT_MIN_FREE",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def audit_dir(tmp_path: Path) -> Path:
    return tmp_path / "audit"


class Attempts:
    """Container ``create`` events (and ``die`` of created ones) of the gateway's label since the start."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.since = int(time.time()) - 1
        self.before = set(self._ids())

    def _ids(self) -> list[str]:
        events = self.engine.events(
            since=self.since, until=int(time.time()) + 1, filters={"type": "container", "event": "create"}, decode=True
        )
        return [e["id"] for e in events if e.get("Actor", {}).get("Attributes", {}).get(MANAGED_LABEL) == "true"]

    def created(self) -> list[str]:
        return [i for i in self._ids() if i not in self.before]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def records(audit_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for seg in sorted(audit_dir.glob("*.jsonl")) for line in seg.read_text().splitlines()]


# --- item 11: limits the engine refuses are refused by the decision ------------------------------------------


@pytest.mark.parametrize(
    ("flags", "rule"),
    [
        (["--cpus", "0.004"], "limits.cpus"),  # the engine's minimum is 0.01 CPU
        (["--cpus", "0.0099"], "limits.cpus"),
    ],
)
def test_limits_below_the_engines_minimum_are_denied_before_any_container(
    engine: Any, audit_dir: Path, capsys: pytest.CaptureFixture[str], flags: list[str], rule: str
) -> None:
    """Before: the decision allowed ``cpus: 0.004``; the runner's create was refused by the engine ("Range of
    CPUs is from 0.01 to ...") and the CLI exited 125 with ``runner.sandbox_failed``."""
    attempts = Attempts(engine)
    rc, out, err = run_cli(capsys, "run", "--json", "--audit-dir", str(audit_dir), *flags, "--code", "print(1)")
    result = json.loads(out)
    assert rc == 77, result
    assert [v["rule"] for v in result["violations"]] == [rule]
    assert "minimum" in result["violations"][0]["message"]
    assert attempts.created() == []
    assert not any(r["event_type"] == "execution.outcome" for r in records(audit_dir))

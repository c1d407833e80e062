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
from tests.integration.conftest import INSTANCE_LABEL, MANAGED_LABEL, gateway_containers

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
    """Container ``create`` events of this session's gateway containers since the start."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.since = int(time.time()) - 1
        self.before = set(self._ids())

    def _ids(self) -> list[str]:
        events = self.engine.events(
            since=self.since, until=int(time.time()) + 1, filters={"type": "container", "event": "create"}, decode=True
        )
        # Other sessions share the engine: only this session's containers count.
        mine = {MANAGED_LABEL: "true", INSTANCE_LABEL: os.environ["GATEWAY_INSTANCE"]}
        return [e["id"] for e in events if mine.items() <= e.get("Actor", {}).get("Attributes", {}).items()]

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
    rc, out, _ = run_cli(capsys, "run", "--json", "--audit-dir", str(audit_dir), *flags, "--code", "print(1)")
    result = json.loads(out)
    assert rc == 77, result
    assert [v["rule"] for v in result["violations"]] == [rule]
    assert "minimum" in result["violations"][0]["message"]
    assert attempts.created() == []
    assert not any(r["event_type"] == "execution.outcome" for r in records(audit_dir))


# --- item 5: returned files are bounded by count, and names cost bytes -------------------------------------

_MANY_EMPTY_FILES = (
    "import os\n"
    "os.makedirs('/workspace/out/d', exist_ok=True)\n"
    "for i in range(20000):\n"
    "    os.close(os.open('/workspace/out/d/f%06d' % i, os.O_CREAT | os.O_WRONLY, 0o600))\n"
    "print('made')\n"
)


def test_many_empty_output_files_give_a_bounded_result_and_record(
    engine: Any, audit_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: empty files cost nothing against ``output_files_bytes``; all 20,000 came back (a result listing
    each, an ``execution.outcome`` record of ~1.6 MB naming each), ``files_truncated`` false. (At 200,000 files
    the review saw 490 MB RSS, a 62 MB JSON result and a 70 MB record.)"""
    rc, out, err = run_cli(
        capsys, "run", "--json", "--timeout", "60", "--audit-dir", str(audit_dir), "--code", _MANY_EMPTY_FILES
    )
    result = json.loads(out)
    assert rc == 0, (result["error"], err)
    assert result["stdout"] == "made\n"
    assert result["files_truncated"] is True
    assert 0 < len(result["files"]) <= 256  # the default policy's limits.output_files default
    assert len(out) < 256 * 1024
    [outcome] = [r for r in records(audit_dir) if r["event_type"] == "execution.outcome"]
    line = json.dumps(outcome, separators=(",", ":"))
    assert len(line) < 16 * 1024, len(line)
    files = outcome["data"]["files"]
    assert len(files) <= 32
    assert outcome["data"]["files_count"] == len(result["files"])
    assert outcome["data"]["files_truncated"] is True
    omitted = outcome["data"]["files_omitted"]
    assert omitted["count"] == len(result["files"]) - len(files)
    assert len(omitted["sha256"]) == 64
    assert gateway_containers(engine) == []


def test_output_file_count_limit_is_a_policy_limit_a_request_may_lower(
    engine: Any, audit_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A request may ask for fewer returned files than the ceiling, never more (rule limits.output_files)."""
    code = "import os\nfor i in range(10):\n    open('/workspace/out/f%d' % i, 'w').write('x')\n"
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"code": code, "limits": {"output_files": 3}}))
    rc, out, _ = run_cli(capsys, "check", "--audit-dir", str(audit_dir), str(request))
    assert rc == 0, out
    from gateway import Gateway

    with Gateway.from_env(audit_dir=audit_dir) as gw:
        result = gw.execute({"code": code, "limits": {"output_files": 3}})
        denied = gw.decide({"code": code, "limits": {"output_files": 100000}})
    data = result.to_dict()
    assert [f["path"] for f in data["files"]] == ["f0", "f1", "f2"]
    assert data["files_truncated"] is True
    assert [v["rule"] for v in denied.to_dict()["violations"]] == ["limits.output_files"]


# --- item 9: `gateway audit verify` says when HMACs were not checked, and a mix of keyed records fails ------


def _rewrite(audit_dir: Path, strip: set[int] | None) -> None:
    """Rehash the trail from the first record in ``strip`` on, dropping the hmac of the records in ``strip``
    (``None``: of every record) and keeping the stale hmac of the others: what a forger without the key does."""
    from gateway.audit.canonical import canonical_bytes, seal

    prev_hash = None
    for seg in sorted(audit_dir.glob("*.jsonl")):
        out = []
        for original in seg.read_bytes().splitlines(keepends=True):
            line = original
            record = json.loads(line)
            if strip is None or record["seq"] >= min(strip):
                record.pop("hash")
                mac = record.pop("hmac")
                if strip is not None and record["seq"] == min(strip):
                    record["data"]["exit_code"] = 0  # the forgery: another outcome
                if prev_hash is not None:
                    record["prev_hash"] = prev_hash
                line = seal(canonical_bytes(record))[0]
                if strip is not None and record["seq"] not in strip:
                    line = line[:-3] + b'","hmac":"' + mac.encode() + b'"}\n'
            prev_hash = json.loads(line)["hash"]
            out.append(line)
        seg.write_bytes(b"".join(out))


def test_verify_without_a_key_fails_on_a_forged_unkeyed_record_and_says_hmacs_were_not_checked(
    engine: Any, audit_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: on a keyed trail, a forged record without ``hmac`` (chain rehashed) and a trail with every HMAC
    stripped both verified OK without the key (exit 0, "chain intact"); the second printed no warning at all."""
    key_file = tmp_path / "key"
    key_file.write_text(os.urandom(32).hex())
    monkeypatch.setenv("GATEWAY_AUDIT_KEY_FILE", str(key_file))
    rc, _, _ = run_cli(capsys, "run", "--audit-dir", str(audit_dir), "--code", "import sys; sys.exit(3)")
    assert rc == 3
    monkeypatch.delenv("GATEWAY_AUDIT_KEY_FILE")
    pristine = {seg: seg.read_bytes() for seg in audit_dir.glob("*.jsonl")}
    outcome_seq = next(r["seq"] for r in records(audit_dir) if r["event_type"] == "execution.outcome")

    rc, out, _ = run_cli(capsys, "audit", "verify", str(audit_dir))
    assert rc == 0
    assert "HMACs were NOT checked" in out
    assert run_cli(capsys, "audit", "verify", "--key-file", str(key_file), str(audit_dir))[0] == 0

    _rewrite(audit_dir, strip={outcome_seq})
    rc, out, _ = run_cli(capsys, "audit", "verify", "--json", str(audit_dir))
    report = json.loads(out)
    assert rc == 1, report
    assert (report["first_break"]["seq"], report["first_break"]["reason"]) == (outcome_seq, "bad_hmac")
    rc, out, _ = run_cli(capsys, "audit", "verify", "--key-file", str(key_file), str(audit_dir))
    assert rc == 1
    assert f"BROKEN at seq {outcome_seq}" in out

    for seg, data in pristine.items():
        seg.write_bytes(data)
    _rewrite(audit_dir, strip=None)
    rc, out, _ = run_cli(capsys, "audit", "verify", str(audit_dir))
    assert rc == 0  # nothing without the key can tell an unkeyed trail from a stripped one; it says so
    assert "HMACs were NOT checked: no record carries one" in out
    rc, out, _ = run_cli(capsys, "audit", "verify", "--key-file", str(key_file), str(audit_dir))
    assert rc == 1
    assert "BROKEN at seq 1" in out
    assert "no hmac" in out

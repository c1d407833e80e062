"""Bounds on the real engine (issue 14, items 5, 6, 9, 11): what a program returns, what the trail keeps, how
the trail's disk is protected, what the verifier says without its key, and limits the engine would refuse.

Each test is an attack that worked on the code before it: the docstring says how it failed there.
"""

from __future__ import annotations

import json
import os
import time
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
        (["--memory", "5m"], "limits.memory"),  # the engine's minimum is 6 MiB (denied before this change too)
        (["--file", f"{__file__}:{'a' * 300}"], "files.path"),  # NAME_MAX is 255 bytes (denied before too)
        (["--file", f"{__file__}:{'/'.join(['d' * 200] * 6)}"], "files.path"),  # a path beyond 1024 bytes
    ],
)
def test_limits_below_the_engines_minimum_are_denied_before_any_container(
    engine: Any, audit_dir: Path, capsys: pytest.CaptureFixture[str], flags: list[str], rule: str
) -> None:
    """Before: the decision allowed ``cpus: 0.004``; the container was created and its start failed (the kernel
    refuses a CFS quota below 1 ms: "cpu.cfs_quota_us: invalid argument"), so the CLI exited 125 with
    ``runner.sandbox_failed``. Memory below 6 MiB and over-long file names were already denied; pinned here."""
    attempts = Attempts(engine)
    rc, out, _ = run_cli(capsys, "run", "--json", "--audit-dir", str(audit_dir), *flags, "--code", "print(1)")
    result = json.loads(out)
    assert rc == 77, result
    assert [v["rule"] for v in result["violations"]] == [rule]
    assert any(word in result["violations"][0]["message"] for word in ("minimum", "longer than"))
    assert attempts.created() == []
    assert not any(r["event_type"] == "execution.outcome" for r in records(audit_dir))


def test_more_cpus_than_the_engines_host_has_are_denied_before_any_container(
    engine: Any, audit_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: a policy allowing more CPUs than the engine's host has let ``--cpus`` past the host through; the
    container was created and the engine refused it ("Range of CPUs is from 0.01 to N"): 125. Now the Docker
    backend declares its host's CPUs to the decision."""
    from gateway.resources import policies_dir

    host = int(engine.info()["NCPU"])
    text = (policies_dir() / "default.yaml").read_text()
    assert "cpus: {default: 1, max: 2}" in text
    policy = tmp_path / "many-cpus.yaml"
    policy.write_text(text.replace("cpus: {default: 1, max: 2}", f"cpus: {{default: 1, max: {host + 4}}}"))
    attempts = Attempts(engine)
    rc, out, _ = run_cli(
        capsys, "run", "--json", "--policy", str(policy), "--audit-dir", str(audit_dir),
        "--cpus", str(host + 1), "--code", "print(1)",
    )  # fmt: skip
    result = json.loads(out)
    assert rc == 77, result
    [violation] = result["violations"]
    assert violation["rule"] == "limits.cpus"
    assert "above what the backend can give" in violation["message"]
    assert attempts.created() == []
    rc, out, _ = run_cli(
        capsys, "run", "--json", "--policy", str(policy), "--audit-dir", str(audit_dir),
        "--cpus", str(host), "--code", "print(1)",
    )  # fmt: skip
    assert rc == 0, json.loads(out)


def test_an_environment_variable_the_kernel_cannot_exec_is_denied_even_in_audit_mode(
    engine: Any, audit_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: under a policy with ``env`` in audit mode, a 140 KB variable was only a warning; the container was
    created and its exec failed ("argument list too long"): no program ran, and the run was reported as the
    sandbox dying instead of a denial."""
    from gateway.resources import policies_dir

    text = (policies_dir() / "default.yaml").read_text()
    text = text.replace("    max_total_bytes: 16k\n", "    max_total_bytes: 16k\n    mode: audit\n")
    policy = tmp_path / "audit-env.yaml"
    policy.write_text(text)
    attempts = Attempts(engine)
    rc, out, _ = run_cli(
        capsys, "run", "--json", "--policy", str(policy), "--audit-dir", str(audit_dir),
        "--env", "APP_X=" + "a" * 140_000, "--code", "print(1)",
    )  # fmt: skip
    result = json.loads(out)
    assert rc == 77, result
    assert {v["rule"] for v in result["violations"]} == {"env.limits"}
    assert attempts.created() == []


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


# --- item 6: metadata, lists in records, and a free-space watermark on the trail ----------------------------


def _free(path: Path) -> int:
    fs = os.statvfs(path)
    return fs.f_bavail * fs.f_frsize


def _fill(path: Path, leave: int) -> None:
    """Write ballast until about ``leave`` bytes are free."""
    (path / "ballast").write_bytes(b"\0" * max(_free(path) - leave, 0))


def test_below_the_watermark_new_work_is_refused_but_a_run_in_flight_records_its_outcome(
    engine: Any, tiny_fs: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: nothing protected the trail's disk; requests (dry runs included) wrote until it was full, and then
    the outcome of a run in flight could not be recorded (``audit_ok`` false, exit 125 after the program ran)."""
    import threading

    from gateway import Gateway

    fs = tiny_fs("size=2m")
    trail = fs / "audit"
    monkeypatch.setenv("GATEWAY_AUDIT_MIN_FREE", "1m")
    attempts = Attempts(engine)
    results: dict[str, Any] = {}
    code = "import time\ntime.sleep(4)\nprint('done')"
    with Gateway.from_env(audit_dir=trail) as gw:
        thread = threading.Thread(target=lambda: results.setdefault("run", gw.execute({"code": code})))
        thread.start()
        deadline = time.monotonic() + 30
        while not attempts.created() and time.monotonic() < deadline:
            time.sleep(0.1)
        _fill(fs, 256 * 1024)  # below the watermark, with room for a few records
        refused = gw.execute({"code": "print('never')"})
        dry = gw.decide({"code": "print('never')"})
        thread.join()
    run = results["run"]
    assert run.exit_status == 0, run.to_dict()
    assert run.audit_ok is True
    assert len(attempts.created()) == 1  # the refused request created nothing
    for result in (refused, dry):
        assert result.exit_status == 125
        assert result.error is not None
        assert result.error.code == "audit.low_space"
        assert "watermark" in result.error.message
    outcomes = [r for r in records(trail) if r["event_type"] == "execution.outcome"]
    assert [o["request_id"] for o in outcomes] == [run.request_id]
    rc, out, _ = run_cli(capsys, "run", "--json", "--audit-dir", str(trail), "--code", "print('never')")
    assert rc == 125
    assert json.loads(out)["error"]["code"] == "audit.low_space"
    assert run_cli(capsys, "audit", "verify", str(trail))[0] == 0
    assert _free(fs) > 100 * 1024  # refused before the disk was full


def test_a_denied_request_with_thousands_of_file_names_costs_a_bounded_trail(
    engine: Any, audit_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: each of 5,000 refused names was listed in ``request.received`` and twice in ``policy.decision``
    (results and violations, each with a message naming it): the trail grew by several times the request."""
    attempts = Attempts(engine)
    request = {"code": "print(1)", "files": {f"../escape-{i:05d}": "x" for i in range(5000)}}
    path = tmp_path / "req.json"
    path.write_text(json.dumps(request))
    rc, out, _ = run_cli(capsys, "check", "--json", "--audit-dir", str(audit_dir), str(path))
    assert rc == 77
    violations = json.loads(out)["violations"]
    assert len(violations) == 5001  # every name, and files.max_count: the caller's own result is complete
    by_type = {r["event_type"]: r for r in records(audit_dir)}
    received, decision = by_type["request.received"], by_type["policy.decision"]
    for record in (received, decision):
        assert len(json.dumps(record)) < 32 * 1024, record["event_type"]
    files = received["data"]["request"]
    assert len(files["files"]) == 32
    assert files["files_omitted"]["count"] == 5000 - 32
    body = decision["data"]["decision"]
    assert len(body["violations"]) <= 32
    assert body["violations_omitted"]["count"] == len(violations) - len(body["violations"])
    assert "$.data.decision.violations" in decision["redacted"]
    trail_bytes = sum(seg.stat().st_size for seg in audit_dir.glob("*.jsonl"))
    assert trail_bytes < path.stat().st_size  # the trail no longer multiplies what the caller sends
    assert attempts.created() == []
    assert run_cli(capsys, "audit", "verify", str(audit_dir))[0] == 0


def test_a_dry_run_with_megabytes_of_metadata_is_invalid_and_writes_a_small_record(
    audit_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``gateway check`` with 8 MiB of metadata was accepted and each dry run wrote it to the trail."""
    path = tmp_path / "req.json"
    path.write_text(json.dumps({"code": "print(1)", "metadata": {f"k{i}": "v" * 1000 for i in range(60)}}))
    rc, out, err = run_cli(capsys, "check", "--audit-dir", str(audit_dir), str(path))
    assert rc == 2, (out, err)
    assert "$.metadata" in err
    assert "at most 16384" in err
    [invalid] = [r for r in records(audit_dir) if r["event_type"] == "request.invalid"]
    assert len(json.dumps(invalid)) < 4096

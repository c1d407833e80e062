"""``gateway report``: goldens on a fixed trail, totals, control evidence, broken and merged trails, the
PolicyReport schema, filters. The trails are written by a real Gateway through the real writer
(``report_support``); nothing here builds records by hand except the one "older gateway" decision."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import pytest
from jsonschema import Draft202012Validator

from gateway._workers import WorkerPool
from gateway.audit import JsonlAuditTrail, verify_trail
from gateway.audit.interrupted import mark_interrupted
from gateway.cli import main
from gateway.errors import AuditIntegrityError
from gateway.report import Progress, ReportFilters, aggregate, build_report, load_catalogue, render
from gateway.report.aggregate import MAX_BUCKETS, DurationHistogram
from gateway.report.model import PolicyReportResult
from gateway.resources import load_schema
from tests.unit.report_support import EGRESS_SCENARIO, START, FixedClock, decision_dict, write_scenario
from tests.unit.workers_support import CountingPool

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
NOW = datetime(2026, 3, 3, 8, 0, 0, tzinfo=UTC)
UPDATE = os.environ.get("GATEWAY_UPDATE_GOLDEN") == "1"


@pytest.fixture
def trail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The scenario's trail at ``./trail-a`` (relative, so the report's text names it the same every run)."""
    monkeypatch.chdir(tmp_path)
    write_scenario(Path("trail-a"))
    return Path("trail-a")


@pytest.fixture
def egress_trail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The scenario and a run with network egress (``EGRESS_SCENARIO``), at ``./trail-a`` like :func:`trail`."""
    monkeypatch.chdir(tmp_path)
    write_scenario(Path("trail-a"), scenario=EGRESS_SCENARIO)
    return Path("trail-a")


def _normalised(text: str, head: str) -> str:
    """The report text with the trail's head hash (which covers the writer's pid and version) masked."""
    return text.replace(head, "<head-hash>").replace(head[:16], "<head-hash>")


@pytest.mark.parametrize("fmt", ["json", "md", "csv"])
def test_golden(egress_trail: Path, fmt: str) -> None:
    trail = egress_trail
    report = build_report([trail], now=NOW)
    head = verify_trail(trail).last_hash
    assert report.verification[0].head.hash == head  # the head the report names is the one verify reaches
    got = _normalised(render(report, fmt), head)
    golden = GOLDEN / f"report.{fmt}"
    if UPDATE:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(got)
    assert got == golden.read_text(), f"regenerate with GATEWAY_UPDATE_GOLDEN=1 if the change is meant ({golden})"


def test_totals_and_sections_say_what_the_scenario_did(trail: Path) -> None:
    data = build_report([trail], now=NOW).to_dict()
    t = data["totals"]
    assert t["requests"] == t["allowed"] + t["denied"] + t["invalid"] == 12
    assert (t["allowed"], t["denied"], t["invalid"], t["dry_runs"], t["errors"]) == (8, 3, 1, 1, 1)
    v = data["verification"][0]
    assert set(v) >= {"trail", "records_checked", "intact", "first_break", "hmac_checked", "head", "anchor"}
    assert v["intact"] is True
    assert v["first_break"] is None
    assert v["anchor"] is None
    assert v["hmac_checked"] is False
    first = json.loads((trail / "trail-000001.jsonl").read_text().splitlines()[0])
    assert v["trail_id"] == first["event_id"]
    assert v["head"]["seq"] == v["records_checked"] == 37
    rules = {r["rule"]: r["count"] for r in data["denial_rules"]}
    assert rules == {"images.allowlist": 1, "limits.memory": 1, "network.mode": 1}
    assert [r["rule"] for r in data["warning_rules"]] == ["limits.memory"]
    outcomes = data["outcomes"]
    assert (outcomes["timed_out"], outcomes["oom_killed"], outcomes["output_truncated"]) == (1, 1, 1)
    assert outcomes["error_codes"] == [{"code": "runner.sandbox_failed", "count": 1}]
    assert [d["principal"] for d in data["denied"]["shown"]] == ["bob", "alice", "carol"]
    assert {p["name"] for p in data["policies"]} == {"default", "audit-warnings"}
    statuses = {c["id"]: c["status"] for c in data["controls"]}
    assert statuses["CIS-Docker-1.6.0-5.5"] == "enforced"
    assert statuses["CIS-Docker-1.6.0-5.1"] == "not_applicable"
    assert statuses["CIS-Docker-1.6.0-5.2"] == "unproven"
    assert all(c["offending_requests"] == [] for c in data["controls"])


def test_the_catalogue_is_cis_docker_section_5_with_versioned_ids() -> None:
    catalogue = load_catalogue()
    assert catalogue.version == "1.6.0"
    ids = [c.id for c in catalogue.controls]
    assert ids == [f"CIS-Docker-1.6.0-5.{n}" for n in range(1, 33)]
    judged = {c.number for c in catalogue.controls if c.check is not None}
    # the run-option controls the issue names: capabilities, privileged, host dirs, host network, memory, CPU,
    # read-only root, PID/IPC/UTS/user namespaces, devices, propagation, seccomp, cgroup parent, nnp, pids,
    # docker socket, default bridge
    assert judged >= {"5.4", "5.5", "5.6", "5.10", "5.11", "5.12", "5.13", "5.16", "5.17", "5.18", "5.20",
                      "5.21", "5.22", "5.25", "5.26", "5.29", "5.30", "5.31", "5.32"}  # fmt: skip


def _append_decision(directory: Path, request_id: str, decision: dict[str, Any], when: datetime) -> None:
    with JsonlAuditTrail(directory, clock=lambda: when) as sink:
        sink.append(
            "policy.decision",
            {"decision": decision, "options_sha256": "0" * 64, "dry_run": False},
            request_id=request_id,
            principal="mallory",
            policy={"name": decision["policy"]["name"], "sha256": decision["policy"]["sha256"]},
        )


def test_an_execution_without_a_control_is_named_by_its_request_id(trail: Path) -> None:
    """One recorded execution whose run options lack the pids limit and run privileged (what a record of a
    gateway without those controls would hold): those controls are violated and name exactly that request."""
    bad = decision_dict(pids_limit=None, privileged=True)
    _append_decision(trail, "req-without-controls", bad, START + timedelta(hours=1))
    data = build_report([trail], now=NOW).to_dict()
    controls = {c["id"]: c for c in data["controls"]}
    for number in ("5.29", "5.5"):
        control = controls[f"CIS-Docker-1.6.0-{number}"]
        assert control["status"] == "violated"
        assert control["offending_requests"] == ["req-without-controls"]
        assert control["executions_failed"] == 1
        assert control["executions_checked"] == 9
    assert controls["CIS-Docker-1.6.0-5.4"]["status"] == "enforced"
    md = render(build_report([trail], now=NOW), "md")
    assert "| CIS-Docker-1.6.0-5.29 | Ensure that the PIDs cgroup limit is used | violated |" in md
    assert "req-without-controls" in md


def test_gvisor_runs_leave_no_new_privileges_unproven(trail: Path) -> None:
    _append_decision(trail, "req-runsc", decision_dict(runtime="runsc"), START + timedelta(hours=1))
    controls = {c["id"]: c for c in build_report([trail], now=NOW).to_dict()["controls"]}
    nnp = controls["CIS-Docker-1.6.0-5.26"]
    assert nnp["status"] == "unproven"
    assert nnp["executions_unproven"] == 1
    assert "gVisor" in nnp["evidence"]
    assert controls["CIS-Docker-1.6.0-5.29"]["status"] == "enforced"


def test_a_sensitive_host_path_or_the_docker_socket_violates(trail: Path) -> None:
    mounts = [{"Type": "bind", "Source": "/var/run/docker.sock", "Target": "/s", "ReadOnly": False,
               "BindOptions": {"Propagation": "rshared"}}]  # fmt: skip
    _append_decision(trail, "req-sock", decision_dict(mounts=mounts), START + timedelta(hours=1))
    _append_decision(trail, "req-etc", decision_dict(volumes={"/etc": {"bind": "/e"}}), START + timedelta(hours=2))
    controls = {c["id"]: c for c in build_report([trail], now=NOW).to_dict()["controls"]}
    assert controls["CIS-Docker-1.6.0-5.32"]["offending_requests"] == ["req-sock"]
    assert controls["CIS-Docker-1.6.0-5.20"]["offending_requests"] == ["req-sock"]
    assert controls["CIS-Docker-1.6.0-5.6"]["offending_requests"] == ["req-etc"]


def _tamper(directory: Path, seq: int) -> None:
    path = directory / "trail-000001.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[seq - 1] = lines[seq - 1].replace(b'"principal":"bob"', b'"principal":"eve"', 1)
    path.write_bytes(b"".join(lines))


def test_a_tampered_trail_is_broken_on_the_first_line_and_exits_1(
    trail: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seq = next(
        i for i, line in enumerate((trail / "trail-000001.jsonl").read_text().splitlines(), 1) if '"bob"' in line
    )
    _tamper(trail, seq)
    expected = f"BROKEN: trail-a: first break at seq {seq} (modified)"
    for fmt in ("md", "csv", "html", "json"):
        assert main(["report", "--trail", "trail-a", "--format", fmt, "-o", f"out.{fmt}"]) == 1
        assert capsys.readouterr().err.splitlines()[0] == expected
    assert Path("out.md").read_text().splitlines()[0] == expected
    assert Path("out.csv").read_text().splitlines()[0] == expected
    html = Path("out.html").read_text()
    assert f'<h1 class="broken">{expected}</h1>' in html
    assert html.index("<h1") == html.index('<h1 class="broken">')  # the first heading
    data = json.loads(Path("out.json").read_text())
    assert data["verification"][0]["intact"] is False
    assert data["verification"][0]["first_break"]["seq"] == seq
    assert data["totals"]["records"] < seq  # only the verified prefix is reported on


def test_two_trails_are_each_verified_and_merged_by_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_scenario(Path("a"), start=START, prefix=0xA)
    write_scenario(Path("b"), start=START + timedelta(seconds=3), prefix=0xB)
    data = build_report([Path("a"), Path("b")], now=NOW).to_dict()
    assert [v["trail"] for v in data["verification"]] == ["a", "b"]
    assert data["verification"][0]["trail_id"] != data["verification"][1]["trail_id"]
    assert all(v["intact"] for v in data["verification"])
    assert data["totals"]["requests"] == 24
    assert data["totals"]["denied"] == 6
    times = [d["time"] for d in data["denied"]["shown"]]
    assert times == sorted(times)
    assert len(times) == 6
    assert [d["request_id"][:8] for d in data["denied"]["shown"]][:2] == ["0000000a", "0000000b"]  # interleaved
    _tamper(Path("b"), 20)
    report = build_report([Path("a"), Path("b")], now=NOW)
    assert [v.intact for v in report.verification] == [True, False]
    assert report.broken_lines() == ["BROKEN: b: first break at seq 20 (modified)"]


def test_policy_report_validates_against_its_schema(trail: Path) -> None:
    doc = build_report([trail], now=NOW).to_dict()["policy_report"]
    schema = load_schema("policy-report")
    Draft202012Validator.check_schema(schema)
    errors = list(Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER).iter_errors(doc))
    assert errors == []
    by_rule = {(r["policy"], r["rule"]): r for r in doc["results"]}
    assert by_rule[("default", "images.allowlist")]["result"] == "fail"
    assert by_rule[("audit-warnings", "limits.memory")]["result"] == "warn"
    assert doc["summary"]["fail"] == sum(1 for r in doc["results"] if r["result"] == "fail")
    broken = {**doc, "summary": {**doc["summary"], "pass": -1}}
    assert list(Draft202012Validator(schema).iter_errors(broken))  # the schema can fail


def test_filters_narrow_the_report(trail: Path) -> None:
    alice = build_report([trail], filters=ReportFilters(principal="alice"), now=NOW).to_dict()
    assert [p["principal"] for p in alice["principals"]] == ["alice"]
    assert alice["totals"]["denied"] == 1
    audit = build_report([trail], filters=ReportFilters(policy="audit-warnings"), now=NOW).to_dict()
    assert audit["totals"]["allowed"] == 1
    assert audit["totals"]["denied"] == 1
    later = build_report([trail], filters=ReportFilters(since="2026-03-02T09:03:00.000000Z"), now=NOW).to_dict()
    assert later["period"]["first_record"] >= "2026-03-02T09:03:00.000000Z"
    assert later["verification"][0]["records_checked"] == 37  # verification covers the whole trail


def test_quiet_when_piped(trail: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--trail", "trail-a", "--format", "json", "-o", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert json.loads(captured.out)["totals"]["requests"] == 12


def test_default_trail_comes_from_the_environment(trail: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_AUDIT_DIR", "trail-a")
    assert main(["report", "--format", "json", "-o", "r.json"]) == 0
    assert json.loads(Path("r.json").read_text())["verification"][0]["trail"] == "trail-a"


def test_durations_and_activity_stay_bounded() -> None:
    hist = DurationHistogram()
    for ms in range(1, 100_001):
        hist.add(ms)
    result = hist.result()
    assert result.count == 100_000
    assert result.min == 1
    assert result.max == 100_000
    assert result.p50 is not None
    assert abs(result.p50 - 50_000) <= 1_000
    assert result.p99 is not None
    assert abs(result.p99 - 99_000) <= 2_000
    assert len(hist.buckets) < 700


def test_a_long_period_widens_the_activity_buckets(tmp_path: Path) -> None:
    clock = FixedClock(START, timedelta(hours=3))
    directory = tmp_path / "long"
    with JsonlAuditTrail(directory, clock=clock) as sink:
        for i in range(400):
            sink.append("request.invalid", {"problems": [{"path": "$", "message": "x"}], "raw_sha256": "0" * 64,
                                            "raw_bytes": i})  # fmt: skip
    report = build_report([directory], now=NOW)
    assert len(report.activity) <= MAX_BUCKETS
    assert report.activity_bucket_s == 86400
    assert sum(b.invalid for b in report.activity) == 400 == report.totals.invalid


def test_refused_counts_every_refusal_a_summary_stands_for(tmp_path: Path) -> None:
    directory = tmp_path / "refused"
    with JsonlAuditTrail(directory, clock=FixedClock(START, timedelta(seconds=1))) as sink:
        sink.append("request.refused", {"count": 1, "summary": False, "code": "service.over_quota"}, principal="m")
        sink.append("request.refused", {"count": 41, "summary": True, "code": "service.over_quota"}, principal="m")
    assert build_report([directory], now=NOW).totals.refused == 42


def test_the_denied_list_is_capped_with_its_count(trail: Path) -> None:
    assert main(["report", "--trail", "trail-a", "--format", "md", "--max-denied", "1", "-o", "r.md"]) == 0
    text = Path("r.md").read_text()
    assert "The first 1 of 3 denied requests" in text


def test_rules_beyond_the_cap_are_counted_together_and_none_is_lost(
    trail: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PolicyReport summary tracks at most MAX_KEYS rules one by one; the results of the others count under
    ``(other)`` of their policy, so every status count still adds up."""
    full = build_report([trail], now=NOW, workers=1).policy_report
    monkeypatch.setattr(aggregate, "MAX_KEYS", 30)
    capped = build_report([trail], now=NOW, workers=1).policy_report
    assert len(full.results) > 30

    def per_status(results: tuple[PolicyReportResult, ...]) -> Counter[tuple[str, str]]:
        counted: Counter[tuple[str, str]] = Counter()
        for r in results:
            for status, n in r.counts:
                counted[(r.policy, status)] += n
        return counted

    assert per_status(capped.results) == per_status(full.results)
    tracked = [r for r in capped.results if r.rule != aggregate.OTHER]
    assert len(tracked) == 30
    assert {r.policy for r in capped.results if r.rule == aggregate.OTHER}  # the rest, under (other)
    by_rule = {(r.policy, r.rule): r for r in full.results}
    assert all(r == by_rule[(r.policy, r.rule)] for r in tracked)  # the tracked ones: exactly as without the cap


def test_a_missing_trail_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--trail", str(tmp_path / "nope"), "--format", "json"]) == 125
    assert "no audit trail directory" in capsys.readouterr().err


def test_copying_a_trail_keeps_its_id(trail: Path, tmp_path: Path) -> None:
    shutil.copytree(trail, tmp_path / "copy")
    a = build_report([trail], now=NOW).verification[0]
    b = build_report([tmp_path / "copy"], now=NOW).verification[0]
    assert a.trail_id == b.trail_id
    assert a.head == b.head


def test_worker_processes_give_the_same_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments aggregated in worker processes and merged make exactly the in-process report (merges do not
    depend on order), over several segments and two trails."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: the report never starts workers")
    monkeypatch.chdir(tmp_path)
    write_scenario(Path("a"), segment_max_bytes=30_000)
    write_scenario(Path("b"), start=START + timedelta(seconds=3), prefix=0xB, segment_max_bytes=30_000)
    _append_decision(Path("b"), "req-bad", decision_dict(privileged=True), START + timedelta(hours=1))
    assert len(list(Path("a").glob("trail-*.jsonl"))) >= 3
    serial = build_report([Path("a"), Path("b")], now=NOW, workers=1, denied_cap=4).to_dict()
    taken: list[int] = []
    pool = partial(CountingPool, taken)
    parallel = build_report([Path("a"), Path("b")], now=NOW, workers=2, denied_cap=4, worker_pool=pool).to_dict()
    assert taken == [1]  # the worker's share was merged: nothing was redone in process
    assert parallel == serial
    assert [d["time"] for d in serial["denied"]["shown"]] == sorted(d["time"] for d in serial["denied"]["shown"])
    assert serial["denied"]["total"] == 6
    assert len(serial["denied"]["shown"]) == 4


def test_a_report_read_by_worker_processes_shows_its_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a report read in several processes said nothing between "reading N segments" and its end (20 s
    for a million records); now this process's share of the records, read so far, with the workers named."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: the report never starts workers")
    trail = JsonlAuditTrail(tmp_path / "big", clock=FixedClock(START), host="report-test", segment_max_bytes=3 << 20)
    for n in range(15_000):
        trail.append("gateway.start", {"policy_source": f"p{n}"}, durable=False)
    trail.sync()
    trail.close()
    segments = sorted((tmp_path / "big").glob("trail-*.jsonl"))
    assert len(segments) >= 2
    assert all(len(p.read_bytes().splitlines()) > 4096 for p in segments[:-1])  # progress is told every 4096
    shown = io.StringIO()
    build_report([tmp_path / "big"], now=NOW, workers=2, progress=Progress(shown, enabled=True))
    lines = shown.getvalue().split("\r\x1b[K")
    assert any(
        re.fullmatch(r"report: [\d,]+ records read here \(\d+%\), 1 worker process\(es\) reading the rest", x)
        for x in lines
    ), lines
    assert re.fullmatch(r"report: [\d,]+ records read here, waiting for 1 worker process\(es\) \.\.\.", lines[-2])
    assert lines[-1] == ""  # cleared at the end


def test_each_image_names_the_sbom_recorded_for_exactly_its_id(trail: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.sbom import image_sbom, record_image_sbom, sbom_digest_for_image

    monkeypatch.setenv("GATEWAY_STATE_DIR", str(trail.resolve().parent / "state"))
    assert all(row["sbom_digest"] is None for row in build_report([trail], now=NOW).to_dict()["images"])
    image_id = "sha256:" + "a" * 64  # the scenario's image id
    status = b"Package: python3\nStatus: install ok installed\nArchitecture: amd64\nVersion: 3.11.2-1+b1\n\n"
    document = image_sbom(image="sandbox:1", image_id=image_id, created="2026-03-03T08:00:00Z", dpkg_status=status)
    record_image_sbom(image_id, document)
    digest = sbom_digest_for_image(image_id)
    assert digest is not None
    rows = {row["image_id"]: row for row in build_report([trail], now=NOW).to_dict()["images"]}
    assert rows[image_id]["sbom_digest"] == digest
    assert digest in render(build_report([trail], now=NOW), "md")


def test_the_report_package_reads_only_the_trail() -> None:
    """Reports are built from the audit trail alone: no decision engine, no policy loader, no runner."""
    import ast

    for path in (Path(__file__).resolve().parents[3] / "gateway" / "report").glob("*.py"):
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        bad = {m for m in imported if m.startswith(("gateway.decision", "gateway.policy", "gateway.runner", "docker"))}
        assert not bad, f"{path.name} imports {bad}"


def test_a_malformed_record_is_reported_alike_with_worker_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chained record whose decision does not have the view's shape stops the report with the error naming
    its seq, whichever process (this one or a worker) read its segment."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: the report never starts workers")
    monkeypatch.chdir(tmp_path)
    write_scenario(Path("a"), segment_max_bytes=30_000)
    bad = decision_dict()
    bad["allowed"] = "yes"
    _append_decision(Path("a"), "req-malformed", bad, START + timedelta(hours=1))
    errors = []
    for workers in (1, 2):
        with pytest.raises(AuditIntegrityError) as caught:
            build_report([Path("a")], now=NOW, workers=workers)
        errors.append(str(caught.value))
    assert errors[0] == errors[1]
    assert "$.data.decision.allowed: expected a boolean, got string 'yes'" in errors[0]


def test_a_worker_answer_that_does_not_load_is_redone_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's aggregate that cannot be unpickled here (say a worker that imported another version of the
    package during an upgrade) is not an error of the report: its share is redone in process, same report."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: the report never starts workers")
    monkeypatch.chdir(tmp_path)
    write_scenario(Path("a"), segment_max_bytes=30_000)
    serial = build_report([Path("a")], now=NOW, workers=1).to_dict()
    assert build_report([Path("a")], now=NOW, workers=2, worker_pool=_OtherVersionPool).to_dict() == serial


_T = TypeVar("_T")

_FROM_ANOTHER_VERSION = b"cgateway.report.aggregate\n_NotInThisVersion\n."
"""A pickle (protocol 0: ``GLOBAL``, ``STOP``) of a class this version of the package does not have."""


class _OtherVersionPool(WorkerPool):
    """Report workers that imported another version of the package: each answer names a class this one lacks."""

    def map(self, tasks: Iterable[bytes], decode: Callable[[bytes], _T]) -> Iterator[_T]:
        return super().map(tasks, lambda _answer: decode(_FROM_ANOTHER_VERSION))


def test_an_interrupted_run_counts_as_an_execution_and_error_but_not_as_a_duration(trail: Path) -> None:
    before = build_report([trail], now=NOW).to_dict()
    _append_decision(trail, "req-cut", decision_dict(), START + timedelta(hours=1))
    with JsonlAuditTrail(trail) as sink:
        assert len(mark_interrupted(sink, gone=lambda _host, _pid, _written: True)) == 1
    after = build_report([trail], now=NOW).to_dict()
    assert after["outcomes"]["executions"] == before["outcomes"]["executions"] + 1
    assert {"code": "gateway.interrupted", "count": 1} in after["outcomes"]["error_codes"]
    assert after["durations_ms"] == before["durations_ms"]  # how long it ran is unknown: not a 0 ms run


def test_egress_by_host_and_principal_and_denied_attempts_by_rule(egress_trail: Path) -> None:
    egress = build_report([egress_trail], now=NOW).to_dict()["egress"]
    totals = {k: egress[k] for k in ("runs", "connections", "denied", "bytes_out", "bytes_in", "records_dropped")}
    assert totals == {
        "runs": 1, "connections": 2, "denied": 4, "bytes_out": 607, "bytes_in": 24_576, "records_dropped": 0,
    }  # fmt: skip
    hosts = {h["name"]: (h["connections"], h["denied"], h["bytes_out"], h["bytes_in"]) for h in egress["hosts"]}
    assert hosts == {
        "mirror.internal": (2, 1, 607, 24_576),
        "pypi.org": (0, 1, 0, 0),
        "files.pythonhosted.org": (0, 1, 0, 0),
        "169.254.169.254": (0, 1, 0, 0),
    }
    assert egress["hosts"][0]["name"] == "mirror.internal"  # most connections first
    assert [(p["name"], p["connections"], p["denied"]) for p in egress["principals"]] == [("dave", 2, 4)]
    rules = {r["rule"]: r for r in egress["denied_rules"]}
    assert egress["denied_rules"][0]["rule"] == "network.egress.host"  # most denials first
    assert {rule: r["count"] for rule, r in rules.items()} == {
        "network.egress.host": 2, "network.egress.literal": 1, "network.egress.port": 1,
    }  # fmt: skip
    examples = rules["network.egress.host"]["examples"]
    assert [(x["host"], x["port"], x["principal"]) for x in examples] == [
        ("pypi.org", 443, "dave"), ("files.pythonhosted.org", 443, "dave"),
    ]  # fmt: skip
    lines = (egress_trail / "trail-000001.jsonl").read_text().splitlines()
    (run,) = [r for r in map(json.loads, lines) if r["event_type"] == "execution.outcome" and r["principal"] == "dave"]
    assert {x["request_id"] for x in examples} == {run["request_id"]}


def test_a_report_without_egress_says_so(trail: Path) -> None:
    report = build_report([trail], now=NOW)
    assert report.egress.runs == 0
    assert report.egress.hosts == report.egress.principals == report.egress.denied_rules == ()
    assert "No run with network egress in the period." in render(report, "md")
    assert "No run with network egress in the period." in render(report, "html")


def test_egress_merges_across_segments_and_trails_and_follows_the_filters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_scenario(Path("a"), scenario=EGRESS_SCENARIO, segment_max_bytes=20_000)
    write_scenario(Path("b"), start=START + timedelta(seconds=3), prefix=0xB, scenario=EGRESS_SCENARIO)
    assert len(list(Path("a").glob("trail-*.jsonl"))) >= 3
    serial = build_report([Path("a"), Path("b")], now=NOW, workers=1).egress
    if (os.cpu_count() or 1) >= 2:
        taken: list[int] = []
        pool = partial(CountingPool, taken)
        assert build_report([Path("a"), Path("b")], now=NOW, workers=2, worker_pool=pool).egress == serial
    assert (serial.runs, serial.connections, serial.denied) == (2, 4, 8)
    host = serial.denied_rules[0]
    assert (host.rule, host.count, len(host.examples)) == ("network.egress.host", 4, 3)  # the first three in time
    assert [x.host for x in host.examples] == ["pypi.org", "pypi.org", "files.pythonhosted.org"]
    filtered = build_report([Path("a")], now=NOW, filters=ReportFilters(principal="alice")).egress
    assert (filtered.runs, filtered.hosts, filtered.denied_rules) == (0, (), ())

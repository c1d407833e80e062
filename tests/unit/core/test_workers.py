"""Worker processes (parallel verify, report and OCSF export) run the caller's package, never one planted in
the current directory."""

from __future__ import annotations

import io
import os
from functools import partial
from pathlib import Path

import pytest

from gateway.audit import JsonlAuditTrail, verify_trail
from gateway.audit.ocsf_export import export_ocsf
from gateway.report.build import build_report
from tests.unit.workers_support import CountingPool


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``gateway`` package in the current directory that leaves a mark and dies when imported; returns the
    mark's path."""
    mark = tmp_path / "planted-code-ran"
    package = tmp_path / "cwd" / "gateway"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(mark)!r}, 'w').close()\nraise SystemExit(3)\n")
    monkeypatch.chdir(package.parent)
    cpus = os.cpu_count() or 1
    monkeypatch.setattr(os, "cpu_count", lambda: max(2, cpus))
    return mark


def _trail(directory: Path) -> Path:
    with JsonlAuditTrail(directory, segment_max_bytes=2600, host="h") as trail:
        for i in range(40):
            trail.append("policy.loaded", {"name": f"p{i}", "sha256": "a" * 64, "source": "x.yaml"}, request_id=f"r{i}")
    assert len(list(directory.glob("trail-*.jsonl"))) >= 6
    return directory


def test_verify_workers_do_not_import_a_package_from_the_current_directory(tmp_path: Path, planted: Path) -> None:
    trail = _trail(tmp_path / "audit")
    taken: list[int] = []
    report = verify_trail(trail, workers=2, worker_pool=partial(CountingPool, taken))
    assert (report.ok, report.records_checked) == (True, 40)
    assert not planted.exists()
    assert taken == [len(list(trail.glob("trail-*.jsonl")))]  # the workers verified every segment


def test_export_workers_do_not_import_a_package_from_the_current_directory(tmp_path: Path, planted: Path) -> None:
    trail = _trail(tmp_path / "audit")
    out = io.BytesIO()
    (report,) = export_ocsf([trail], out, workers=2)
    assert report.exported == 40
    assert not planted.exists()


def test_report_workers_do_not_import_a_package_from_the_current_directory(tmp_path: Path, planted: Path) -> None:
    trail = _trail(tmp_path / "audit")
    taken: list[int] = []
    report = build_report([trail], workers=2, worker_pool=partial(CountingPool, taken)).to_dict()
    assert taken == [1]  # the worker's share was merged: the report was not redone in process
    assert report["verification"][0]["records_checked"] == 40
    assert not planted.exists()

"""`gateway policy impact` replays a recorded request's packages: a candidate that drops a project shows whom rule
packages.allowed would deny."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.resources import policies_dir

MIRROR = policies_dir() / "examples" / "egress-mirror.yaml"


def test_impact_replays_a_requests_packages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trail = tmp_path / "trail"
    for principal, package in (("fetcher", "requests>=2"), ("resolver", "idna")):
        path = tmp_path / "request.json"
        path.write_text(json.dumps({"code": "x", "principal": principal, "packages": [package]}), encoding="utf-8")
        main(["check", "--policy", str(MIRROR), "--audit-dir", str(trail), str(path)])
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(
        f"apiVersion: gateway.agent-exec/v1\nkind: Policy\nextends: {MIRROR}\nmetadata: {{name: packages-mirror}}\n"
        "spec:\n  packages:\n    index: http://mirror.internal:18089/simple/\n    allow: [idna]\n",
        encoding="utf-8",
    )
    capsys.readouterr()
    assert main(["policy", "impact", str(candidate), "--audit-dir", str(trail), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(d["principal"], d["rules"], d["was_allowed"]) for d in report["denied"]] == [
        ("fetcher", ["packages.allowed"], True)
    ]

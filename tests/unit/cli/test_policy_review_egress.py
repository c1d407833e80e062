"""`gateway policy diff` and `impact` see egress: a host a change lets sandboxes reach, a request it would deny."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.resources import policies_dir

MIRROR = policies_dir() / "examples" / "egress-mirror.yaml"


def _candidate(tmp_path: Path, allow: str) -> Path:
    path = tmp_path / "candidate.yaml"
    path.write_text(
        # The mirror's egress without its package index (which must stay on the egress list): over default.yaml.
        f"apiVersion: gateway.agent-exec/v1\nkind: Policy\nextends: {policies_dir() / 'default.yaml'}\n"
        "metadata: {name: egress-mirror}\n"
        f"spec:\n  network:\n    egress:\n      allow:\n{allow}",
        encoding="utf-8",
    )
    return path


def test_diff_names_each_host_added_removed_or_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    candidate = _candidate(
        tmp_path,
        "        - {host: mirror.internal, ports: [18443], cidrs: [127.0.0.0/8]}\n        - {host: '*.PyPI.org'}\n",
    )
    capsys.readouterr()
    assert main(["policy", "diff", str(MIRROR), str(candidate), "--json"]) == 1
    egress = json.loads(capsys.readouterr().out)["egress"]
    assert egress == [
        {"host": "*.pypi.org", "change": "added", "new": {"ports": [443], "cidrs": []}},
        {
            "host": "mirror.internal",
            "change": "changed",
            "old": {"ports": [18089, 18443], "cidrs": ["127.0.0.0/8"]},
            "new": {"ports": [18443], "cidrs": ["127.0.0.0/8"]},
        },
    ]
    assert main(["policy", "diff", str(MIRROR), str(candidate)]) == 1
    text = capsys.readouterr().out
    assert "egress + *.pypi.org: ports 443 (added)\n" in text
    assert main(["policy", "diff", str(candidate), str(policies_dir() / "default.yaml")]) == 1
    assert "egress - mirror.internal: ports 18443 cidrs 127.0.0.0/8 (removed)\n" in capsys.readouterr().out


def test_impact_replays_a_requests_egress_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trail = tmp_path / "trail"
    for principal, port in (("fetcher", 18089), ("tls-only", 18443)):
        request = {"code": "x", "principal": principal, "network": "egress"}
        request["egress"] = [{"host": "mirror.internal", "ports": [port]}]
        path = tmp_path / "request.json"
        path.write_text(json.dumps(request), encoding="utf-8")
        main(["check", "--policy", str(MIRROR), "--audit-dir", str(trail), str(path)])
    candidate = _candidate(tmp_path, "        - {host: mirror.internal, ports: [18443], cidrs: [127.0.0.0/8]}\n")
    capsys.readouterr()
    assert main(["policy", "impact", str(candidate), "--audit-dir", str(trail), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["skipped"] == []
    assert [(d["principal"], d["rules"], d["was_allowed"]) for d in report["denied"]] == [
        ("fetcher", ["network.egress"], True)
    ]


def test_gateway_check_shows_the_egress_plan_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"code": "1", "network": "egress"}))
    policy = policies_dir() / "examples" / "egress-mirror.yaml"
    assert main(["check", str(request), "--policy", str(policy), "--audit-dir", str(tmp_path / "audit")]) == 0
    lines = capsys.readouterr().out.splitlines()
    [egress] = [line for line in lines if line.startswith("  egress: ")]
    shown = json.loads(egress.removeprefix("  egress: "))
    assert shown["destinations"] == [{"cidrs": ["127.0.0.0/8"], "host": "mirror.internal", "ports": [18089, 18443]}]
    assert "  mounts: []" in lines

"""The HTML report in a real browser: Debian's headless Chromium renders it to a screenshot and a PDF, and the
DOM it built holds the key figures. The file is self-contained: no script, no external reference."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.report import build_report, render
from tests.unit.report_support import EGRESS_SCENARIO, write_scenario

CHROMIUM = os.environ.get("GATEWAY_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = pytest.mark.slow


@pytest.fixture
def chromium(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[bytes]]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"CI requires {CHROMIUM} (scripts/setup.sh installs Debian's chromium)")
        pytest.skip(f"no browser at {CHROMIUM} (apt-get install chromium)")

    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
        return subprocess.run(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            timeout=120,
            check=False,
        )

    return run


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_html_renders_in_chromium_with_its_figures(
    tmp_path: Path, chromium: Callable[..., subprocess.CompletedProcess[bytes]]
) -> None:
    trail = write_scenario(tmp_path / "trail", scenario=EGRESS_SCENARIO)
    report = build_report([trail], now=datetime(2026, 3, 3, tzinfo=UTC))
    html = render(report, "html")
    assert "<script" not in html.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)  # nothing loads from anywhere
    page = tmp_path / "report.html"
    page.write_text(html)
    url = page.as_uri()

    shot = chromium(f"--screenshot={tmp_path / 'shot.png'}", "--window-size=1280,2000", url)
    assert shot.returncode == 0, shot.stderr[-2000:]
    width, height = _png_size((tmp_path / "shot.png").read_bytes())
    assert (width, height) == (1280, 2000)

    pdf = chromium(f"--print-to-pdf={tmp_path / 'report.pdf'}", "--no-pdf-header-footer", url)
    assert pdf.returncode == 0, pdf.stderr[-2000:]
    data = (tmp_path / "report.pdf").read_bytes()
    assert data.startswith(b"%PDF-")
    assert len(re.findall(rb"/Type\s*/Page\b", data)) >= 2  # the whole report, on A4 pages

    dom = chromium("--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom.stdout.decode("utf-8")))
    t = report.totals
    for figure_id, value in (("requests", t.requests), ("allowed", t.allowed), ("denied", t.denied)):
        assert f'id="total-{figure_id}">{value}<' in dom.stdout.decode("utf-8")
    assert "chain intact up to seq 47" in text  # the scenario's 37 records and the egress run's 10
    assert 'id="egress-denied">4<' in dom.stdout.decode("utf-8")
    assert "network.egress.host 2 pypi.org:443" in text
    assert "CIS-Docker-1.6.0-5.29 Ensure that the PIDs cgroup limit is used enforced" in text
    assert "images.allowlist" in text
    assert dom.stdout.decode("utf-8").count("<svg") == 3  # activity, outcomes, denials by rule
    assert shutil.which(CHROMIUM) or Path(CHROMIUM).exists()


def test_a_broken_report_opens_with_broken_in_the_browser(
    tmp_path: Path, chromium: Callable[..., subprocess.CompletedProcess[bytes]]
) -> None:
    trail = write_scenario(tmp_path / "trail")
    segment = trail / "trail-000001.jsonl"
    lines = segment.read_bytes().splitlines(keepends=True)
    lines[4] = lines[4].replace(b'"alice"', b'"eve"', 1)
    segment.write_bytes(b"".join(lines))
    page = tmp_path / "broken.html"
    page.write_text(render(build_report([trail]), "html"))
    dom = chromium("--dump-dom", page.as_uri()).stdout.decode("utf-8")
    first_heading = re.search(r"<h1[^>]*>(.*?)</h1>", dom)
    assert first_heading is not None
    assert first_heading.group(1) == f"BROKEN: {trail}: first break at seq 5 (modified)"

"""Suite-wide fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _isolated_audit_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own trail directory unless it names one: tests never write to the repo's audit/."""
    path = tmp_path_factory.mktemp("audit")
    monkeypatch.setenv("GATEWAY_AUDIT_DIR", str(path))
    return path

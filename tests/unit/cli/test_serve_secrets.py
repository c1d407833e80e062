"""``gateway serve`` reads the egress secrets once, at start: ``secrets_file`` (else ``GATEWAY_SECRETS_FILE``) under
the ``GATEWAY_SECRET_*`` variables; a secrets file others may read stops it from starting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.cli.serve_cmd import _docker_runner
from gateway.errors import ServerConfigError
from gateway.service.config import load_server_config_text

HEAD = "apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\n"


def _store_values(tmp_path: Path, text: str, mode: int = 0o600) -> dict[str, str]:
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text(text, encoding="utf-8")
    os.chmod(secrets, mode)
    config = load_server_config_text(f"{HEAD}secrets_file: secrets.yaml\n", base=tmp_path)
    assert config.secrets_file == secrets
    runner = _docker_runner(config)
    return dict(runner.keywords["secrets"].values)  # type: ignore[attr-defined]


def test_the_file_and_the_variables_are_read_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_SECRET_API_KEY", "from-env")
    values = _store_values(tmp_path, "mirror-token: from-file\napi-key: from-file\n")
    assert values["mirror-token"] == "from-file"
    assert values["api-key"] == "from-env"


def test_a_secrets_file_others_may_read_stops_the_service(tmp_path: Path) -> None:
    with pytest.raises(ServerConfigError, match="chmod 600"):
        _store_values(tmp_path, "mirror-token: x\n", mode=0o644)


def test_without_the_key_the_environment_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = tmp_path / "elsewhere.json"
    secrets.write_text('{"mirror-token": "from-json"}', encoding="utf-8")
    os.chmod(secrets, 0o600)
    monkeypatch.setenv("GATEWAY_SECRETS_FILE", str(secrets))
    config = load_server_config_text(HEAD, base=tmp_path)
    assert config.secrets_file is None
    assert _docker_runner(config).keywords["secrets"].value("mirror-token") == "from-json"  # type: ignore[attr-defined]

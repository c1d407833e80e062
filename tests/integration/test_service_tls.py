"""``gateway serve --tls-cert/--tls-key``: HTTPS on a real server with certificates made by trustme."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from servers import one_principal, start

from gateway.cli import main
from gateway.cli.serve_cmd import tls_args
from gateway.errors import ServerConfigError
from gateway.service.config import ServerConfig, load_server_config_text

pytestmark = pytest.mark.usefixtures("engine")


@pytest.fixture
def tls_server(tmp_path: Path, engine: Any) -> Iterator[tuple[int, str, trustme.CA]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    principals, token = one_principal(tmp_path)
    config = ServerConfig(principals=principals, audit_dir=tmp_path / "audit", tls_cert=cert_file, tls_key=key_file)
    port, _service, stop = start(config, **tls_args(config))
    try:
        yield port, token, ca
    finally:
        stop()


def test_https_with_the_ca_trusted_succeeds(tls_server: tuple[int, str, trustme.CA]) -> None:
    port, token, ca = tls_server
    context = ssl.create_default_context()
    ca.configure_trust(context)
    with httpx.Client(verify=context, timeout=30) as client:
        response = client.get(f"https://127.0.0.1:{port}/v1/policy", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    assert response.json()["principal"] == "alice"


def test_plain_http_to_the_tls_port_fails(tls_server: tuple[int, str, trustme.CA]) -> None:
    port, _token, _ca = tls_server
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)


def test_a_client_that_does_not_trust_the_ca_fails(tls_server: tuple[int, str, trustme.CA]) -> None:
    port, _token, _ca = tls_server
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"https://127.0.0.1:{port}/healthz", timeout=10)


@pytest.mark.parametrize(("given", "missing"), [("tls_cert", "tls_key"), ("tls_key", "tls_cert")])
def test_a_cert_without_a_key_and_vice_versa_is_refused(tmp_path: Path, given: str, missing: str) -> None:
    with pytest.raises(ServerConfigError, match=f"{given} is set but {missing} is not"):
        ServerConfig(**{given: tmp_path / "x.pem"})
    with pytest.raises(ServerConfigError) as raised:
        load_server_config_text(f"apiVersion: gateway.agent-exec/v1\nkind: ServerConfig\n{given}: x.pem\n")
    assert [str(p) for p in raised.value.problems] == [f"<string>:1: $: '{missing}' is a dependency of '{given}'"]


def test_the_cli_refuses_a_cert_without_a_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["serve", "--principals", str(tmp_path / "p.yaml"), "--tls-cert", str(tmp_path / "c.pem")])
    assert status != 0
    assert "tls_cert is set but tls_key is not" in capsys.readouterr().err

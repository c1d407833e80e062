"""The gateway's secret values: GATEWAY_SECRET_<NAME> variables over a 0600 secrets file; never shown."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.egress.proxy import EgressLimits, EgressPlan
from gateway.egress.secrets import Injection, SecretRule, SecretStore, SecretStoreError, injections, secret_variable
from gateway.errors import SandboxError
from gateway.runner.docker.egress import bind_secrets

VALUE = "s3cr3t-value-0123456789"


def secrets_file(tmp_path: Path, text: str, name: str = "secrets.yaml", mode: int = 0o600) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    os.chmod(path, mode)
    return str(path)


def test_a_name_and_its_variable() -> None:
    assert secret_variable("mirror-token") == "GATEWAY_SECRET_MIRROR_TOKEN"
    store = SecretStore.load({"GATEWAY_SECRET_MIRROR_TOKEN": VALUE, "GATEWAY_SECRET_": "x", "OTHER": "y"})
    assert store.value("mirror-token") == VALUE
    assert store.values == {"mirror-token": VALUE}
    assert store.value("other") is None


def test_a_variable_overrides_the_file_and_an_empty_value_is_no_value(tmp_path: Path) -> None:
    path = secrets_file(tmp_path, "mirror-token: from-file\napi-key: key-from-file\n")
    store = SecretStore.load({"GATEWAY_SECRET_API_KEY": "from-env", "GATEWAY_SECRET_EMPTY": ""}, path)
    assert store.value("mirror-token") == "from-file"
    assert store.value("api-key") == "from-env"
    assert store.value("empty") is None
    json_path = secrets_file(tmp_path, '{"mirror-token": "from-json"}', "secrets.json")
    assert SecretStore.load({}, json_path).value("mirror-token") == "from-json"


def test_a_store_never_shows_a_value(tmp_path: Path) -> None:
    store = SecretStore.load({"GATEWAY_SECRET_MIRROR_TOKEN": VALUE})
    assert VALUE not in repr(store)
    assert VALUE not in store.missing("mirror-token")


@pytest.mark.parametrize(
    ("text", "mode", "found"),
    [
        ("mirror-token: x\n", 0o640, "chmod 600"),
        ("mirror-token: x\n", 0o604, "chmod 600"),
        ("- a\n- b\n", 0o600, "must be a mapping"),
        ("Mirror_Token: x\n", 0o600, "lower-case name"),
        ("mirror-token: 3\n", 0o600, "lower-case name"),
        ("mirror-token: [\n", 0o600, "not valid JSON or YAML"),
    ],
)
def test_a_secrets_file_others_can_read_or_of_the_wrong_shape_is_refused(
    tmp_path: Path, text: str, mode: int, found: str
) -> None:
    path = secrets_file(tmp_path, text, mode=mode)
    with pytest.raises(SecretStoreError, match=found):
        SecretStore.load({}, path)


def test_a_missing_or_linked_secrets_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SecretStoreError, match="cannot open"):
        SecretStore.load({}, str(tmp_path / "absent.yaml"))
    target = secrets_file(tmp_path, "mirror-token: x\n")
    (tmp_path / "link.yaml").symlink_to(target)
    with pytest.raises(SecretStoreError, match="cannot open"):
        SecretStore.load({}, str(tmp_path / "link.yaml"))


def test_a_rule_fills_its_template() -> None:
    assert SecretRule("t", ("h",)).header_value(VALUE) == f"Bearer {VALUE}"
    assert SecretRule("t", ("h",), "X-Api-Key", "{secret}").header_value(VALUE) == VALUE
    assert SecretRule("t", ("h",), principals=("a",)).applies_to("a")
    assert not SecretRule("t", ("h",), principals=("a",)).applies_to("b")
    assert not SecretRule("t", ("h",), principals=("a",)).applies_to(None)
    assert SecretRule("t", ("h",)).applies_to(None)


def test_a_run_whose_secret_has_no_usable_value_is_refused_before_any_container() -> None:
    plan = EgressPlan((), EgressLimits(), (SecretRule("mirror-token", ("mirror.internal",)),))
    bound = bind_secrets(plan, SecretStore.load({"GATEWAY_SECRET_MIRROR_TOKEN": VALUE}))
    assert bound.values == {"mirror-token": VALUE}
    assert VALUE not in repr(bound)
    assert injections(bound.secrets, bound.values) == {
        "mirror.internal": Injection("mirror-token", "Authorization", f"Bearer {VALUE}")
    }
    with pytest.raises(SandboxError, match="GATEWAY_SECRET_MIRROR_TOKEN") as caught:
        bind_secrets(plan, SecretStore.load({"GATEWAY_SECRET_OTHER": VALUE}))
    assert "nothing ran" in str(caught.value)
    for bad in ("line\r\nX-Evil: 1", "caf\u00e9", "nul\x00"):
        with pytest.raises(SandboxError, match="control or non-ASCII") as caught:
            bind_secrets(plan, SecretStore.load({"GATEWAY_SECRET_MIRROR_TOKEN": bad}))
        assert bad not in str(caught.value)
    with pytest.raises(KeyError):
        injections(plan.secrets, {})

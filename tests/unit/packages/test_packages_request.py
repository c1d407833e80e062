"""A request's packages: parsed as given, judged by the packages rules, recorded in the plan; until the install
phase runs them, an allowed request with packages fails closed before any sandbox exists."""

from __future__ import annotations

import pytest

from gateway.errors import PackageInstallError, RequestError
from gateway.policy import load_policy
from gateway.request import parse_request
from gateway.resources import policies_dir
from gateway.runner import FakeRunner
from gateway.testing import capture_audit, decide

POLICY = load_policy(policies_dir() / "examples" / "egress-mirror.yaml")


def test_packages_are_kept_as_given_and_round_trip() -> None:
    request = parse_request({"code": "x", "packages": ["Requests>=2", "idna"]})
    assert request.packages == ("Requests>=2", "idna")
    assert parse_request(request.to_dict()) == request
    assert "packages" not in parse_request({"code": "x"}).to_dict()


@pytest.mark.parametrize(
    "packages",
    [[], ["x"] * 65, ["a" * 201], ["idna\n"], ["idn\u00e1"], [""]],
    ids=["empty", "too-many", "too-long", "line-break", "non-ascii", "empty-string"],
)
def test_a_malformed_packages_list_is_an_invalid_request(packages: list[str]) -> None:
    with pytest.raises(RequestError):
        parse_request({"code": "x", "packages": packages})


def test_the_plan_records_the_normalised_requirements_sorted() -> None:
    decision = decide(POLICY, parse_request({"code": "x", "packages": ["Requests[Socks] >=2", "IDNA"]}))
    assert decision.allowed
    assert decision.to_dict()["plan"]["packages"] == {
        "index": "http://mirror.internal:18089/simple/",
        "requirements": ["idna", "requests[socks]>=2"],
        "binary_only": True,
    }
    assert "packages" not in decide(POLICY, parse_request({"code": "x"})).to_dict()["plan"]


def test_an_allowed_request_with_packages_fails_closed_without_an_installer() -> None:
    runner = FakeRunner()
    with capture_audit(POLICY, runner) as (gateway, sink):
        result = gateway.execute({"code": "print(1)", "packages": ["idna"]})
    assert result.decision is not None
    assert result.decision.allowed
    assert isinstance(result.error, PackageInstallError)
    assert not result.ran
    assert runner.calls == []
    [outcome] = [r for r in sink.records if r["event_type"] == "execution.outcome"]
    assert outcome["data"]["error"]["code"] == "packages.install_failed"


@pytest.mark.parametrize(
    "mount",
    [{"source": "/srv/data", "target": "/d", "mode": "exec"}, {"source": "/srv/data", "target": "/d", "exec": True}],
)
def test_a_request_cannot_ask_for_exec_on_its_mounts(mount: dict[str, object]) -> None:
    # Exec is the packages tree's alone (HostMount.exec, set by the installer): a request's mount is noexec.
    with pytest.raises(RequestError):
        parse_request({"code": "x", "mounts": [mount]})

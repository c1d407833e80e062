"""`gateway run`'s request flags that have no field of their own elsewhere: ``--package`` and ``--egress``."""

from __future__ import annotations

import argparse

import pytest

from gateway.cli.run_cmd import build_request, register
from gateway.errors import RequestError
from gateway.request import parse_request


def test_run_flags_ask_for_packages_and_narrow_egress() -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        ["run", "--code", "x", "--network", "egress", "--package", "requests>=2", "--package", "idna",
         "--egress", "mirror.internal:18089,18443", "--egress", "pypi.org", "--egress", "[2001:db8::1]:443"]
    )  # fmt: skip
    request = build_request(args)
    assert request["packages"] == ["requests>=2", "idna"]
    assert request["egress"] == [
        {"host": "mirror.internal", "ports": [18089, 18443]},
        {"host": "pypi.org"},
        {"host": "2001:db8::1", "ports": [443]},
    ]
    assert parse_request(request).packages is not None


@pytest.mark.parametrize("bad", ["mirror.internal:https", ":443", "[2001:db8::1", "[::1]x"])
def test_a_malformed_egress_flag_names_itself(bad: str) -> None:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    with pytest.raises(RequestError, match="--egress"):
        build_request(parser.parse_args(["run", "--code", "x", "--egress", bad]))

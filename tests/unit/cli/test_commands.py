"""The command table: every sub-command is in it, and a command line imports only its command's module."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from gateway.cli import COMMANDS, build_parser, main


def _choices(parser: argparse.ArgumentParser) -> list[str]:
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def test_the_table_names_every_command_the_parser_has_in_order() -> None:
    assert _choices(build_parser()) == list(COMMANDS)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_alone_parses_its_own_command_line(command: str) -> None:
    assert command in _choices(build_parser(command))


def test_an_unknown_or_missing_command_is_a_usage_error_listing_every_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["reprot"]) == 2
    assert "invalid choice: 'reprot'" in capsys.readouterr().err
    assert main([]) == 2
    assert main(["--help"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in COMMANDS)


def test_the_report_command_does_not_import_docker_the_policy_loader_or_the_service() -> None:
    probe = (
        "import sys; from gateway.cli import main; main(['report', '--help']); "
        "print(sorted(m for m in ('docker', 'jsonschema', 'gateway.policy.loader', 'gateway.service.app', "
        "'gateway._gateway') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"

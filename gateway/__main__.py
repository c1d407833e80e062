"""``python -m gateway``: the ``gateway`` command (gateway.cli.console_main)."""

from gateway.cli import console_main

console_main()

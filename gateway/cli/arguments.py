"""Argument types shared by the commands: a bad value is a usage error (exit 2) naming its flag."""

from __future__ import annotations

import argparse

from gateway.audit.query import parse_time
from gateway.errors import AuditError

__all__ = ["time_argument"]


def time_argument(value: str) -> str:
    """An RFC 3339 time or a date (``--since``, ``--until``), as the trail's timestamp text."""
    try:
        return parse_time(value)
    except AuditError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (e.g. 2026-12-01T09:30:00Z, or a date: 2026-12-01)") from None

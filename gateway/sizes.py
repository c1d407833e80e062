"""Byte sizes as people write them in policies and requests: ``256m``, ``1g``, ``64k``, ``1048576``.

Accepted forms (case-insensitive, no spaces, no fractions, no sign):

* a non-negative integer (JSON/YAML number, or a string of digits): bytes;
* digits followed by a unit: ``b``; ``k``/``kb``/``kib``; ``m``/``mb``/``mib``; ``g``/``gb``/``gib``;
  ``t``/``tb``/``tib``.

Every unit is binary (``1k`` = 1024 bytes, ``1mb`` = ``1m`` = 1 MiB), exactly as ``docker run --memory``
reads them, so a value copied from a ``docker`` command means the same thing here. Anything else is an error
naming the accepted forms; a size never silently becomes zero or "unlimited".
"""

from __future__ import annotations

import re

__all__ = ["ACCEPTED_FORMS", "MAX_SIZE", "SizeError", "format_size", "parse_size"]

MAX_SIZE = 2**63 - 1
"""The engine stores sizes as signed 64-bit integers; anything larger is refused, not wrapped."""

ACCEPTED_FORMS = "an integer number of bytes, or digits with a unit b, k, m, g, t (optionally kb/kib, ...), e.g. 256m"

_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
_SIZE_RE = re.compile(r"([0-9]{1,20})(?:([kmgt])(?:i?b)?|(b))?", re.IGNORECASE)


class SizeError(ValueError):
    """A size string or number that is not one of the accepted forms."""


def parse_size(value: object) -> int:
    """Return the number of bytes ``value`` stands for, or raise :class:`SizeError` saying why not."""
    if isinstance(value, bool):
        raise SizeError(f"{value!r} is not a size; expected {ACCEPTED_FORMS}")
    if isinstance(value, int):
        if value < 0:
            raise SizeError(f"{value} is negative; expected {ACCEPTED_FORMS}")
        if value > MAX_SIZE:
            raise SizeError(f"{value} is larger than the engine's maximum {MAX_SIZE}")
        return value
    if not isinstance(value, str):
        raise SizeError(f"{value!r} is not a size; expected {ACCEPTED_FORMS}")
    match = _SIZE_RE.fullmatch(value)
    if match is None:
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise SizeError(f"{shown!r} is not a size; expected {ACCEPTED_FORMS}")
    digits, unit, plain_b = match.groups()
    multiplier = _UNITS[(unit or plain_b or "").lower()]
    result = int(digits) * multiplier
    if result > MAX_SIZE:
        raise SizeError(f"{value!r} is larger than the engine's maximum {MAX_SIZE} bytes")
    return result


def format_size(n: int) -> str:
    """The shortest exact unit form of ``n`` bytes (``268435456`` -> ``256m``), for messages."""
    for unit, factor in (("t", 1024**4), ("g", 1024**3), ("m", 1024**2), ("k", 1024)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)

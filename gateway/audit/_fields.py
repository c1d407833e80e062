"""Typed reads from a parsed audit record, each failure naming the record's ``seq`` and the field's path.

The reading half of :mod:`gateway.audit.records`: a :class:`FieldReader` checks the JSON type of each field
a view reads and raises :class:`~gateway.errors.AuditIntegrityError` on the first one that is missing or
wrong, so that every view reports malformed records the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from gateway.audit.pipeline import json_path
from gateway.errors import AuditIntegrityError

__all__ = ["FieldReader", "describe"]

_HINT: Final = (
    "the record does not have the shape of schemas/audit-record.schema.json; "
    "run `gateway audit verify` to check that the trail is the one that was written"
)
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")
_is_hex64 = _HEX64.match
_ABSENT: Final = object()


def describe(value: object) -> str:
    """JSON name of a value's type, with a short repr of scalars (``string 'yes'``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {value!r}"
    if isinstance(value, int):
        return f"integer {value!r}"
    if isinstance(value, float):
        return f"number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {shown!r}"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class FieldReader:
    """Typed reads from one record; every failure names the record's ``seq`` and the field's JSON path.

    Each method reads ``obj[key]`` (``base`` is the JSON path of ``obj``) and returns it with its type
    checked; the ``_or_none`` forms also accept null and read a missing key as ``None`` unless ``required``.
    The checks are written out per type, not through a generic predicate: a query may view every record of
    a trail, so a read costs about what ``json.loads`` spent on the field.
    """

    __slots__ = ("record",)

    def __init__(self, record: Mapping[str, Any]) -> None:
        self.record: Final = record
        """The record read (its own dict, not a proxy): its ``seq`` names it in errors, and a view's properties
        read their fields from it."""

    def error(self, path: str, problem: str) -> AuditIntegrityError:
        seq = self.record.get("seq")
        label = f"seq {seq}" if _is_int(seq) else "with no valid seq"
        return AuditIntegrityError(f"audit record {label}: {path}: {problem}", hint=_HINT)

    def _wrong(self, obj: Mapping[str, Any], key: str, base: str, expected: str) -> AuditIntegrityError:
        if key not in obj:
            return self.error(json_path(base, key), "missing")
        return self.error(json_path(base, key), f"expected {expected}, got {describe(obj[key])}")

    def _absent(self, obj: Mapping[str, Any], key: str, base: str, required: bool) -> None:
        """``None`` was read: fine for null, or for a missing key unless ``required``."""
        if required and key not in obj:
            raise self._wrong(obj, key, base, "")

    def text(self, obj: Mapping[str, Any], key: str, base: str) -> str:
        value = obj.get(key)
        if isinstance(value, str):
            return value
        raise self._wrong(obj, key, base, "a string")

    def text_or_none(self, obj: Mapping[str, Any], key: str, base: str, *, required: bool = False) -> str | None:
        value = obj.get(key)
        if value is None:
            self._absent(obj, key, base, required)
            return None
        if isinstance(value, str):
            return value
        raise self._wrong(obj, key, base, "a string or null")

    def choice(self, obj: Mapping[str, Any], key: str, base: str, choices: frozenset[str]) -> str:
        value = obj.get(key)
        if isinstance(value, str) and value in choices:
            return value
        raise self._wrong(obj, key, base, "one of " + ", ".join(sorted(choices)))

    def choice_or_none(self, obj: Mapping[str, Any], key: str, base: str, choices: frozenset[str]) -> str | None:
        """One of ``choices``, or ``None`` for null or a missing key."""
        value = obj.get(key)
        if value is None:
            return None
        if isinstance(value, str) and value in choices:
            return value
        raise self._wrong(obj, key, base, "one of " + ", ".join(sorted(choices)) + " or null")

    def digest(self, obj: Mapping[str, Any], key: str, base: str) -> str:
        value = obj.get(key)
        if isinstance(value, str) and _is_hex64(value) is not None:
            return value
        raise self._wrong(obj, key, base, "64 lowercase hex digits")

    def digest_or_none(self, obj: Mapping[str, Any], key: str, base: str) -> str | None:
        value = obj.get(key)
        if value is None:
            return None
        if isinstance(value, str) and _is_hex64(value) is not None:
            return value
        raise self._wrong(obj, key, base, "64 lowercase hex digits or null")

    def integer(self, obj: Mapping[str, Any], key: str, base: str, *, minimum: int = 0) -> int:
        value = obj.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
            return value
        raise self._wrong(obj, key, base, f"an integer >= {minimum}")

    def integer_or_none(self, obj: Mapping[str, Any], key: str, base: str, *, required: bool = False) -> int | None:
        value = obj.get(key)
        if value is None:
            self._absent(obj, key, base, required)
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise self._wrong(obj, key, base, "an integer or null")

    def flag(self, obj: Mapping[str, Any], key: str, base: str, *, default: bool | None = None) -> bool:
        """A boolean; a missing key reads as ``default``, or is an error when there is none."""
        value = obj.get(key)
        if isinstance(value, bool):
            return value
        if default is not None and key not in obj:
            return default
        raise self._wrong(obj, key, base, "a boolean")

    def object(self, obj: Mapping[str, Any], key: str, base: str) -> Mapping[str, Any]:
        """An object itself, for the reads that build a view (a proxy's reads cost more than a dict's); what
        the view exposes is a :meth:`mapping`."""
        value = obj.get(key)
        if type(value) is dict or isinstance(value, Mapping):  # parsed JSON: a dict, without the ABC check
            return value
        raise self._wrong(obj, key, base, "an object")

    def mapping(self, obj: Mapping[str, Any], key: str, base: str) -> Mapping[str, Any]:
        """A read-only proxy of an object (never a copy)."""
        return MappingProxyType(self.object(obj, key, base))

    def mapping_or_none(
        self, obj: Mapping[str, Any], key: str, base: str, *, required: bool = False
    ) -> Mapping[str, Any] | None:
        """A read-only proxy of an object, or ``None``."""
        value = obj.get(key)
        if value is None:
            self._absent(obj, key, base, required)
            return None
        if type(value) is dict or isinstance(value, Mapping):
            return MappingProxyType(value)
        raise self._wrong(obj, key, base, "an object or null")

    def _array(self, obj: Mapping[str, Any], key: str, base: str, required: bool) -> list[Any]:
        value = obj.get(key, _ABSENT)
        if isinstance(value, list):
            return value
        if value is _ABSENT and not required:
            return []
        raise self._wrong(obj, key, base, "an array")

    def objects(
        self, obj: Mapping[str, Any], key: str, base: str, *, required: bool = False
    ) -> list[tuple[str, Mapping[str, Any]]]:
        """``(path, item)`` for each item of an array of objects; a missing key reads as no items."""
        items = self._array(obj, key, base, required)
        if not items:
            return []
        where = json_path(base, key)
        out: list[tuple[str, Mapping[str, Any]]] = []
        for index, item in enumerate(items):
            at = f"{where}[{index}]"  # json_path(where, index), inlined: one per item of every decision
            if type(item) is not dict and not isinstance(item, Mapping):
                raise self.error(at, f"expected an object, got {describe(item)}")
            out.append((at, item))
        return out

    def texts(self, obj: Mapping[str, Any], key: str, base: str, *, required: bool = False) -> tuple[str, ...]:
        """The items of an array of strings; a missing key reads as no items unless ``required``."""
        items = self._array(obj, key, base, required)
        if not items:  # most records redact nothing
            return ()
        for index, item in enumerate(items):
            if not isinstance(item, str):
                raise self.error(json_path(json_path(base, key), index), f"expected a string, got {describe(item)}")
        return tuple(items)

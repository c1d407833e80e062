"""Execution requests: parse and validate untrusted input into a frozen :class:`ExecutionRequest`.

Input may be a mapping (already parsed), a JSON string, or raw bytes. Bytes are capped *before* decoding,
JSON is parsed with duplicate keys and NaN refused, nesting depth is checked iteratively (no
``RecursionError`` can escape), and the document is validated against ``schemas/request.schema.json``.

Validation runs a hand-written checker compiled from the schema's own patterns (jsonschema costs about
200 microseconds per request, the whole decision budget). A request it accepts is accepted; a request it
rejects is re-validated by the real Draft 2020-12 validator so the caller gets every problem with the
schema's own wording and JSON path. ``tests/unit/test_request_schema_parity.py`` checks, with hypothesis,
that the two agree on what is valid.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any, NamedTuple

from jsonschema import Draft202012Validator

from gateway.errors import Problem, RequestError
from gateway.policy.sizes import MAX_SIZE, SizeError, parse_size
from gateway.resources import load_schema
from gateway.validation import problems_from_error

__all__ = [
    "MAX_DEPTH",
    "MAX_REQUEST_BYTES",
    "ExecutionRequest",
    "MountRequest",
    "RequestLimits",
    "fast_problems",
    "parse_request",
    "schema_problems",
]

MAX_REQUEST_BYTES = 8 * 1024 * 1024
"""Requests larger than this are refused before they are decoded or parsed."""
MAX_DEPTH = 32
"""Maximum nesting of objects/arrays anywhere in a request (``metadata`` is free-form)."""

_SIZE_FIELDS = ("memory", "output_bytes", "output_files_bytes", "tmpfs")
_TOP_FIELDS = frozenset(
    ("code", "language", "image", "limits", "network", "runtime", "mounts", "files", "env", "principal", "metadata")
)
_LIMIT_FIELDS = frozenset(("memory", "cpus", "pids", "timeout_s", "output_bytes", "output_files_bytes", "tmpfs"))
_MOUNT_FIELDS = frozenset(("source", "target", "mode"))


def _utf8_len(text: str) -> int:
    """``len(text.encode("utf-8", "surrogatepass"))`` without encoding ASCII text (its length is its size)."""
    if type(text) is str and text.isascii():
        return len(text)
    return len(text.encode("utf-8", "surrogatepass"))


class MountRequest(NamedTuple):
    source: str
    """Absolute host path as the caller wrote it (canonicalised later, by the policy engine)."""
    target: str
    mode: str = "ro"


class RequestLimits(NamedTuple):
    """Limits the caller asked for; ``None`` means "the policy default". (A NamedTuple: immutable, cheap.)"""

    memory: int | None = None
    cpus: float | None = None
    pids: int | None = None
    timeout_s: float | None = None
    output_bytes: int | None = None
    output_files_bytes: int | None = None
    tmpfs: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("memory", "cpus", "pids", "timeout_s", "output_bytes", "output_files_bytes", "tmpfs"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


@dataclass(frozen=True, slots=True)
class ExecutionRequest:
    """A validated request. Sizes are bytes; omitted fields are ``None`` (or empty) and get policy defaults."""

    code: str
    language: str | None = None
    image: str | None = None
    limits: RequestLimits = field(default_factory=RequestLimits)
    network: str | None = None
    runtime: str | None = None
    mounts: tuple[MountRequest, ...] = ()
    files: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    principal: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def code_bytes(self) -> int:
        return _utf8_len(self.code)

    @property
    def files_bytes(self) -> int:
        return sum(map(_utf8_len, self.files.values())) if self.files else 0

    def to_dict(self) -> dict[str, Any]:
        """The request as JSON data (sizes in bytes), suitable for the audit trail and re-parsing."""
        out: dict[str, Any] = {"code": self.code}
        for name in ("language", "image", "network", "runtime", "principal"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        limits = self.limits.to_dict()
        if limits:
            out["limits"] = limits
        if self.mounts:
            out["mounts"] = [{"source": m.source, "target": m.target, "mode": m.mode} for m in self.mounts]
        if self.files:
            out["files"] = dict(self.files)
        if self.env:
            out["env"] = dict(self.env)
        if self.metadata:
            out["metadata"] = json.loads(json.dumps(dict(self.metadata)))
        return out


# --- validation -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Compiled:
    validator: Draft202012Validator
    language: re.Pattern[str]
    image: re.Pattern[str]
    network: re.Pattern[str]
    runtime: re.Pattern[str]
    principal: re.Pattern[str]
    env_name: re.Pattern[str]
    size: re.Pattern[str]
    mount_path: re.Pattern[str]
    strings: tuple[tuple[str, re.Pattern[str], int | None], ...]
    """The top-level string fields: name, pattern, maximum length (None: the pattern bounds it)."""


@cache
def _compiled() -> _Compiled:
    schema = load_schema("request")
    props = schema["properties"]
    language = re.compile(props["language"]["pattern"])
    image = re.compile(props["image"]["pattern"])
    network = re.compile(props["network"]["pattern"])
    runtime = re.compile(props["runtime"]["pattern"])
    principal = re.compile(props["principal"]["pattern"])
    return _Compiled(
        validator=Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER),
        language=language,
        image=image,
        network=network,
        runtime=runtime,
        principal=principal,
        env_name=re.compile(props["env"]["propertyNames"]["pattern"]),
        size=re.compile(schema["$defs"]["size"]["pattern"]),
        mount_path=re.compile(props["mounts"]["items"]["properties"]["source"]["pattern"]),
        strings=(
            ("language", language, None),
            ("image", image, 512),
            ("network", network, None),
            ("runtime", runtime, None),
            ("principal", principal, None),
        ),
    )


def _is_int(value: Any) -> bool:
    # JSON Schema's "integer" includes 2.0; bool is never a number.
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, float) and value.is_integer()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def fast_problems(doc: Any) -> list[Problem]:
    """The hand-written schema check. Empty list means the schema accepts ``doc``.

    The messages are short; when this finds anything, :func:`parse_request` reports the real validator's
    errors instead.
    """
    c = _compiled()
    out: list[Problem] = []

    def bad(path: str, message: str) -> None:
        out.append(Problem(message, path=path))

    if not isinstance(doc, dict):
        bad("$", "a request must be a JSON object")
        return out
    if not _TOP_FIELDS.issuperset(doc):
        for key in doc:
            if key not in _TOP_FIELDS:
                bad("$", f"unknown field {key!r}")
    code = doc.get("code")
    if not isinstance(code, str) or not code:
        bad("$.code", "code is required and must be a non-empty string")
    for name, pattern, max_len in c.strings:
        if name in doc:
            value = doc[name]
            if not isinstance(value, str) or pattern.search(value) is None:
                bad(f"$.{name}", "invalid")
            elif max_len is not None and len(value) > max_len:
                bad(f"$.{name}", "too long")
    if "limits" in doc:
        limits = doc["limits"]
        if not isinstance(limits, dict):
            bad("$.limits", "must be an object")
        else:
            for key, value in limits.items():
                kind = type(value)
                if key not in _LIMIT_FIELDS:
                    bad("$.limits", f"unknown field {key!r}")
                elif key in _SIZE_FIELDS:
                    if kind is int or (kind is not bool and _is_int(value)):
                        if value < 0:
                            bad(f"$.limits.{key}", "negative")
                    elif not isinstance(value, str) or c.size.search(value) is None:
                        bad(f"$.limits.{key}", "not a size")
                elif key == "pids":
                    if not (kind is int or _is_int(value)) or not 1 <= value <= 1_000_000:
                        bad(f"$.limits.{key}", "invalid")
                elif key == "cpus":
                    if not (kind is float or kind is int or _is_number(value)) or not 0 < value <= 1024:
                        bad(f"$.limits.{key}", "invalid")
                elif not (kind is int or kind is float or _is_number(value)) or not 0 < value <= 86400:  # timeout_s
                    bad(f"$.limits.{key}", "invalid")
    if "mounts" in doc:
        mounts = doc["mounts"]
        if not isinstance(mounts, list) or len(mounts) > 32:
            bad("$.mounts", "must be an array of at most 32 mounts")
        else:
            for index, mount in enumerate(mounts):
                path = f"$.mounts[{index}]"
                if not isinstance(mount, dict) or "source" not in mount or "target" not in mount:
                    bad(path, "must be an object with source and target")
                    continue
                for key, value in mount.items():
                    if key not in _MOUNT_FIELDS:
                        bad(path, f"unknown field {key!r}")
                    elif key == "mode":
                        if value not in ("ro", "rw") or not isinstance(value, str):
                            bad(f"{path}.mode", "must be ro or rw")
                    elif not isinstance(value, str) or len(value) > 4096 or c.mount_path.search(value) is None:
                        bad(f"{path}.{key}", "must be an absolute path")
    if "files" in doc:
        files = doc["files"]
        if not isinstance(files, dict) or len(files) > 10000:
            bad("$.files", "must be an object")
        else:
            for key, value in files.items():
                if not 1 <= len(key) <= 4096 or not isinstance(value, str):
                    bad("$.files", "bad file entry")
    if "env" in doc:
        env = doc["env"]
        if not isinstance(env, dict) or len(env) > 1024:
            bad("$.env", "must be an object")
        else:
            env_name = c.env_name.search
            for key, value in env.items():
                if len(key) > 128 or env_name(key) is None or not isinstance(value, str):
                    bad("$.env", "bad variable")
    if "metadata" in doc:
        metadata = doc["metadata"]
        if not isinstance(metadata, dict) or len(metadata) > 64:
            bad("$.metadata", "must be an object with at most 64 keys")
    return out


def schema_problems(doc: Any, *, source: str | None = None) -> list[Problem]:
    """Every error the Draft 2020-12 validator finds, with its JSON path."""
    problems: list[Problem] = []
    for error in _compiled().validator.iter_errors(doc):
        problems.extend(problems_from_error(error, source=source, domain="request"))
    problems.sort(key=lambda p: p.path)
    return problems


# --- parsing --------------------------------------------------------------------------------------------


class _DuplicateKeyError(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # a key came twice: name the first repeat
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


@cache
def _decoder() -> json.JSONDecoder:
    # ``json.loads(text, object_pairs_hook=..., parse_constant=...)`` builds this decoder (and its scanner) on
    # every call; it holds no per-document state, so one is built and reused.
    return json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_no_constants)


def _invalid(source: str, message: str, path: str = "$", line: int | None = None) -> RequestError:
    return RequestError(
        f"invalid request: {message}",
        problems=[Problem(message, path=path, source=source, line=line, code="request.malformed")],
    )


_TEXT_TYPES = (str, bytes, bytearray)


def _loads(text: str) -> Any:
    """``json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constants)``, with a reused decoder."""
    if text.startswith("\ufeff"):  # refused by json.loads before decoding, with this message
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    return _decoder().decode(text)


def _decode(data: str | bytes | bytearray, source: str, max_bytes: int) -> Any:
    if isinstance(data, bytes | bytearray):
        if len(data) > max_bytes:
            raise _invalid(source, f"request is {len(data)} bytes, above the {max_bytes} byte cap")
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _invalid(source, f"request is not valid UTF-8 (byte {exc.start})") from exc
    else:
        if len(data) > max_bytes:
            raise _invalid(source, f"request is {len(data)} characters, above the {max_bytes} cap")
        text = data
    try:
        return _loads(text)
    except _DuplicateKeyError as exc:
        raise _invalid(source, f"duplicate key {exc.args[0]!r} in JSON object") from exc
    except json.JSONDecodeError as exc:
        raise _invalid(source, f"invalid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno) from exc
    except RecursionError as exc:
        raise _invalid(source, "JSON nested too deeply") from exc
    except ValueError as exc:  # NaN / Infinity
        raise _invalid(source, str(exc)) from exc


def _path_text(link: Any) -> str:
    # Paths are kept as (parent, key) links and only spelled out when a problem is reported.
    keys: list[str | int] = []
    while link is not None:
        link, key = link
        keys.append(key)
    out = "$"
    for key in reversed(keys):
        out = f"{out}[{key}]" if isinstance(key, int) else f"{out}.{key}"
    return out


def _copy_checked(doc: Any, source: str) -> Any:
    """A plain-JSON copy of ``doc``: only JSON types, string keys, finite numbers, bounded depth.

    Iterative (an explicit stack), so no nesting can overflow Python's recursion limit.
    """
    isfinite = math.isfinite
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, int, Any, Any]] = [(doc, None, 0, root, 0)]
    while stack:
        value, link, depth, parent, slot = stack.pop()
        kind = type(value)
        if kind is str or kind is int or kind is bool or value is None:
            parent[slot] = value
        elif kind is float:
            if not math.isfinite(value):
                raise _invalid(source, "numbers must be finite", path=_path_text(link))
            parent[slot] = value
        elif kind is dict or isinstance(value, Mapping):
            if depth >= MAX_DEPTH:
                raise _invalid(source, f"nested deeper than {MAX_DEPTH} levels", path=_path_text(link))
            out: dict[str, Any] = {}
            parent[slot] = out
            for key, item in value.items():
                if type(key) is not str:
                    raise _invalid(source, f"object key {key!r} is not a string", path=_path_text(link))
                kind = type(item)
                if kind is str or kind is int or kind is bool or (kind is float and isfinite(item)):
                    out[key] = item
                else:
                    out[key] = None
                    if item is not None:
                        stack.append((item, (link, key), depth + 1, out, key))
        elif kind is list or kind is tuple:
            if depth >= MAX_DEPTH:
                raise _invalid(source, f"nested deeper than {MAX_DEPTH} levels", path=_path_text(link))
            items: list[Any] = [None] * len(value)
            parent[slot] = items
            for index, item in enumerate(value):
                kind = type(item)
                if kind is str or kind is int or kind is bool or (kind is float and isfinite(item)):
                    items[index] = item
                elif item is not None:
                    stack.append((item, (link, index), depth + 1, items, index))
        elif isinstance(value, bool):
            parent[slot] = bool(value)
        elif isinstance(value, str):
            parent[slot] = str(value)
        elif isinstance(value, int):
            parent[slot] = int(value)
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise _invalid(source, "numbers must be finite", path=_path_text(link))
            parent[slot] = float(value)
        else:
            raise _invalid(source, f"{type(value).__name__} is not a JSON type", path=_path_text(link))
    return root[0]


_EMPTY: Mapping[str, Any] = MappingProxyType({})
_NO_LIMITS = RequestLimits()


def _build(doc: dict[str, Any], source: str) -> ExecutionRequest:
    # ``doc`` is the private copy made by _copy_checked and already schema-checked: its dicts are wrapped
    # read-only as they are, not copied again.
    problems: list[Problem] = []

    def bad(path: str, message: str) -> None:
        problems.append(Problem(message, path=path, source=source, code="request.invalid_value"))

    get = doc.get
    for name in ("language", "image", "network", "runtime", "principal"):
        value = get(name)
        if value is not None and ("\n" in value or "\r" in value):
            bad(f"$.{name}", "must not contain a line break")
    raw_limits = get("limits")
    limits = _NO_LIMITS
    if raw_limits:
        values: dict[str, Any] = {}
        for key, value in raw_limits.items():
            if key in _SIZE_FIELDS:
                if type(value) is int and 0 <= value <= MAX_SIZE:
                    values[key] = value  # what parse_size returns for it
                    continue
                try:
                    values[key] = parse_size(int(value) if isinstance(value, float) else value)
                except SizeError as exc:
                    bad(f"$.limits.{key}", str(exc))
            elif key == "pids":
                values[key] = int(value)
            else:
                values[key] = float(value) if key == "cpus" else value
        limits = RequestLimits(**values)
    mounts = []
    for index, item in enumerate(get("mounts", ())):
        for key in ("source", "target"):
            text = item[key]
            if any(ch in text for ch in "\x00\n\r:,"):
                bad(f"$.mounts[{index}].{key}", "must not contain NUL, line breaks, ':' or ','")
        mounts.append(MountRequest(item["source"], item["target"], item.get("mode", "ro")))
    env = get("env")
    if env:
        for name in env:
            if "\n" in name:
                bad("$.env", f"variable name {name!r} must not contain a line break")
    if problems:
        raise RequestError(f"invalid request: {len(problems)} problem(s)", problems=problems)
    files = get("files")
    metadata = get("metadata")
    return ExecutionRequest(
        doc["code"],
        get("language"),
        get("image"),
        limits,
        get("network"),
        get("runtime"),
        tuple(mounts),
        MappingProxyType(files) if files else _EMPTY,
        MappingProxyType(env) if env else _EMPTY,
        get("principal"),
        MappingProxyType(metadata) if metadata else _EMPTY,
    )


def parse_request(
    data: Mapping[str, Any] | str | bytes | bytearray,
    *,
    source: str = "<request>",
    max_bytes: int = MAX_REQUEST_BYTES,
) -> ExecutionRequest:
    """Validate ``data`` into an :class:`ExecutionRequest`; raise :class:`RequestError` listing every problem."""
    raw = _decode(data, source, max_bytes) if isinstance(data, _TEXT_TYPES) else data
    # A private copy in plain JSON shapes (the caller may mutate theirs afterwards), depth-checked.
    doc = _copy_checked(raw, source)
    if fast_problems(doc):
        problems = [Problem(p.message, path=p.path, source=source, code=p.code) for p in schema_problems(doc)] or [
            Problem(p.message, path=p.path, source=source, code="request.schema") for p in fast_problems(doc)
        ]
        raise RequestError(f"invalid request: {len(problems)} problem(s)", problems=problems)
    return _build(doc, source)

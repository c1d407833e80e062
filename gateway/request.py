"""Execution requests: parse and validate untrusted input into a frozen :class:`ExecutionRequest`.

Input may be a mapping (already parsed), a JSON string, or raw bytes. It goes through four steps, each of
which reports what it finds as a :class:`RequestError` and nothing else:

1. *Decode* text or bytes: the size cap is checked before anything is decoded; bytes must be UTF-8 (a BOM is
   refused); JSON may not repeat a key in an object or use ``NaN``/``Infinity``.
2. *Copy* the document into plain JSON shapes (``dict``, ``list``, ``str``, ``int`` of at most 4300 digits,
   finite ``float``, ``bool``, ``None``), so the caller can change theirs afterwards and no exotic type reaches
   validation. The copy is iterative with a depth cap (:data:`MAX_DEPTH`), so no nesting can raise
   ``RecursionError``, and counts values: more than any valid request holds (:data:`MAX_VALUES`) is refused.
3. *Validate* the copy against ``schemas/request.schema.json`` (Draft 2020-12), the only statement of the
   request format: jsonschema-rs accepts a valid request in microseconds; a request it does not accept is
   explained by python-jsonschema, which reports every error (up to :data:`MAX_PROBLEMS`) with its JSON path
   (see :func:`schema_problems`).
4. *Build* the request, with the checks a schema cannot state: no line breaks where a pattern's ``$`` would
   let a trailing one through, no bind-syntax characters in mount paths, sizes parsed into bytes, the total
   size of ``metadata`` (:data:`MAX_METADATA_BYTES`). A binary file (its content canonical base64, as the
   schema's pattern states) becomes a :class:`BinaryFile`, still encoded: its size is known from its length, so
   the policy's ``limits.files_size`` bounds the decoded bytes before anything is decoded (only an allowed run
   decodes it).

The Python API may give a file's content as ``bytes``; step 2 turns it into the base64 form a JSON body carries.

A caller may bound ``code`` too (``max_code_bytes``, after step 2): the service passes the largest
``limits.code_size`` of its policies, so that code no policy accepts is refused before it waits for anything.

A session request (:func:`parse_session_request`, ``schemas/session-request.schema.json``) goes through the same
steps: its profile fields are the execution request's by reference in the schema, and built by the same step 4.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from types import MappingProxyType
from typing import Any

import jsonschema_rs
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from gateway.errors import CodeTooLargeError, Problem, RequestError
from gateway.payload import request_file
from gateway.resources import load_schema
from gateway.sizes import SizeError, parse_size
from gateway.validation import problems_from_error

__all__ = [
    "MAX_DEPTH",
    "MAX_METADATA_BYTES",
    "MAX_METADATA_DEPTH",
    "MAX_PROBLEMS",
    "MAX_REQUEST_BYTES",
    "MAX_VALUES",
    "BinaryFile",
    "EgressAsk",
    "ExecutionRequest",
    "MountRequest",
    "RequestLimits",
    "SessionRequest",
    "parse_request",
    "parse_session_request",
    "schema_problems",
    "session_schema_problems",
]

MAX_REQUEST_BYTES = 8 * 1024 * 1024
"""Requests larger than this are refused before they are decoded or parsed."""
MAX_DEPTH = 32
"""Maximum nesting of objects/arrays anywhere in a request (``metadata`` is free-form)."""
MAX_VALUES = 40_000
"""Most JSON values (objects, arrays and scalars; keys not counted) a request may hold. The largest valid request
holds fewer: 30,001 in ``files`` (10,000 binary files of three values each), 1,025 in ``env``, 97 in ``mounts``,
about 8,200 in ``metadata`` (16 KiB of compact JSON), a few dozen elsewhere (``tests/unit/core/test_request_bounds.py``
builds it). A document with more is refused before the schema is asked: python-jsonschema, which explains an
invalid request, walks every value (~20-45 us each here), so without this bound one 4 MiB body cost a worker
3.5-40 s of CPU; with it, at most about 0.8-1.8 s."""
MAX_PROBLEMS = 100
"""Most schema problems one refusal lists; a last problem says that more were found and not listed."""

MAX_METADATA_BYTES = 16 * 1024
"""Largest ``metadata`` as compact JSON (UTF-8). It is recorded in the trail with every request, dry runs and
denials included, so it is bounded tightly; the schema bounds its keys, strings, items and nesting."""
MAX_METADATA_DEPTH = 4
"""Deepest nesting of objects and arrays in ``metadata`` (``metadata`` itself is level 1); stated in the schema
(``$defs/metadata2`` .. ``metadata5``)."""

_SIZE_FIELDS = frozenset(
    ("memory", "output_bytes", "output_files_bytes", "tmpfs", "egress_bytes_out", "egress_bytes_in")
)
_TEXT_FIELDS = ("language", "image", "network", "runtime", "principal")


def _utf8_size(text: str) -> int:
    # JSON can carry lone surrogates ("\ud800"); "surrogatepass" counts them instead of failing.
    return len(text.encode("utf-8", "surrogatepass"))


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class BinaryFile:
    """A file the request sent as base64: its canonical text, checked at intake and decoded only when a run
    needs the bytes, so that a request's decoded size is judged (``limits.files_size``) before it is decoded."""

    base64: str
    """Canonical base64 (RFC 4648, standard alphabet, padded, nothing else): the request schema's pattern."""

    @property
    def size(self) -> int:
        """Decoded bytes, from the length alone."""
        return len(self.base64) // 4 * 3 - self.base64[-2:].count("=")

    def decode(self) -> bytes:
        return base64.b64decode(self.base64)

    def to_dict(self) -> dict[str, str]:
        """The request's form of this file."""
        return {"content": self.base64, "encoding": "base64"}


@dataclass(frozen=True, slots=True)
class MountRequest:
    """One bind mount as the caller asked for it; the policy decides whether it is allowed."""

    source: str
    """Absolute host path as the caller wrote it (canonicalised later, by the policy engine)."""
    target: str
    """Absolute path inside the container."""
    mode: str = "ro"
    """``ro`` or ``rw``."""


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Limits the caller asked for; ``None`` means "the policy default"."""

    memory: int | None = None
    """Bytes."""
    cpus: float | None = None
    """CPU cores."""
    pids: int | None = None
    """Maximum number of processes and threads."""
    timeout_s: float | None = None
    """Wall-clock deadline in seconds (an ``int`` when the caller wrote one)."""
    output_bytes: int | None = None
    """Bytes of stdout and of stderr kept, each."""
    output_files_bytes: int | None = None
    """Total bytes of files returned from ``/workspace/out`` (contents and names)."""
    output_files: int | None = None
    """How many files are returned from ``/workspace/out`` at most."""
    tmpfs: int | None = None
    """Bytes of each tmpfs."""
    egress_connections: int | None = None
    """With network ``egress``: connections the run may open in all."""
    egress_bytes_out: int | None = None
    """With network ``egress``: bytes the run may send upstream in all."""
    egress_bytes_in: int | None = None
    """With network ``egress``: bytes the run may receive in all."""
    egress_rate: int | None = None
    """With network ``egress``: connection attempts allowed within any second."""

    def to_dict(self) -> dict[str, Any]:
        """The limits that were given, as JSON data."""
        values = ((f.name, getattr(self, f.name)) for f in fields(self))
        return {name: value for name, value in values if value is not None}


@dataclass(frozen=True, slots=True)
class EgressAsk:
    """One destination a request with network ``egress`` narrows the policy's egress list to."""

    host: str
    """A host name, ``*.`` wildcard or IP literal, within a policy entry's host."""
    ports: tuple[int, ...] = (443,)


@dataclass(frozen=True, slots=True)
class ExecutionRequest:
    """A validated request. Sizes are bytes; omitted fields are ``None`` (or empty) and get policy defaults."""

    code: str
    """Source code to run (never empty)."""
    language: str | None = None
    image: str | None = None
    limits: RequestLimits = field(default_factory=RequestLimits)
    network: str | None = None
    runtime: str | None = None
    mounts: tuple[MountRequest, ...] = ()
    files: Mapping[str, str | BinaryFile] = field(default_factory=_empty)
    """Relative file name -> content (UTF-8 text, or bytes sent as base64), placed under ``/workspace``;
    read-only."""
    env: Mapping[str, str] = field(default_factory=_empty)
    """Environment variables; read-only."""
    principal: str | None = None
    """Who is asking; recorded in the audit trail."""
    metadata: Mapping[str, Any] = field(default_factory=_empty)
    """Free-form caller data, recorded but never used for decisions; read-only at the top level."""
    egress: tuple[EgressAsk, ...] | None = None
    """With network ``egress``: the destinations the run may reach, each within the policy's list (rule
    ``network.egress``); ``None``: the policy's whole list."""
    packages: tuple[str, ...] = ()
    """Packages to install before the run, as given: Python requirement strings from the policy's index for
    language ``python``, npm specs (``name``, ``name@range``) from its npm registry for ``javascript`` (rules
    ``packages.enabled``, ``packages.allowed`` parse and judge them)."""

    @property
    def code_bytes(self) -> int:
        """UTF-8 size of :attr:`code`, which the policy caps."""
        return _utf8_size(self.code)

    @property
    def files_bytes(self) -> int:
        """Total size of the file contents in bytes (text as UTF-8, binary decoded), which the policy caps."""
        return sum(_utf8_size(c) if isinstance(c, str) else c.size for c in self.files.values())

    def file_contents(self) -> dict[str, bytes]:
        """Every file's bytes, as the sandbox receives them (binary files are decoded here)."""
        return {
            name: c.encode("utf-8", "surrogatepass") if isinstance(c, str) else c.decode()
            for name, c in self.files.items()
        }

    def to_dict(self) -> dict[str, Any]:
        """The request as JSON data (sizes in bytes), suitable for the audit trail and re-parsing."""
        out: dict[str, Any] = {"code": self.code}
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        limits = self.limits.to_dict()
        if limits:
            out["limits"] = limits
        if self.mounts:
            out["mounts"] = [{"source": m.source, "target": m.target, "mode": m.mode} for m in self.mounts]
        if self.files:
            out["files"] = {name: c if isinstance(c, str) else c.to_dict() for name, c in self.files.items()}
        if self.env:
            out["env"] = dict(self.env)
        if self.metadata:
            out["metadata"] = json.loads(json.dumps(dict(self.metadata)))
        if self.egress is not None:
            out["egress"] = [{"host": e.host, "ports": list(e.ports)} for e in self.egress]
        if self.packages:
            out["packages"] = list(self.packages)
        return out


# --- step 1: decode -------------------------------------------------------------------------------------


def _invalid(source: str, message: str, path: str = "$", line: int | None = None) -> RequestError:
    return RequestError(
        f"invalid request: {message}",
        problems=[Problem(message, path=path, source=source, line=line, code="request.malformed")],
    )


class _DuplicateKeyError(ValueError):
    pass


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of repeated keys; a request that says two things is refused instead.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKeyError(key)
        out[key] = value
    return out


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


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
        # json.loads refuses a leading BOM itself ("Unexpected UTF-8 BOM").
        return json.loads(text, object_pairs_hook=_refuse_duplicates, parse_constant=_refuse_constant)
    except _DuplicateKeyError as exc:
        raise _invalid(source, f"duplicate key {exc.args[0]!r} in JSON object") from exc
    except json.JSONDecodeError as exc:
        raise _invalid(source, f"invalid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno) from exc
    except RecursionError as exc:
        raise _invalid(source, "JSON nested too deeply") from exc
    except ValueError as exc:  # NaN / Infinity, integers too long to convert
        raise _invalid(source, str(exc)) from exc


# --- step 2: copy ---------------------------------------------------------------------------------------

_Keys = tuple[str | int, ...]
_MAX_INT_DIGITS = 4300
"""Longest integer JSON text may carry (Python's default ``int_max_str_digits``, which ``json.loads`` applies);
a mapping's integers are held to it too, so that every accepted request can be written out and read back."""
_INT_BOUND = 10**_MAX_INT_DIGITS


_PATH_NAME = re.compile("[a-zA-Z][a-zA-Z0-9_]*")


def _json_path(keys: _Keys) -> str:
    """The JSON path of ``keys`` as python-jsonschema writes it (``$.files['a.txt'].content``, ``$.mounts[0]``)."""
    path = "$"
    for key in keys:
        if isinstance(key, int):
            path += f"[{key}]"
        elif _PATH_NAME.fullmatch(key):
            path += f".{key}"
        else:
            escaped = key.replace("\\", "\\\\").replace("'", "\\'")
            path += f"['{escaped}']"
    return path


def _is_array(value: Any) -> bool:
    return type(value) is list or type(value) is tuple


def _plain_scalar(value: Any, source: str, keys: _Keys) -> Any:
    """``value`` as a plain JSON scalar (subclasses such as ``IntEnum`` become their base type)."""
    if value is None:
        return None
    if isinstance(value, bool):  # before int: bool is an int subclass
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        if abs(value) >= _INT_BOUND:
            message = f"integer of more than {_MAX_INT_DIGITS} digits, more than JSON text carries; send it as a string"
            raise _invalid(source, message, path=_json_path(keys))
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _invalid(source, "numbers must be finite", path=_json_path(keys))
        return float(value)
    raise _invalid(source, f"{type(value).__name__} is not a JSON type", path=_json_path(keys))


def _copy_checked(doc: Any, source: str) -> Any:
    """A plain-JSON copy of ``doc``: only JSON types, string keys, finite numbers, bounded depth.

    Iterative: containers wait on an explicit stack instead of Python's call stack, so no nesting can
    overflow the recursion limit; scalars are copied as they are met, so the stack only holds containers.
    """
    root: list[Any] = [None]
    # Containers whose copy is made but not yet filled: (original, copy, path).
    pending: list[tuple[Any, Any, _Keys]] = []
    count = 0

    def place(value: Any, parent: Any, slot: str | int, keys: _Keys) -> None:
        nonlocal count
        if len(keys) == 2 and keys[0] == "files" and isinstance(value, bytes | bytearray | memoryview):
            value = request_file(value)  # the Python API's bytes, in the form a JSON body carries them
        count += 1
        if count > MAX_VALUES:
            message = f"holds more than {MAX_VALUES} JSON values, more than any valid request; nothing else was checked"
            problem = Problem(message, path="$", source=source, code="request.too_many_values")
            raise RequestError(f"invalid request: {message}", problems=[problem])
        if isinstance(value, Mapping) or _is_array(value):
            if len(keys) >= MAX_DEPTH:
                raise _invalid(source, f"nested deeper than {MAX_DEPTH} levels", path=_json_path(keys))
            copy: Any = {} if isinstance(value, Mapping) else [None] * len(value)
            parent[slot] = copy
            pending.append((value, copy, keys))
        else:
            parent[slot] = _plain_scalar(value, source, keys)

    place(doc, root, 0, ())
    while pending:
        value, copy, keys = pending.pop()
        if isinstance(copy, dict):
            for key, item in value.items():
                if type(key) is not str:
                    raise _invalid(source, f"object key {key!r} is not a string", path=_json_path(keys))
                place(item, copy, key, (*keys, key))
        else:
            for index, item in enumerate(value):
                place(item, copy, index, (*keys, index))
    return root[0]


# --- step 3: validate -----------------------------------------------------------------------------------


@cache
def _validator() -> Draft202012Validator:
    """The request schema for python-jsonschema, compiled once: it explains a request that is not accepted."""
    return Draft202012Validator(load_schema("request"), format_checker=Draft202012Validator.FORMAT_CHECKER)


@cache
def _fast_validator() -> jsonschema_rs.Validator:
    """The same schema for jsonschema-rs, compiled once: it accepts a valid request (a format it does not know
    would be an error here, not a check skipped)."""
    return jsonschema_rs.Draft202012Validator(
        load_schema("request"), validate_formats=True, ignore_unknown_formats=False
    )


def _accepted(doc: Any) -> bool:
    """Whether jsonschema-rs finds ``doc`` valid; ``False`` leaves the verdict to python-jsonschema."""
    try:
        return _fast_validator().is_valid(doc)
    except ValueError:  # a lone surrogate ("\ud800", valid in JSON) cannot become a Rust string
        return False


def schema_problems(doc: Any, *, source: str | None = None) -> list[Problem]:
    """The errors the Draft 2020-12 validator finds in ``doc`` (every one, up to :data:`MAX_PROBLEMS`; then a last
    problem ``request.more_problems`` says more were found), each with its JSON path, sorted by path.

    jsonschema-rs decides first (a few microseconds, against a few hundred for python-jsonschema); python-jsonschema
    walks only what it does not accept, and its errors are the ones reported. So a valid request costs
    microseconds and an invalid one reads as it always did. Where the two disagree, python-jsonschema is right
    and the slower path is taken: in jsonschema-rs a pattern's ``$`` does not match before a trailing newline
    (in Python's ``re`` it does; step 4 refuses such values). That jsonschema-rs never accepts what
    python-jsonschema refuses is tested (``tests/unit/core/test_request_schema_agreement.py``).
    """
    if _accepted(doc):
        return []
    problems: list[Problem] = []
    errors = _validator().iter_errors(doc)
    for error in errors:
        if len(problems) >= MAX_PROBLEMS:
            break
        problems.extend(problems_from_error(error, source=source, domain="request"))
    else:
        if len(problems) <= MAX_PROBLEMS:
            return sorted(problems, key=lambda p: p.path)
    # Listing every problem of a hostile document would cost as much as finding them all: stop at MAX_PROBLEMS.
    shown = sorted(problems[:MAX_PROBLEMS], key=lambda p: p.path)
    message = f"more problems were found; only the first {MAX_PROBLEMS} are listed"
    return [*shown, Problem(message, path="$", source=source, code="request.more_problems")]


# --- step 4: build --------------------------------------------------------------------------------------

_Report = Callable[[str, str], None]


def _limits(raw: Mapping[str, Any], bad: _Report) -> RequestLimits:
    # The schema has checked types and ranges; JSON Schema's "integer" includes 2.0, made an int here.
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _SIZE_FIELDS:
            try:
                values[key] = parse_size(int(value) if isinstance(value, float) else value)
            except SizeError as exc:
                bad(f"$.limits.{key}", str(exc))
        elif key in ("pids", "output_files", "egress_connections", "egress_rate"):
            values[key] = int(value)
        elif key == "cpus":
            values[key] = float(value)
        else:
            values[key] = value
    return RequestLimits(**values)


def _mounts(raw: list[dict[str, str]], bad: _Report) -> tuple[MountRequest, ...]:
    # These characters would change the meaning of a Docker bind specification ("src:dst:mode,opt").
    for index, item in enumerate(raw):
        for key in ("source", "target"):
            if any(ch in item[key] for ch in "\x00\n\r:,"):
                bad(f"$.mounts[{index}].{key}", "must not contain NUL, line breaks, ':' or ','")
    return tuple(MountRequest(item["source"], item["target"], item.get("mode", "ro")) for item in raw)


def _files(raw: Mapping[str, Any], bad: _Report) -> Mapping[str, str | BinaryFile]:
    # The schema has checked the shape: a string, or {"content": str, "encoding": "base64"}.
    files: dict[str, str | BinaryFile] = {}
    for name, value in raw.items():
        if isinstance(value, str):
            files[name] = value
            continue
        if value["content"].endswith("\n"):  # the schema's pattern is canonical base64; its "$" lets this through
            bad(_json_path(("files", name, "content")), "is not canonical base64: it ends with a line break")
        files[name] = BinaryFile(value["content"])
    return MappingProxyType(files)


def _build(doc: dict[str, Any], source: str) -> ExecutionRequest:
    """The request from ``doc``, a schema-valid private copy (so its dicts are wrapped, not copied again)."""
    problems: list[Problem] = []

    def bad(path: str, message: str) -> None:
        problems.append(Problem(message, path=path, source=source, code="request.invalid_value"))

    # A pattern's "$" also matches before a trailing newline, so "none\n" passes the schema.
    for name in _TEXT_FIELDS:
        value = doc.get(name)
        if value is not None and ("\n" in value or "\r" in value):
            bad(f"$.{name}", "must not contain a line break")
    limits = _limits(doc.get("limits", {}), bad)
    mounts = _mounts(doc.get("mounts", []), bad)
    files = _files(doc.get("files", {}), bad)
    for index, text in enumerate(doc.get("packages", ())):
        if "\n" in text or "\r" in text:  # the schema's printable-ASCII pattern ends with "$"
            bad(f"$.packages[{index}]", "must not contain a line break")
    for name in doc.get("env", {}):
        if "\n" in name:
            bad("$.env", f"variable name {name!r} must not contain a line break")
    if "metadata" in doc:
        size = len(
            json.dumps(doc["metadata"], separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
        )
        if size > MAX_METADATA_BYTES:
            bad(
                "$.metadata",
                f"is {size} bytes as compact JSON; at most {MAX_METADATA_BYTES} are allowed (it is recorded with "
                "every request: send large data as files instead)",
            )
    if problems:
        raise RequestError(f"invalid request: {len(problems)} problem(s)", problems=problems)
    return ExecutionRequest(
        code=doc["code"],
        language=doc.get("language"),
        image=doc.get("image"),
        limits=limits,
        network=doc.get("network"),
        runtime=doc.get("runtime"),
        mounts=mounts,
        files=files,
        env=MappingProxyType(doc.get("env", {})),
        principal=doc.get("principal"),
        metadata=MappingProxyType(doc.get("metadata", {})),
        egress=None
        if "egress" not in doc
        else tuple(EgressAsk(e["host"], tuple(e.get("ports", (443,)))) for e in doc["egress"]),
        packages=tuple(doc.get("packages", ())),
    )


def _check_code_size(doc: Any, max_code_bytes: int, source: str) -> None:
    """:class:`CodeTooLargeError` for ``code`` above ``max_code_bytes`` (UTF-8), before the schema is asked."""
    code = doc.get("code") if isinstance(doc, dict) else None
    if isinstance(code, str) and (size := _utf8_size(code)) > max_code_bytes:
        message = (
            f"code is {size} bytes (UTF-8); no policy of this gateway accepts more than {max_code_bytes} "
            "(limits.code_size)"
        )
        problem = Problem(message, path="$.code", source=source, code=CodeTooLargeError.code)
        raise CodeTooLargeError(f"invalid request: {message}", problems=[problem])


def parse_request(
    data: Mapping[str, Any] | str | bytes | bytearray,
    *,
    source: str = "<request>",
    max_bytes: int = MAX_REQUEST_BYTES,
    max_code_bytes: int | None = None,
) -> ExecutionRequest:
    """Validate ``data`` into an :class:`ExecutionRequest`; raise :class:`RequestError` listing every problem.
    ``max_code_bytes``: code above it is refused first (:class:`CodeTooLargeError`, 413): the service's bound,
    the largest ``limits.code_size`` of its policies (:attr:`gateway.PolicySet.code_size_ceiling`)."""
    raw = _decode(data, source, max_bytes) if isinstance(data, str | bytes | bytearray) else data
    doc = _copy_checked(raw, source)
    if max_code_bytes is not None:
        _check_code_size(doc, max_code_bytes, source)
    problems = schema_problems(doc, source=source)
    if problems:
        raise RequestError(f"invalid request: {len(problems)} problem(s)", problems=problems)
    return _build(doc, source)


# --- session requests -----------------------------------------------------------------------------------

_PROFILE_FIELDS = ("language", "image", "limits", "network", "runtime", "mounts", "principal", "metadata")
"""The execution request's fields a session request carries: its profile, who asks, free metadata."""


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """A validated request to create a session. Omitted values are ``None`` (or empty): the policy's defaults.

    The profile fields mean what they mean in an :class:`ExecutionRequest`: the session's profile is decided
    exactly as an execution's would be (:func:`gateway.decision.decide_session`)."""

    mode: str
    """``workspace`` or ``kernel``."""
    idle_s: float | None = None
    """Seconds the session may stay unused."""
    lifetime_s: float | None = None
    """Seconds the session lives, counted from when it became ready."""
    workspace_size: int | None = None
    """Bytes: the hard bound of the session's ``/workspace``."""
    language: str | None = None
    image: str | None = None
    limits: RequestLimits = field(default_factory=RequestLimits)
    """The session's limits: memory, cpus, pids and tmpfs bound its sandbox; ``timeout_s`` and the output caps
    are the default and the ceiling of each execution in it."""
    network: str | None = None
    runtime: str | None = None
    mounts: tuple[MountRequest, ...] = ()
    principal: str | None = None
    """Who asks: the session belongs to this principal."""
    metadata: Mapping[str, Any] = field(default_factory=_empty)
    """Free-form caller data, recorded but never used for decisions."""

    def profile_request(self) -> ExecutionRequest:
        """The execution request whose decision fixes this session's profile: the same fields, and no code, files
        or environment (those belong to each execution in the session)."""
        return ExecutionRequest(
            code="",
            language=self.language,
            image=self.image,
            limits=self.limits,
            network=self.network,
            runtime=self.runtime,
            mounts=self.mounts,
            principal=self.principal,
            metadata=self.metadata,
        )

    def to_dict(self) -> dict[str, Any]:
        """The request as JSON data (sizes in bytes), suitable for the audit trail and re-parsing."""
        out: dict[str, Any] = {"mode": self.mode}
        for name in ("idle_s", "lifetime_s", "workspace_size"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        profile = self.profile_request().to_dict()
        del profile["code"]
        return out | profile


@cache
def _session_validator() -> Draft202012Validator:
    """python-jsonschema for session requests (the execution request schema resolves its references)."""
    request = load_schema("request")
    registry: Registry[Any] = Registry().with_resource(request["$id"], Resource.from_contents(request))
    schema = load_schema("session-request")
    return Draft202012Validator(schema, registry=registry, format_checker=Draft202012Validator.FORMAT_CHECKER)


@cache
def _session_fast_validator() -> jsonschema_rs.Validator:
    """jsonschema-rs for session requests: accepts a valid one in microseconds (as :func:`schema_problems`)."""
    request = load_schema("request")
    return jsonschema_rs.Draft202012Validator(
        load_schema("session-request"),
        registry=jsonschema_rs.Registry([(request["$id"], request)]),
        validate_formats=True,
        ignore_unknown_formats=False,
    )


def session_schema_problems(doc: Any, *, source: str | None = None) -> list[Problem]:
    """Every error of ``doc`` against ``schemas/session-request.schema.json``, as :func:`schema_problems` reports
    them (at most :data:`MAX_PROBLEMS`, sorted by path)."""
    try:
        if _session_fast_validator().is_valid(doc):
            return []
    except ValueError:  # a lone surrogate cannot become a Rust string: python-jsonschema decides
        pass
    problems: list[Problem] = []
    for error in _session_validator().iter_errors(doc):
        problems.extend(problems_from_error(error, source=source, domain="request"))
        if len(problems) >= MAX_PROBLEMS:
            break
    return sorted(problems[:MAX_PROBLEMS], key=lambda p: p.path)


def parse_session_request(
    data: Mapping[str, Any] | str | bytes | bytearray,
    *,
    source: str = "<session request>",
    max_bytes: int = MAX_REQUEST_BYTES,
) -> SessionRequest:
    """Validate ``data`` into a :class:`SessionRequest`; raise :class:`RequestError` listing every problem."""
    raw = _decode(data, source, max_bytes) if isinstance(data, str | bytes | bytearray) else data
    doc = _copy_checked(raw, source)
    problems = session_schema_problems(doc, source=source)
    if problems:
        raise RequestError(f"invalid session request: {len(problems)} problem(s)", problems=problems)
    workspace_size = None
    try:
        # The profile's fields, built by step 4 of an execution request (the same checks); the code is a stand-in.
        profile = _build({"code": "-"} | {k: doc[k] for k in _PROFILE_FIELDS if k in doc}, source)
        if "workspace_size" in doc:
            value = doc["workspace_size"]
            workspace_size = parse_size(int(value) if isinstance(value, float) else value)
    except SizeError as exc:
        problem = Problem(str(exc), path="$.workspace_size", source=source, code="request.invalid_value")
        raise RequestError("invalid session request: 1 problem(s)", problems=[problem]) from exc
    return SessionRequest(
        mode=doc["mode"],
        idle_s=doc.get("idle_s"),
        lifetime_s=doc.get("lifetime_s"),
        workspace_size=workspace_size,
        language=profile.language,
        image=profile.image,
        limits=profile.limits,
        network=profile.network,
        runtime=profile.runtime,
        mounts=profile.mounts,
        principal=profile.principal,
        metadata=profile.metadata,
    )

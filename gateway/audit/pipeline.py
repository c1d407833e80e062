"""The record pipeline: small processors that turn an event into a sealed line (structlog-style).

``normalise`` → ``redact`` → ``stamp`` run in the caller's thread and build the unchained record; ``chain``
runs under the trail lock and adds ``seq``, ``timestamp``, ``prev_hash`` and seals ``hash``/``hmac``. Both
sinks (:class:`~gateway.audit.jsonl.JsonlAuditTrail`, :class:`~gateway.audit.memory.MemoryAuditSink`) use
this same pipeline, so what a unit test sees in memory is byte for byte what the trail would hold.

Redaction rules (each erased path is listed in the record's ``redacted``):

* ``request.received``: ``data.request.code`` is kept up to ``code_max_bytes`` bytes *as stored* (JSON-escaped:
  a control character takes 6 bytes, a character beyond the BMP 12; cut beyond, with ``code_truncated``), plus
  ``code_sha256`` and ``code_bytes`` (UTF-8) of the whole code; ``data.request.files`` becomes
  ``[{"name", "sha256", "bytes"}]`` (contents never kept; a binary file is digested over its decoded bytes and
  its entry says ``"encoding": "base64"``); ``data.request.env`` becomes ``env_names`` (values
  never kept); any other string of the request (a file or mount name, metadata) longer than
  :data:`STRING_MAX_BYTES` as stored keeps a prefix that fits. The erased paths are listed one by one only
  while they are short (:func:`_erased_paths`). So a request costs the code cap plus a bounded rest, whatever
  characters it holds.
* ``policy.decision``: values of ``data.decision.options.environment`` become ``"<redacted>"``, the
  ``got`` of any rule result whose path is under ``$.env`` keeps names only, and the strings of each rule result
  (which quote the request) are cut to :data:`STRING_MAX_BYTES` as stored.
* ``request.invalid``: the strings of each of ``data.problems`` (which quote the request) are cut likewise.
* every event: any list under ``data`` keeps at most :data:`LIST_MAX_ITEMS` items and :data:`LIST_MAX_BYTES`
  bytes; a cut list ``k`` gains ``k_omitted: {"count", "sha256"}`` (:func:`bound_lists`), so no caller input
  can make one record unbounded.

Numbers: records hold no floats. Inside ``data.request`` and ``data.decision`` (which carry caller-supplied
JSON such as ``limits.cpus: 0.5``) a float is stored as its shortest round-trip decimal string (``"0.5"``);
a float anywhere else is a programming error and raises :class:`~gateway.audit.canonical.CanonicalError`.
"""

from __future__ import annotations

import binascii
import hashlib
import json
import os
import re
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from opentelemetry import trace

from gateway._version import __version__
from gateway.audit.canonical import CanonicalError, canonical_bytes, check_json, seal
from gateway.audit.interface import EVENT_TYPES, SCHEMA_VERSION
from gateway.canonical import SCALAR_TYPES, audit_body_size

__all__ = [
    "LIST_MAX_BYTES",
    "LIST_MAX_ITEMS",
    "REDACTED",
    "STRING_MAX_BYTES",
    "Processor",
    "RecordPipeline",
    "SealedRecord",
    "bound_lists",
    "bounded",
    "chain",
    "json_path",
    "normalise",
    "redactor",
    "stamper",
    "stored_prefix",
    "stored_request",
    "utc_timestamp",
]

Record = dict[str, Any]
Processor = Callable[[Record], Record]
"""One pipeline step: takes the record being built, returns it (possibly the same dict, updated)."""

REDACTED: Final = "<redacted>"
"""Placeholder stored in place of an erased value where the shape must stay (docker ``environment``)."""

LIST_MAX_ITEMS: Final = 32
"""At most this many items of any list are kept in a record; the rest become ``<key>_omitted``."""
LIST_MAX_BYTES: Final = 8192
"""...and at most this many bytes of them (canonical JSON), so 32 long names cannot blow a record up either."""

STRING_MAX_BYTES: Final = 1024
"""A request's strings other than its code keep at most this many bytes as stored (JSON-escaped)."""

_REDACTED_MAX: Final = 4 * LIST_MAX_ITEMS
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FLOAT_SUBTREES: Final = ("request", "decision")


def json_path(base: str, key: str | int) -> str:
    """Append one step to a JSON path: ``$.a.b``, ``$.a['x/y.txt']``, ``$.a[3]``."""
    if isinstance(key, int):
        return f"{base}[{key}]"
    if _IDENT.match(key):
        return f"{base}.{key}"
    escaped = key.replace("\\", "\\\\").replace("'", "\\'")
    return f"{base}['{escaped}']"


def utc_timestamp(now: datetime | None = None) -> str:
    """UTC RFC 3339 with microseconds and ``Z``: ``2024-05-01T12:00:00.123456Z``."""
    moment = now if now is not None else datetime.now(UTC)
    # The text of strftime("%Y-%m-%dT%H:%M:%S.%fZ"), built without parsing a format for every record.
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _plain(value: Any, floats_ok: bool) -> Any:
    """Deep copy into plain JSON types; floats become decimal strings only where ``floats_ok``.

    Raises a bare :class:`CanonicalError`; :func:`normalise` then names the path (the fast path builds none).
    Members and items of the plain scalar types are copied as they are, without a call each: a decision record
    holds hundreds of them.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if floats_ok:
            return repr(value)
        raise CanonicalError
    if isinstance(value, (list, tuple)):
        return [item if type(item) in SCALAR_TYPES else _plain(item, floats_ok) for item in value]
    if isinstance(value, (dict, Mapping)):  # a dict is known without the ABC's slower check
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalError
            out[key] = item if type(item) in SCALAR_TYPES else _plain(item, floats_ok)
        return out
    raise CanonicalError


def _without_floats(value: Any) -> Any:
    if isinstance(value, float):
        return None
    if isinstance(value, Mapping):
        return {k: _without_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_floats(v) for v in value]
    return value


def normalise(record: Record) -> Record:
    """Copy ``data`` into plain JSON (the caller's mapping is never mutated) and check the event type."""
    event_type = record["event_type"]
    if event_type not in EVENT_TYPES:
        raise CanonicalError(f"unknown audit event type {event_type!r}")
    data = record["data"]
    if not isinstance(data, Mapping):
        raise CanonicalError(f"$.data: expected an object, got {type(data).__name__}")
    plain: dict[str, Any] = {}
    for key, item in data.items():
        if not isinstance(key, str):
            raise CanonicalError(f"$.data: non-string key {key!r} in an audit record")
        floats_ok = key in _FLOAT_SUBTREES
        try:
            plain[key] = _plain(item, floats_ok)
        except CanonicalError:
            check_json(item if not floats_ok else _without_floats(item), json_path("$.data", key))
            raise
    record["data"] = plain
    policy = record.get("policy")
    if policy is not None:
        record["policy"] = {"name": str(policy["name"]), "sha256": str(policy["sha256"])}
    return record


def bounded(
    items: list[Any], *, max_items: int = LIST_MAX_ITEMS, max_bytes: int = LIST_MAX_BYTES
) -> tuple[list[Any], dict[str, Any] | None]:
    """The first items of ``items`` that fit both caps, and a summary of the rest (``None`` when none left).

    The summary is ``{"count": n, "sha256": hex}``: how many items were left out and the sha256 of their
    canonical JSON array, so whoever holds the full list (the caller's own result) can prove it is the one.
    At least one item is kept whatever its size (an item is a single value the record already bounds).
    ``items`` is plain JSON (as :func:`normalise` makes a record's data): it is sized without being checked;
    a record holding anything else is refused when it is serialised (:func:`chain`).
    """
    if len(items) <= max_items and audit_body_size(items) - len(items) - 1 <= max_bytes:
        return list(items), None  # the common case: the whole list fits, sized in one pass (the array minus its commas)
    kept: list[Any] = []
    used = 0
    for item in items:
        size = audit_body_size(item)
        if len(kept) >= max_items or (kept and used + size > max_bytes):
            break
        kept.append(item)
        used += size
    rest = items[len(kept) :]
    if not rest:
        return kept, None
    return kept, {"count": len(rest), "sha256": hashlib.sha256(canonical_bytes(rest)).hexdigest()}


_KEPT_WHOLE_STEPS: Final = ("data", "decision", "options")
"""Subtrees never cut: the decision record holds exactly the options the backend will submit (the gateway
builds them, and the policy schema bounds every list in them: mounts, variables, ...)."""


def _bound(value: Any, path: tuple[str | int, ...], erased: list[str], max_items: int, fits: bool = False) -> Any:
    """Cap every list under ``value``; ``path`` holds the steps to it, turned into text only for a cut list.

    ``fits``: ``value`` is inside a list that was kept whole, whose items are within :data:`LIST_MAX_BYTES` as
    canonical JSON; a list under it is no longer than that, so only its item count can make it too long (and
    it is not serialised again to be sized). Only containers are walked: scalars hold no list."""
    if path == _KEPT_WHOLE_STEPS or (fits and not _has_long_list(value, max_items)):
        return value  # kept whole; or only an over-long list could be cut under a list that fits, and none is
    if isinstance(value, dict):
        for key in list(value):
            item = value[key]
            if isinstance(item, list):
                inside_whole = fits
                if item and not key.endswith("_omitted") and not (fits and len(item) <= max_items):
                    kept, rest = bounded(item, max_items=max_items)
                    if rest is not None:
                        item = value[key] = kept
                        value[f"{key}_omitted"] = rest
                        erased.append(_path_text((*path, key)))
                    inside_whole = fits or rest is None
                value[key] = _bound(item, (*path, key), erased, max_items, inside_whole)
            elif isinstance(item, dict):
                _bound(item, (*path, key), erased, max_items, fits)
    elif isinstance(value, list):
        return [
            _bound(item, (*path, index), erased, max_items, fits) if isinstance(item, (dict, list)) else item
            for index, item in enumerate(value)
        ]
    return value


def _has_long_list(value: Any, max_items: int) -> bool:
    """Whether ``value`` is or holds a list of more than ``max_items`` items (a fast walk without paths)."""
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, list):
        if len(value) > max_items:
            return True
        items = value
    else:
        return False
    for item in items:  # noqa: SIM110 - a loop, not any(): no generator per container
        if type(item) not in SCALAR_TYPES and _has_long_list(item, max_items):
            return True
    return False


def _path_text(steps: tuple[str | int, ...]) -> str:
    text = "$"
    for step in steps:
        text = json_path(text, step)
    return text


def bound_lists(max_items: int = LIST_MAX_ITEMS) -> Processor:
    """The processor that caps every list under ``data``, whatever the event: a list ``k`` longer than the caps
    keeps its first items and gains a sibling ``k_omitted`` (``{"count", "sha256"}`` of the rest); its path is
    listed in ``redacted``. The assembled options of a decision are kept whole (:data:`_KEPT_WHOLE_STEPS`). Runs after
    redaction, so a request's thousands of file names, a decision's thousands
    of rule results, an outcome's thousands of returned files all cost a bounded record."""

    def bound(record: Record) -> Record:
        erased: list[str] = []
        record["data"] = _bound(record["data"], ("data",), erased, max_items)
        if erased:
            record["redacted"] = sorted({*record.get("redacted", ()), *erased})
        if len(record.get("redacted", ())) > _REDACTED_MAX:  # defence in depth: every producer above bounds its own
            record["redacted"] = [*record["redacted"][: _REDACTED_MAX - 1], "$.data"]
        return record

    return bound


def _sha256_text(value: Any) -> tuple[str, int]:
    raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else canonical_bytes(value)
    return hashlib.sha256(raw).hexdigest(), len(raw)


_BASE64_CHUNK = 1 << 16
"""Base64 characters decoded at a time for a digest (a multiple of 4)."""


def _base64_digest(value: Any) -> tuple[str, int] | None:
    """sha256 and size of the bytes a binary request file (``{"content": <base64>, "encoding": "base64"}``)
    carries, decoded a chunk at a time so the bytes are never all held; ``None`` for anything else."""
    if not (isinstance(value, dict) and value.get("encoding") == "base64" and isinstance(value.get("content"), str)):
        return None
    text: str = value["content"]
    digest, size = hashlib.sha256(), 0
    try:
        for start in range(0, len(text), _BASE64_CHUNK):
            chunk = binascii.a2b_base64(text[start : start + _BASE64_CHUNK], strict_mode=True)
            digest.update(chunk)
            size += len(chunk)
    except (binascii.Error, ValueError):  # never from a parsed request (intake checked it); digest it as JSON
        return None
    return digest.hexdigest(), size


def stored_prefix(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` whose stored form (the JSON string as a record holds it, ASCII-escaped,
    without its quotes) is at most ``max_bytes``: ``text`` itself when it fits."""
    if len(text) <= max_bytes // 12 or audit_body_size(text) - 2 <= max_bytes:
        return text  # no character takes more than 12 bytes escaped (a surrogate pair)
    low, high = 0, min(len(text), max_bytes)  # every character takes at least one byte
    while low < high:  # the stored size grows with the prefix: the longest one that fits
        middle = (low + high + 1) // 2
        if audit_body_size(text[:middle]) - 2 <= max_bytes:
            low = middle
        else:
            high = middle - 1
    return text[:low]


def _cap_strings(value: Any, path: str, erased: list[str]) -> Any:
    """``value`` with every string longer than :data:`STRING_MAX_BYTES` as stored cut to a prefix that fits
    (its path listed in ``erased``)."""
    if isinstance(value, str):
        kept = stored_prefix(value, STRING_MAX_BYTES)
        if len(kept) < len(value):
            erased.append(path)
        return kept
    if isinstance(value, dict):
        return {key: _cap_strings(item, json_path(path, key), erased) for key, item in value.items()}
    if isinstance(value, list):
        return [_cap_strings(item, json_path(path, index), erased) for index, item in enumerate(value)]
    return value


def stored_request(request: Mapping[str, Any], code_max_bytes: int = 65536) -> dict[str, Any]:
    """``request`` (an ``ExecutionRequest.to_dict()``) as a record keeps it: files by digest, environment by name,
    code up to ``code_max_bytes``. For what shows a request outside the trail (a pending approval)."""
    kept: dict[str, Any] = json.loads(json.dumps(request))
    _redact_request(kept, code_max_bytes, [])
    return kept


def _redact_request(request: dict[str, Any], code_max_bytes: int, erased: list[str]) -> None:
    base = "$.data.request"
    code = request.get("code")
    if isinstance(code, str):
        raw = code.encode("utf-8", "surrogatepass")
        request["code_sha256"] = hashlib.sha256(raw).hexdigest()
        request["code_bytes"] = len(raw)
        kept = stored_prefix(code, code_max_bytes)
        request["code_truncated"] = len(kept) < len(code)
        if request["code_truncated"]:
            request["code"] = kept
            erased.append(json_path(base, "code"))
    files = request.get("files")
    if isinstance(files, dict):
        summary = []
        for name in sorted(files):
            content = files[name]
            binary = _base64_digest(content)
            sha, size = binary if binary is not None else _sha256_text(content)
            entry: dict[str, Any] = {"name": name, "sha256": sha, "bytes": size}
            if binary is not None:
                entry["encoding"] = "base64"
            summary.append(entry)
        request["files"] = summary
        erased.extend(_erased_paths(json_path(base, "files"), sorted(files)))
    env = request.get("env")
    if isinstance(env, dict):
        request["env_names"] = sorted(env)
        erased.extend(_erased_paths(json_path(base, "env"), sorted(env)))
        del request["env"]
    for key in list(request):
        if key not in _REQUEST_OWN_CAPS:
            request[key] = _cap_strings(request[key], json_path(base, key), erased)


_REQUEST_OWN_CAPS: Final = frozenset({"code", "code_sha256", "code_bytes", "code_truncated"})
"""Members of a recorded request that :func:`_cap_strings` leaves alone: the code has a cap of its own."""


def _erased_paths(base: str, keys: list[str]) -> list[str]:
    """One path per erased member, or only ``base`` when there are more than a record lists of anything or their
    paths together take more than :data:`LIST_MAX_BYTES` as stored (long names)."""
    if len(keys) > LIST_MAX_ITEMS:
        return [base]
    paths = [json_path(base, key) for key in keys]
    return paths if audit_body_size(paths) <= LIST_MAX_BYTES else [base]


def _names_only(got: Any) -> Any:
    if isinstance(got, dict):
        return sorted(got)
    if isinstance(got, list):
        return [item.split("=", 1)[0] if isinstance(item, str) else REDACTED for item in got]
    return REDACTED


def _redact_decision(decision: dict[str, Any], erased: list[str]) -> None:
    base = "$.data.decision"
    options = decision.get("options")
    if isinstance(options, dict):
        env = options.get("environment")
        env_path = json_path(json_path(base, "options"), "environment")
        if isinstance(env, dict):
            for name in sorted(env):
                env[name] = REDACTED
            erased.extend(_erased_paths(env_path, sorted(env)))
        elif isinstance(env, list):
            cut: list[str | int] = []
            for index, item in enumerate(env):
                if isinstance(item, str) and "=" in item:
                    env[index] = item.split("=", 1)[0] + "=" + REDACTED
                    cut.append(index)
            erased.extend([env_path] if len(cut) > LIST_MAX_ITEMS else [json_path(env_path, i) for i in cut])
    for group in ("results", "violations", "warnings"):
        results = decision.get(group)
        if not isinstance(results, list):
            continue
        for index, result in enumerate(results[:LIST_MAX_ITEMS]):  # the rest is cut by bound_lists
            if not isinstance(result, dict):
                continue
            path = result.get("path")
            under_env = isinstance(path, str) and (path == "$.env" or path.startswith(("$.env.", "$.env[")))
            if under_env and result.get("got") is not None:
                result["got"] = _names_only(result["got"])
                erased.append(json_path(json_path(json_path(base, group), index), "got"))
            # a result names what the request held (a file name of 4,096 control characters): its strings are cut
            results[index] = _cap_strings(result, json_path(json_path(base, group), index), erased)


def redactor(code_max_bytes: int) -> Processor:
    """The redaction processor for a given code cap; sets ``redacted`` (sorted JSON paths)."""
    if code_max_bytes < 0:
        raise ValueError("code_max_bytes must be >= 0")

    def redact(record: Record) -> Record:
        erased: list[str] = []
        data = record["data"]
        held = record["event_type"] in ("request.received", "approval.requested")  # both keep the request
        if held and isinstance(data.get("request"), dict):
            _redact_request(data["request"], code_max_bytes, erased)
        if record["event_type"] == "policy.decision" and isinstance(data.get("decision"), dict):
            _redact_decision(data["decision"], erased)
        if record["event_type"] == "request.invalid" and isinstance(data.get("problems"), list):
            problems = data["problems"]  # each quotes the request (an unknown key of 4,096 control characters)
            for index, problem in enumerate(problems[:LIST_MAX_ITEMS]):  # the rest is cut by bound_lists
                problems[index] = _cap_strings(problem, json_path("$.data.problems", index), erased)
        record["redacted"] = sorted(erased)
        return record

    return redact


@dataclass(frozen=True, slots=True)
class GatewayIdentity:
    """Who wrote a record: stamped as ``gateway`` in every record."""

    version: str
    host: str
    pid: int

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "host": self.host, "pid": self.pid}


def _current_trace() -> tuple[str, str] | None:
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def stamper(host: str | None = None, id_factory: Callable[[], str] | None = None) -> Processor:
    """The stamping processor: ``schema``, ``event_id``, ``gateway`` and ``trace_id``/``span_id``.

    The pid is read at each call so that a forked worker stamps its own.
    """
    host_name = host if host is not None else socket.gethostname()
    new_id = id_factory if id_factory is not None else (lambda: str(uuid.uuid4()))

    def stamp(record: Record) -> Record:
        record["schema"] = SCHEMA_VERSION
        record["event_id"] = new_id()
        record["gateway"] = GatewayIdentity(__version__, host_name, os.getpid()).to_dict()
        ids = _current_trace()
        if ids is not None:
            record["trace_id"], record["span_id"] = ids
        return record

    return stamp


@dataclass(slots=True)
class RecordPipeline:
    """Runs the processors that build an unchained record from one ``append`` call."""

    code_max_bytes: int = 65536
    host: str | None = None
    processors: list[Processor] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.processors:
            self.processors = [normalise, redactor(self.code_max_bytes), bound_lists(), stamper(self.host)]
        if self.processors[0] is not normalise:
            # chain() serialises ``data`` without walking it again: normalise is what made it plain JSON.
            raise ValueError("the first processor of a record pipeline must be normalise")

    def build(
        self,
        event_type: str,
        data: Mapping[str, Any],
        *,
        request_id: str | None,
        principal: str | None,
        policy: Mapping[str, str] | None,
    ) -> Record:
        record: Record = {
            "event_type": event_type,
            "data": data,
            "request_id": request_id,
            "principal": principal,
            "policy": policy,
        }
        for processor in self.processors:
            record = processor(record)
        return record


@dataclass(frozen=True, slots=True)
class SealedRecord:
    """A chained record ready to be written."""

    record: Record
    """The full record as a verifier would parse it (with ``hash`` and ``hmac``)."""
    line: bytes
    """The exact bytes to append, newline included."""
    hash: str
    hmac: str | None


def chain(record: Record, *, seq: int, prev_hash: str, key: bytes | None, timestamp: str | None = None) -> SealedRecord:
    """The chaining processor: runs under the trail lock, so ``seq`` and ``timestamp`` follow write order.

    ``record`` is what :meth:`RecordPipeline.build` returned: its ``data`` is the plain JSON copy
    :func:`normalise` made (and the later processors kept plain), so only the other members are checked here
    before the body is serialised; a float or a non-string key in any of them is refused (:class:`CanonicalError`).
    """
    body_record = dict(record)
    body_record["seq"] = seq
    body_record["prev_hash"] = prev_hash
    body_record["timestamp"] = timestamp if timestamp is not None else utc_timestamp()
    check_json({name: value for name, value in body_record.items() if name != "data"})
    body = canonical_bytes(body_record, checked=True)
    line, digest, mac = seal(body, key)
    full = dict(body_record)
    full["hash"] = digest
    if mac is not None:
        full["hmac"] = mac
    return SealedRecord(full, line, digest, mac)

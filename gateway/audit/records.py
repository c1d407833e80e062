"""Typed, read-only views of audit records, for query and reports.

:func:`view_record` reads one parsed record (a line of the trail, or an entry of
:attr:`MemoryAuditSink.records <gateway.audit.memory.MemoryAuditSink.records>`) into a read-only view chosen
by its ``event_type``: :class:`RequestReceivedView`, :class:`RequestInvalidView`, :class:`PolicyDecisionView`,
:class:`ExecutionOutcomeView`, :class:`ImagePulledView`, :class:`NetworkConnectionView`, or
:class:`GenericRecordView` for the other events.
Every view carries the envelope of :class:`AuditRecordView`; field names follow
``schemas/audit-record.schema.json``.

A view's fields are ``Final``: mypy rejects an assignment to one, and a view (slotted) takes no other
attribute. They are not frozen at run time: a frozen dataclass sets each field through
``object.__setattr__``, ~10 % of the instructions an export spends per record (views are built for every
record a query, report or export reads), where a slotted class stores it directly.

A view never changes the record and never copies it: the nested objects it exposes (``record``, ``data``,
``request``, ``options``) are read-only proxies over the record's own dicts. It checks the type of every
field it reads and raises :class:`~gateway.errors.AuditIntegrityError` naming the record's ``seq`` and the
JSON path of the first field that is missing or of the wrong type (``audit record seq 7:
$.data.decision.allowed: expected a boolean, got string 'yes'``), so a report never silently counts a
malformed record. The fields are read when the view is built, except those that identify a record and say
where it comes from and how it is chained (the envelope's ``event_id``, ``prev_hash``, ``hmac``, ``redacted``,
``trace_id``, ``span_id`` and ``gateway``, a decision's ``decision_id`` and ``options_sha256``): a report never
reads them, so they are properties, read and checked each time they are asked for (the export asks once per
record). A view checks shapes, not the chain: ``gateway audit verify`` is what proves a record is the one
that was written.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from types import MappingProxyType
from typing import Any, Final, NamedTuple

from gateway.audit._fields import FieldReader, describe
from gateway.audit.interface import EVENT_TYPES, SCHEMA_VERSION

__all__ = [
    "NOT_PASSED",
    "AuditRecordView",
    "ExecutionOutcomeView",
    "FileDigestView",
    "GatewayIdentityView",
    "GenericRecordView",
    "ImagePulledView",
    "NetworkConnectionView",
    "PolicyDecisionView",
    "PolicyRefView",
    "ProblemView",
    "RequestInvalidView",
    "RequestReceivedView",
    "RuleResultView",
    "view_record",
]

NOT_PASSED: Final = frozenset({"fail", "error", "warn"})
"""Rule statuses that count as "did not pass" (:attr:`PolicyDecisionView.not_passed`)."""

_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z\Z")


class PolicyRefView(NamedTuple):
    """The policy a record was made under (the envelope's ``policy``)."""

    name: str
    sha256: str
    """sha256 of the policy document in the policy fingerprint format (:mod:`gateway.canonical`)."""


class GatewayIdentityView(NamedTuple):
    """The gateway process that wrote a record (the envelope's ``gateway``)."""

    version: str
    """Package version of the writer."""
    host: str
    pid: int


class RuleResultView(NamedTuple):
    """One rule result of a recorded decision (``got``/``expected`` are left in the record: redacted).

    The small values nested in a view (the policy and writer of the envelope, rule results, file digests,
    problems) are named tuples: as immutable as a frozen dataclass and about five times cheaper to build,
    which counts for the ~25 results of every decision a report or an export reads.
    """

    rule: str
    """Rule id, e.g. ``images.allowlist``."""
    status: str
    """``pass``, ``fail``, ``warn``, ``error`` or ``skip``."""
    mode: str | None
    """``enforce`` or ``audit``; ``None`` when the record does not say."""
    path: str | None
    """JSON path of the request field the rule looked at."""
    message: str | None


class FileDigestView(NamedTuple):
    """A file named by a request or produced by a run: never its contents, only digest and size."""

    name: str
    sha256: str
    bytes: int


class ProblemView(NamedTuple):
    """One reason a request was invalid."""

    path: str
    """JSON path in the request."""
    message: str


@dataclass(slots=True, kw_only=True, unsafe_hash=True)
class AuditRecordView:
    """The envelope every record carries; the base of every view.

    Views compare (and hash) by their fields, ``hash`` included, which covers the whole record
    (``unsafe_hash``: the fields are ``Final``, so a view's hash does not change)."""

    schema: Final[str]
    """Record format version (:data:`~gateway.audit.interface.SCHEMA_VERSION`)."""
    seq: Final[int]
    """Position in the trail, contiguous from 1."""
    event_type: Final[str]
    timestamp: Final[str]
    """When the record was chained: UTC RFC 3339 with microseconds and ``Z`` (sorts as text)."""
    request_id: Final[str | None]
    principal: Final[str | None]
    policy: Final[PolicyRefView | None]
    hash: Final[str]
    record: Final[Mapping[str, Any]] = field(compare=False, repr=False)
    """The whole record, read-only (a proxy over its own dict)."""
    data: Final[Mapping[str, Any]] = field(compare=False, repr=False)
    """The event's ``data``, read-only (a proxy over the record's own dict)."""
    _reader: Final[FieldReader] = field(compare=False, repr=False)
    """The reader the view was built with: its properties read the record's own dicts through it (a proxy's
    reads cost more than a dict's; errors name the record's seq)."""

    @property
    def event_id(self) -> str:
        r = self._reader
        return r.text(r.record, "event_id", "$")

    @property
    def prev_hash(self) -> str:
        r = self._reader
        return r.digest(r.record, "prev_hash", "$")

    @property
    def hmac(self) -> str | None:
        """Present on keyed trails only."""
        r = self._reader
        return r.digest_or_none(r.record, "hmac", "$")

    @property
    def redacted(self) -> tuple[str, ...]:
        """JSON paths that redaction erased or cut."""
        r = self._reader
        return r.texts(r.record, "redacted", "$", required=True)

    @property
    def trace_id(self) -> str | None:
        r = self._reader
        return r.text_or_none(r.record, "trace_id", "$")

    @property
    def span_id(self) -> str | None:
        r = self._reader
        return r.text_or_none(r.record, "span_id", "$")

    @property
    def gateway(self) -> GatewayIdentityView | None:
        """The writer's identity; ``None`` when the record does not carry one (the schema requires it)."""
        r = self._reader
        return _gateway(r, r.record)

    @property
    def images(self) -> frozenset[str]:
        """Every image reference the event names (what ``gateway audit query --image`` matches)."""
        return frozenset()


@dataclass(slots=True, kw_only=True, unsafe_hash=True)
class RequestReceivedView(AuditRecordView):
    """``request.received``: a well-formed request reached the policy engine (redacted)."""

    request: Final[Mapping[str, Any]] = field(compare=False, repr=False)
    """``data.request`` as stored (after redaction), read-only."""
    image: Final[str | None]
    language: Final[str | None]
    runtime: Final[str | None]
    network: Final[str | None]
    code_sha256: Final[str | None]
    """sha256 of the whole code, even when the stored code was cut."""
    code_bytes: Final[int | None]
    code_truncated: Final[bool]
    """Whether the stored code was cut at the cap (``False`` when the record does not say)."""
    env_names: Final[tuple[str, ...]]
    """Names of the environment variables asked for; values are never stored."""
    files: Final[tuple[FileDigestView, ...]]

    @property
    def images(self) -> frozenset[str]:
        return frozenset() if self.image is None else frozenset({self.image})


@dataclass(slots=True, kw_only=True, unsafe_hash=True)
class RequestInvalidView(AuditRecordView):
    """``request.invalid``: a request failed validation before any policy evaluation."""

    problems: Final[tuple[ProblemView, ...]]
    raw_sha256: Final[str]
    """sha256 of the raw request bytes as received."""
    raw_bytes: Final[int]


@dataclass(slots=True, kw_only=True, unsafe_hash=True)
class PolicyDecisionView(AuditRecordView):
    """``policy.decision``: what the policy decided, rule by rule."""

    allowed: Final[bool]
    dry_run: Final[bool]
    """True for ``gateway check`` (nothing was meant to run); ``False`` when the record does not say."""
    results: Final[tuple[RuleResultView, ...]]
    """Every rule result, in the decision's order."""
    violations: Final[tuple[str, ...]]
    """Rule ids of the results that denied (enforce-mode failures and errors)."""
    warnings: Final[tuple[str, ...]]
    """Rule ids of the warn results and audit-mode failures."""
    options: Final[Mapping[str, Any] | None] = field(compare=False, repr=False)
    """The assembled ``containers.create`` arguments as stored (environment values redacted); ``None`` when
    denied."""
    options_image: Final[str | None]
    """``image`` of the stored options."""
    image: Final[str | None]
    """``image`` of the execution plan; ``None`` when denied."""
    runtime: Final[str | None]
    """``runtime`` of the execution plan (``runc``, ``runsc``); ``None`` when denied or not planned."""

    @property
    def images(self) -> frozenset[str]:
        return frozenset(i for i in (self.image, self.options_image) if i is not None)

    @property
    def decision_id(self) -> str | None:
        r = self._reader
        return r.text_or_none(r.record["data"]["decision"], "decision_id", _DECISION)

    @property
    def options_sha256(self) -> str | None:
        """sha256 of the options before redaction, in the run-options format (:mod:`gateway.canonical`)."""
        r = self._reader
        return r.digest_or_none(r.record["data"], "options_sha256", _DATA)

    @property
    def not_passed(self) -> frozenset[str]:
        """Rule ids of the results with a ``fail``, ``error`` or ``warn`` status, and of the violations and
        warnings (results that did not pass, by their definition): what ``gateway audit query --rule`` matches.

        Derived when asked (the query and the export ask, a report does not), not stored."""
        failed = frozenset(result.rule for result in self.results if result.status in NOT_PASSED)
        return failed.union(self.violations, self.warnings)


@dataclass(slots=True, kw_only=True, unsafe_hash=True)
class ExecutionOutcomeView(AuditRecordView):
    """``execution.outcome``: what happened when the sandbox ran (or why it did not)."""

    exit_code: Final[int | None]
    """The program's exit code; ``None`` when it never exited on its own."""
    timed_out: Final[bool]
    oom_killed: Final[bool]
    output_limit_killed: Final[bool]
    """``False`` when the record does not say (as for the other optional kill flags)."""
    resource_killed: Final[bool]
    duration_ms: Final[int]
    container_id: Final[str | None]
    image: Final[str | None]
    image_id: Final[str | None]
    files: Final[tuple[FileDigestView, ...]]
    """Output files collected from ``/workspace/out``."""
    error_code: Final[str | None]
    """Stable code of the gateway or engine error when the run failed for a reason other than the program."""
    error_message: Final[str | None]
    pool: Final[str | None] = None
    """``hit`` / ``miss`` / ``cold``: how the run found its sandbox (warm pool); None in older records."""

    @property
    def images(self) -> frozenset[str]:
        return frozenset() if self.image is None else frozenset({self.image})


@dataclass(slots=True, kw_only=True, unsafe_hash=True)
class ImagePulledView(AuditRecordView):
    """``image.pulled``: an image was pulled under the policy's pull setting."""

    image: Final[str]
    image_id: Final[str]

    @property
    def images(self) -> frozenset[str]:
        return frozenset({self.image})


@dataclass(slots=True, kw_only=True, unsafe_hash=True)
class NetworkConnectionView(AuditRecordView):
    """``network.connection``: one connection (or attempt) a run made through its egress proxy."""

    host: Final[str]
    port: Final[int]
    address: Final[str | None]
    """The resolved address connected to; ``None`` when none was (denied before resolving)."""
    method: Final[str]
    """``CONNECT`` or the plain-HTTP method; empty when the request could not be read."""
    allowed: Final[bool]
    """``data.decision`` is ``allowed``."""
    rule: Final[str]
    message: Final[str | None]
    bytes_out: Final[int]
    bytes_in: Final[int]
    duration_ms: Final[int]
    ended: Final[str]


@dataclass(slots=True, kw_only=True, unsafe_hash=True)
class GenericRecordView(AuditRecordView):
    """Any other event: the envelope, and ``data`` as stored."""


# --- building -----------------------------------------------------------------------------------------


_DATA: Final = "$.data"
_DECISION: Final = "$.data.decision"
_STATUSES: Final = frozenset({"pass", "fail", "warn", "error", "skip"})
_MODES: Final = frozenset({"enforce", "audit"})
_MODES_OR_NULL: Final = frozenset({*_MODES, None})
_DECISIONS: Final = frozenset({"allowed", "denied"})
_RESULT_FIELDS: Final = itemgetter(*RuleResultView._fields)
"""A result's fields in :class:`RuleResultView`'s order, read in one call (``KeyError`` if one is missing)."""

_Envelope = dict[str, Any]
"""The keyword arguments of :class:`AuditRecordView`, read from one record."""


def _policy(r: FieldReader, record: Mapping[str, Any]) -> PolicyRefView | None:
    policy = record.get("policy")
    if policy is None:
        if "policy" not in record:
            raise r.error("$.policy", "missing")
        return None
    if type(policy) is not dict and not isinstance(policy, Mapping):
        raise r.error("$.policy", f"expected an object or null, got {describe(policy)}")
    return PolicyRefView(r.text(policy, "name", "$.policy"), r.digest(policy, "sha256", "$.policy"))


def _gateway(r: FieldReader, record: Mapping[str, Any]) -> GatewayIdentityView | None:
    writer = record.get("gateway")
    if writer is None:
        return None
    if type(writer) is not dict and not isinstance(writer, Mapping):
        raise r.error("$.gateway", f"expected an object or null, got {describe(writer)}")
    return GatewayIdentityView(
        r.text(writer, "version", "$.gateway"),
        r.text(writer, "host", "$.gateway"),
        r.integer(writer, "pid", "$.gateway"),
    )


def _envelope(r: FieldReader, record: Mapping[str, Any]) -> _Envelope:
    seq = r.integer(record, "seq", "$", minimum=1)
    schema = r.text(record, "schema", "$")
    if schema != SCHEMA_VERSION:
        raise r.error("$.schema", f"expected {SCHEMA_VERSION!r}, got {describe(schema)}")
    event_type = r.text(record, "event_type", "$")
    if event_type not in EVENT_TYPES:
        raise r.error("$.event_type", f"expected a known event type, got {describe(event_type)}")
    timestamp = r.text(record, "timestamp", "$")
    if _TIMESTAMP.match(timestamp) is None:
        raise r.error("$.timestamp", f"expected UTC RFC 3339 with microseconds and Z, got {describe(timestamp)}")
    return {
        "schema": schema,
        "seq": seq,
        "event_type": event_type,
        "timestamp": timestamp,
        "request_id": r.text_or_none(record, "request_id", "$", required=True),
        "principal": r.text_or_none(record, "principal", "$", required=True),
        "policy": _policy(r, record),
        "hash": r.digest(record, "hash", "$"),
        "record": MappingProxyType(record),
        "data": r.mapping(record, "data", "$"),
        "_reader": r,
    }


def _files(r: FieldReader, obj: Mapping[str, Any], base: str) -> tuple[FileDigestView, ...]:
    items = r.objects(obj, "files", base)
    if not items:  # most outcomes collect no file
        return ()
    return tuple(
        FileDigestView(r.text(item, "name", at), r.digest(item, "sha256", at), r.integer(item, "bytes", at))
        for at, item in items
    )


def _request_received(r: FieldReader, env: _Envelope, data: Mapping[str, Any]) -> RequestReceivedView:
    request = r.object(data, "request", _DATA)
    base = "$.data.request"
    return RequestReceivedView(
        **env,
        request=MappingProxyType(request),
        image=r.text_or_none(request, "image", base),
        language=r.text_or_none(request, "language", base),
        runtime=r.text_or_none(request, "runtime", base),
        network=r.text_or_none(request, "network", base),
        code_sha256=r.digest_or_none(request, "code_sha256", base),
        code_bytes=r.integer_or_none(request, "code_bytes", base),
        code_truncated=r.flag(request, "code_truncated", base, default=False),
        env_names=r.texts(request, "env_names", base),
        files=_files(r, request, base),
    )


def _request_invalid(r: FieldReader, env: _Envelope, data: Mapping[str, Any]) -> RequestInvalidView:
    return RequestInvalidView(
        **env,
        problems=tuple(
            ProblemView(r.text(item, "path", at), r.text(item, "message", at))
            for at, item in r.objects(data, "problems", _DATA, required=True)
        ),
        raw_sha256=r.digest(data, "raw_sha256", _DATA),
        raw_bytes=r.integer(data, "raw_bytes", _DATA),
    )


def _well_typed(results: tuple[RuleResultView, ...]) -> bool:
    """Whether every result read by the first pass of :func:`_rule_results` has the types of its view."""
    for rule, status, mode, path, message in results:  # a loop: cheaper than all() of a generator
        if not (
            type(rule) is str
            and status in _STATUSES  # raises TypeError for an unhashable value
            and mode in _MODES_OR_NULL
            and (path is None or type(path) is str)
            and (message is None or type(message) is str)
        ):
            return False
    return True


def _rule_results(r: FieldReader, decision: Mapping[str, Any]) -> tuple[RuleResultView, ...]:
    # A decision holds a result per rule (~25) and a report views every decision of a trail. A writer records
    # all five fields of every result, so a first pass builds the views straight from them (``_make`` of what
    # ``_RESULT_FIELDS`` reads, through ``map``: one read per result instead of five, and no ``__new__`` with
    # five arguments) and then checks their types; when it meets what it does not accept (a field missing, an
    # item not an object, a wrong type), the field-by-field reads below run instead and raise the error naming
    # the path, or accept what the first pass did not expect (a result without ``mode`` reads as ``None``).
    items = decision.get("results")
    if type(items) is list:
        try:
            results = tuple(map(RuleResultView._make, map(_RESULT_FIELDS, items)))
            if _well_typed(results):
                return results
        except (KeyError, TypeError):  # a missing field, an item that is not an object, an unhashable status
            pass
    return tuple(
        RuleResultView(
            rule=r.text(item, "rule", at),
            status=r.choice(item, "status", at, _STATUSES),
            mode=r.choice_or_none(item, "mode", at, _MODES),
            path=r.text_or_none(item, "path", at),
            message=r.text_or_none(item, "message", at),
        )
        for at, item in r.objects(decision, "results", _DECISION)
    )


def _rule_ids(r: FieldReader, decision: Mapping[str, Any], group: str) -> tuple[str, ...]:
    """The rule ids of ``violations`` or ``warnings`` (subsets of ``results``; their status is checked too)."""
    rules = []
    for at, item in r.objects(decision, group, _DECISION):
        rules.append(r.text(item, "rule", at))
        r.choice(item, "status", at, _STATUSES)
    return tuple(rules)


def _policy_decision(r: FieldReader, env: _Envelope, data: Mapping[str, Any]) -> PolicyDecisionView:
    decision = r.object(data, "decision", _DATA)
    options = r.mapping_or_none(decision, "options", _DECISION)
    plan = r.mapping_or_none(decision, "plan", _DECISION)
    plan_base = "$.data.decision.plan"
    return PolicyDecisionView(
        **env,
        allowed=r.flag(decision, "allowed", _DECISION),
        dry_run=r.flag(data, "dry_run", _DATA, default=False),
        results=_rule_results(r, decision),
        violations=_rule_ids(r, decision, "violations"),
        warnings=_rule_ids(r, decision, "warnings"),
        options=options,
        options_image=None if options is None else r.text_or_none(options, "image", "$.data.decision.options"),
        image=None if plan is None else r.text_or_none(plan, "image", plan_base),
        runtime=None if plan is None else r.text_or_none(plan, "runtime", plan_base),
    )


def _execution_outcome(r: FieldReader, env: _Envelope, data: Mapping[str, Any]) -> ExecutionOutcomeView:
    error = r.mapping_or_none(data, "error", _DATA)
    return ExecutionOutcomeView(
        **env,
        exit_code=r.integer_or_none(data, "exit_code", _DATA, required=True),
        timed_out=r.flag(data, "timed_out", _DATA),
        oom_killed=r.flag(data, "oom_killed", _DATA),
        output_limit_killed=r.flag(data, "output_limit_killed", _DATA, default=False),
        resource_killed=r.flag(data, "resource_killed", _DATA, default=False),
        duration_ms=r.integer(data, "duration_ms", _DATA),
        container_id=r.text_or_none(data, "container_id", _DATA),
        image=r.text_or_none(data, "image", _DATA),
        image_id=r.text_or_none(data, "image_id", _DATA),
        files=_files(r, data, _DATA),
        error_code=None if error is None else r.text_or_none(error, "code", "$.data.error"),
        error_message=None if error is None else r.text_or_none(error, "message", "$.data.error"),
        pool=r.text_or_none(data, "pool", _DATA),
    )


def _image_pulled(r: FieldReader, env: _Envelope, data: Mapping[str, Any]) -> ImagePulledView:
    return ImagePulledView(**env, image=r.text(data, "image", _DATA), image_id=r.text(data, "image_id", _DATA))


def _network_connection(r: FieldReader, env: _Envelope, data: Mapping[str, Any]) -> NetworkConnectionView:
    return NetworkConnectionView(
        **env,
        host=r.text(data, "host", _DATA),
        port=r.integer(data, "port", _DATA),
        address=r.text_or_none(data, "address", _DATA),
        method=r.text(data, "method", _DATA),
        allowed=r.choice(data, "decision", _DATA, _DECISIONS) == "allowed",
        rule=r.text(data, "rule", _DATA),
        message=r.text_or_none(data, "message", _DATA),
        bytes_out=r.integer(data, "bytes_out", _DATA),
        bytes_in=r.integer(data, "bytes_in", _DATA),
        duration_ms=r.integer(data, "duration_ms", _DATA),
        ended=r.text(data, "ended", _DATA),
    )


def _generic(_r: FieldReader, env: _Envelope, _data: Mapping[str, Any]) -> GenericRecordView:
    return GenericRecordView(**env)


_Builder = Callable[[FieldReader, _Envelope, Mapping[str, Any]], AuditRecordView]
"""Builds one type's view from the reader, the envelope and the record's own ``data`` (not its proxy)."""

_BUILDERS: Final[Mapping[str, _Builder]] = MappingProxyType(
    {
        "request.received": _request_received,
        "request.invalid": _request_invalid,
        "policy.decision": _policy_decision,
        "execution.outcome": _execution_outcome,
        "image.pulled": _image_pulled,
        "network.connection": _network_connection,
    }
)


def view_record(record: Mapping[str, Any]) -> AuditRecordView:
    """The typed view of one parsed record, chosen by its ``event_type``.

    Raises :class:`~gateway.errors.AuditIntegrityError` naming the ``seq`` and the JSON path of the first field
    that is missing or of the wrong type. The record is neither changed nor copied.
    """
    reader = FieldReader(record)
    envelope = _envelope(reader, record)
    data = record["data"]  # checked by _envelope: the builders read the record's own dicts, the view exposes proxies
    return _BUILDERS.get(envelope["event_type"], _generic)(reader, envelope, data)

"""Query a trail: stream records that match filters, one line at a time (constant memory).

Filters combine with AND. ``decision``, ``rule`` and ``dry_run`` select ``policy.decision`` records only: ``rule``
matches a decision in which that rule did not pass (status ``fail``, ``error`` or ``warn``); ``dry_run`` ``True``
the decisions of ``gateway check`` (nothing was meant to run), ``False`` those of real runs. ``policy`` matches
the name of the policy a record was made under (the envelope's ``policy.name``). ``image`` matches the
image named by a request, a decision (plan or options), a pull or an outcome. ``since`` is inclusive,
``until`` exclusive. The filters on ``data`` (decision, rule, image) read each candidate record through its
typed view (:func:`~gateway.audit.records.view_record`): a record without the shape of
``schemas/audit-record.schema.json`` matches none of them. Querying does not verify the chain
(``gateway audit verify`` does); lines that are not complete JSON records (a torn tail) are skipped and
reported to ``on_skip``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.audit.pipeline import utc_timestamp
from gateway.audit.records import AuditRecordView, PolicyDecisionView, view_record
from gateway.audit.segments import list_segments
from gateway.errors import AuditError, AuditIntegrityError

__all__ = ["QueryFilters", "parse_time", "query_trail", "query_trail_lines"]

_DECISIONS = frozenset({"policy.decision"})


def parse_time(value: str | datetime) -> str:
    """Normalise an RFC 3339 time (or a date) to the trail's timestamp text, so strings compare in order."""
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError as exc:
            raise AuditError(f"not an RFC 3339 time: {value!r}") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        return utc_timestamp(moment)
    except OverflowError as exc:  # e.g. 0001-01-01T00:00:00+01:00: before year 1 in UTC
        raise AuditError(f"time out of range once converted to UTC: {value!r}") from exc


@dataclass(frozen=True, slots=True)
class QueryFilters:
    """What to select; ``None`` means no constraint."""

    since: str | None = None
    until: str | None = None
    principal: str | None = None
    decision: str | None = None
    """``"allow"`` or ``"deny"``."""
    rule: str | None = None
    image: str | None = None
    event_types: frozenset[str] | None = None
    request_id: str | None = None
    policy: str | None = None
    """Name of the policy the record was made under."""
    dry_run: bool | None = None
    """``True``: decisions of dry runs (``gateway check``) only; ``False``: decisions of real runs only."""

    _types: frozenset[str] | None = field(init=False, repr=False, compare=False)
    """The event types a matching record can have (``None``: any): ``event_types``, narrowed to decisions by
    ``decision``, ``rule`` and ``dry_run``."""

    def __post_init__(self) -> None:
        if self.decision not in (None, "allow", "deny"):
            raise AuditError(f"decision filter must be 'allow' or 'deny', got {self.decision!r}")
        types = self.event_types
        if self.decision is not None or self.rule is not None or self.dry_run is not None:
            types = _DECISIONS if types is None else types & _DECISIONS
        object.__setattr__(self, "_types", types)  # derived once; the dataclass stays frozen

    def matches(self, record: Mapping[str, Any]) -> bool:
        """Whether a parsed record passes every filter.

        The envelope filters compare the record's flat top-level members directly; the filters on ``data``
        (decision, rule, image) read the record's typed view, so a record whose view cannot be built (not the
        schema's shape) matches none of them.
        """
        ts = record.get("timestamp")
        if self.since is not None and not (isinstance(ts, str) and ts >= self.since):
            return False
        if self.until is not None and not (isinstance(ts, str) and ts < self.until):
            return False
        kind = record.get("event_type")
        if self._types is not None and not (isinstance(kind, str) and kind in self._types):
            return False
        if self.principal is not None and record.get("principal") != self.principal:
            return False
        if self.request_id is not None and record.get("request_id") != self.request_id:
            return False
        if self.policy is not None:
            ref = record.get("policy")
            if not (isinstance(ref, dict) and ref.get("name") == self.policy):
                return False
        if self.decision is None and self.rule is None and self.image is None and self.dry_run is None:
            return True
        try:
            entry = view_record(record)
        except AuditIntegrityError:
            return False
        return self._matches_data(entry)

    def _matches_data(self, entry: AuditRecordView) -> bool:
        if isinstance(entry, PolicyDecisionView):
            if self.decision is not None and entry.allowed is not (self.decision == "allow"):
                return False
            if self.rule is not None and self.rule not in entry.not_passed:
                return False
            if self.dry_run is not None and entry.dry_run is not self.dry_run:
                return False
        elif self.decision is not None or self.rule is not None or self.dry_run is not None:
            return False
        return self.image is None or self.image in entry.images


def query_trail(
    directory: str | Path,
    filters: QueryFilters | None = None,
    *,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    principal: str | None = None,
    decision: str | None = None,
    rule: str | None = None,
    image: str | None = None,
    event_types: Collection[str] | None = None,
    request_id: str | None = None,
    policy: str | None = None,
    dry_run: bool | None = None,
    on_skip: Callable[[str, int], None] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the records of the trail that match, in trail order; ``filters`` or keyword filters."""
    if filters is None:
        filters = QueryFilters(
            since=None if since is None else parse_time(since),
            until=None if until is None else parse_time(until),
            principal=principal,
            decision=decision,
            rule=rule,
            image=image,
            event_types=None if event_types is None else frozenset(event_types),
            request_id=request_id,
            policy=policy,
            dry_run=dry_run,
        )
    return (record for _raw, record in query_trail_lines(directory, filters, on_skip=on_skip))


def query_trail_lines(
    directory: str | Path, filters: QueryFilters, *, on_skip: Callable[[str, int], None] | None = None
) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """Like :func:`query_trail`, but each match with its line exactly as stored (newline included), so that
    a reader (``GET /v1/audit/records``) can re-check its hash. Raises :class:`AuditError` at once when
    ``directory`` is not a trail directory; the lines are read lazily."""
    root = Path(directory)
    if not root.is_dir():
        raise AuditError(f"no audit trail directory at {root}")
    return _scan(root, filters, on_skip)


def _scan(
    root: Path, filters: QueryFilters, on_skip: Callable[[str, int], None] | None
) -> Iterator[tuple[bytes, dict[str, Any]]]:
    needles: list[bytes] = []  # cheap byte pre-filter before parsing: exact JSON strings that must appear
    for value in (filters.principal, filters.request_id, filters.rule, filters.image, filters.policy):
        if value is not None:
            needles.append(json.dumps(value).encode("ascii"))
    for _index, path in list_segments(root):
        with path.open("rb", buffering=1 << 20) as fh:
            for line_no, raw in enumerate(fh, start=1):
                if needles and not all(n in raw for n in needles):
                    continue
                try:
                    record = json.loads(raw)
                except ValueError:
                    if on_skip is not None:
                        on_skip(path.name, line_no)
                    continue
                if isinstance(record, dict) and filters.matches(record):
                    yield raw, record

"""The streaming aggregate: records in (typed views), a :class:`~gateway.report.model.Report`'s sections out.

Memory is bounded whatever the trail's length: counters keyed by things that are few (principals, policies,
rules, images, exit and error codes; each map capped at :data:`MAX_KEYS`, the rest counted together), a
fixed log histogram for duration percentiles, activity buckets whose width grows so that there are at most
:data:`MAX_BUCKETS`, a few example messages per rule, the first :data:`DENIED_CAP` denied requests (the
count of all is kept), and egress connections by host and by principal (hosts capped like the other keys) with
the first few denied attempts of each denying rule.

Aggregates of disjoint parts of the trails (one per segment, in worker processes) :meth:`Aggregate.merge`
into the aggregate of the whole, whatever the order: every choice is independent of the order the records
came in (the example messages are the smallest distinct ones, the lists keep the first records by
``(timestamp, trail, seq)``, the activity width is the smallest that fits), except which keys are tracked
one by one once a map holds :data:`MAX_KEYS`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from gateway.audit.interrupted import INTERRUPTED
from gateway.audit.records import (
    NOT_PASSED,
    AuditRecordView,
    ExecutionOutcomeView,
    GenericRecordView,
    NetworkConnectionView,
    PolicyDecisionView,
    RequestInvalidView,
)
from gateway.report.controls import ControlTally, Order, execution_facts, load_catalogue
from gateway.report.model import (
    ActivityBucket,
    ControlRow,
    Controls,
    Denied,
    DeniedRow,
    Durations,
    Egress,
    EgressDeniedRule,
    EgressExample,
    EgressRow,
    ImageRow,
    Outcomes,
    PolicyReport,
    PolicyReportResult,
    PolicyRow,
    PrincipalRow,
    RuleRow,
)
from gateway.sbom import sbom_digest_for_image

__all__ = ["DENIED_CAP", "MAX_BUCKETS", "MAX_KEYS", "Aggregate", "DurationHistogram"]

MAX_KEYS: Final = 1000
"""Distinct principals, policies, rules, images or codes tracked one by one; beyond, counted as ``(other)``."""
MAX_BUCKETS: Final = 120
"""Activity buckets at most: the bucket width steps up a ladder of round widths until the period fits."""
DENIED_CAP: Final = 1000
"""Denied requests listed one by one (the first in time order); the total is always exact."""
EXAMPLES: Final = 3
"""Distinct example messages kept per rule."""
OTHER: Final = "(other)"
_WIDTHS: Final = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400, 30 * 86400, 365 * 86400)
_RANK: Final = {"skip": 0, "pass": 1, "warn": 2, "fail": 3, "error": 4}


class DurationHistogram:
    """Fixed log buckets (ratio 1.02: a percentile is within 2 % of the true value); exact count, min, max, sum."""

    _LOG = math.log(1.02)

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.count = 0
        self.total = 0
        self.low: int | None = None
        self.high: int | None = None

    def add(self, ms: int) -> None:
        self.buckets[int(math.log(ms + 1) / self._LOG)] += 1
        self.count += 1
        self.total += ms
        self.low = ms if self.low is None or ms < self.low else self.low
        self.high = ms if self.high is None or ms > self.high else self.high

    def percentile(self, q: float) -> int | None:
        """The upper bound of the bucket holding the ``q``-quantile (clamped to the exact min and max)."""
        if self.count == 0 or self.low is None or self.high is None:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for index in sorted(self.buckets):
            seen += self.buckets[index]
            if seen >= rank:
                value = round(math.exp((index + 1) * self._LOG) - 1)
                return min(max(value, self.low), self.high)
        return self.high

    def result(self) -> Durations:
        mean = None if self.count == 0 else round(self.total / self.count)
        p = self.percentile
        return Durations(self.count, self.low, self.high, mean, p(0.5), p(0.9), p(0.95), p(0.99))


def _capped(counter: Mapping[Any, Any], key: Any) -> Any:
    """``key``, or :data:`OTHER` when the map is full and does not hold it."""
    return key if key in counter or len(counter) < MAX_KEYS else OTHER


def _epoch(timestamp: str) -> int:
    return int(datetime.strptime(timestamp[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp())


def _iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class _Who:
    allowed: int = 0
    denied: int = 0
    invalid: int = 0
    errors: int = 0
    dry_runs: int = 0


@dataclass(slots=True)
class _Policy:
    first: str
    last: str
    decisions: int = 0
    loaded: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Rule:
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, message: str | None) -> None:
        self.count += 1
        if message:
            self.offer(message[:300])

    def offer(self, message: str) -> None:
        """Keep the :data:`EXAMPLES` smallest distinct messages (the same whatever the order)."""
        examples = self.examples
        if message in examples or (len(examples) >= EXAMPLES and message >= examples[-1]):
            return
        examples.append(message)
        examples.sort()
        del examples[EXAMPLES:]

    def merge(self, other: _Rule) -> None:
        self.count += other.count
        for message in other.examples:
            self.offer(message)


@dataclass(slots=True)
class _Flow:
    """One host's or principal's connections: allowed, denied, bytes out, bytes in."""

    connections: int = 0
    denied: int = 0
    bytes_out: int = 0
    bytes_in: int = 0

    def merge(self, other: _Flow) -> None:
        self.connections += other.connections
        self.denied += other.denied
        self.bytes_out += other.bytes_out
        self.bytes_in += other.bytes_in


@dataclass(slots=True)
class _Refusals:
    """One denying rule's attempts: the count, and the first :data:`EXAMPLES` in ``(timestamp, trail, seq)`` order."""

    count: int = 0
    examples: list[tuple[Order, EgressExample]] = field(default_factory=list)

    def offer(self, order: Order, example: EgressExample) -> None:
        self.examples = sorted([*self.examples, (order, example)])[:EXAMPLES]

    def merge(self, other: _Refusals) -> None:
        self.count += other.count
        self.examples = sorted(self.examples + other.examples)[:EXAMPLES]


class _Activity:
    def __init__(self) -> None:
        self.width = _WIDTHS[0]
        self.buckets: dict[int, list[int]] = {}
        self._last_minute = ""
        self._last_epoch = 0

    def add(self, timestamp: str, column: int) -> None:
        minute = timestamp[:16]
        if minute != self._last_minute:  # records come in time order: one parse per minute of trail
            self._last_minute, self._last_epoch = minute, _epoch(timestamp[:16] + ":00")
        key = self._last_epoch - self._last_epoch % self.width
        row = self.buckets.get(key)
        if row is None:
            row = self.buckets[key] = [0, 0, 0, 0]
            self._fit()
            row = self.buckets[self._last_epoch - self._last_epoch % self.width]
        row[column] += 1

    def _fit(self) -> None:
        while len(self.buckets) > MAX_BUCKETS and self.width != _WIDTHS[-1]:
            self.width = _WIDTHS[_WIDTHS.index(self.width) + 1]
            merged: dict[int, list[int]] = {}
            for key, row in self.buckets.items():
                into = merged.setdefault(key - key % self.width, [0, 0, 0, 0])
                for i, n in enumerate(row):
                    into[i] += n
            self.buckets = merged

    def merge(self, other: _Activity) -> None:
        width = max(self.width, other.width)
        merged: dict[int, list[int]] = {}
        for buckets in (self.buckets, other.buckets):
            for key, row in buckets.items():
                into = merged.setdefault(key - key % width, [0, 0, 0, 0])
                for i, n in enumerate(row):
                    into[i] += n
        self.width, self.buckets = width, merged
        self._last_minute = ""
        self._fit()

    def result(self) -> tuple[ActivityBucket, ...]:
        return tuple(ActivityBucket(_iso(k), *row) for k, row in sorted(self.buckets.items()))


class Aggregate:
    """Feed it views in time order (:meth:`add`); read the sections at the end."""

    def __init__(self, *, denied_cap: int = DENIED_CAP) -> None:
        self.catalogue = load_catalogue()
        self.tally = ControlTally(self.catalogue)
        self.denied_cap = denied_cap
        self.records = 0
        self.first: str | None = None
        self.last: str | None = None
        self.allowed = self.denied = self.invalid = self.errors = self.dry_runs = self.refused = 0
        self.executions = 0
        self.who: dict[str, _Who] = {}
        self.policies: dict[tuple[str, str], _Policy] = {}
        self.denials: dict[str, _Rule] = {}
        self.warnings: dict[str, _Rule] = {}
        self.images: Counter[Any] = Counter()
        """``(image, image id)`` or :data:`OTHER`."""
        self.exit_codes: Counter[Any] = Counter()
        """Exit code (``None``: no exit of its own) or :data:`OTHER`."""
        self.error_codes: Counter[str] = Counter()
        self.timed_out = self.oom_killed = self.truncated = self.output_killed = self.resource_killed = 0
        self.durations = DurationHistogram()
        self.activity = _Activity()
        self.denied_rows: list[tuple[Order, DeniedRow]] = []
        self.rules: dict[str, dict[str, dict[str, int]]] = {}
        """Per policy name, per rule id (:data:`OTHER` beyond :data:`MAX_KEYS` rules in all): the number of
        results of each status (an audit-mode failure counts as ``warn``)."""
        self.rule_count = 0
        """Rules in :attr:`rules`, over every policy."""
        self.rule_messages: dict[tuple[str, str], str] = {}
        """Per ``(policy, rule)`` of :attr:`rules`, the smallest message of a result that did not pass."""
        self.egress = [0, 0, 0, 0, 0, 0]
        """The egress totals of the outcomes: runs, connections, denied, bytes out, bytes in, records dropped."""
        self.egress_hosts: dict[str, _Flow] = {}
        self.egress_principals: dict[str, _Flow] = {}
        self.egress_refusals: dict[str, _Refusals] = {}
        """Denied connection attempts by rule."""

    # --- feeding --------------------------------------------------------------------------------------

    def _principal(self, name: str | None) -> _Who:
        key = _capped(self.who, name or "(none)")
        row = self.who.get(key)
        if row is None:
            row = self.who[key] = _Who()
        return row

    def _seen_policy(self, view: AuditRecordView, *, decision: bool) -> None:
        ref = view.policy
        if ref is None:
            return
        key = _capped(self.policies, (ref.name, ref.sha256))
        if key == OTHER:
            key = (OTHER, "")
        row = self.policies.get(key)
        if row is None:
            row = self.policies[key] = _Policy(view.timestamp, view.timestamp)
        row.last = view.timestamp
        if decision:
            row.decisions += 1

    def add(self, view: AuditRecordView, trail: int = 0) -> None:
        """Count one record of trail number ``trail``; records of one trail come in ``seq`` order."""
        self.records += 1
        if self.first is None or view.timestamp < self.first:
            self.first = view.timestamp
        if self.last is None or view.timestamp > self.last:
            self.last = view.timestamp
        if isinstance(view, PolicyDecisionView):
            self._decision(view, (view.timestamp, trail, view.seq))
        elif isinstance(view, ExecutionOutcomeView):
            self._outcome(view)
        elif isinstance(view, NetworkConnectionView):
            self._connection(view, (view.timestamp, trail, view.seq))
        elif isinstance(view, RequestInvalidView):
            self.invalid += 1
            self._principal(view.principal).invalid += 1
            self.activity.add(view.timestamp, 2)
        elif isinstance(view, GenericRecordView):
            self._generic(view)

    def _generic(self, view: GenericRecordView) -> None:
        kind = view.event_type
        if kind == "request.refused":  # a summary record stands for `count` refusals
            count = view.data.get("count")
            self.refused += count if type(count) is int and count >= 1 else 1
        elif kind in ("policy.loaded", "policy.reloaded"):
            name, sha = view.data.get("name"), view.data.get("sha256")
            if isinstance(name, str) and isinstance(sha, str):
                key = _capped(self.policies, (name, sha))
                if key != OTHER:
                    row = self.policies.get(key)
                    if row is None:
                        row = self.policies[key] = _Policy(view.timestamp, view.timestamp)
                    if len(row.loaded) < EXAMPLES * 4:
                        row.loaded.append(view.timestamp)
            return
        self._seen_policy(view, decision=False)

    def _connection(self, view: NetworkConnectionView, order: Order) -> None:
        self._seen_policy(view, decision=False)
        for flows, key in ((self.egress_hosts, view.host), (self.egress_principals, view.principal or "(none)")):
            flow = flows.setdefault(_capped(flows, key), _Flow())
            flow.connections += view.allowed
            flow.denied += not view.allowed
            flow.bytes_out += view.bytes_out
            flow.bytes_in += view.bytes_in
        if not view.allowed:
            refusals = self.egress_refusals
            rule = refusals.setdefault(_capped(refusals, view.rule), _Refusals())
            rule.count += 1
            if len(rule.examples) < EXAMPLES or order < rule.examples[-1][0]:
                rule.offer(order, EgressExample(view.timestamp, view.principal, view.host, view.port, view.request_id))

    def _decision(self, view: PolicyDecisionView, order: Order) -> None:
        self._seen_policy(view, decision=True)
        who = self._principal(view.principal)
        policy_name = view.policy.name if view.policy is not None else "(none)"
        rules = self.rules.get(policy_name)
        if rules is None:
            rules = self.rules[policy_name] = {}
        messages: dict[str, str | None] = {}  # per rule, its last result that did not pass: the examples
        for result in view.results:
            counts = rules.get(result.rule)
            if counts is None:
                counts = self._rule_counts(rules, result.rule)
            status = result.status
            if status not in NOT_PASSED:  # most results: a count is all they add
                counts[status] += 1
                continue
            messages[result.rule] = result.message
            if status == "fail" and result.mode == "audit":
                status = "warn"
            counts[status] += 1
            if result.message:
                key = (policy_name, result.rule if result.rule in rules else OTHER)
                message = result.message[:300]
                if key not in self.rule_messages or message < self.rule_messages[key]:
                    self.rule_messages[key] = message
        if view.dry_run:
            self.dry_runs += 1
            who.dry_runs += 1
            return
        for rule in view.warnings:
            self._rule(self.warnings, rule).add(messages.get(rule))
        if view.allowed:
            self.allowed += 1
            who.allowed += 1
            self.activity.add(view.timestamp, 0)
            if view.options is not None:
                plan = view.data["decision"].get("plan")
                facts = execution_facts(view.options, plan if isinstance(plan, Mapping) else None)
                self.tally.add(order, view.request_id, facts)
            return
        self.denied += 1
        who.denied += 1
        self.activity.add(view.timestamp, 1)
        for rule in dict.fromkeys(view.violations):
            self._rule(self.denials, rule).add(messages.get(rule))
        if len(self.denied_rows) < self.denied_cap:
            self.denied_rows.append(
                (
                    order,
                    DeniedRow(
                        view.timestamp,
                        view.principal,
                        None if view.policy is None else view.policy.name,
                        tuple(dict.fromkeys(view.violations)),
                        view.request_id,
                    ),
                )
            )

    def _rule_counts(self, rules: dict[str, dict[str, int]], rule: str) -> dict[str, int]:
        """The status counts of a rule not yet in ``rules`` (one policy's): new, or :data:`OTHER`'s once
        :data:`MAX_KEYS` rules are tracked."""
        if self.rule_count >= MAX_KEYS:
            rule = OTHER
            if rule in rules:
                return rules[rule]
        self.rule_count += 1
        counts = rules[rule] = dict.fromkeys(_RANK, 0)
        return counts

    @staticmethod
    def _rule(rules: dict[str, _Rule], rule: str) -> _Rule:
        key = _capped(rules, rule)
        row = rules.get(key)
        if row is None:
            row = rules[key] = _Rule()
        return row

    def _outcome(self, view: ExecutionOutcomeView) -> None:
        self._seen_policy(view, decision=False)
        self.executions += 1
        if view.error_code != INTERRUPTED:  # its gateway died mid-run: how long it ran is unknown (recorded as 0)
            self.durations.add(view.duration_ms)
        self.exit_codes[_capped(self.exit_codes, view.exit_code)] += 1
        self.timed_out += view.timed_out
        self.oom_killed += view.oom_killed
        self.output_killed += view.output_limit_killed
        self.resource_killed += view.resource_killed
        data = view.data
        if any(isinstance(s, Mapping) and s.get("truncated") is True for s in (data.get("stdout"), data.get("stderr"))):
            self.truncated += 1
        if view.image is not None:
            self.images[_capped(self.images, (view.image, view.image_id))] += 1
        egress = data.get("egress")
        if isinstance(egress, Mapping):  # checked by the schema, read defensively like the streams above
            counts = [egress.get(k) for k in ("connections", "denied", "bytes_out", "bytes_in", "records_dropped")]
            totals = self.egress
            totals[0] += 1
            for index, n in enumerate(counts, start=1):
                totals[index] += n if type(n) is int and n >= 0 else 0
        if view.error_code is not None:
            self.errors += 1
            self._principal(view.principal).errors += 1
            self.error_codes[_capped(self.error_codes, view.error_code)] += 1
            self.activity.add(view.timestamp, 3)

    # --- merging --------------------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {name: value for name, value in self.__dict__.items() if name != "catalogue"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.catalogue = load_catalogue()

    def merge(self, other: Aggregate) -> None:
        """Add the aggregate of another, disjoint part of the trails."""
        self.records += other.records
        self.first = min(t for t in (self.first, other.first) if t is not None) if other.first else self.first
        self.last = max(t for t in (self.last, other.last) if t is not None) if other.last else self.last
        for name in ("allowed", "denied", "invalid", "errors", "dry_runs", "refused", "executions", "timed_out",
                     "oom_killed", "truncated", "output_killed", "resource_killed"):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name_key, who in other.who.items():
            mine = self.who.setdefault(_capped(self.who, name_key), _Who())
            for name in ("allowed", "denied", "invalid", "errors", "dry_runs"):
                setattr(mine, name, getattr(mine, name) + getattr(who, name))
        for ref, pol in other.policies.items():
            target = ref if ref in self.policies or len(self.policies) < MAX_KEYS else (OTHER, "")
            if target not in self.policies:
                self.policies[target] = _Policy(pol.first, pol.last, 0, [])
            row = self.policies[target]
            row.first, row.last = min(row.first, pol.first), max(row.last, pol.last)
            row.decisions += pol.decisions
            row.loaded = sorted(row.loaded + pol.loaded)[: EXAMPLES * 4]
        for mine_rules, theirs in ((self.denials, other.denials), (self.warnings, other.warnings)):
            for rule, counted in theirs.items():
                self._rule(mine_rules, rule).merge(counted)
        for counter, theirs_counter in ((self.images, other.images), (self.exit_codes, other.exit_codes),
                                        (self.error_codes, other.error_codes)):  # fmt: skip
            for code, n in theirs_counter.items():
                counter[_capped(counter, code)] += n
        hist, theirs_hist = self.durations, other.durations
        hist.buckets.update(theirs_hist.buckets)
        hist.count += theirs_hist.count
        hist.total += theirs_hist.total
        for value in (theirs_hist.low, theirs_hist.high):
            if value is not None:
                hist.low = value if hist.low is None or value < hist.low else hist.low
                hist.high = value if hist.high is None or value > hist.high else hist.high
        self.activity.merge(other.activity)
        self.denied_rows = sorted(self.denied_rows + other.denied_rows)[: self.denied_cap]
        for policy_name, their_rules in other.rules.items():
            rules = self.rules.setdefault(policy_name, {})
            for rule, their_counts in their_rules.items():
                counts = rules.get(rule)
                if counts is None:
                    counts = self._rule_counts(rules, rule)
                for status, n in their_counts.items():
                    counts[status] += n
        for rule_key, message in other.rule_messages.items():
            if rule_key not in self.rule_messages or message < self.rule_messages[rule_key]:
                self.rule_messages[rule_key] = message
        self.tally.merge(other.tally)
        self.egress = [a + b for a, b in zip(self.egress, other.egress, strict=True)]
        for mine_flows, their_flows in ((self.egress_hosts, other.egress_hosts),
                                        (self.egress_principals, other.egress_principals)):  # fmt: skip
            for key, flow in their_flows.items():
                mine_flows.setdefault(_capped(mine_flows, key), _Flow()).merge(flow)
        for rule_id, refusals in other.egress_refusals.items():
            self.egress_refusals.setdefault(_capped(self.egress_refusals, rule_id), _Refusals()).merge(refusals)

    # --- results --------------------------------------------------------------------------------------

    def principals(self) -> tuple[tuple[PrincipalRow, ...], int]:
        rows = []
        omitted = 0
        for name, w in self.who.items():
            if name == OTHER:
                omitted = w.allowed + w.denied + w.invalid
            requests = w.allowed + w.denied + w.invalid
            rows.append(PrincipalRow(name, requests, w.allowed, w.denied, w.invalid, w.errors, w.dry_runs))
        rows.sort(key=lambda r: (-r.requests, -r.dry_runs, r.principal))
        return tuple(rows), omitted

    def policy_rows(self) -> tuple[PolicyRow, ...]:
        rows = [
            PolicyRow(name, sha, p.first, p.last, p.decisions, tuple(p.loaded))
            for (name, sha), p in self.policies.items()
        ]
        rows.sort(key=lambda r: (r.first_seen, r.name, r.sha256))
        return tuple(rows)

    @staticmethod
    def rule_rows(rules: dict[str, _Rule]) -> tuple[RuleRow, ...]:
        rows = [RuleRow(rule, r.count, tuple(r.examples)) for rule, r in rules.items()]
        rows.sort(key=lambda r: (-r.count, r.rule))
        return tuple(rows)

    def image_rows(self) -> tuple[ImageRow, ...]:
        rows = []
        for key, n in self.images.items():
            image, image_id = (OTHER, None) if key == OTHER else key
            rows.append(ImageRow(image, image_id, n, sbom_digest_for_image(image_id) if image_id else None))
        rows.sort(key=lambda r: (-r.executions, r.image, r.image_id or ""))
        return tuple(rows)

    def outcomes(self) -> Outcomes:
        codes = sorted(self.exit_codes.items(), key=lambda kv: (-kv[1], -1 if kv[0] is None else kv[0]))
        errors = sorted(self.error_codes.items(), key=lambda kv: (-kv[1], kv[0]))
        return Outcomes(
            self.executions,
            tuple((None if c == OTHER else c, n) for c, n in codes),
            self.timed_out,
            self.oom_killed,
            self.truncated,
            self.output_killed,
            self.resource_killed,
            tuple(errors),
        )

    def denied_list(self) -> Denied:
        return Denied(self.denied, tuple(row for _order, row in self.denied_rows), self.denied_cap)

    def controls(self) -> Controls:
        rows = tuple(
            ControlRow(
                id=r["id"],
                number=r["number"],
                title=r["title"],
                status=r["status"],
                evidence=r["evidence"],
                executions_checked=r["executions_checked"],
                executions_failed=r["executions_failed"],
                executions_unproven=r["executions_unproven"],
                offending_requests=tuple(r["offending_requests"]),
                offending_omitted=r["offending_omitted"],
            )
            for r in self.tally.results()
        )
        c = self.catalogue
        return Controls(c.benchmark, c.version, c.section, self.tally.executions, rows)

    def egress_section(self) -> Egress:
        def rows(flows: dict[str, _Flow]) -> tuple[EgressRow, ...]:
            made = [EgressRow(k, f.connections, f.denied, f.bytes_out, f.bytes_in) for k, f in flows.items()]
            made.sort(key=lambda r: (-r.connections - r.denied, -r.bytes_in - r.bytes_out, r.name))
            return tuple(made)

        refusals = [
            EgressDeniedRule(rule, r.count, tuple(example for _order, example in r.examples))
            for rule, r in self.egress_refusals.items()
        ]
        refusals.sort(key=lambda r: (-r.count, r.rule))
        runs, connections, denied, bytes_out, bytes_in, dropped = self.egress
        return Egress(
            runs, connections, denied, bytes_out, bytes_in, dropped,
            rows(self.egress_hosts), rows(self.egress_principals), tuple(refusals),
        )  # fmt: skip

    def policy_report(self, name: str) -> PolicyReport:
        results = []
        for policy, rules in sorted(self.rules.items()):
            for rule, counts in sorted(rules.items()):
                results.append(self._policy_report_result(policy, rule, counts))
        return PolicyReport(name, tuple(results))

    def _policy_report_result(self, policy: str, rule: str, counts: dict[str, int]) -> PolicyReportResult:
        worst = max((s for s, n in counts.items() if n), key=lambda s: _RANK[s])
        total = sum(counts.values())
        message = self.rule_messages.get((policy, rule)) or f"{rule}: {counts['pass']} of {total} passed"
        ordered = tuple((s, counts[s]) for s in ("pass", "fail", "warn", "error", "skip") if counts[s])
        return PolicyReportResult(policy, rule, worst, ordered, message)

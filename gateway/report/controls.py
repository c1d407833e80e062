"""Control evidence: the CIS Docker Benchmark section 5 catalogue (one data file) judged per execution.

The catalogue (``cis-docker-<version>.json`` next to this module) is data: each control has its number and
title and either a ``check`` in a small vocabulary over the recorded run options, ``unproven`` (no run option
can prove it), or ``not_applicable`` (it does not concern a per-execution run option). This module interprets
that vocabulary; it knows no control by number.

An execution is an allowed ``policy.decision`` of a real run (not a dry run): its ``data.decision.options`` are
the ``containers.create`` arguments the backend submitted, recorded before anything ran. A control is
``enforced`` for a period only if the options of *every* execution in it pass the check; ``violated`` lists
the request ids of the ones that did not (the first :data:`MAX_OFFENDING`, with the count of all);
``unproven`` when the check cannot prove it (always, or for the executions that ran under a condition named by
``unproven_when``, e.g. gVisor) and nothing violated it; ``not_applicable`` when the catalogue says so or no
execution ran in the period.

The check vocabulary (``key`` is a top-level run option, or a derived list: ``$mount_sources`` every host
path a mount names, the staged bind, a volume, a bind or the judged path behind a staged bind;
``$mount_propagations`` every mount's propagation):

``absent_or_in``      the key is absent or its value is one of ``values``
``absent_or_not_in``  the key is absent or its value is none of ``values``
``present_not_in``    the key is present and its value is none of ``values``
``equals``            the value is ``value``
``contains``          the value is a list holding ``value``
``empty``             the key is absent, null, or an empty list, object or string
``positive``          a number > 0, or a non-empty list or object
``no_item_matches``   no string item (or the string value) fully matches the regular expression ``pattern``
``all`` / ``any``     every / some check of ``of``
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final

from gateway.errors import GatewayError

__all__ = [
    "CATALOGUE_FILE",
    "MAX_OFFENDING",
    "STATUSES",
    "Catalogue",
    "CatalogueError",
    "Control",
    "ControlTally",
    "execution_facts",
    "load_catalogue",
]

CATALOGUE_FILE: Final = Path(__file__).with_name("cis-docker-1.6.0.json")
"""The one catalogue file: CIS Docker Benchmark v1.6.0, section 5."""
MAX_OFFENDING: Final = 50
"""Request ids listed per violated control (the count of all is kept)."""
STATUSES: Final = ("enforced", "violated", "unproven", "not_applicable")

Facts = Mapping[str, Any]
Check = Callable[[Facts], bool]


class CatalogueError(GatewayError):
    """The control catalogue does not have the expected shape (a packaging or editing mistake)."""

    code = "report.catalogue"
    hint = "restore gateway/report/cis-docker-1.6.0.json from the release"


_ABSENT: Final = object()


def _empty(value: Any) -> bool:
    return value is _ABSENT or value is None or (isinstance(value, (list, dict, str, tuple)) and len(value) == 0)


def _positive(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return value > 0
    if isinstance(value, str):  # a caller-supplied number recorded as its decimal string
        try:
            return float(value) > 0
        except ValueError:
            return False
    return isinstance(value, (list, dict, tuple)) and len(value) > 0


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, str)]
    return []


def _compile(spec: Any, where: str) -> Check:
    """One check of the catalogue as a function of the facts: the spec is read here, once, not per execution."""
    if not isinstance(spec, dict) or not isinstance(spec.get("op"), str):
        raise CatalogueError(f"{CATALOGUE_FILE.name}: {where}: a check is an object with an 'op'")
    op = spec["op"]
    key = spec.get("key")
    if op in ("all", "any"):
        parts = tuple(_compile(item, f"{where}.of[{i}]") for i, item in enumerate(spec.get("of") or []))
        if not parts:
            raise CatalogueError(f"{CATALOGUE_FILE.name}: {where}: '{op}' needs a non-empty 'of'")
        return _all(parts) if op == "all" else _any(parts)
    if not isinstance(key, str):
        raise CatalogueError(f"{CATALOGUE_FILE.name}: {where}: '{op}' needs a 'key'")
    values = spec.get("values", [])
    want = spec.get("value")

    def absent_or_in(f: Facts) -> bool:
        value = f.get(key, _ABSENT)
        return value is _ABSENT or value in values

    def absent_or_not_in(f: Facts) -> bool:
        value = f.get(key, _ABSENT)
        return value is _ABSENT or value not in values

    def present_not_in(f: Facts) -> bool:
        value = f.get(key, _ABSENT)
        return value is not _ABSENT and value not in values

    def equals(f: Facts) -> bool:
        value = f.get(key, _ABSENT)
        return value == want and type(value) is type(want)

    def contains(f: Facts) -> bool:
        value = f.get(key)
        return isinstance(value, list) and want in value

    def empty(f: Facts) -> bool:
        return _empty(f.get(key, _ABSENT))

    def positive(f: Facts) -> bool:
        return _positive(f.get(key, _ABSENT))

    checks: dict[str, Check] = {
        "absent_or_in": absent_or_in,
        "absent_or_not_in": absent_or_not_in,
        "present_not_in": present_not_in,
        "equals": equals,
        "contains": contains,
        "empty": empty,
        "positive": positive,
    }
    if op == "no_item_matches":
        return _no_item_matches(key, re.compile(str(spec.get("pattern"))))
    if op not in checks:
        raise CatalogueError(f"{CATALOGUE_FILE.name}: {where}: unknown op {op!r}")
    return checks[op]


def _all(parts: tuple[Check, ...]) -> Check:
    def every(f: Facts) -> bool:
        for part in parts:  # noqa: SIM110 - all() of a generator: a fifth more for the whole tally
            if not part(f):
                return False
        return True

    return every


def _any(parts: tuple[Check, ...]) -> Check:
    def some(f: Facts) -> bool:
        for part in parts:  # noqa: SIM110 - as in _all
            if part(f):
                return True
        return False

    return some


def _no_item_matches(key: str, pattern: re.Pattern[str]) -> Check:
    def no_item_matches(f: Facts) -> bool:
        value = f.get(key)
        if isinstance(value, str):
            return pattern.fullmatch(value) is None
        if isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, str) and pattern.fullmatch(item) is not None:
                    return False
        return True

    return no_item_matches


@dataclass(frozen=True, slots=True)
class Control:
    """One control of the catalogue."""

    id: str
    """``CIS-Docker-<version>-5.<n>``."""
    number: str
    title: str
    evidence: str
    """What the check reads (or why it cannot be checked)."""
    check: Check | None
    unproven: str | None
    """Why no run option can prove it (status ``unproven`` whatever ran)."""
    not_applicable: str | None
    unproven_key: str | None
    unproven_values: tuple[Any, ...]
    unproven_why: str | None


@dataclass(frozen=True, slots=True)
class Catalogue:
    benchmark: str
    version: str
    section: str
    controls: tuple[Control, ...]


@cache
def load_catalogue(path: Path = CATALOGUE_FILE) -> Catalogue:
    """The catalogue file, its checks compiled once."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CatalogueError(f"cannot read the control catalogue {path}: {exc}") from exc
    version = str(raw.get("version", ""))
    controls = []
    for index, entry in enumerate(raw.get("controls") or []):
        where = f"$.controls[{index}]"
        number = entry.get("number")
        title = entry.get("title")
        if not isinstance(number, str) or not number.startswith("5.") or not isinstance(title, str):
            raise CatalogueError(f"{path.name}: {where}: every control has a number 5.<n> and a title")
        check = _compile(entry["check"], f"{where}.check") if "check" in entry else None
        unproven = entry.get("unproven")
        not_applicable = entry.get("not_applicable")
        if [check is not None, unproven is not None, not_applicable is not None].count(True) != 1:
            raise CatalogueError(f"{path.name}: {where}: give exactly one of check, unproven, not_applicable")
        when = entry.get("unproven_when") or {}
        controls.append(
            Control(
                id=f"CIS-Docker-{version}-{number}",
                number=number,
                title=title,
                evidence=str(entry.get("evidence") or unproven or not_applicable),
                check=check,
                unproven=unproven,
                not_applicable=not_applicable,
                unproven_key=when.get("key"),
                unproven_values=tuple(when.get("values") or ()),
                unproven_why=when.get("why"),
            )
        )
    if not controls or len({c.id for c in controls}) != len(controls):
        raise CatalogueError(f"{path.name}: the catalogue needs controls with distinct numbers")
    return Catalogue(str(raw.get("benchmark", "")), version, str(raw.get("section", "")), tuple(controls))


def _mount_facts(options: Mapping[str, Any], plan_mounts: Sequence[Any]) -> tuple[list[str], list[str]]:
    sources: list[str] = []
    propagations: list[str] = []
    for mount in options.get("mounts") or ():
        if isinstance(mount, Mapping):
            sources.extend(_strings(mount.get("Source")))
            bind = mount.get("BindOptions")
            if isinstance(bind, Mapping):
                propagations.extend(_strings(bind.get("Propagation")))
    volumes = options.get("volumes")
    if isinstance(volumes, Mapping):
        sources.extend(k for k in volumes if isinstance(k, str))
    elif isinstance(volumes, list):
        sources.extend(v.split(":", 1)[0] for v in volumes if isinstance(v, str))
    for bind in options.get("binds") or ():
        if isinstance(bind, str):
            sources.append(bind.split(":", 1)[0])
            parts = bind.split(":")
            if len(parts) == 3:
                propagations.extend(p for p in parts[2].split(",") if "shared" in p or "private" in p or "slave" in p)
    for mount in plan_mounts:
        if isinstance(mount, Mapping):
            sources.extend(_strings(mount.get("source")))
    return sources, propagations


def execution_facts(options: Mapping[str, Any], plan: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the checks read for one execution: the run options plus the derived ``$mount_*`` lists."""
    plan_mounts = plan.get("mounts") if plan is not None else None
    sources, propagations = _mount_facts(options, plan_mounts if isinstance(plan_mounts, list) else [])
    facts = dict(options)
    facts["$mount_sources"] = sources
    facts["$mount_propagations"] = propagations
    return facts


Order = tuple[str, int, int]
"""Where a record stands in the merged trails: ``(timestamp, trail index, seq)``."""


@dataclass(slots=True)
class _Count:
    """One control's count over the executions seen (every execution is checked against every control)."""

    failed: int = 0
    unproven: int = 0
    offending: list[tuple[Order, str]] = field(default_factory=list)
    """The first :data:`MAX_OFFENDING` failures in trail order."""


class ControlTally:
    """The streaming count of every control over the executions seen (bounded: counts and capped id lists).

    Tallies of disjoint parts of the trails merge (:meth:`merge`) into exactly the tally of the whole; the
    compiled checks are not pickled (a worker process's tally travels as counts only).
    """

    def __init__(self, catalogue: Catalogue) -> None:
        self.catalogue = catalogue
        self._counts = {c.id: _Count() for c in catalogue.controls if c.check is not None}
        self.executions = 0
        self._judged = self._checks()

    def _checks(self) -> list[tuple[Check, Control, _Count]]:
        """Each control with a check: the check, the control and its count (what :meth:`add` walks)."""
        return [(c.check, c, self._counts[c.id]) for c in self.catalogue.controls if c.check is not None]

    def __getstate__(self) -> dict[str, Any]:
        return {"counts": self._counts, "executions": self.executions}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.catalogue = load_catalogue()
        self._counts = state["counts"]
        self.executions = state["executions"]
        self._judged = self._checks()

    def add(self, order: Order, request_id: str | None, facts: Facts) -> None:
        """Judge one execution against every control with a check: it fails when the check does not hold; it
        is unproven when the check holds but the execution ran under the control's ``unproven_when``."""
        self.executions += 1
        for check, control, count in self._judged:
            if not check(facts):
                count.failed += 1
                if len(count.offending) < MAX_OFFENDING:
                    count.offending.append((order, request_id or "(no request id)"))
            elif control.unproven_key is not None and facts.get(control.unproven_key) in control.unproven_values:
                count.unproven += 1

    def merge(self, other: ControlTally) -> None:
        self.executions += other.executions
        for cid, theirs in other._counts.items():
            mine = self._counts[cid]
            mine.failed += theirs.failed
            mine.unproven += theirs.unproven
            mine.offending = sorted(mine.offending + theirs.offending)[:MAX_OFFENDING]

    def results(self) -> list[dict[str, Any]]:
        """Per control, in catalogue order: id, number, title, status, evidence, counts, offending ids."""
        out = []
        for control in self.catalogue.controls:
            row: dict[str, Any] = {
                "id": control.id,
                "number": control.number,
                "title": control.title,
                "executions_checked": 0,
                "executions_failed": 0,
                "executions_unproven": 0,
                "offending_requests": [],
                "offending_omitted": 0,
            }
            if control.not_applicable is not None:
                row.update(status="not_applicable", evidence=control.not_applicable)
            elif control.check is None:
                row.update(status="unproven", evidence=str(control.unproven))
            elif self.executions == 0:
                row.update(status="not_applicable", evidence=f"no execution in the period; checks: {control.evidence}")
            else:
                count = self._counts[control.id]
                checked = self.executions
                offending = [rid for _order, rid in count.offending]
                row.update(
                    executions_checked=checked,
                    executions_failed=count.failed,
                    executions_unproven=count.unproven,
                    offending_requests=offending,
                    offending_omitted=count.failed - len(offending),
                )
                if count.failed:
                    row.update(
                        status="violated",
                        evidence=f"{count.failed} of {checked} execution(s) fail: {control.evidence}",
                    )
                elif count.unproven:
                    row.update(
                        status="unproven",
                        evidence=f"{count.unproven} of {checked} execution(s) cannot prove it: "
                        f"{control.unproven_why}; the others: {control.evidence}",
                    )
                else:
                    row.update(status="enforced", evidence=f"all {checked} execution(s): {control.evidence}")
            out.append(row)
        return out

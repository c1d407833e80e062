"""Times given to the trail's queries (CLI --since/--until, GET /v1/audit/records): bad ones are AuditErrors."""

from __future__ import annotations

import pytest

from gateway.audit.query import parse_time
from gateway.errors import AuditError


def test_a_time_that_leaves_the_calendar_in_utc_is_refused_not_a_crash() -> None:
    # Valid RFC 3339 text, but one hour before year 1 once converted to UTC: datetime raises OverflowError.
    with pytest.raises(AuditError, match="0001-01-01T00:00:00\\+01:00"):
        parse_time("0001-01-01T00:00:00+01:00")


def test_a_time_is_normalised_to_the_trails_utc_text() -> None:
    assert parse_time("2026-12-05T13:00:00+01:00") == parse_time("2026-12-05T12:00:00Z")

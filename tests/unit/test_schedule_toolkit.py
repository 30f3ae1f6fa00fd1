"""The schedule toolkit's pure math: jitter, calendars (with DST), start and end bounds."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core.calendars import (
    MAX_EXCLUDES,
    Calendar,
    calendar_to_dict,
    parse_calendar,
)
from duetime.core.errors import InvalidSchedule, UnknownTimezone, ValidationError
from duetime.core.schedule import (
    Cron,
    OneTime,
    excluded,
    fire_at,
    fires_between,
    first_fire,
    jitter_ms,
    next_fire,
    parse_schedule,
    schedule_to_dict,
    upcoming,
)

FAST = settings(max_examples=80, deadline=None)
JOB = "0b7f6c1e-1111-4c1e-9a63-6a0d7e1f2b10"
BERLIN = ZoneInfo("Europe/Berlin")
_ids = st.uuids().map(str)
_instants_ms = st.integers(0, 4_000_000_000_000)
_jitters = st.floats(0, 86_400, allow_nan=False)


# --------------------------------------------------------------------------------- jitter


@FAST
@given(job_id=_ids, nominal_ms=_instants_ms, jitter_s=_jitters)
def test_jitter_lies_in_its_range_and_is_the_same_every_time(
    job_id: str, nominal_ms: int, jitter_s: float
) -> None:
    offset = jitter_ms(job_id, nominal_ms, jitter_s)
    assert 0 <= offset <= jitter_s * 1000
    assert offset == jitter_ms(job_id, nominal_ms, jitter_s)  # no state, no randomness


def test_jitter_spreads_occurrences_over_the_range() -> None:
    """Not a constant: 1,000 occurrences of one job use the whole window (quartiles all hit)."""
    offsets = [jitter_ms(JOB, 60_000 * i, 60) for i in range(1000)]
    quarters = {min(3, o * 4 // 60_001) for o in offsets}
    assert quarters == {0, 1, 2, 3}
    assert len(set(offsets)) > 900


@FAST
@given(job_id=_ids, jitter_s=st.floats(1, 3600, allow_nan=False), start=st.integers(0, 10**6))
def test_jittered_fire_times_follow_the_nominal_sequence(
    job_id: str, jitter_s: float, start: int
) -> None:
    """Each fire is its nominal occurrence plus at most jitter_s; the nominal sequence (what
    misfire, overlap and execution ids use) is the cron's, unchanged by jitter."""
    plain = Cron("*/5 * * * *")
    jittered = Cron("*/5 * * * *", jitter_s=jitter_s)
    after = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=start)
    nominal = fires_between(jittered, after, after + timedelta(hours=2), 10)
    assert nominal == fires_between(plain, after, after + timedelta(hours=2), 10)
    for t in nominal:
        fired = fire_at(jittered, job_id, t)
        assert t <= fired <= t + timedelta(seconds=jitter_s)
        assert fire_at(plain, job_id, t) == t


def test_jitter_is_refused_out_of_range_and_on_one_time_schedules() -> None:
    for bad in (-1, 86_401, float("nan"), "5", True):
        with pytest.raises(InvalidSchedule) as err:
            parse_schedule({"cron": "* * * * *", "jitter_s": bad})
        assert err.value.field == "schedule.jitter_s"
    with pytest.raises(InvalidSchedule) as err:
        parse_schedule({"at": "2026-01-01T00:00:00Z", "jitter_s": 5})
    assert err.value.field == "schedule.jitter_s"


# ------------------------------------------------------------------------------ calendars


def holidays(**extra: Any) -> dict[str, Any]:
    return {
        "name": "holidays",
        "timezone": "Europe/Berlin",
        "exclude": ["2026-12-25", "2026-12-24..2026-12-31"],
        "exclude_weekdays": ["sat", "Sunday"],
        **extra,
    }


def test_calendar_rules_are_normalised_and_round_trip() -> None:
    cal = parse_calendar(holidays(exclude=["2026-12-31", "2026-12-24..2026-12-30", "2027-01-05"]))
    assert cal.ranges == (
        (date(2026, 12, 24), date(2026, 12, 31)),
        (date(2027, 1, 5), date(2027, 1, 5)),
    )
    assert calendar_to_dict(cal) == {
        "name": "holidays",
        "timezone": "Europe/Berlin",
        "exclude": ["2026-12-24..2026-12-31", "2027-01-05"],
        "exclude_weekdays": ["sat", "sun"],
    }
    assert parse_calendar(calendar_to_dict(cal)) == cal


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "bad name"}, "calendar.name"),
        ({"name": ""}, "calendar.name"),
        ({"timezone": "Mars/Base"}, "calendar.timezone"),
        ({"exclude": ["2026-02-30"]}, "calendar.exclude[0]"),
        ({"exclude": ["2026-12-31..2026-12-01"]}, "calendar.exclude[0]"),
        ({"exclude": ["2000-01-01..2030-01-01"]}, "calendar.exclude[0]"),
        ({"exclude": ["26-1-1"]}, "calendar.exclude[0]"),
        ({"exclude": [20261225]}, "calendar.exclude[0]"),
        ({"exclude": "2026-12-25"}, "calendar.exclude"),
        ({"exclude": ["2026-01-01"] * (MAX_EXCLUDES + 1)}, "calendar.exclude"),
        ({"exclude_weekdays": ["someday"]}, "calendar.exclude_weekdays[0]"),
        (
            {
                "exclude_weekdays": [
                    WEEK for WEEK in ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
                ]
            },
            "calendar.exclude_weekdays",
        ),
        ({"holidays": []}, "calendar.holidays"),
    ],
)
def test_a_bad_calendar_is_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        parse_calendar(holidays(**change))
    assert err.value.field == field
    if "timezone" in change:
        assert isinstance(err.value, UnknownTimezone)


def test_a_calendar_name_reaches_only_the_rest_api() -> None:
    with pytest.raises(InvalidSchedule, match="the REST API and the SDK resolve names"):
        parse_schedule({"cron": "0 9 * * *", "calendar": "holidays"})


_days = st.dates(date(2025, 1, 1), date(2028, 12, 31))


@FAST
@given(
    ranges=st.lists(st.tuples(_days, st.integers(0, 20)), max_size=6),
    weekdays=st.sets(st.integers(0, 6), max_size=6),
    zone=st.sampled_from(["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC"]),
    hour=st.integers(0, 23),
    minute=st.sampled_from([0, 30]),
)
def test_an_occurrence_is_excluded_exactly_when_its_local_date_is(
    ranges: list[tuple[date, int]], weekdays: set[int], zone: str, hour: int, minute: int
) -> None:
    """Over DST changes too: hourly fires across both 2026 Berlin transitions are excluded
    iff their date in the CALENDAR's zone is excluded (the cron's own zone differs)."""
    cal = parse_calendar(
        {
            "name": "c",
            "timezone": zone,
            "exclude": [f"{d}..{d + timedelta(days=n)}" for d, n in ranges],
            "exclude_weekdays": [
                ["mon", "tue", "wed", "thu", "fri", "sat", "sun"][w] for w in weekdays
            ],
        }
    )
    cron = Cron(f"{minute} {hour} * * *", "Europe/Berlin", calendar=cal)
    for start in (datetime(2026, 3, 20, tzinfo=UTC), datetime(2026, 10, 16, tzinfo=UTC)):
        for t in fires_between(cron, start, start + timedelta(days=16), 100):
            local = t.astimezone(ZoneInfo(zone)).date()
            expected = local.weekday() in weekdays or any(
                d <= local <= d + timedelta(days=n) for d, n in ranges
            )
            assert excluded(cron, t) is expected, (t, local)


def test_a_berlin_calendar_excludes_by_berlin_date_across_the_dst_night() -> None:
    """00:30 Berlin on 2026-03-29 (the spring-forward day) is 23:30 UTC on the 28th: its date
    is the 29th in Berlin, so a Berlin calendar excluding the 29th skips it, and only it."""
    cal = Calendar("c", "Europe/Berlin", ((date(2026, 3, 29), date(2026, 3, 29)),))
    cron = Cron("30 0 * * *", "Europe/Berlin", calendar=cal)
    fires = fires_between(
        cron, datetime(2026, 3, 27, tzinfo=UTC), datetime(2026, 3, 31, tzinfo=UTC), 10
    )
    skipped = [t for t in fires if excluded(cron, t)]
    assert skipped == [datetime(2026, 3, 28, 23, 30, tzinfo=UTC)]
    assert len(fires) == 4


def test_upcoming_leaves_out_excluded_days_and_adds_the_jitter() -> None:
    cal = parse_calendar(holidays())
    cron = Cron("0 9 * * *", "Europe/Berlin", jitter_s=600, calendar=cal)
    first = first_fire(cron, datetime(2026, 12, 21, tzinfo=UTC))
    runs = upcoming(cron, JOB, first, 5)
    days = [t.astimezone(BERLIN).date() for t in runs]
    # Mon 21 to Wed 23, then past the holidays (24 to 31) Friday 1 January, then past the
    # weekend of 2 and 3 January
    assert days == [date(2026, 12, d) for d in (21, 22, 23)] + [date(2027, 1, 1), date(2027, 1, 4)]
    for t in runs:
        nominal = t.astimezone(BERLIN).replace(hour=9, minute=0, second=0, microsecond=0)
        assert nominal <= t <= nominal + timedelta(seconds=600)


def test_schedule_dict_round_trip_with_jitter_and_calendar() -> None:
    body = {
        "cron": "0 9 * * *",
        "timezone": "Europe/Berlin",
        "jitter_s": 30.0,
        "calendar": calendar_to_dict(parse_calendar(holidays())),
        "start_at": "2026-01-01T00:00:00Z",
        "end_at": "2027-01-01T00:00:00Z",
    }
    schedule = parse_schedule(body)
    assert schedule_to_dict(schedule) == body
    assert parse_schedule(schedule_to_dict(schedule)) == schedule


# --------------------------------------------------------------------------------- bounds


@FAST
@given(
    start_h=st.integers(0, 500),
    span_h=st.integers(0, 500),
    after_h=st.integers(-100, 1100),
    jitter_s=st.sampled_from([0.0, 900.0]),
)
def test_fires_stay_within_the_bounds(
    start_h: int, span_h: int, after_h: int, jitter_s: float
) -> None:
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    start, end = t0 + timedelta(hours=start_h), t0 + timedelta(hours=start_h + span_h)
    cron = Cron("17 */3 * * *", "Europe/Berlin", start, end, jitter_s)
    after = t0 + timedelta(hours=after_h)
    fires = fires_between(cron, after, after + timedelta(days=60), 1000)
    assert all(start <= t <= end for t in fires)
    nxt = next_fire(cron, after)
    assert nxt is None or start <= nxt <= end
    if after >= end:
        assert nxt is None and upcoming(cron, JOB, nxt, 5) == []
    assert all(
        start <= t <= end + timedelta(seconds=jitter_s)
        for t in upcoming(cron, JOB, first_fire(cron, after), 20)
    )


def test_a_one_time_schedule_has_no_bounds_nor_calendar() -> None:
    for key in ("start_at", "end_at", "calendar"):
        with pytest.raises(InvalidSchedule):
            parse_schedule({"at": "2026-01-01T00:00:00Z", key: "2026-01-01T00:00:00Z"})
    assert upcoming(OneTime(datetime(2026, 1, 1, tzinfo=UTC)), JOB, None, 3) == []

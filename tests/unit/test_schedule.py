"""Schedules (duetime.core.schedule): parsing, errors, fire sequences, misfire and overlap."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from croniter import CroniterBadDateError, croniter
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from duetime.core.errors import InvalidSchedule, UnknownTimezone
from duetime.core.models import Misfire, Overlap
from duetime.core.schedule import (
    Cron,
    OneTime,
    Schedule,
    fires_between,
    first_fire,
    misfire_fires,
    next_fire,
    overlap_decision,
    parse_cron,
    parse_schedule,
    schedule_to_dict,
)

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
FAST = settings(max_examples=60, deadline=None)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


# ------------------------------------------------------------------------------- parsing


def test_parse_one_time_and_round_trip() -> None:
    s = parse_schedule({"at": "2024-05-01T14:00:00+02:00"})
    assert s == OneTime(utc(2024, 5, 1, 12))
    assert s.at.tzinfo is UTC
    assert schedule_to_dict(s) == {"at": "2024-05-01T12:00:00Z"}
    assert parse_schedule({"at": "2024-05-01T12:00:00Z"}) == s


def test_parse_cron_defaults_and_round_trip() -> None:
    s = parse_schedule({"cron": "0 2 * * *"})
    assert s == Cron("0 2 * * *", "UTC")
    full = {
        "cron": "*/30 0 2 * * MON-FRI",
        "timezone": "Europe/Berlin",
        "start_at": "2024-01-01T00:00:00Z",
        "end_at": "2025-01-01T00:00:00Z",
    }
    c = parse_schedule(full)
    assert isinstance(c, Cron)
    assert c.start_at == utc(2024, 1, 1) and c.end_at == utc(2025, 1, 1)
    assert schedule_to_dict(c) == full
    assert parse_schedule(schedule_to_dict(c)) == c


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({}, "schedule", "needs 'at'"),
        ({"at": "2024-05-01T12:00:00Z", "cron": "* * * * *"}, "schedule", "both"),
        ({"at": "2024-05-01T12:00:00"}, "schedule.at", "no UTC offset"),
        ({"at": "2024-05-01"}, "schedule.at", "no UTC offset"),
        ({"at": "tomorrow"}, "schedule.at", "not an RFC 3339"),
        ({"at": 1714564800}, "schedule.at", "timestamp string"),
        ({"at": "2024-05-01T12:00:00Z", "timezone": "UTC"}, "schedule.timezone", "unknown"),
        ({"cron": "* * * * *", "timzone": "UTC"}, "schedule.timzone", "unknown field"),
        ({"cron": 5}, "schedule.cron", "string"),
        ({"cron": ""}, "schedule.cron", "non-empty"),
        ({"cron": "* * * *"}, "schedule.cron", "has 4 fields"),
        ({"cron": "* * * * * * *"}, "schedule.cron", "has 7 fields"),
        ({"cron": "60 * * * *"}, "schedule.cron", "minute field: 60 is out of range 0-59"),
        ({"cron": "0 24 * * *"}, "schedule.cron", "hour field: 24 is out of range"),
        ({"cron": "0 0 0 * *"}, "schedule.cron", "day-of-month field: 0 is out of range"),
        ({"cron": "0 0 * 13 *"}, "schedule.cron", "month field: 13"),
        ({"cron": "0 0 * * 8"}, "schedule.cron", "day-of-week field: 8"),
        ({"cron": "60 0 * * * *"}, "schedule.cron", "second field: 60"),
        ({"cron": "0 0 31 2 *"}, "schedule.cron", "never fires"),
        ({"cron": "0 0 30 2 *"}, "schedule.cron", "never fires"),
        ({"cron": "0 0 31 4,6,9,11 *"}, "schedule.cron", "never fires"),
        ({"cron": "0 0 L * *"}, "schedule.cron", "not supported"),
        ({"cron": "0 0 * * 5#3"}, "schedule.cron", "not supported"),
        ({"cron": "0 0 * * FOO"}, "schedule.cron", "known name"),
        ({"cron": "5-1 * * * *"}, "schedule.cron", "backwards"),
        ({"cron": "*/0 * * * *"}, "schedule.cron", "positive"),
        ({"cron": "1,,2 * * * *"}, "schedule.cron", "empty list element"),
        ({"cron": "? * * * *"}, "schedule.cron", "minute field"),
        ({"cron": "@sometimes"}, "schedule.cron", "unknown cron macro"),
        ({"cron": "* " * 200}, "schedule.cron", "longer than"),
        (
            {
                "cron": "0 * * * *",
                "start_at": "2025-01-01T00:00:00Z",
                "end_at": "2024-01-01T00:00Z",
            },
            "schedule.end_at",
            "before start_at",
        ),
        ({"cron": "0 * * * *", "start_at": "2025-01-01T00:00:00"}, "schedule.start_at", "offset"),
    ],
)
def test_parse_errors_name_the_field(body: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InvalidSchedule) as info:
        parse_schedule(body)
    assert info.value.field == field
    assert info.value.details["field"] == field
    assert words in info.value.message


@pytest.mark.parametrize("tz", ["Mars/Olympus", "europe/berlin_", "../etc/passwd", "", "/UTC"])
def test_unknown_time_zone(tz: str) -> None:
    with pytest.raises(UnknownTimezone) as info:
        parse_schedule({"cron": "0 * * * *", "timezone": tz})
    assert info.value.field == "schedule.timezone"
    assert info.value.code == "unknown_timezone"


def test_not_a_mapping() -> None:
    with pytest.raises(InvalidSchedule):
        parse_schedule(["at"])  # type: ignore[arg-type]  # deliberately wrong


@pytest.mark.parametrize(
    "expr",
    [
        "0 0 29 2 *",
        "0 0 29 2 */7",  # Feb 29 on a Sunday: 40 years apart around 2100, still fires
        "0 0 31 * *",
        "@hourly",
        "@YEARLY",
        "0 9-17/2 * jan-mar,DEC mon-fri",
        "0 0 ? * 7",
        "5/15 * * * *",
        "0 0 1,15 * sun",
    ],
)
def test_accepted_expressions(expr: str) -> None:
    assert next_fire(Cron(expr), T0) is not None


def test_naive_datetimes_are_refused() -> None:
    with pytest.raises(InvalidSchedule):
        OneTime(datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="timezone-aware"):
        next_fire(Cron("* * * * *"), datetime(2024, 1, 1))


# ------------------------------------------------------------------------- field semantics


def test_six_fields_put_seconds_first() -> None:
    c = Cron("15 30 2 * * *")
    assert next_fire(c, utc(2024, 5, 1)) == utc(2024, 5, 1, 2, 30, 15)


def test_step_from_a_start_value() -> None:
    assert fires_between(Cron("5/20 * * * *"), utc(2024, 5, 1), utc(2024, 5, 1, 1), 10) == [
        utc(2024, 5, 1, 0, 5),
        utc(2024, 5, 1, 0, 25),
        utc(2024, 5, 1, 0, 45),
    ]


def test_day_of_month_or_day_of_week_when_both_restricted() -> None:
    # 2024-01: the 5th is a Friday; Mondays are 1, 8, 15, 22, 29
    fires = fires_between(Cron("0 0 5 * MON"), utc(2023, 12, 31), utc(2024, 1, 31), 50)
    assert [f.day for f in fires] == [1, 5, 8, 15, 22, 29]


def test_impossible_day_of_month_or_a_weekday() -> None:
    # Feb 30 never exists, but Sundays in February do (croniter 5.0.1 gives up on this one)
    fires = fires_between(Cron("0 0 30 2 0"), utc(2024, 1, 1), utc(2024, 12, 31), 10)
    assert [f.day for f in fires] == [4, 11, 18, 25]


def test_star_prefixed_day_field_means_and() -> None:
    # Vixie cron: a day field starting with '*' does not trigger the OR rule
    fires = fires_between(Cron("0 0 */2 * MON"), utc(2023, 12, 31), utc(2024, 2, 1), 50)
    assert [f.day for f in fires] == [1, 15, 29]  # odd days that are Mondays


def test_single_value_range() -> None:
    # croniter 5.0.1 reads "11-11" as "*" (fires on 2000-01-02); we read it as November
    assert next_fire(Cron("0 0 * 11-11 *"), utc(2000, 1, 1)) == utc(2000, 11, 1)
    assert parse_cron("0 5-5 * * *").hours == (5,)


def test_sunday_is_0_and_7() -> None:
    assert parse_cron("0 0 * * 7").dows == parse_cron("0 0 * * 0").dows == frozenset({0})


def test_leap_day_only_every_four_years() -> None:
    c = Cron("0 0 29 2 *")
    assert fires_between(c, utc(2023, 1, 1), utc(2033, 1, 1), 10) == [
        utc(2024, 2, 29),
        utc(2028, 2, 29),
        utc(2032, 2, 29),
    ]
    assert next_fire(c, utc(2096, 3, 1)) == utc(2104, 2, 29)  # 2100 is not a leap year


def _field(draw: st.DrawFn, lo: int, hi: int, restricted_only: bool = False) -> str:
    kinds = ["value", "range", "range_step", "list"]
    if not restricted_only:
        kinds += ["star", "star_step"]
    kind = draw(st.sampled_from(kinds))
    a = draw(st.integers(lo, hi))
    b = draw(st.integers(a, hi))
    k = draw(st.integers(1, max(1, hi - lo)))
    if kind == "star":
        return "*"
    if kind == "star_step":
        return f"*/{k}"
    if kind == "value" or a == b:  # croniter 5.0.1 reads "a-a" as "*": see the test below
        return str(a)
    if kind == "range":
        return f"{a}-{b}"
    if kind == "range_step":
        return f"{a}-{b}/{k}"
    values = draw(st.lists(st.integers(lo, hi), min_size=1, max_size=4))
    return ",".join(map(str, values))


@st.composite
def cron_exprs(draw: st.DrawFn, seconds: bool = False) -> str:
    """Random valid-looking expressions; day fields are '*' or restricted, never '*/k'
    together with a restricted other day field (croniter reads that one differently)."""
    fields = [
        _field(draw, 0, 59),
        _field(draw, 0, 23),
        "*" if draw(st.booleans()) else _field(draw, 1, 31, restricted_only=True),
        _field(draw, 1, 12),
        # croniter refuses day-of-week 7 in 6-field expressions
        "*" if draw(st.booleans()) else _field(draw, 0, 6 if seconds else 7, restricted_only=True),
    ]
    if seconds:
        fields.insert(0, _field(draw, 0, 59))
    return " ".join(fields)


def _cron_or_reject(expr: str, tz: str = "UTC", **kw: Any) -> Cron:
    try:
        return Cron(expr, tz, **kw)
    except InvalidSchedule:
        assume(False)
        raise


instants = st.datetimes(
    min_value=datetime(1990, 1, 1), max_value=datetime(2090, 1, 1), timezones=st.just(UTC)
)


@FAST
@given(expr=cron_exprs(), after=instants)
def test_agrees_with_croniter_in_utc(expr: str, after: datetime) -> None:
    c = _cron_or_reject(expr)
    it = croniter(expr, after.replace(tzinfo=None))
    try:
        expected = [it.get_next(datetime).replace(tzinfo=UTC) for _ in range(5)]
    except CroniterBadDateError:  # croniter 5 gives up on e.g. "0 0 30 2 0": see below
        assume(False)
        raise
    assert fires_between(c, after, expected[-1], 5) == expected


@FAST
@given(expr=cron_exprs(seconds=True), after=instants)
def test_seconds_field_agrees_with_croniter(expr: str, after: datetime) -> None:
    c = _cron_or_reject(expr)
    it = croniter(expr, after.replace(tzinfo=None), second_at_beginning=True)
    try:
        expected = [it.get_next(datetime).replace(tzinfo=UTC) for _ in range(5)]
    except CroniterBadDateError:
        assume(False)
        raise
    assert fires_between(c, after, expected[-1], 5) == expected


# ----------------------------------------------------------------------- fire properties

ZONES = st.sampled_from(
    ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
)


@FAST
@given(expr=cron_exprs(seconds=True), tz=ZONES, after=instants)
def test_next_fire_is_strictly_after_and_sequences_increase(
    expr: str, tz: str, after: datetime
) -> None:
    c = _cron_or_reject(expr, tz)
    fires = fires_between(c, after, after + timedelta(days=3000), 20)
    assert fires, "a valid expression fires within 3000 days (leap days included)"
    assert fires[0] == next_fire(c, after)
    assert fires[0] > after
    assert all(a < b for a, b in itertools.pairwise(fires))
    assert all(f.tzinfo is UTC and f.microsecond == 0 for f in fires)
    # the sequence is the chain of next_fire calls
    for a, b in itertools.pairwise(fires):
        assert next_fire(c, a) == b


@FAST
@given(
    expr=cron_exprs(),
    tz=ZONES,
    start=instants,
    length_h=st.integers(0, 24 * 60),
    after_offset_h=st.integers(-48, 24 * 60),
)
def test_start_and_end_bounds(
    expr: str, tz: str, start: datetime, length_h: int, after_offset_h: int
) -> None:
    end = start + timedelta(hours=length_h)
    bounded = _cron_or_reject(expr, tz, start_at=start, end_at=end)
    free = Cron(expr, tz)
    after = start + timedelta(hours=after_offset_h)
    got = fires_between(bounded, after, end + timedelta(days=400), 50)
    assert all(start <= f <= end and f > after for f in got)
    expected = fires_between(free, max(after, start - timedelta(seconds=1)), end, 60)
    expected = [f for f in expected if f >= start and f > after][:50]
    assert got == expected
    assert next_fire(bounded, end) is None


def test_end_at_is_inclusive_and_start_at_too() -> None:
    c = Cron("0 * * * *", start_at=utc(2024, 5, 1, 3), end_at=utc(2024, 5, 1, 5))
    assert first_fire(c, utc(2024, 1, 1)) == utc(2024, 5, 1, 3)
    assert next_fire(c, utc(2024, 1, 1)) == utc(2024, 5, 1, 3)
    assert fires_between(c, utc(2024, 1, 1), utc(2025, 1, 1), 10) == [
        utc(2024, 5, 1, 3),
        utc(2024, 5, 1, 4),
        utc(2024, 5, 1, 5),
    ]
    assert next_fire(c, utc(2024, 5, 1, 5)) is None


def test_one_time() -> None:
    s = OneTime(utc(2024, 5, 1, 12))
    assert next_fire(s, utc(2024, 5, 1, 11)) == s.at
    assert next_fire(s, s.at) is None
    assert fires_between(s, utc(2024, 5, 1), s.at, 5) == [s.at]
    assert fires_between(s, s.at, utc(2024, 6, 1), 5) == []
    assert fires_between(s, utc(2024, 5, 1), s.at, 0) == []
    # a time in the past runs now
    assert first_fire(s, utc(2024, 5, 2)) == utc(2024, 5, 2)
    assert first_fire(s, utc(2024, 4, 1)) == s.at


def test_first_fire_of_a_cron_is_inclusive() -> None:
    c = Cron("0 12 * * *")
    assert first_fire(c, utc(2024, 5, 1, 12)) == utc(2024, 5, 1, 12)
    assert first_fire(c, utc(2024, 5, 1, 12, 0, 1)) == utc(2024, 5, 2, 12)
    assert next_fire(c, utc(2024, 5, 1, 12)) == utc(2024, 5, 2, 12)


def test_fires_between_respects_limit_and_bounds() -> None:
    c = Cron("* * * * * *")
    got = fires_between(c, T0, T0 + timedelta(days=365), 1000)
    assert len(got) == 1000 and got[0] == T0 + timedelta(seconds=1)
    assert fires_between(c, T0, T0, 10) == []
    assert fires_between(c, T0, T0 - timedelta(hours=1), 10) == []
    with pytest.raises(ValueError):
        fires_between(c, T0, T0, -1)


def test_every_second_for_a_long_time_is_fast_enough() -> None:
    # bounded work: the limit, not the span, decides the cost
    c = Cron("* * * * * *", "Europe/Berlin")
    assert len(fires_between(c, utc(2000, 1, 1), utc(2100, 1, 1), 5000)) == 5000


# ------------------------------------------------------------------------------- misfire


HOURLY = Cron("0 * * * *")


def test_misfire_skip_emits_nothing() -> None:
    assert misfire_fires(HOURLY, Misfire.SKIP, T0, T0 + timedelta(hours=5), 10, 1e9) == []


def test_misfire_run_once_emits_the_latest_missed_occurrence() -> None:
    now = T0 + timedelta(hours=5, minutes=30)
    assert misfire_fires(HOURLY, Misfire.RUN_ONCE, T0, now, 10, 60) == [T0 + timedelta(hours=5)]
    # nothing missed
    assert misfire_fires(HOURLY, Misfire.RUN_ONCE, T0, T0 + timedelta(minutes=59), 10, 60) == []
    # an occurrence exactly at missed_after was not missed; one exactly at now was
    assert misfire_fires(HOURLY, Misfire.RUN_ONCE, T0, T0 + timedelta(hours=1), 1, 1) == [
        T0 + timedelta(hours=1)
    ]


def test_misfire_run_all_window_and_cap() -> None:
    now = T0 + timedelta(hours=10, minutes=30)
    every = [T0 + timedelta(hours=h) for h in range(1, 11)]
    assert misfire_fires(HOURLY, Misfire.RUN_ALL, T0, now, 100, 1e9) == every
    assert misfire_fires(HOURLY, Misfire.RUN_ALL, T0, now, 3, 1e9) == every[-3:]
    assert misfire_fires(HOURLY, Misfire.RUN_ALL, T0, now, 100, 3 * 3600) == every[-3:]
    assert misfire_fires(HOURLY, Misfire.RUN_ALL, T0, now, 0, 1e9) == []
    assert misfire_fires(HOURLY, Misfire.RUN_ALL, T0, T0, 100, 1e9) == []


def test_misfire_one_time() -> None:
    s = OneTime(T0 + timedelta(hours=1))
    now = T0 + timedelta(days=3)
    assert misfire_fires(s, Misfire.SKIP, T0, now, 5, 60) == []
    assert misfire_fires(s, Misfire.RUN_ONCE, T0, now, 5, 60) == [s.at]
    assert misfire_fires(s, Misfire.RUN_ALL, T0, now, 5, 60) == [s.at]  # window: cron only
    assert misfire_fires(s, Misfire.RUN_ALL, s.at, now, 5, 60) == []  # already handled


def test_misfire_of_a_per_second_job_after_a_long_pause_is_bounded() -> None:
    c = Cron("* * * * * *")
    now = utc(2024, 5, 1)
    got = misfire_fires(c, Misfire.RUN_ALL, utc(2020, 1, 1), now, 100, 1e12)
    assert got == [now - timedelta(seconds=99 - i) for i in range(100)]
    assert misfire_fires(c, Misfire.RUN_ONCE, utc(2020, 1, 1), now, 1, 1) == [now]


@FAST
@given(
    expr=cron_exprs(),
    tz=ZONES,
    missed_after=instants,
    span_h=st.integers(0, 24 * 40),
    cap=st.integers(0, 30),
    window_h=st.integers(0, 24 * 60),
)
def test_misfire_matches_forward_enumeration(
    expr: str, tz: str, missed_after: datetime, span_h: int, cap: int, window_h: int
) -> None:
    c = _cron_or_reject(expr, tz)
    now = missed_after + timedelta(hours=span_h)
    missed = fires_between(c, missed_after, now, 100_000)
    assume(len(missed) < 100_000)
    once = misfire_fires(c, Misfire.RUN_ONCE, missed_after, now, cap, window_h * 3600)
    assert once == missed[-1:]
    lower = max(missed_after, now - timedelta(hours=window_h))
    expected_all = [t for t in missed if t > lower][-cap:] if cap else []
    got_all = misfire_fires(c, Misfire.RUN_ALL, missed_after, now, cap, window_h * 3600)
    assert got_all == expected_all


# ------------------------------------------------------------------------------- overlap


@pytest.mark.parametrize(
    ("policy", "running", "queued", "decision"),
    [
        (Overlap.ALLOW, 0, 0, "fire"),
        (Overlap.ALLOW, 3, 1, "fire"),
        (Overlap.SKIP, 0, 0, "fire"),
        (Overlap.SKIP, 1, 0, "skip"),
        (Overlap.QUEUE_ONE, 0, 0, "fire"),
        (Overlap.QUEUE_ONE, 1, 0, "queue"),
        (Overlap.QUEUE_ONE, 1, 1, "skip"),
    ],
)
def test_overlap_decision(policy: Overlap, running: int, queued: int, decision: str) -> None:
    assert overlap_decision(policy, running, queued) == decision


def test_schedule_is_hashable_and_comparable() -> None:
    schedules: set[Schedule] = {Cron("0 * * * *"), Cron("0 * * * *"), OneTime(T0)}
    assert len(schedules) == 2

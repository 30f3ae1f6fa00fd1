"""The DST policy of duetime.core.schedule, day by day, and against an independent oracle.

Policy: a wall time in a spring-forward gap fires once, at the first instant after the gap;
a wall time in an autumn fold fires once, at its first occurrence.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from duetime.core.errors import InvalidSchedule
from duetime.core.schedule import Cron, CronSpec, fires_between, next_fire, parse_cron

# (zone, spring-forward day, autumn-fold day) in 2024
TRANSITIONS = [
    ("Europe/Berlin", date(2024, 3, 31), date(2024, 10, 27)),
    ("America/New_York", date(2024, 3, 10), date(2024, 11, 3)),
    ("Australia/Lord_Howe", date(2024, 10, 6), date(2024, 4, 7)),  # 30-minute shifts
]
ORDINARY = date(2024, 6, 12)


def day_bounds(tz: str, day: date) -> tuple[datetime, datetime]:
    """(start, end) in UTC of the local calendar day: local midnights."""
    zone = ZoneInfo(tz)
    start = datetime.combine(day, datetime.min.time(), zone).astimezone(UTC)
    end = datetime.combine(day + timedelta(days=1), datetime.min.time(), zone).astimezone(UTC)
    return start, end


def local_day_fires(expr: str, tz: str, day: date) -> list[datetime]:
    """Fires t with start <= t < end of the local day."""
    start, end = day_bounds(tz, day)
    got = fires_between(Cron(expr, tz), start - timedelta(microseconds=1), end, 10_000)
    return [t for t in got if t < end]


def local(t: datetime, tz: str) -> str:
    return t.astimezone(ZoneInfo(tz)).strftime("%H:%M%z")


# ------------------------------------------------------------------------------- day tables


@pytest.mark.parametrize(
    ("tz", "day", "hourly", "half_hourly"),
    [
        ("Europe/Berlin", date(2024, 3, 31), 23, 46),
        ("Europe/Berlin", ORDINARY, 24, 48),
        ("Europe/Berlin", date(2024, 10, 27), 24, 48),  # 25-hour day, 02:00 fires once
        ("America/New_York", date(2024, 3, 10), 23, 46),
        ("America/New_York", ORDINARY, 24, 48),
        ("America/New_York", date(2024, 11, 3), 24, 48),
        # Lord Howe: 02:00 → 02:30 in October (23.5 h day), 02:00 → 01:30 in April (24.5 h)
        ("Australia/Lord_Howe", date(2024, 10, 6), 24, 47),
        ("Australia/Lord_Howe", ORDINARY, 24, 48),
        ("Australia/Lord_Howe", date(2024, 4, 7), 24, 48),
    ],
)
def test_fire_counts_on_transition_days(tz: str, day: date, hourly: int, half_hourly: int) -> None:
    assert len(local_day_fires("0 * * * *", tz, day)) == hourly
    assert len(local_day_fires("*/30 * * * *", tz, day)) == half_hourly


@pytest.mark.parametrize(
    ("tz", "day", "expected"),
    [
        ("Europe/Berlin", date(2024, 3, 31), ["00:00+0100", "01:00+0100", "03:00+0200"]),
        ("Europe/Berlin", date(2024, 10, 27), ["00:00+0200", "01:00+0200", "02:00+0200"]),
        ("America/New_York", date(2024, 3, 10), ["00:00-0500", "01:00-0500", "03:00-0400"]),
        ("America/New_York", date(2024, 11, 3), ["00:00-0400", "01:00-0400", "02:00-0500"]),
        ("Australia/Lord_Howe", date(2024, 10, 6), ["00:00+1030", "01:00+1030", "02:30+1100"]),
        ("Australia/Lord_Howe", date(2024, 4, 7), ["00:00+1100", "01:00+1100", "02:00+1030"]),
    ],
)
def test_hourly_wall_clock_around_the_transition(tz: str, day: date, expected: list[str]) -> None:
    assert [local(t, tz) for t in local_day_fires("0 * * * *", tz, day)[:3]] == expected


@pytest.mark.parametrize(("tz", "spring", "autumn"), TRANSITIONS)
def test_daily_0230_fires_once_per_local_day_across_the_year(
    tz: str, spring: date, autumn: date
) -> None:
    c = Cron("30 2 * * *", tz)
    zone = ZoneInfo(tz)
    start, _ = day_bounds(tz, date(2024, 1, 1))
    fires = fires_between(c, start, start + timedelta(days=366), 1000)
    days = [t.astimezone(zone).date() for t in fires]
    assert days == [date(2024, 1, 1) + timedelta(days=i) for i in range(366)]
    by_day = dict(zip(days, fires, strict=True))
    for d, t in by_day.items():
        wall = t.astimezone(zone)
        if d == spring and tz != "Australia/Lord_Howe":
            # 02:30 does not exist: the first instant after the gap
            assert (wall.hour, wall.minute) == (3, 0), d
        else:
            assert (wall.hour, wall.minute, wall.fold) == (2, 30, 0), d


def test_berlin_spring_gap_maps_to_the_end_of_the_gap() -> None:
    c = Cron("30 2 * * *", "Europe/Berlin")
    assert next_fire(c, datetime(2024, 3, 30, 12, tzinfo=UTC)) == datetime(
        2024, 3, 31, 1, 0, tzinfo=UTC
    )


def test_berlin_autumn_fold_fires_at_first_occurrence_only() -> None:
    c = Cron("30 2 * * *", "Europe/Berlin")
    first = datetime(2024, 10, 27, 0, 30, tzinfo=UTC)  # 02:30 CEST
    assert next_fire(c, datetime(2024, 10, 26, 12, tzinfo=UTC)) == first
    # not again at 02:30 CET (01:30 UTC), and not at 03:30 the next day (croniter 5.0.1 did)
    assert next_fire(c, first) == datetime(2024, 10, 28, 1, 30, tzinfo=UTC)


def test_several_gap_times_collapse_into_one_fire() -> None:
    c = Cron("*/15 2 * * *", "Europe/Berlin")
    start, end = day_bounds("Europe/Berlin", date(2024, 3, 31))
    assert fires_between(c, start, end, 100) == [datetime(2024, 3, 31, 1, 0, tzinfo=UTC)]
    every_second = Cron("* * 2 * * *", "Europe/Berlin")
    assert fires_between(every_second, start, end, 10_000) == [
        datetime(2024, 3, 31, 1, 0, tzinfo=UTC)
    ]


def test_gap_fire_and_a_match_at_the_gap_end_are_one_fire() -> None:
    # 02:30 (in the gap) and 03:00 (the first instant after it) both match: one fire
    c = Cron("0,30 2,3 * * *", "Europe/Berlin")
    start, end = day_bounds("Europe/Berlin", date(2024, 3, 31))
    assert [local(t, "Europe/Berlin") for t in fires_between(c, start, end, 100)] == [
        "03:00+0200",
        "03:30+0200",
    ]


def test_per_minute_job_in_the_fold_does_not_repeat() -> None:
    c = Cron("* * * * *", "Europe/Berlin")
    start, end = day_bounds("Europe/Berlin", date(2024, 10, 27))
    fires = fires_between(c, start - timedelta(seconds=1), end - timedelta(seconds=1), 10_000)
    assert len(fires) == 24 * 60  # the repeated hour is not repeated
    # nothing fires during the second 02:xx (01:00–02:00 UTC)
    assert not [
        t
        for t in fires
        if datetime(2024, 10, 27, 1, tzinfo=UTC) <= t < datetime(2024, 10, 27, 2, tzinfo=UTC)
    ]


def test_a_skipped_calendar_day() -> None:
    # Samoa skipped 2011-12-30 entirely: that day's noon fires at the end of the gap,
    # 2011-12-31 00:00 local
    c = Cron("0 12 * * *", "Pacific/Apia")
    fires = fires_between(
        c, datetime(2011, 12, 28, tzinfo=UTC), datetime(2012, 1, 1, 20, tzinfo=UTC), 9
    )
    walls = [t.astimezone(ZoneInfo("Pacific/Apia")).strftime("%m-%d %H:%M") for t in fires]
    assert walls == ["12-28 12:00", "12-29 12:00", "12-31 00:00", "12-31 12:00", "01-01 12:00"]


# ------------------------------------------------------------------------- oracle property


def oracle_fires(spec: CronSpec, tz: str, start: datetime, minutes: int) -> list[datetime]:
    """Walk UTC minute by minute; independent of the library's wall-clock iteration.

    An instant fires when its wall time matches and is the first occurrence (fold == 0), or
    when it is the first instant after a gap and a wall time in (previous wall, this wall]
    matches.
    """
    zone = ZoneInfo(tz)
    out = []
    prev_wall: datetime | None = None
    for i in range(minutes):
        u = start + timedelta(minutes=i)
        aware = u.astimezone(zone)
        wall = aware.replace(tzinfo=None, fold=0)
        if aware.fold == 1:
            hit = False
        elif prev_wall is not None and wall - prev_wall > timedelta(minutes=1):
            n = (wall - prev_wall) // timedelta(minutes=1)
            hit = any(spec.matches(prev_wall + timedelta(minutes=k)) for k in range(1, n + 1))
        else:
            hit = spec.matches(wall)
        if hit:
            out.append(u)
        prev_wall = wall
    return out


ZONE_DAYS = [(tz, d) for tz, spring, autumn in TRANSITIONS for d in (spring, autumn)] + [
    ("Europe/London", date(2024, 3, 31)),
    ("Antarctica/Troll", date(2024, 10, 27)),  # a two-hour fold
    ("America/Santiago", date(2024, 9, 8)),  # the gap is at midnight
]


def _field(draw: st.DrawFn, lo: int, hi: int) -> str:
    kind = draw(st.sampled_from(["star", "step", "value", "range", "list"]))
    a = draw(st.integers(lo, hi))
    b = draw(st.integers(a, hi))
    if kind == "star":
        return "*"
    if kind == "step":
        return f"*/{draw(st.integers(1, hi - lo + 1))}"
    if kind == "value":
        return str(a)
    if kind == "range":
        return f"{a}-{b}"
    return ",".join(map(str, draw(st.lists(st.integers(lo, hi), min_size=1, max_size=5))))


@st.composite
def day_exprs(draw: st.DrawFn) -> str:
    return f"{_field(draw, 0, 59)} {_field(draw, 0, 23)} * * *"


@settings(max_examples=40, deadline=None)
@given(expr=day_exprs(), zone_day=st.sampled_from(ZONE_DAYS))
def test_matches_oracle_around_transitions(expr: str, zone_day: tuple[str, date]) -> None:
    tz, day = zone_day
    start = datetime.combine(day - timedelta(days=1), datetime.min.time(), UTC)
    minutes = 3 * 24 * 60
    expected = oracle_fires(parse_cron(expr), tz, start, minutes)
    got = fires_between(
        Cron(expr, tz), start - timedelta(seconds=1), start + timedelta(minutes=minutes - 1), 10_000
    )
    assert got == expected


@st.composite
def any_exprs(draw: st.DrawFn) -> str:
    fields = [_field(draw, 0, 59), _field(draw, 0, 59), _field(draw, 0, 23)]
    fields += [_field(draw, 1, 31), _field(draw, 1, 12), _field(draw, 0, 7)]
    return " ".join(fields)


@settings(max_examples=60, deadline=None)
@given(
    expr=any_exprs(),
    tz=st.sampled_from(["Europe/Berlin", "America/New_York", "Australia/Lord_Howe"]),
    after=st.datetimes(datetime(2000, 1, 1), datetime(2040, 1, 1), timezones=st.just(UTC)),
)
def test_every_fire_matches_in_its_time_zone(expr: str, tz: str, after: datetime) -> None:
    try:
        c = Cron(expr, tz)
    except InvalidSchedule:
        assume(False)
        return
    zone = ZoneInfo(tz)
    for t in fires_between(c, after, after + timedelta(days=3 * 366), 30):
        aware = t.astimezone(zone)
        wall = aware.replace(tzinfo=None, fold=0)
        if c.spec.matches(wall):
            assert aware.fold == 0, f"{t} fired at the second occurrence of {wall}"
            continue
        # gap-shifted: t is the first instant after a gap holding a matching wall time
        before = (t - timedelta(microseconds=1)).astimezone(zone)
        gap = aware.utcoffset() - before.utcoffset()  # type: ignore[operator]
        assert gap > timedelta(0), f"{t} ({wall}) neither matches nor ends a gap"
        gap_start = wall - gap
        n = int(gap.total_seconds())
        assert any(c.spec.matches(gap_start + timedelta(seconds=k)) for k in range(n)), t

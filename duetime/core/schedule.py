"""Schedules: one-time and cron, and the pure math of when they fire.

Role: every question "when does this job run next?" is answered here, from arguments only —
no clock, no randomness, no I/O. Callers pass ``after``/``now`` (UTC-aware datetimes).

Guarantees:

* Cron expressions take 5 fields (``min hour dom month dow``) or 6 with SECONDS FIRST
  (``sec min hour dom month dow``, as Quartz, Spring and Temporal read them), plus the
  ``@hourly``-style macros. ``*``, ``?`` (day fields), lists, ranges, steps and month/day
  names are supported; ``L``, ``W`` and ``#`` are refused. When day-of-month and day-of-week
  are both restricted (neither starts with ``*`` or ``?``), a day matching EITHER fires
  (Vixie cron); otherwise both must match.
* Validation refuses an expression that can never fire (``0 0 30 2 *``). The Gregorian
  calendar repeats every 400 years, and every (month, day, weekday, leap-year) combination
  occurs in 2000–2027, so a 28-year scan is an exact test. Iteration is bounded: a search
  that finds no matching day in 400 years (impossible for a validated expression) stops.
* DST policy — the expression is evaluated on NAIVE local wall-clock times, each of which is
  then mapped to UTC with zoneinfo:
    - a wall time that does not exist (spring-forward gap) fires once, at the first instant
      after the gap (Berlin 02:30 on the spring day → 03:00 CEST = 01:00 UTC); several gap
      times collapse into that one fire;
    - a wall time that occurs twice (autumn fold) fires once, at its FIRST occurrence
      (``fold=0``).
  So an hourly ``0 * * * *`` fires 23 times on Berlin's spring day, 24 on a normal day and
  24 on the autumn day (the 25-hour day repeats 02:00 but it fires only once).
* Every sequence of fires is strictly increasing and in whole seconds; results are UTC-aware.
* Jitter (``Cron.jitter_s``, cron only: a one-time job names its own instant) delays each
  NOMINAL occurrence by :func:`jitter_ms`, a hash of the job id and the occurrence: in
  [0, jitter_s], the same on every scheduler and after every restart, with no state. The
  sequence of nominal occurrences (and so misfire, overlap and execution ids) is unchanged.
* A calendar (``Cron.calendar``, see :mod:`duetime.core.calendars`) does not change the
  sequence either: :func:`excluded` tells the scheduler which occurrences to skip.
"""

from __future__ import annotations

import calendar
import hashlib
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from functools import lru_cache
from typing import Any, Literal
from zoneinfo import ZoneInfo

from duetime.core.calendars import Calendar, calendar_to_dict, parse_calendar
from duetime.core.errors import InvalidSchedule, UnknownTimezone
from duetime.core.models import Misfire, Overlap

__all__ = [
    "Cron",
    "CronSpec",
    "OneTime",
    "Schedule",
    "excluded",
    "fire_at",
    "fires_between",
    "first_fire",
    "jitter_ms",
    "misfire_fires",
    "next_fire",
    "overlap_decision",
    "parse_cron",
    "parse_schedule",
    "parse_timestamp",
    "schedule_to_dict",
    "upcoming",
]

MAX_EXPR_CHARS = 256
MIN_TIMESTAMP = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TIMESTAMP = datetime(9000, 1, 1, tzinfo=UTC)
"""Timestamps a schedule may name: epoch milliseconds stay positive, and the cron search
(400 years ahead at most) never runs off the calendar's year 9999."""
VALIDATION_YEARS = (2000, 2028)  # [start, end): contains every calendar combination
MAX_JITTER_S = 24 * 3600.0
"""Jitter above a day is refused: it would spread a daily job over the next day's run."""
SEARCH_HORIZON_DAYS = 146_097  # 400 Gregorian years: no match in that span means never
_ONE_US = timedelta(microseconds=1)
# A fold longer than this is unknown in tzdata (Antarctica/Troll's is 2 h): used to bound the
# wall-clock start of a backwards search.
_FOLD_LOOKBACK_HOURS = 26

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES = {name.upper(): i for i, name in enumerate(calendar.month_abbr) if name}
_DOW_NAMES = {"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}


@dataclass(frozen=True)
class _FieldDef:
    name: str
    lo: int
    hi: int
    names: Mapping[str, int]
    question_ok: bool = False


_SECOND = _FieldDef("second", 0, 59, {})
_MINUTE = _FieldDef("minute", 0, 59, {})
_HOUR = _FieldDef("hour", 0, 23, {})
_DOM = _FieldDef("day-of-month", 1, 31, {}, question_ok=True)
_MONTH = _FieldDef("month", 1, 12, _MONTH_NAMES)
_DOW = _FieldDef("day-of-week", 0, 7, _DOW_NAMES, question_ok=True)


@dataclass(frozen=True)
class CronSpec:
    """A parsed cron expression: the allowed values of each field, sorted."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    doms: frozenset[int]
    months: frozenset[int]
    dows: frozenset[int]  # 0 = Sunday … 6 = Saturday (7 is folded into 0)
    day_or: bool  # both day fields restricted: either matches (Vixie cron)

    def day_matches(self, d: date) -> bool:
        if d.month not in self.months:
            return False
        dom_ok = d.day in self.doms
        dow_ok = d.isoweekday() % 7 in self.dows
        return (dom_ok or dow_ok) if self.day_or else (dom_ok and dow_ok)

    def matches(self, wall: datetime) -> bool:
        """Does this naive wall-clock time (to the second) match the expression?"""
        return (
            wall.second in self.seconds
            and wall.minute in self.minutes
            and wall.hour in self.hours
            and self.day_matches(wall.date())
        )


def _bad_cron(message: str) -> InvalidSchedule:
    return InvalidSchedule(message, field="schedule.cron")


def _field_value(text: str, fd: _FieldDef) -> int:
    if text.isdigit():
        value = int(text)
    elif text.upper() in fd.names:
        value = fd.names[text.upper()]
    elif any(ch in text.upper() for ch in "LW#"):
        raise _bad_cron(f"cron {fd.name} field: {text!r}: L, W and # are not supported")
    else:
        raise _bad_cron(f"cron {fd.name} field: {text!r} is not a number or a known name")
    if not fd.lo <= value <= fd.hi:
        raise _bad_cron(f"cron {fd.name} field: {value} is out of range {fd.lo}-{fd.hi}")
    return value


def _parse_field(text: str, fd: _FieldDef) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise _bad_cron(f"cron {fd.name} field {text!r}: empty list element")
        body, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise _bad_cron(f"cron {fd.name} field {part!r}: step must be a positive number")
            step = int(step_text)
        if body == "*" or (body == "?" and fd.question_ok):
            lo, hi = fd.lo, fd.hi
        elif "-" in body:
            first, _, last = body.partition("-")
            lo, hi = _field_value(first, fd), _field_value(last, fd)
            if lo > hi:
                raise _bad_cron(f"cron {fd.name} field {part!r}: range runs backwards")
        else:
            lo = _field_value(body, fd)
            hi = fd.hi if slash else lo  # "5/15" means 5-max/15, as Quartz and croniter read it
        values.update(range(lo, hi + 1, step))
    return values


def parse_cron(expr: str) -> CronSpec:
    """Parse and validate a cron expression; raise InvalidSchedule naming what is wrong."""
    if not isinstance(expr, str) or not expr.strip():
        raise _bad_cron("cron expression must be a non-empty string")
    if len(expr) > MAX_EXPR_CHARS:
        raise _bad_cron(f"cron expression is longer than {MAX_EXPR_CHARS} characters")
    return _parse_cron(expr)


@lru_cache(maxsize=4096)
def _parse_cron(expr: str) -> CronSpec:
    """A valid expression's spec, kept: one create parses its schedule three times (validation,
    the record, the row's first run) and a deployment has few distinct expressions. CronSpec
    is frozen (tuples and frozensets), so sharing one is safe; an invalid expression raises
    and is not kept. Bounded, and keyed by strings of at most MAX_EXPR_CHARS."""
    text = expr.strip()
    if text.startswith("@"):
        if text.lower() not in _MACROS:
            raise _bad_cron(f"unknown cron macro {text!r}; known: {', '.join(_MACROS)}")
        text = _MACROS[text.lower()]
    parts = text.split()
    if len(parts) == 5:
        parts = ["0", *parts]
    elif len(parts) != 6:
        raise _bad_cron(
            f"cron expression has {len(parts)} fields; expected 5 (min hour day-of-month month "
            "day-of-week) or 6 with seconds first (sec min hour day-of-month month day-of-week)"
        )
    sec, minute, hour, dom, month, dow = parts
    dows = _parse_field(dow, _DOW)
    if 7 in dows:
        dows = (dows - {7}) | {0}
    spec = CronSpec(
        seconds=tuple(sorted(_parse_field(sec, _SECOND))),
        minutes=tuple(sorted(_parse_field(minute, _MINUTE))),
        hours=tuple(sorted(_parse_field(hour, _HOUR))),
        doms=frozenset(_parse_field(dom, _DOM)),
        months=frozenset(_parse_field(month, _MONTH)),
        dows=frozenset(dows),
        day_or=not (dom[0] in "*?" or dow[0] in "*?"),
    )
    start, end = date(VALIDATION_YEARS[0], 1, 1), date(VALIDATION_YEARS[1], 1, 1)
    if _first_matching_day(spec, start, 1, (end - start).days - 1) is None:
        raise _bad_cron(f"cron expression {expr!r} never fires (no such day in any year)")
    return spec


def _next_month(d: date) -> date:
    return date(d.year + d.month // 12, d.month % 12 + 1, 1)


def _first_matching_day(
    spec: CronSpec, start: date, step: int, max_days: int = SEARCH_HORIZON_DAYS
) -> date | None:
    """The first matching day from ``start`` in direction ``step`` (±1), at most
    ``max_days`` days away."""
    d, idle = start, 0
    try:
        while idle <= max_days:
            if d.month not in spec.months:
                # jump over the whole month
                nd = _next_month(d) if step == 1 else d.replace(day=1) - timedelta(days=1)
                idle += abs((nd - d).days)
                d = nd
                continue
            if spec.day_matches(d):
                return d
            idle += 1
            d += timedelta(days=step)
    except OverflowError:  # ran off year 1 or 9999
        return None
    return None


def _wall_times(spec: CronSpec, start: datetime, step: int) -> Iterator[datetime]:
    """Matching naive wall times from ``start`` (inclusive) in direction ``step`` (±1)."""
    d: date | None = start.date()
    first_day = True
    while d is not None:
        d = _first_matching_day(spec, d, step)
        if d is None:
            return
        bounded = first_day and d == start.date()
        first_day = False
        clock = _times_from(spec, start, step) if bounded else _times_of_day(spec, step)
        for h, m, s in clock:
            yield datetime.combine(d, time(h, m, s))
        try:
            d += timedelta(days=step)
        except OverflowError:
            return


def _times_of_day(spec: CronSpec, step: int) -> Iterator[tuple[int, int, int]]:
    hours = spec.hours if step == 1 else spec.hours[::-1]
    minutes = spec.minutes if step == 1 else spec.minutes[::-1]
    seconds = spec.seconds if step == 1 else spec.seconds[::-1]
    for h in hours:
        for m in minutes:
            for s in seconds:
                yield h, m, s


def _times_from(spec: CronSpec, bound: datetime, step: int) -> Iterator[tuple[int, int, int]]:
    """The day's matching (h, m, s) at or after ``bound``'s time of day (at or before it when
    ``step`` is -1), starting the search AT the bound: late in the day ``* * * * * *`` costs
    a few steps, not the 86,400 of a scan from midnight."""
    bh, bm, bs = bound.hour, bound.minute, bound.second
    if step == 1:
        for h in spec.hours[bisect_left(spec.hours, bh) :]:
            mins = spec.minutes if h > bh else spec.minutes[bisect_left(spec.minutes, bm) :]
            for m in mins:
                later = (h, m) > (bh, bm)
                for s in spec.seconds if later else spec.seconds[bisect_left(spec.seconds, bs) :]:
                    yield h, m, s
        return
    for h in reversed(spec.hours[: bisect_right(spec.hours, bh)]):
        mins = spec.minutes if h < bh else spec.minutes[: bisect_right(spec.minutes, bm)]
        for m in reversed(mins):
            earlier = (h, m) < (bh, bm)
            secs = spec.seconds if earlier else spec.seconds[: bisect_right(spec.seconds, bs)]
            for s in reversed(secs):
                yield h, m, s


def _wall_to_utc(
    wall: datetime, tz: tzinfo, last_gap_end: datetime | None
) -> tuple[datetime, bool]:
    """Map a naive wall time to UTC: first occurrence in a fold, end of the gap in a gap.

    Returns (instant, whether ``wall`` was in a gap).
    """
    utc = wall.replace(tzinfo=tz).astimezone(UTC)
    if utc.astimezone(tz).replace(tzinfo=None) == wall:
        return utc, False  # exists; fold=0 is the first occurrence when ambiguous
    # In a gap, fold=1 reads the wall time with the offset after the transition (an instant
    # before it) and fold=0 with the offset before it (an instant at or after it).
    lo = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    hi = utc
    if last_gap_end is not None and lo < last_gap_end <= hi:
        return last_gap_end, True
    after_offset = hi.astimezone(tz).utcoffset()
    while hi - lo > _ONE_US:
        mid = lo + (hi - lo) // 2
        if mid.astimezone(tz).utcoffset() == after_offset:
            hi = mid
        else:
            lo = mid
    return hi, True


# ---------------------------------------------------------------------------------- schedules


def _aware_utc(value: datetime, field_name: str) -> datetime:
    if not isinstance(value, datetime):
        raise InvalidSchedule(f"{field_name} must be a datetime", field=field_name)
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidSchedule(
            f"{field_name} has no UTC offset; give one (e.g. 'Z' or '+01:00')", field=field_name
        )
    try:
        utc = value.astimezone(UTC)
    except OverflowError:  # an offset that pushes the year to 0 or 10000
        utc = None
    if utc is None or not MIN_TIMESTAMP <= utc < MAX_TIMESTAMP:
        raise InvalidSchedule(
            f"{field_name} must lie in [{MIN_TIMESTAMP.year}, {MAX_TIMESTAMP.year}) UTC",
            field=field_name,
        )
    return utc


def _zone(name: str) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise UnknownTimezone("timezone must be a non-empty IANA name", field="schedule.timezone")
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError, OSError) as exc:  # ZoneInfoNotFoundError is a KeyError
        raise UnknownTimezone(
            f"unknown time zone {name!r}; use an IANA name such as 'Europe/Berlin' or 'UTC'",
            field="schedule.timezone",
        ) from exc


@dataclass(frozen=True)
class OneTime:
    """Run once at ``at`` (normalised to UTC; a naive datetime is refused)."""

    at: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "at", _aware_utc(self.at, "schedule.at"))


@dataclass(frozen=True)
class Cron:
    """Run at every match of ``expr`` in ``timezone``, within [start_at, end_at] if given;
    each occurrence ``jitter_ms`` late, none on a date ``calendar`` excludes."""

    expr: str
    timezone: str = "UTC"
    start_at: datetime | None = None
    end_at: datetime | None = None
    jitter_s: float = 0.0
    calendar: Calendar | None = None
    spec: CronSpec = field(init=False, repr=False, compare=False)
    tz: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "spec", parse_cron(self.expr))
        object.__setattr__(self, "tz", _zone(self.timezone))
        if self.start_at is not None:
            object.__setattr__(self, "start_at", _aware_utc(self.start_at, "schedule.start_at"))
        if self.end_at is not None:
            object.__setattr__(self, "end_at", _aware_utc(self.end_at, "schedule.end_at"))
        jitter = self.jitter_s
        # bool is an int: `true` is not a number of seconds
        if isinstance(jitter, bool) or not isinstance(jitter, int | float):
            raise InvalidSchedule("schedule.jitter_s must be a number", field="schedule.jitter_s")
        if not 0 <= jitter <= MAX_JITTER_S:  # also refuses NaN
            raise InvalidSchedule(
                f"schedule.jitter_s must lie in [0, {MAX_JITTER_S:.0f}] seconds, not {jitter}",
                field="schedule.jitter_s",
            )
        object.__setattr__(self, "jitter_s", float(jitter))
        if self.start_at is not None and self.end_at is not None and self.end_at < self.start_at:
            raise InvalidSchedule(
                f"end_at {self.end_at.isoformat()} is before start_at {self.start_at.isoformat()}",
                field="schedule.end_at",
            )


Schedule = OneTime | Cron


def parse_timestamp(value: Any, field_name: str) -> datetime:
    """An RFC 3339 string (with its offset) or an aware datetime → UTC; InvalidSchedule naming
    ``field_name`` otherwise, or outside the years a schedule may name."""
    return _parse_timestamp(value, field_name)


def _parse_timestamp(value: Any, field_name: str) -> datetime:
    if isinstance(value, datetime):
        return _aware_utc(value, field_name)
    if not isinstance(value, str):
        raise InvalidSchedule(
            f"{field_name} must be an RFC 3339 timestamp string", field=field_name
        )
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise InvalidSchedule(
            f"{field_name} {value!r} is not an RFC 3339 timestamp", field=field_name
        ) from exc
    if parsed.tzinfo is None:
        raise InvalidSchedule(
            f"{field_name} {value!r} has no UTC offset; add 'Z' or an offset such as '+01:00'",
            field=field_name,
        )
    return _aware_utc(parsed, field_name)


_CRON_KEYS = frozenset({"cron", "timezone", "start_at", "end_at", "jitter_s", "calendar"})


def parse_schedule(obj: Mapping[str, Any]) -> Schedule:
    """Build a schedule from its API body form; raise InvalidSchedule / UnknownTimezone."""
    if not isinstance(obj, Mapping):
        raise InvalidSchedule("schedule must be an object", field="schedule")
    has_at, has_cron = "at" in obj, "cron" in obj
    if has_at and has_cron:
        raise InvalidSchedule(
            "schedule has both 'at' and 'cron'; give exactly one", field="schedule"
        )
    if not (has_at or has_cron):
        raise InvalidSchedule(
            "schedule needs 'at' (a one-time RFC 3339 timestamp) or 'cron' (recurring)",
            field="schedule",
        )
    allowed = frozenset({"at"}) if has_at else _CRON_KEYS
    for key in obj:
        if key not in allowed:
            kind = "a one-time ('at')" if has_at else "a cron"
            raise InvalidSchedule(
                f"unknown field {key!r} for {kind} schedule; allowed: {', '.join(sorted(allowed))}",
                field=f"schedule.{key}",
            )
    if has_at:
        return OneTime(_parse_timestamp(obj.get("at"), "schedule.at"))
    expr = obj.get("cron")
    if not isinstance(expr, str):
        raise InvalidSchedule("schedule.cron must be a string", field="schedule.cron")
    timezone = obj.get("timezone")
    if timezone is None:  # absent or JSON null
        timezone = "UTC"
    if not isinstance(timezone, str):
        raise UnknownTimezone("schedule.timezone must be a string", field="schedule.timezone")
    start_at = obj.get("start_at")
    end_at = obj.get("end_at")
    jitter_s = obj.get("jitter_s")
    return Cron(
        expr,
        timezone,
        None if start_at is None else _parse_timestamp(start_at, "schedule.start_at"),
        None if end_at is None else _parse_timestamp(end_at, "schedule.end_at"),
        0.0 if jitter_s is None else jitter_s,
        _calendar(obj.get("calendar")),
    )


def _calendar(raw: Any) -> Calendar | None:
    """A calendar's rules (an object). A bare NAME is resolved by the REST API against its
    stored calendars before the body comes here; anywhere else it cannot be."""
    if raw is None:
        return None
    if isinstance(raw, str):
        raise InvalidSchedule(
            f"schedule.calendar {raw[:100]!r} is a calendar name: the REST API and the SDK "
            "resolve names (from POST /v1/calendars); here give the calendar's rules",
            field="schedule.calendar",
        )
    return parse_calendar(raw, "schedule.calendar")


def _rfc3339(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def schedule_to_dict(schedule: Schedule) -> dict[str, Any]:
    """The API body form; ``parse_schedule(schedule_to_dict(s)) == s``."""
    if isinstance(schedule, OneTime):
        return {"at": _rfc3339(schedule.at)}
    out: dict[str, Any] = {"cron": schedule.expr, "timezone": schedule.timezone}
    if schedule.start_at is not None:
        out.update(start_at=_rfc3339(schedule.start_at))
    if schedule.end_at is not None:
        out.update(end_at=_rfc3339(schedule.end_at))
    if schedule.jitter_s:
        out.update(jitter_s=schedule.jitter_s)
    if schedule.calendar is not None:
        out.update(calendar=calendar_to_dict(schedule.calendar))
    return out


# ------------------------------------------------------------------------------ fire sequences


def _require_aware(value: datetime, name: str) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (got naive {value.isoformat()})")
    return value.astimezone(UTC)


def _cron_forward(cron: Cron, after: datetime, inclusive: bool) -> Iterator[datetime]:
    """Fires > after (>= if inclusive), honouring start_at/end_at, strictly increasing."""
    lower = after
    if cron.start_at is not None and cron.start_at > lower:
        lower, inclusive = cron.start_at, True
    # Any wall time before lower's own wall time maps to an instant <= lower (the map from
    # wall time to UTC is non-decreasing), so starting there loses nothing.
    start_wall = lower.astimezone(cron.tz).replace(tzinfo=None)
    last: datetime | None = None
    gap_end: datetime | None = None
    for wall in _wall_times(cron.spec, start_wall, 1):
        t, in_gap = _wall_to_utc(wall, cron.tz, gap_end)
        if in_gap:
            gap_end = t
        if t < lower or (t == lower and not inclusive) or (last is not None and t <= last):
            continue
        if cron.end_at is not None and t > cron.end_at:
            return
        last = t
        yield t


def _cron_backward(cron: Cron, upper: datetime) -> Iterator[datetime]:
    """Fires <= upper, newest first, honouring start_at/end_at, strictly decreasing."""
    if cron.end_at is not None and cron.end_at < upper:
        upper = cron.end_at
    # In a fold, wall times later than upper's own wall time can still map to instants
    # <= upper (their first occurrence): start from the largest offset seen lately.
    offset = max(
        (upper - timedelta(hours=h)).astimezone(cron.tz).utcoffset() or timedelta(0)
        for h in range(_FOLD_LOOKBACK_HOURS + 1)
    )
    start_wall = (upper + offset).replace(tzinfo=None)
    last: datetime | None = None
    gap_end: datetime | None = None
    for wall in _wall_times(cron.spec, start_wall, -1):
        t, in_gap = _wall_to_utc(wall, cron.tz, gap_end)
        if in_gap:
            gap_end = t
        if t > upper or (last is not None and t >= last):
            continue
        if cron.start_at is not None and t < cron.start_at:
            return
        last = t
        yield t


def next_fire(schedule: Schedule, after: datetime) -> datetime | None:
    """The first fire strictly after ``after``, or None (one-time done, past end_at)."""
    after = _require_aware(after, "after")
    if isinstance(schedule, OneTime):
        return schedule.at if schedule.at > after else None
    return next(_cron_forward(schedule, after, inclusive=False), None)


def first_fire(schedule: Schedule, created_at: datetime) -> datetime | None:
    """When a job created at ``created_at`` fires first.

    One-time: ``max(at, created_at)`` — a time in the past runs now. Cron: the first match
    at or after ``max(created_at, start_at)`` (a job created exactly on a match fires then).
    """
    created_at = _require_aware(created_at, "created_at")
    if isinstance(schedule, OneTime):
        return max(schedule.at, created_at)
    return next(_cron_forward(schedule, created_at, inclusive=True), None)


def fires_between(
    schedule: Schedule, after: datetime, until: datetime, limit: int
) -> list[datetime]:
    """The earliest ``limit`` fires t with after < t <= until, in order."""
    after, until = _require_aware(after, "after"), _require_aware(until, "until")
    if limit < 0:
        raise ValueError("limit must be >= 0")
    if isinstance(schedule, OneTime):
        return [schedule.at] if after < schedule.at <= until and limit > 0 else []
    out: list[datetime] = []
    if limit == 0 or until <= after:
        return out
    for t in _cron_forward(schedule, after, inclusive=False):
        if t > until:
            break
        out.append(t)
        if len(out) >= limit:
            break
    return out


def jitter_ms(job_id: str, nominal_ms: int, jitter_s: float) -> int:
    """The delay of one occurrence: uniform-ish in [0, jitter_s] (whole ms), derived from the
    job id and the nominal occurrence only, so every scheduler, before and after a restart or
    a failover, computes the same fire time (and no state has to remember it)."""
    bound_ms = int(jitter_s * 1000)
    if bound_ms <= 0:
        return 0
    digest = hashlib.blake2b(f"{job_id}/{nominal_ms}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (bound_ms + 1)


def fire_at(schedule: Schedule, job_id: str, nominal: datetime) -> datetime:
    """When the occurrence ``nominal`` actually fires: nominal + its jitter (cron only)."""
    if isinstance(schedule, OneTime) or not schedule.jitter_s:
        return nominal
    nominal_ms = int(nominal.timestamp() * 1000)
    return nominal + timedelta(milliseconds=jitter_ms(job_id, nominal_ms, schedule.jitter_s))


def excluded(schedule: Schedule, nominal: datetime) -> bool:
    """Does the job's calendar exclude this occurrence (by its date in the calendar's zone)?"""
    return (
        isinstance(schedule, Cron)
        and schedule.calendar is not None
        and schedule.calendar.excludes(nominal)
    )


MAX_UPCOMING_SCAN = 10_000
"""Nominal occurrences ``upcoming`` looks at for the ones a calendar lets through."""


def upcoming(schedule: Schedule, job_id: str, first: datetime | None, count: int) -> list[datetime]:
    """The fire times (jitter included) of the next ``count`` occurrences from the nominal
    ``first`` on (inclusive), those a calendar excludes left out; what ``next_runs`` shows."""
    out: list[datetime] = []
    nominal, scanned = first, 0
    while nominal is not None and len(out) < count and scanned < MAX_UPCOMING_SCAN:
        scanned += 1
        if not excluded(schedule, nominal):
            out.append(fire_at(schedule, job_id, nominal))
        nominal = next_fire(schedule, nominal)
    return out


def misfire_fires(
    schedule: Schedule,
    policy: Misfire,
    missed_after: datetime,
    now: datetime,
    catch_up_cap: int,
    catch_up_window_s: float,
) -> list[datetime]:
    """The occurrences to emit for those missed in (missed_after, now], oldest first.

    * ``skip``: none.
    * ``run_once``: the latest missed occurrence, however old; its ``scheduled_at`` is that
      occurrence's time (the run is late, and the lateness shows).
    * ``run_all``: the missed occurrences in (now - catch_up_window_s, now], at most the
      ``catch_up_cap`` most recent ones.
    A one-time job missed (its ``at`` in the interval) fires once under run_once and run_all,
    whatever the window. Callers track which fires already happened and pass
    ``missed_after`` = the last instant they had handled.
    """
    missed_after, now = _require_aware(missed_after, "missed_after"), _require_aware(now, "now")
    if catch_up_cap < 0 or not catch_up_window_s >= 0:  # also refuses NaN
        raise ValueError("catch_up_cap and catch_up_window_s must be >= 0")
    if policy is Misfire.SKIP or now <= missed_after:
        return []
    if isinstance(schedule, OneTime):
        return [schedule.at] if missed_after < schedule.at <= now else []
    if policy is Misfire.RUN_ONCE:
        latest = next(_cron_backward(schedule, now), None)
        return [latest] if latest is not None and latest > missed_after else []
    if catch_up_window_s >= (now - missed_after).total_seconds():
        lower = missed_after  # also keeps a huge window from overflowing datetime
    else:
        lower = now - timedelta(seconds=catch_up_window_s)
    out: list[datetime] = []
    if catch_up_cap == 0:
        return out
    for t in _cron_backward(schedule, now):
        if t <= lower:
            break
        out.append(t)
        if len(out) >= catch_up_cap:
            break
    out.reverse()
    return out


def overlap_decision(
    policy: Overlap, running: int, queued: int
) -> Literal["fire", "skip", "queue"]:
    """What to do with an occurrence that is due while earlier ones may still be live.

    ``running``/``queued``: executions of this job running now / held back waiting for them.
    allow → fire; skip → fire only if nothing runs; queue_one → fire if nothing runs, else
    hold it back if nothing is held yet, else skip it.
    """
    if running < 0 or queued < 0:
        raise ValueError("running and queued must be >= 0")
    if policy is Overlap.ALLOW or running == 0:
        return "fire"
    if policy is Overlap.QUEUE_ONE and queued == 0:
        return "queue"
    return "skip"

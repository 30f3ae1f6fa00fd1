"""Named calendars: dates, date ranges and weekdays on which a cron job does not run.

Role: the pure rules of a calendar and their one validation, shared by the REST API (which
stores calendars by name), the SDK (which passes the rules inline) and the scheduler (which
skips an excluded occurrence). No clock, no I/O.

Guarantees:

* An occurrence is excluded when its LOCAL DATE in the calendar's own time zone (which may
  differ from the cron's) is an excluded date, lies in an excluded range (both ends
  included), or falls on an excluded weekday. A DST change does not move a date: an
  occurrence at 00:30 local on an excluded day is excluded whatever the offset.
* The rules are normalised when parsed (dates sorted, duplicates dropped, weekdays in
  Monday-first order), so two calendars with the same rules compare equal and the copy a job
  carries is stable (``parse_calendar(calendar_to_dict(c)) == c``).
* Bounded: at most ``MAX_EXCLUDES`` entries; a range spans at most ``MAX_RANGE_DAYS``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any
from zoneinfo import ZoneInfo

from .errors import UnknownTimezone, ValidationError

__all__ = [
    "CALENDAR_NAME_PATTERN",
    "Calendar",
    "UnknownCalendar",
    "calendar_to_dict",
    "check_calendar_name",
    "parse_calendar",
]

CALENDAR_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
"""A calendar's name: it travels in URLs (``/v1/calendars/{name}``) and CLI arguments."""
_NAME_RE = re.compile(CALENDAR_NAME_PATTERN)
MAX_EXCLUDES = 1000
"""Entries of ``exclude``: a job carries a copy of its calendar, which must stay small."""
MAX_RANGE_DAYS = 3660
"""A range longer than ten years is a mistake (a job that never runs), not a holiday."""
MIN_YEAR, MAX_YEAR = 1970, 8999
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
"""Weekday names, Monday first (``date.weekday()`` order)."""
_KEYS = frozenset({"name", "timezone", "exclude", "exclude_weekdays"})


class UnknownCalendar(ValidationError):
    """A job names a calendar that does not exist (REST 422)."""

    code = "unknown_calendar"


@dataclass(frozen=True)
class Calendar:
    """A calendar's rules. ``ranges``: inclusive (first, last) date pairs, sorted;
    ``weekdays``: excluded ``date.weekday()`` numbers (0 = Monday)."""

    name: str
    timezone: str = "UTC"
    ranges: tuple[tuple[date, date], ...] = ()
    weekdays: frozenset[int] = frozenset()

    def excludes_date(self, day: date) -> bool:
        if day.weekday() in self.weekdays:
            return True
        # few entries (<= 1000) and the check runs once per occurrence: a scan is enough
        return any(first <= day <= last for first, last in self.ranges)

    def excludes(self, instant: datetime) -> bool:
        """Is this instant's local date (in the calendar's zone) excluded?"""
        if instant.tzinfo is None:
            raise ValueError(f"instant must be timezone-aware (got {instant.isoformat()})")
        return self.excludes_date(instant.astimezone(ZoneInfo(self.timezone)).date())


def check_calendar_name(name: Any, field: str = "calendar") -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValidationError(
            f"{field} must be a calendar name (letters, digits, '.', '_', '-'; up to 100; "
            f"first a letter or digit), not {str(name)[:120]!r}",
            field=field,
        )
    return name


def _day(text: str, field: str) -> date:
    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise ValidationError(
            f"{field}: {text[:40]!r} is not a date (YYYY-MM-DD)", field=field
        ) from None
    if len(text) != 10 or not MIN_YEAR <= day.year <= MAX_YEAR:
        raise ValidationError(
            f"{field}: {text[:40]!r} must be YYYY-MM-DD in years {MIN_YEAR}-{MAX_YEAR}",
            field=field,
        )
    return day


def _range(entry: Any, field: str) -> tuple[date, date]:
    """``"2026-12-25"`` (one day) or ``"2026-12-24..2026-12-31"`` (both ends included)."""
    if not isinstance(entry, str):
        raise ValidationError(f"{field} must be a string: a date or a range", field=field)
    first_text, dots, last_text = entry.partition("..")
    first = _day(first_text.strip(), field)
    last = _day(last_text.strip(), field) if dots else first
    if last < first:
        raise ValidationError(f"{field}: range {entry!r} runs backwards", field=field)
    if (last - first).days >= MAX_RANGE_DAYS:
        raise ValidationError(
            f"{field}: range {entry!r} is longer than {MAX_RANGE_DAYS} days", field=field
        )
    return first, last


_WEEKDAY_NAMES = {
    **{name: i for i, name in enumerate(WEEKDAYS)},
    **{
        name: i
        for i, name in enumerate(
            ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
        )
    },
}


def _weekday(entry: Any, field: str) -> int:
    """``sat``, ``Saturday`` (any case) → 5."""
    day = _WEEKDAY_NAMES.get(entry.strip().lower()) if isinstance(entry, str) else None
    if day is None:
        raise ValidationError(
            f"{field}: {str(entry)[:40]!r} is not a weekday ({', '.join(WEEKDAYS)})", field=field
        )
    return day


def _zone_name(raw: Any, field: str) -> str:
    name = "UTC" if raw is None else raw
    if not isinstance(name, str) or not name:
        raise UnknownTimezone(f"{field} must be an IANA time zone name", field=field)
    try:
        ZoneInfo(name)
    except (KeyError, ValueError, OSError):  # ZoneInfoNotFoundError is a KeyError
        raise UnknownTimezone(
            f"unknown time zone {name[:80]!r}; use an IANA name such as 'Europe/Berlin'",
            field=field,
        ) from None
    return name


def _merged(ranges: list[tuple[date, date]]) -> tuple[tuple[date, date], ...]:
    """Sorted, with overlapping and adjacent ranges joined: one normal form per rule set."""
    out: list[tuple[date, date]] = []
    for first, last in sorted(ranges):
        if out and first.toordinal() <= out[-1][1].toordinal() + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return tuple(out)


def parse_calendar(obj: Any, field: str = "calendar") -> Calendar:
    """A calendar from its API form; ValidationError naming the field at fault."""
    if not isinstance(obj, Mapping):
        raise ValidationError(f"{field} must be an object", field=field)
    unknown = sorted(str(k) for k in obj if k not in _KEYS)
    if unknown:
        raise ValidationError(
            f"unknown field(s) of a calendar: {', '.join(unknown)[:200]}; allowed: "
            f"{', '.join(sorted(_KEYS))}",
            field=f"{field}.{unknown[0][:80]}",
        )
    name = check_calendar_name(obj.get("name"), f"{field}.name")
    timezone = _zone_name(obj.get("timezone"), f"{field}.timezone")
    excludes = obj.get("exclude") or []
    weekdays = obj.get("exclude_weekdays") or []
    for key, value in (("exclude", excludes), ("exclude_weekdays", weekdays)):
        if not isinstance(value, list):
            raise ValidationError(f"{field}.{key} must be a list", field=f"{field}.{key}")
    if len(excludes) > MAX_EXCLUDES:
        raise ValidationError(
            f"{field}.exclude has {len(excludes)} entries, over the limit of {MAX_EXCLUDES}",
            field=f"{field}.exclude",
        )
    ranges = [_range(e, f"{field}.exclude[{i}]") for i, e in enumerate(excludes)]
    days = frozenset(_weekday(w, f"{field}.exclude_weekdays[{i}]") for i, w in enumerate(weekdays))
    if len(days) == len(WEEKDAYS):
        # a calendar that excludes every day would silently stop its jobs for good
        raise ValidationError(
            f"{field}.exclude_weekdays excludes every day of the week",
            field=f"{field}.exclude_weekdays",
        )
    return Calendar(name, timezone, _merged(ranges), days)


def calendar_to_dict(calendar: Calendar) -> dict[str, Any]:
    """The API form (also what a job's copy holds); ``parse_calendar`` gives it back."""
    return {
        "name": calendar.name,
        "timezone": calendar.timezone,
        "exclude": [
            first.isoformat() if first == last else f"{first.isoformat()}..{last.isoformat()}"
            for first, last in calendar.ranges
        ],
        "exclude_weekdays": [WEEKDAYS[d] for d in sorted(calendar.weekdays)],
    }


def local_date(calendar: Calendar, instant_ms: int) -> date:
    """The date of ``instant_ms`` in the calendar's zone (for messages and metrics)."""
    return (
        datetime.fromtimestamp(instant_ms / 1000, tz=UTC)
        .astimezone(ZoneInfo(calendar.timezone))
        .date()
    )

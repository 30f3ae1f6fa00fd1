"""Routes of named calendars (``/v1/calendars``) and the resolution of a job's ``calendar``.

A calendar lives in the API's ``calendars`` table (migration 0010). A cron job names one
(``"schedule": {"cron": ..., "calendar": "holidays"}``) and the API copies the calendar's
rules into the job's definition when the job is created or updated: the schedulers skip
occurrences on the copy's excluded dates and never read this table (docs/decisions.md). So a
change to a calendar, or its deletion, applies to the jobs created or updated after it; an
existing job keeps its copy until it is updated (``PATCH`` with its schedule re-reads the
calendar). ``GET /v1/jobs/{id}`` shows the copy the job runs by.

Errors: an unknown calendar named by a job is a 422 (``unknown_calendar``, field
``schedule.calendar``); a calendar that exists with other rules is a 409 on ``POST`` (``PUT``
replaces it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from psycopg import AsyncConnection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from duetime.core.calendars import (
    CALENDAR_NAME_PATTERN,
    Calendar,
    UnknownCalendar,
    calendar_to_dict,
    check_calendar_name,
    parse_calendar,
)
from duetime.core.errors import Conflict, NotFound, ValidationError

from .deps import Res, Resources, read_json
from .pagination import BadRequest
from .schemas import CALENDAR_SCHEMA, errors, request_body

router = APIRouter()


class CalendarOut(BaseModel):
    name: str
    timezone: str
    exclude: list[str]
    exclude_weekdays: list[str]
    created_at: datetime
    updated_at: datetime


class CalendarPage(BaseModel):
    items: list[CalendarOut]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class CalendarRow:
    name: str
    rules: dict[str, Any]
    """The API form of the rules (``calendar_to_dict``): what a job copies."""
    created_at: datetime
    updated_at: datetime

    def out(self) -> CalendarOut:
        return CalendarOut(**self.rules, created_at=self.created_at, updated_at=self.updated_at)


_COLUMNS = "name, rules, created_at, updated_at"


async def _get(conn: AsyncConnection[Any], name: str) -> CalendarRow | None:
    async with conn.cursor(row_factory=class_row(CalendarRow)) as cur:
        await cur.execute(f"SELECT {_COLUMNS} FROM calendars WHERE name = %s", (name,))
        return await cur.fetchone()


def _rules(body: Any, name: str | None = None) -> Calendar:
    """A calendar body, validated and normalised; ``name``: the path's (the body may leave
    its own out, or must give the same)."""
    if not isinstance(body, dict):
        raise ValidationError("a calendar must be a JSON object", field="")
    if name is not None:
        given = body.get("name", name)
        if given != name:
            raise ValidationError(
                f"the body names calendar {str(given)[:100]!r}, the path {name!r}", field="name"
            )
        body = {**body, "name": name}
    return parse_calendar(body, "calendar")


@router.post(
    "/calendars",
    status_code=201,
    response_model=CalendarOut,
    responses={
        200: {"model": CalendarOut, "description": "the calendar exists with these same rules"},
        **errors(400, 401, 409, 413, 415, 422),
    },
    openapi_extra=request_body(CALENDAR_SCHEMA),
    summary="create a named calendar: dates, date ranges and weekdays a cron job skips",
)
async def create_calendar(request: Request, response: Response, res: Res) -> CalendarOut:
    calendar = _rules(await read_json(request, res.settings))
    rules = calendar_to_dict(calendar)
    now = res.now()
    async with res.pool.connection() as conn, conn.transaction():
        async with conn.cursor(row_factory=class_row(CalendarRow)) as cur:
            await cur.execute(
                f"INSERT INTO calendars ({_COLUMNS}) VALUES (%s, %s, %s, %s) "
                f"ON CONFLICT (name) DO NOTHING RETURNING {_COLUMNS}",
                (calendar.name, Jsonb(rules), now, now),
            )
            row: CalendarRow | None = await cur.fetchone()
        if row is None:
            row = await _get(conn, calendar.name)
            if row is None or row.rules != rules:
                raise Conflict(
                    f"calendar {calendar.name!r} exists with other rules (PUT replaces them)",
                    details={"name": calendar.name},
                )
            response.status_code = 200
    return row.out()


@router.put(
    "/calendars/{name}",
    response_model=CalendarOut,
    responses=errors(400, 401, 413, 415, 422),
    openapi_extra=request_body(CALENDAR_SCHEMA),
    summary="create or replace a calendar (jobs that copied it keep their copy until updated)",
)
async def put_calendar(name: str, request: Request, res: Res) -> CalendarOut:
    name = check_calendar_name(name, "name")
    rules = calendar_to_dict(_rules(await read_json(request, res.settings), name))
    now = res.now()
    async with (
        res.pool.connection() as conn,
        conn.cursor(row_factory=class_row(CalendarRow)) as cur,
    ):
        await cur.execute(
            f"INSERT INTO calendars ({_COLUMNS}) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (name) DO UPDATE SET rules = EXCLUDED.rules, updated_at = "
            f"EXCLUDED.updated_at RETURNING {_COLUMNS}",
            (name, Jsonb(rules), now, now),
        )
        row: CalendarRow | None = await cur.fetchone()
    assert row is not None  # an upsert returns its row
    return row.out()


def _path_name(name: str) -> str:
    """A path's calendar name; one that cannot be a name names nothing we have (404)."""
    try:
        return check_calendar_name(name, "name")
    except ValidationError:
        raise NotFound(f"no calendar {name[:100]!r}", details={"name": name[:100]}) from None


@router.get(
    "/calendars/{name}",
    response_model=CalendarOut,
    responses=errors(400, 401, 404),
    summary="one calendar",
)
async def get_calendar(name: str, res: Res) -> CalendarOut:
    name = _path_name(name)
    async with res.pool.connection() as conn:
        row = await _get(conn, name)
    if row is None:
        raise NotFound(f"no calendar {name!r}", details={"name": name})
    return row.out()


@router.get(
    "/calendars",
    response_model=CalendarPage,
    responses=errors(400, 401),
    summary="list calendars by name",
)
async def list_calendars(
    res: Res,
    limit: int = Query(100, ge=1, le=500, description="page size"),
    cursor: str | None = Query(None, max_length=200, description="next_cursor of the last page"),
) -> CalendarPage:
    if cursor is not None:
        try:
            check_calendar_name(cursor, "cursor")
        except ValidationError:
            raise BadRequest(
                "cursor is not one this API gave", details={"field": "cursor"}
            ) from None
    async with (
        res.pool.connection() as conn,
        conn.cursor(row_factory=class_row(CalendarRow)) as cur,
    ):
        await cur.execute(
            f"SELECT {_COLUMNS} FROM calendars WHERE name > %s ORDER BY name LIMIT %s",
            (cursor or "", limit + 1),
        )
        rows = await cur.fetchall()
    items = [r.out() for r in rows[:limit]]
    return CalendarPage(items=items, next_cursor=items[-1].name if len(rows) > limit else None)


@router.delete(
    "/calendars/{name}",
    response_model=CalendarOut,
    responses=errors(400, 401, 404),
    summary="delete a calendar (jobs that copied it keep their copy)",
)
async def delete_calendar(name: str, res: Res) -> CalendarOut:
    name = _path_name(name)
    async with (
        res.pool.connection() as conn,
        conn.cursor(row_factory=class_row(CalendarRow)) as cur,
    ):
        await cur.execute(f"DELETE FROM calendars WHERE name = %s RETURNING {_COLUMNS}", (name,))
        row: CalendarRow | None = await cur.fetchone()
    if row is None:
        raise NotFound(f"no calendar {name!r}", details={"name": name})
    return row.out()


def _named(body: Any) -> str | None:
    """The calendar NAME a job body's schedule gives, if it gives one (not rules)."""
    schedule = body.get("schedule") if isinstance(body, dict) else None
    name = schedule.get("calendar") if isinstance(schedule, dict) else None
    return name if isinstance(name, str) else None


async def resolve_calendars(res: Resources, bodies: list[Any], fields: list[str]) -> list[Any]:
    """Job bodies (or a PATCH's changes) with a calendar NAME in their schedule replaced by
    the calendar's rules: the copy each job carries (one query for all the names). Anything
    else is returned as it is (the job's own validation judges it). ``fields``: where each
    body's schedule is, for the 422 of an unknown calendar."""
    names = {
        check_calendar_name(name, f"{where}.calendar")
        for body, where in zip(bodies, fields, strict=True)
        if (name := _named(body)) is not None
    }
    if not names:
        return bodies
    async with (
        res.pool.connection() as conn,
        conn.cursor(row_factory=class_row(CalendarRow)) as cur,
    ):
        await cur.execute(
            f"SELECT {_COLUMNS} FROM calendars WHERE name = ANY(%s)", (sorted(names),)
        )
        found = {row.name: row.rules for row in await cur.fetchall()}
    out: list[Any] = []
    for body, where in zip(bodies, fields, strict=True):
        name = _named(body)
        if name is None:
            out.append(body)
            continue
        rules = found.get(name)
        if rules is None:
            raise UnknownCalendar(
                f"{where}.calendar: unknown calendar {name!r}: create it first "
                "(POST /v1/calendars)",
                field=f"{where}.calendar",
                details={"calendar": name},
            )
        out.append({**body, "schedule": {**body.get("schedule"), "calendar": rules}})
    return out


async def resolve_calendar(res: Resources, body: Any) -> Any:
    """One job body (or PATCH changes): see :func:`resolve_calendars`."""
    if _named(body) is None:
        return body
    (resolved,) = await resolve_calendars(res, [body], ["schedule"])
    return resolved


__all__ = [
    "CALENDAR_NAME_PATTERN",
    "UnknownCalendar",
    "resolve_calendar",
    "resolve_calendars",
    "router",
]

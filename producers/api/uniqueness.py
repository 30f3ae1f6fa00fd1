"""Unique jobs and debounce on ``POST /v1/jobs`` (issue 18, item 3).

A job body may carry one of

- ``unique: {"key": K, "window_s": W}``: a second create with the same key inside the window
  returns the first job (200, ``deduplicated: true``, header ``Duetime-Deduplicated: true``)
  and creates nothing. The window starts at the first create.
- ``debounce: {"key": K, "window_s": W}``: each create re-arms the window and replaces the
  job pending for the key, which is cancelled (201, ``replaced_job_id``); the job is due at the
  window's end (or at its own later ``schedule.at``), so only the last create's job runs
  (trailing edge). Debounce is for one-time jobs: a cron schedule is refused (422).

``K`` is a key template (``duetime.core.keys``: literal text with ``{payload.field}``
placeholders), resolved against the job's payload when it is created; ``W`` is seconds in
(0, a week]. Keys of ``unique`` and ``debounce`` are separate namespaces.

Guarantee across API processes: the key's row in ``job_keys`` (migration 0011) is locked in
the transaction that inserts the job's row and publishes its definition, so creates of one
key are serialised by PostgreSQL; a create that fails (invalid job, Kafka down) rolls the key
back with the job. Limits of the guarantee, said plainly: a debounced job whose window ends
while a replacing create is in flight may start before the cancel reaches its scheduler (the
cancel is then too late, as any cancel of a started job); and the Kafka-direct
``JobClient`` refuses both fields (it has no shared row to check: ``docs/decisions.md``).

The pure part (:func:`take_directive`) is separate from the PostgreSQL part
(:func:`claim`), so that its validation is tested without a database.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from fastapi import Response
from psycopg import AsyncConnection

from duetime.core.errors import Conflict, ValidationError
from duetime.core.keys import KeyTemplateError, parse_template, resolve_key
from duetime.core.models import Status
from duetime.core.retry import MAX_DELAY_LIMIT_S
from duetime.core.schedule import parse_timestamp

from . import store
from .deps import Resources

Kind = Literal["unique", "debounce"]
KINDS: tuple[Kind, ...] = ("unique", "debounce")
MAX_WINDOW_S = MAX_DELAY_LIMIT_S
"""A week: a key's row must not outlive the execution history it guards (30 days)."""
PRUNE_BATCH = 10
"""Rows of ended windows a keyed create deletes on its way (bounded work per request)."""
DEDUP_HEADER = "Duetime-Deduplicated"


@dataclass(frozen=True, slots=True)
class Directive:
    """A job body's ``unique`` or ``debounce``, validated, its key resolved."""

    kind: Kind
    key: str
    window_s: float


@dataclass(frozen=True, slots=True)
class Claim:
    """What the key's row said: the job to answer with instead (unique), or the job this one
    replaces (debounce)."""

    duplicate_of: str | None = None
    replaces: str | None = None


def take_directive(body: dict[str, Any], now: datetime) -> tuple[dict[str, Any], Directive | None]:
    """The body without ``unique``/``debounce``, and that directive, validated (a
    :class:`ValidationError` naming the field otherwise). For debounce, the body's schedule
    becomes ``{"at": max(its own at, now + window)}``. Pure: ``now`` is passed in."""
    given = [kind for kind in KINDS if kind in body]
    if not given:
        return body, None
    if len(given) > 1:
        raise ValidationError("a job may have unique or debounce, not both", field="debounce")
    kind = given[0]
    rest = {k: v for k, v in body.items() if k != kind}
    raw = body[kind]
    if not isinstance(raw, dict):
        raise ValidationError(f"{kind} must be an object with key and window_s", field=kind)
    unknown = sorted(str(k) for k in raw if k not in ("key", "window_s"))
    if unknown:
        raise ValidationError(
            f"{kind} has unknown field(s): {', '.join(unknown)}", field=f"{kind}.{unknown[0]}"
        )
    window_s = _window_s(raw.get("window_s"), kind)
    try:
        key = resolve_key(parse_template(raw.get("key")), rest.get("payload"))
    except KeyTemplateError as exc:
        raise ValidationError(f"{kind}.key {exc}", field=f"{kind}.key") from None
    if not key:
        raise ValidationError(f"{kind}.key resolves to an empty key", field=f"{kind}.key")
    directive = Directive(kind=kind, key=key, window_s=window_s)
    if kind == "debounce":
        rest.update(schedule=_debounced_schedule(rest.get("schedule"), now, window_s))
        if rest.get("depends_on"):
            raise ValidationError("debounce is not supported for DAG members", field="debounce")
    return rest, directive


def _window_s(raw: Any, kind: str) -> float:
    field = f"{kind}.window_s"
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValidationError(f"{field} must be a number of seconds", field=field)
    if not (math.isfinite(raw) and 0 < raw <= MAX_WINDOW_S):
        raise ValidationError(f"{field} {raw!r} must be > 0 and <= {MAX_WINDOW_S:g}", field=field)
    return float(raw)


def _debounced_schedule(schedule: Any, now: datetime, window_s: float) -> dict[str, str]:
    """A debounced job runs at its window's end (trailing edge), or at its own later time."""
    due = now + timedelta(seconds=window_s)
    if schedule is not None:
        if not isinstance(schedule, dict) or set(schedule) != {"at"}:
            raise ValidationError(
                'debounce needs a one-time job (schedule {"at": ...} or none): only the '
                "last create inside the window runs, at the window's end",
                field="debounce",
            )
        due = max(due, parse_timestamp(schedule.get("at"), "schedule.at"))
    return {"at": due.isoformat().replace("+00:00", "Z")}


# --- PostgreSQL ----------------------------------------------------------------------------

_PRUNE = """
DELETE FROM job_keys WHERE ctid IN (
    SELECT ctid FROM job_keys WHERE window_ends_at < %s
    ORDER BY window_ends_at LIMIT %s FOR UPDATE SKIP LOCKED)
"""
# a conflicting insert waits for the row's holder to commit, then re-reads the row: the WHERE
# of DO UPDATE sees the committed window, so exactly one of two creates takes an ended window
_TAKE_UNIQUE = """
INSERT INTO job_keys (kind, key, job_id, window_ends_at) VALUES ('unique', %s, %s, %s)
ON CONFLICT (kind, key) DO UPDATE
    SET job_id = EXCLUDED.job_id, window_ends_at = EXCLUDED.window_ends_at
    WHERE job_keys.window_ends_at <= %s
RETURNING job_id
"""
_INSERT_DEBOUNCE = """
INSERT INTO job_keys (kind, key, job_id, window_ends_at) VALUES ('debounce', %s, %s, %s)
ON CONFLICT (kind, key) DO NOTHING
RETURNING job_id
"""
_LOCK = "SELECT job_id, window_ends_at FROM job_keys WHERE kind = %s AND key = %s FOR UPDATE"
_REARM = "UPDATE job_keys SET job_id = %s, window_ends_at = %s WHERE kind = 'debounce' AND key = %s"


async def claim(
    conn: AsyncConnection[Any], directive: Directive, job_id: str, now: datetime
) -> Claim:
    """Take the key's row for ``job_id`` in the caller's transaction (held until it ends)."""
    await conn.execute(_PRUNE, (now - timedelta(minutes=1), PRUNE_BATCH))
    ends = now + timedelta(seconds=directive.window_s)
    for _ in range(3):  # a row pruned between two statements (clocks apart): take it again
        if directive.kind == "unique":
            cur = await conn.execute(_TAKE_UNIQUE, (directive.key, job_id, ends, now))
        else:
            cur = await conn.execute(_INSERT_DEBOUNCE, (directive.key, job_id, ends))
        if await cur.fetchone() is not None:
            return Claim()  # the key was free, or its window had ended: this job holds it
        held = await _locked(conn, directive)
        if held is None:
            continue
        held_job, held_until = held
        if directive.kind == "unique":
            return Claim(duplicate_of=held_job)
        await conn.execute(_REARM, (job_id, ends, directive.key))
        if held_until <= now or held_job == job_id:
            return Claim()  # that window had ended: its job ran (or runs) as it should
        return Claim(replaces=held_job)
    raise Conflict(
        f"the {directive.kind} key is being changed by other requests: retry",
        details={"kind": directive.kind},
    )


async def _locked(conn: AsyncConnection[Any], directive: Directive) -> tuple[str, datetime] | None:
    cur = await conn.execute(_LOCK, (directive.kind, directive.key))
    row = await cur.fetchone()
    return None if row is None else (str(row[0]), row[1])


# --- the route's steps ---------------------------------------------------------------------


async def deduplicated(
    conn: AsyncConnection[Any], job_id: str, response: Response
) -> dict[str, Any]:
    """The answer to a unique create inside the window: the first job, 200, said twice (a
    field and a header) so that a client reading either knows nothing was created."""
    row = await store.get_job(conn, job_id)
    response.status_code = 200
    response.headers[DEDUP_HEADER] = "true"
    status = row.status.value if row is not None else Status.PENDING.value
    return {
        "job_id": job_id,
        "status": status,
        "next_run_at": row.next_run_at if row is not None else None,
        "deduplicated": True,
    }


async def cancel_replaced(res: Resources, job_id: str) -> None:
    """Cancel the debounced job a newer create replaced (a cancel command, as
    ``POST /v1/jobs/{id}/cancel`` publishes it; a job already finished ignores it)."""
    await res.writer.publish(
        lambda done: res.client.command(
            job_id,
            "cancel",
            wait=False,
            on_delivery=done,
            reason="debounce: replaced by a newer create with the same key",
            requested_by="api",
        )
    )

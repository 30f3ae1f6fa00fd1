"""Opaque cursors: base64url of ``[sort timestamp, id]`` of the last item of a page.

Keyset pagination (``WHERE (ts, id) < (cursor) ORDER BY ts DESC, id DESC``): stable while rows
are added, O(page) whatever the depth.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from duetime.core.errors import DuetimeError

R = TypeVar("R")


class BadRequest(DuetimeError):
    """A malformed request: bad JSON, a bad query parameter or cursor (REST 400)."""

    code = "bad_request"


def encode_cursor(ts: datetime | str, key: str) -> str:
    """``ts``: a datetime, or one already in ISO form (a row turned into JSON)."""
    iso = ts.isoformat() if isinstance(ts, datetime) else ts
    raw = json.dumps([iso, str(key)], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> tuple[datetime, str] | None:
    if cursor is None or cursor == "":
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        ts, key = json.loads(raw)
        return datetime.fromisoformat(ts), str(uuid.UUID(key))
    except (ValueError, TypeError, UnicodeDecodeError):
        raise BadRequest(
            "cursor is not one this API handed out", details={"field": "cursor"}
        ) from None


def page_of(
    rows: Sequence[R],
    limit: int,
    keyset: Callable[[R], tuple[datetime | str, Any]],
    item: Callable[[R], Any],
) -> dict[str, Any]:
    """A list route's answer from rows fetched with ``limit + 1`` (one more tells whether a
    next page exists); ``keyset`` gives a row's keyset columns (timestamp, id)."""
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = None
    if more and rows:
        ts, key = keyset(rows[-1])
        cursor = encode_cursor(ts, str(key))
    return {"items": [item(r) for r in rows], "next_cursor": cursor}

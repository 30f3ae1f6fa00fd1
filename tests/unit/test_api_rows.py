"""The API's read-your-writes row equals the projector's row for the same definition, and
cursors round-trip (pure: no broker, no database)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from duetime.consumers.projector.rows import job_row as projector_row
from duetime.core.jobspec import build_job
from duetime.producers.api.pagination import BadRequest, decode_cursor, encode_cursor
from duetime.producers.api.store import job_row as api_row

NOW_MS = 1_790_000_000_123


@pytest.mark.parametrize(
    "body",
    [
        {"name": "a", "target": {"type": "http", "url": "http://h/x"}},
        {
            "name": "cron",
            "schedule": {"cron": "*/5 * * * * *", "timezone": "Europe/Berlin"},
            "target": {"type": "python", "ref": "pkg.mod:fn"},
            "payload": {"k": [1, 2.5, None]},
            "labels": {"team": "x"},
            "priority": "critical",
        },
        {
            "name": "once",
            "schedule": {"at": "2020-01-01T00:00:00Z"},
            "target": {"type": "kafka", "topic": "out"},
        },
        {
            "name": "member",
            "target": {"type": "http", "url": "http://h/x"},
            "dag_id": "6f9f3c1e-5d1b-4c1e-9a63-6a0d7e1f2b10",
            "dag_key": "b",
            "depends_on": ["a"],
        },
    ],
)
def test_the_api_row_is_the_projector_row(body: dict[str, Any]) -> None:
    definition = build_job(body, now_ms=NOW_MS)
    assert api_row(definition) == projector_row(definition)


def test_cursors_round_trip_and_garbage_is_a_bad_request() -> None:
    ts = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
    key = "6f9f3c1e-5d1b-4c1e-9a63-6a0d7e1f2b10"
    assert decode_cursor(encode_cursor(ts, key)) == (ts, key)
    assert decode_cursor(None) is None
    for bad in ("garbage", "e30", encode_cursor(ts, "not-a-uuid")):
        with pytest.raises(BadRequest):
            decode_cursor(bad)

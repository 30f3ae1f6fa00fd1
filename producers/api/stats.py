"""Routes of the figures the web dashboard draws: jobs by status, dead-letter depth,
executions per time bucket by outcome, start lateness percentiles (all queues, or one:
``?queue=``), consumer lag per queue and priority (``duetime.core.lag``).

Everything is computed on request from the PostgreSQL projection and, for the lag, from
Kafka's end offsets and a consumer group's committed offsets: nothing here is cached or
private to the dashboard (any client may read the same figures).
"""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import KafkaException
from fastapi import APIRouter, Query

from duetime.core.errors import NotFound
from duetime.core.lag import QueueLag, queue_lag
from duetime.core.topics import DEFAULT_QUEUE, QUEUE_PATTERN, Topics

from .deps import Res
from .errors import Unavailable
from .pagination import BadRequest
from .schemas import ConsumerLagOut, ExecutionStatsOut, OverviewOut, errors

router = APIRouter()

MAX_BUCKETS = 500
OUTCOMES = ("success", "failed", "dead")
# Outcomes are counted by finished_at, but the executions table is partitioned by
# scheduled_at: an execution scheduled more than this before the window is not counted
# (a replay of an old dead letter), so the query reads a bounded number of partitions.
FINISH_SLACK = timedelta(hours=1)


@router.get(
    "/stats/overview",
    response_model=OverviewOut,
    responses=errors(401),
    summary="jobs by status, dead-letter depth",
)
async def overview(res: Res) -> dict[str, Any]:
    async with res.pool.connection() as conn:
        cur = await conn.execute(  # deleted jobs are not shown on the dashboard
            "SELECT status, count(*) FROM jobs WHERE NOT deleted GROUP BY status"
        )
        by_status = {str(s): int(n) for s, n in await cur.fetchall()}
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE replayed_at IS NULL), count(*) FROM dead_letters"
        )
        row = await cur.fetchone()
    depth, total = (0, 0) if row is None else (int(row[0]), int(row[1]))
    return {
        "jobs_total": sum(by_status.values()),
        "jobs_by_status": by_status,
        "dlq_depth": depth,
        "dlq_total": total,
        "at": res.now(),
    }


@router.get(
    "/stats/executions",
    response_model=ExecutionStatsOut,
    responses=errors(400, 401),
    summary="per time bucket: executions finished by outcome, start lateness p50/p99",
)
async def executions(
    res: Res,
    window_s: int = Query(3600, ge=60, le=7 * 86400, description="how far back"),
    bucket_s: int = Query(60, ge=5, le=86400, description="bucket width"),
    queue: str | None = Query(
        None, pattern="^" + QUEUE_PATTERN + "$", description="executions of this queue only"
    ),
) -> dict[str, Any]:
    count = math.ceil(window_s / bucket_s)
    if count > MAX_BUCKETS:
        raise BadRequest(
            f"window_s / bucket_s gives {count} buckets, more than {MAX_BUCKETS}",
            details={"field": "bucket_s"},
        )
    now = res.now()
    last = math.floor(now.timestamp() / bucket_s) * bucket_s
    first = last - (count - 1) * bucket_s
    since = datetime.fromtimestamp(first, UTC)
    bucket = f"floor(extract(epoch FROM {{col}}) / {bucket_s:d})::bigint * {bucket_s:d}"
    async with res.pool.connection() as conn:
        cur = await conn.execute(
            f"SELECT {bucket.format(col='finished_at')} AS b, status, count(*) FROM executions "
            "WHERE scheduled_at >= %s AND finished_at >= %s AND status = ANY(%s) "
            "AND (%s::text IS NULL OR queue = %s) GROUP BY 1, 2",
            (since - FINISH_SLACK, since, list(OUTCOMES), queue, queue),
        )
        outcome_rows = await cur.fetchall()
        cur = await conn.execute(
            f"SELECT {bucket.format(col='scheduled_at')} AS b, count(*), "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY lateness_ms), "
            "percentile_cont(0.99) WITHIN GROUP (ORDER BY lateness_ms) FROM executions "
            "WHERE scheduled_at >= %s AND lateness_ms IS NOT NULL "
            "AND (%s::text IS NULL OR queue = %s) GROUP BY 1",
            (since, queue, queue),
        )
        lateness_rows = await cur.fetchall()
    buckets: dict[int, dict[str, Any]] = {
        first + i * bucket_s: {
            "start": datetime.fromtimestamp(first + i * bucket_s, UTC),
            "outcomes": dict.fromkeys(OUTCOMES, 0),
            "started": 0,
            "lateness_p50_ms": None,
            "lateness_p99_ms": None,
        }
        for i in range(count)
    }
    for b, status, n in outcome_rows:
        if int(b) in buckets:
            buckets[int(b)]["outcomes"][str(status)] = int(n)
    for b, n, p50, p99 in lateness_rows:
        if int(b) in buckets:
            buckets[int(b)].update(started=int(n), lateness_p50_ms=p50, lateness_p99_ms=p99)
    return {
        "window_s": window_s,
        "bucket_s": bucket_s,
        "queue": queue,
        "at": now,
        "buckets": list(buckets.values()),
    }


@router.get(
    "/stats/lag",
    response_model=ConsumerLagOut,
    responses=errors(400, 401, 404, 503),
    summary="consumer lag per queue and priority: execution requests a worker group has not "
    "consumed yet (records, transaction markers not counted)",
)
async def lag(
    res: Res,
    group: str | None = Query(
        None, min_length=1, max_length=200, description="worker group (default <prefix>workers)"
    ),
    queue: str | None = Query(
        None, pattern="^" + QUEUE_PATTERN + "$", description="this queue only"
    ),
) -> dict[str, Any]:
    common = res.settings.common
    topics = Topics(common.topic_prefix)
    name = group or f"{topics.prefix}workers"

    def measure() -> list[QueueLag]:
        only = None if queue is None else [queue]
        return queue_lag(common, res.admin, topics, name, queues=only)

    try:
        queues = await asyncio.wait_for(asyncio.to_thread(measure), 20.0)
    except (TimeoutError, KafkaException) as exc:
        raise Unavailable(f"Kafka did not answer: {exc}"[:300]) from None
    if queue is not None and not queues:
        raise NotFound(f"no queue {queue}", details={"queue": queue})
    default = next((q for q in queues if q.queue == DEFAULT_QUEUE), None)
    return {
        "group": name,
        "at": res.now(),
        # the default queue's, as before queues existed
        "priorities": [] if default is None else [t.as_dict() for t in default.priorities],
        "queues": [q.as_dict() for q in queues],
    }

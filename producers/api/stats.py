"""Routes of the figures the web dashboard draws: jobs by status, dead-letter depth,
executions per time bucket by outcome, start lateness percentiles, consumer lag per priority.

Everything is computed on request from the PostgreSQL projection and, for the lag, from
Kafka's end offsets and a consumer group's committed offsets: nothing here is cached or
private to the dashboard (any client may read the same figures).
"""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition

# confluent-kafka defines OffsetSpec in a private module and re-exports it from .admin without
# marking the re-export (no __all__ entry, no "as"), and leaves its constructors unannotated
# (errors under --strict only, hence unused-ignore for the plain configuration)
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined, unused-ignore]
from fastapi import APIRouter, Query

from duetime.core.models import PRIORITY_ORDER
from duetime.core.topics import Topics

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
            "GROUP BY 1, 2",
            (since - FINISH_SLACK, since, list(OUTCOMES)),
        )
        outcome_rows = await cur.fetchall()
        cur = await conn.execute(
            f"SELECT {bucket.format(col='scheduled_at')} AS b, count(*), "
            "percentile_cont(0.5) WITHIN GROUP (ORDER BY lateness_ms), "
            "percentile_cont(0.99) WITHIN GROUP (ORDER BY lateness_ms) FROM executions "
            "WHERE scheduled_at >= %s AND lateness_ms IS NOT NULL GROUP BY 1",
            (since,),
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
        "at": now,
        "buckets": list(buckets.values()),
    }


@router.get(
    "/stats/lag",
    response_model=ConsumerLagOut,
    responses=errors(400, 401, 503),
    summary="consumer lag per priority: execution requests not yet consumed by a worker group",
)
async def lag(
    res: Res,
    group: str | None = Query(
        None, min_length=1, max_length=200, description="worker group (default <prefix>workers)"
    ),
) -> dict[str, Any]:
    topics = Topics(res.settings.common.topic_prefix)
    name = group or f"{topics.prefix}workers"
    try:
        per_topic = await asyncio.wait_for(asyncio.to_thread(_lag, res, topics, name), 10.0)
    except (TimeoutError, KafkaException) as exc:
        raise Unavailable(f"Kafka did not answer: {exc}"[:300]) from None
    return {
        "group": name,
        "at": res.now(),
        "priorities": [
            {"priority": p.value, "topic": topics.execution(p), **per_topic[topics.execution(p)]}
            for p in PRIORITY_ORDER
        ],
    }


def _lag(res: Any, topics: Topics, group: str) -> dict[str, dict[str, int]]:
    """Per execution topic: end offsets, committed offsets of ``group`` and their difference
    (a partition the group never committed counts from its first retained offset)."""
    admin = res.admin
    names = topics.executions
    md = admin.list_topics(timeout=5)
    tps = [
        TopicPartition(t, p)
        for t in names
        if t in md.topics and md.topics[t].error is None
        for p in md.topics[t].partitions
    ]
    ends = _offsets(admin, tps, _offset_spec(latest=True))
    starts = _offsets(admin, tps, _offset_spec(latest=False))
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, tps)])
    committed = {
        (tp.topic, tp.partition): tp.offset
        for tp in future[group].result(timeout=5).topic_partitions
    }
    out = {t: {"end_offset": 0, "committed_offset": 0, "lag": 0} for t in names}
    for tp in tps:
        key = (tp.topic, tp.partition)
        end, done = ends[key], committed.get(key, -1)
        row = out[tp.topic]
        row["end_offset"] += end
        row["committed_offset"] += max(done, 0)
        row["lag"] += max(0, end - (done if done >= 0 else starts[key]))
    return out


def _offset_spec(*, latest: bool) -> OffsetSpec:
    # the library ships these two constructors unannotated
    spec: OffsetSpec = OffsetSpec.latest() if latest else OffsetSpec.earliest()  # type: ignore[no-untyped-call, unused-ignore]
    return spec


def _offsets(admin: Any, tps: list[TopicPartition], spec: Any) -> dict[tuple[str, int], int]:
    if not tps:
        return {}
    futures = admin.list_offsets({tp: spec for tp in tps}, request_timeout=5)
    return {(tp.topic, tp.partition): int(f.result().offset) for tp, f in futures.items()}

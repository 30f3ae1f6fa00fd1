"""Consumer lag of a worker group on every queue's execution topics, in real records.

Offsets are not records: every Kafka transaction writes a commit marker into each partition it
touched, and that marker takes an offset no consumer ever receives. On an idle system the end
offset is therefore ahead of a caught-up group's committed offset by the markers after its last
record (the dashboard showed "12" for an empty queue). So a partition whose offset gap is small
(``exact_below`` or less) is read from the committed offset to the last stable offset with a
read_committed consumer, and the records that arrive are counted: markers and aborted records
never arrive. A larger gap is reported as offsets (an upper bound; markers are at most one per
scheduler transaction, and a transaction usually carries many requests), with ``exact: false``.

Used by ``GET /v1/stats/lag`` and ``duetime queues list``; reads only (never commits, never
joins the group it reports on).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_INVALID,
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)

# confluent-kafka re-exports OffsetSpec from a private module without marking it
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined, unused-ignore]

from . import kafka
from .backoff import retry_transient
from .config import CommonSettings
from .models import PRIORITY_ORDER, Priority
from .topics import DEFAULT_QUEUE, Topics

log = logging.getLogger("duetime.lag")

EXACT_BELOW = 200
"""A partition's offset gap up to this is counted in records (read); above it, in offsets."""
READ_TIMEOUT_S = 3.0

TP = tuple[str, int]


@dataclass(slots=True)
class TopicLag:
    """One execution topic's figures, summed over its partitions."""

    queue: str
    priority: Priority
    topic: str
    end_offset: int = 0
    committed_offset: int = 0
    lag: int = 0
    """Records (requests) after the group's committed offsets, markers not counted."""
    exact: bool = True
    """False when a partition's gap was too large to read: ``lag`` then counts offsets."""
    committed: bool = False
    """Whether the group committed any partition of this topic."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "priority": self.priority.value,
            "topic": self.topic,
            "end_offset": self.end_offset,
            "committed_offset": self.committed_offset,
            "lag": self.lag,
            "exact": self.exact,
            "committed": self.committed,
        }


@dataclass(slots=True)
class QueueLag:
    queue: str
    priorities: list[TopicLag] = field(default_factory=list)
    partitions: int = 0

    @property
    def lag(self) -> int:
        return sum(t.lag for t in self.priorities)

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "partitions": self.partitions,
            "lag": self.lag,
            "priorities": [t.as_dict() for t in self.priorities],
        }


def record_gap(start: int, end: int, offsets: Iterable[int]) -> int:
    """How many of the records read (``offsets``) lie in [start, end): the lag in records."""
    return sum(1 for o in offsets if start <= o < end)


def queue_lag(
    common: CommonSettings,
    admin: Any,
    topics: Topics,
    group: str,
    *,
    queues: Iterable[str] | None = None,
    exact_below: int = EXACT_BELOW,
    timeout_s: float = 5.0,
) -> list[QueueLag]:
    """The lag of ``group`` on each existing queue (default queue first, then by name), or on
    ``queues`` only. A partition the group never committed counts from its first retained
    offset (what a group starting at the beginning would have to read)."""
    md = admin.list_topics(timeout=timeout_s)
    found = topics.queues_in(md.topics)
    wanted = sorted(found, key=lambda q: (q != DEFAULT_QUEUE, q))
    if queues is not None:
        allowed = set(queues)
        wanted = [q for q in wanted if q in allowed]
    tps = [
        TopicPartition(t, p)
        for q in wanted
        for t in topics.executions_of(q)
        if t in md.topics and md.topics[t].error is None
        for p in md.topics[t].partitions
    ]
    # a partition whose leader is moving, or that was just created, answers "not leader" for
    # a moment (measured: up to 3.5 s after creation on a loaded 2-core machine): retried for
    # up to 3 * timeout_s, then the error is the caller's
    deadline = time.monotonic() + 3 * timeout_s

    def offsets(latest: bool) -> dict[TP, int]:
        return retry_transient(
            lambda: _offsets(admin, tps, latest=latest, timeout_s=timeout_s),
            transient=_retriable,
            dependency="kafka",
            what="reading end offsets for the lag",
            logger=log,
            stopping=lambda: time.monotonic() > deadline,
        )

    ends, starts = offsets(True), offsets(False)
    committed = _committed(admin, group, tps, timeout_s)
    # from the committed offset, or the first retained one (retention may have passed both)
    begin = {k: max(committed.get(k, -1), starts.get(k, 0)) for k in ends}
    small = {k: (begin[k], ends[k]) for k in ends if 0 < ends[k] - begin[k] <= exact_below}
    counted = _count_records(common, small, timeout_s=READ_TIMEOUT_S)
    out: list[QueueLag] = []
    for q in wanted:
        ql = QueueLag(q)
        for p in PRIORITY_ORDER:
            t = topics.execution(p, q)
            row = TopicLag(queue=q, priority=p, topic=t)
            for (topic, part), end in ends.items():
                if topic != t:
                    continue
                ql.partitions = max(ql.partitions, part + 1)
                done = committed.get((topic, part), -1)
                row.end_offset += end
                row.committed_offset += max(done, 0)
                row.committed = row.committed or done >= 0
                gap = max(0, end - begin[(topic, part)])
                if (topic, part) in counted:
                    row.lag += counted[(topic, part)]
                else:
                    row.lag += gap
                    row.exact = row.exact and (gap == 0 or gap <= exact_below)
            ql.priorities.append(row)
        out.append(ql)
    return out


def _retriable(exc: BaseException) -> bool:
    if not isinstance(exc, KafkaException) or not exc.args:
        return False
    error = exc.args[0]
    # the admin client does not mark these retriable, but they pass as leaders settle
    return isinstance(error, KafkaError) and (bool(error.retriable()) or error.code() in _SETTLING)


_SETTLING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TIMED_OUT,
    }
)


def _offsets(
    admin: Any, tps: list[TopicPartition], *, latest: bool, timeout_s: float
) -> dict[TP, int]:
    if not tps:
        return {}
    # the library ships these two constructors unannotated
    spec = OffsetSpec.latest() if latest else OffsetSpec.earliest()  # type: ignore[no-untyped-call, unused-ignore]
    # read_committed: the end is the last stable offset (a transaction still open is not lag)
    futures = admin.list_offsets(
        {tp: spec for tp in tps},
        isolation_level=IsolationLevel.READ_COMMITTED,
        request_timeout=timeout_s,
    )
    return {(tp.topic, tp.partition): int(f.result().offset) for tp, f in futures.items()}


def _committed(
    admin: Any, group: str, tps: list[TopicPartition], timeout_s: float
) -> dict[TP, int]:
    if not tps:
        return {}
    future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, tps)])
    return {
        (tp.topic, tp.partition): int(tp.offset)
        for tp in future[group].result(timeout=timeout_s).topic_partitions
        if tp.offset != OFFSET_INVALID
    }


def _count_records(
    common: CommonSettings, ranges: dict[TP, tuple[int, int]], *, timeout_s: float
) -> dict[TP, int]:
    """Read each partition's [start, end) with a read_committed consumer that joins no group
    (assign only, never commits) and count the records that arrive. A partition not read to
    its end in ``timeout_s`` is left out (its gap in offsets is reported instead)."""
    if not ranges:
        return {}
    consumer = kafka.consumer(
        common,
        # a group id librdkafka requires, never joined (assign) nor committed to
        f"{common.topic_prefix}lag-probe-{uuid.uuid4().hex[:8]}",
        **{"enable.partition.eof": True, "fetch.wait.max.ms": 10},
    )
    try:
        consumer.assign([TopicPartition(t, p, start) for (t, p), (start, _) in ranges.items()])
        seen: dict[TP, list[int]] = {k: [] for k in ranges}
        done: set[TP] = set()
        deadline = time.monotonic() + timeout_s
        while len(done) < len(ranges) and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.1):
                key = (msg.topic() or "", msg.partition() or 0)
                if key not in ranges:
                    continue
                err = msg.error()
                offset = msg.offset() or 0
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        done.add(key)
                    continue
                seen[key].append(offset)
                if offset + 1 >= ranges[key][1]:
                    done.add(key)
        return {k: record_gap(*ranges[k], seen[k]) for k in done}
    finally:
        consumer.close()

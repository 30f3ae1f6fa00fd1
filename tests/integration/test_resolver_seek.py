"""The resolver's seek after a rebalance (``seek_to_committed_or_start``), on the real broker.

faust left a stream partition without a committed offset wherever aiokafka's fetcher stood,
after records fetched during the recovery had been dropped: a successor resolver then never
saw a run's events. Here a consumer of the group reads records without committing them (the
fetcher's position moves past them, as in that race), and the seek must bring each partition
back: to its first record when nothing is committed, to the committed offset otherwise, and
leave the changelog partitions alone (faust's recovery seeks those itself).
"""

from __future__ import annotations

import asyncio
from typing import Any

from duetime.consumers.resolver.app import seek_to_committed_or_start
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics, TopicSpec
from duetime.infra.topics import create_topics


async def _seek_scenario(settings: CommonSettings) -> dict[str, Any]:
    from aiokafka import (  # type: ignore[import-untyped]  # no stubs shipped
        AIOKafkaConsumer,
        AIOKafkaProducer,
        TopicPartition,
    )
    from aiokafka.structs import OffsetAndMetadata  # type: ignore[import-untyped]

    stream = Topics(settings.topic_prefix).results
    changelog = settings.topic_prefix + "seek-changelog"
    create_topics(settings.bootstrap_servers, [TopicSpec(changelog, 1, {}, None)])
    uncommitted, committed_tp, log_tp = (
        TopicPartition(stream, 0),
        TopicPartition(stream, 1),
        TopicPartition(changelog, 0),
    )
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await producer.start()
    try:
        for tp in (uncommitted, committed_tp, log_tp):
            for i in range(5):
                await producer.send_and_wait(tp.topic, b"%d" % i, partition=tp.partition)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        group_id=settings.topic_prefix + "seek",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        consumer.assign([uncommitted, committed_tp, log_tp])
        await consumer.commit({committed_tp: OffsetAndMetadata(2, "")})
        for tp in (uncommitted, committed_tp, log_tp):
            consumer.seek(tp, 0)
        read = 0
        while read < 15:  # every record fetched and handed out, nothing committed
            batches = await consumer.getmany(timeout_ms=5000)
            assert batches, "the records written above were not fetched"
            read += sum(len(records) for records in batches.values())
        before = {tp: await consumer.position(tp) for tp in (uncommitted, committed_tp, log_tp)}
        answer = await seek_to_committed_or_start(consumer, {changelog})
        after = {tp: await consumer.position(tp) for tp in (uncommitted, committed_tp, log_tp)}
        again = await consumer.getmany(uncommitted, timeout_ms=5000)
        return {
            "before": before,
            "after": after,
            "answer": answer,
            "again": [r.offset for r in again.get(uncommitted, [])],
            "tps": (uncommitted, committed_tp, log_tp),
        }
    finally:
        await consumer.stop()


def test_a_partition_without_a_committed_offset_starts_again_at_its_first_record(
    settings: CommonSettings,
) -> None:
    out = asyncio.run(_seek_scenario(settings))
    uncommitted, committed_tp, log_tp = out["tps"]
    assert out["before"] == {uncommitted: 5, committed_tp: 5, log_tp: 5}
    assert out["answer"][uncommitted] is None
    assert out["answer"][committed_tp] == 2
    # the subject: faust's own seek (aiokafka's seek_to_committed) left the first at 5
    assert out["after"] == {uncommitted: 0, committed_tp: 2, log_tp: 5}
    assert out["again"][:1] == [0]  # and its records are handed out again

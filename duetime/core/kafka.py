"""Kafka client factories and the one place where Kafka errors are classified.

Every non-default client setting carries a comment saying why. Roles build their clients here
so that the same tuning (and the same reasons) apply everywhere.
"""

from __future__ import annotations

import enum
import time
import uuid
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from .config import CommonSettings


def producer(settings: CommonSettings, **overrides: Any) -> Producer:
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        # idempotence: a retried send is never written twice (and it is required by transactions)
        "enable.idempotence": True,
        # a small linger batches bursts without costing the 5 s start budget anything visible
        "linger.ms": 2,
        "client.id": f"duetime-{settings.instance_id}",
    }
    conf.update(overrides)
    return Producer(conf)


def transactional_producer(
    settings: CommonSettings, transactional_id: str, **overrides: Any
) -> Producer:
    return producer(
        settings,
        **{
            "transactional.id": transactional_id,
            # A new owner's init_transactions aborts a dead owner's open transaction at once
            # (transactional ids are per partition), so failover does not wait for this. It
            # only bounds how long an owner that died with nobody to take over blocks
            # read_committed readers, and it must stay far above a busy cycle's transaction,
            # or the broker aborts it and fences the producer.
            "transaction.timeout.ms": 30_000,
            **overrides,
        },
    )


def consumer(settings: CommonSettings, group_id: str, **overrides: Any) -> Consumer:
    """A member of a classic-protocol group, with the range assignor (co-partitioning)."""
    conf: dict[str, Any] = {
        **_member_conf(settings, group_id),
        # range keeps partition p of every co-partitioned topic on the same member
        "partition.assignment.strategy": "range",
        # detect a dead member fast: failover budget is 5 s (default is 45 s)
        "session.timeout.ms": 3000,
        "heartbeat.interval.ms": 500,
    }
    conf.update(overrides)
    return Consumer(conf)


def kip848_consumer(settings: CommonSettings, group_id: str, **overrides: Any) -> Consumer:
    """A member of a KIP-848 (``group.protocol=consumer``) group, with the broker's range
    assignor: every topic split evenly, partition p of each topic on one member, incremental
    rebalances. Its session timeout and heartbeat interval are the broker's
    (``group.consumer.*``), so the client may not set them."""
    conf: dict[str, Any] = {
        **_member_conf(settings, group_id),
        "group.protocol": "consumer",
        "group.remote.assignor": "range",
    }
    conf.update(overrides)
    return Consumer(conf)


def _member_conf(settings: CommonSettings, group_id: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": settings.bootstrap_servers,
        "group.id": group_id,
        "client.id": f"duetime-{settings.instance_id}",
        # offsets are committed explicitly, after the work (or inside a transaction)
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        # never see records of aborted or still-open transactions
        "isolation.level": "read_committed",
    }


def admin(settings: CommonSettings) -> AdminClient:
    return AdminClient({"bootstrap.servers": settings.bootstrap_servers})


class ErrorClass(enum.Enum):
    RETRIABLE = "retriable"
    ABORT = "abort"  # abort the transaction, rewind, retry
    RECREATE = "recreate"  # unknown outcome (e.g. commit timed out): recreate the producer
    FATAL = "fatal"


def classify(exc: BaseException) -> ErrorClass:
    """How a transactional path must react to ``exc`` (confluent-kafka's transactional API)."""
    if not isinstance(exc, KafkaException) or not exc.args:
        return ErrorClass.FATAL
    err = exc.args[0]
    if not isinstance(err, KafkaError):
        return ErrorClass.FATAL
    if err.fatal():
        return ErrorClass.FATAL
    if err.txn_requires_abort():
        return ErrorClass.ABORT
    if err.code() in (KafkaError._TIMED_OUT, KafkaError._TIMED_OUT_QUEUE):
        return ErrorClass.RECREATE
    if err.retriable():
        return ErrorClass.RETRIABLE
    return ErrorClass.ABORT


def watermarks(
    client: Consumer, topic: str, partition: int, timeout_s: float = 30.0
) -> tuple[int, int]:
    """(low, high) of a partition, retrying while the cluster settles (e.g. a fresh topic
    whose leader the client does not know yet answers NOT_LEADER for a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = client.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=5, cached=False
            )
            return int(low), int(high)
        except KafkaException as exc:
            if classify(exc) is ErrorClass.FATAL or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def new_id() -> str:
    return str(uuid.uuid4())


def read_batch(consumer: Consumer, max_records: int, timeout_s: float) -> list[Message]:
    """Up to ``max_records`` records, returning as soon as one is there.

    ``consume(n, timeout)`` waits for n records or the whole timeout, which under a steady
    trickle is the timeout every time; ``poll`` returns with the first record, and
    ``consume(timeout=0)`` then takes whatever else is already fetched without waiting.
    Error events (partition EOF, ...) are returned as they are: the caller decides.
    """
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    if max_records <= 1:
        return [first]
    return [first, *consumer.consume(max_records - 1, 0)]

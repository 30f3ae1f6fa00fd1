"""A new owner fences the previous one while it restores (``Scheduler._build``): the changelog
is read to its end while ``init_transactions`` runs, then to its end again once fenced. What
the previous owner committed before the fence is restored, what it left open is not, and the
restore ends at once in both cases (never waiting for the 30 s stall limit)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaException, Producer

from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.schedulers.partition import WAKE_HEADER
from duetime.schedulers.service import Scheduler
from duetime.schedulers.settings import SchedulerSettings

PARTITION = 1


@pytest.fixture
def scheduler(settings: CommonSettings) -> Iterator[Scheduler]:
    """A scheduler that never joins its group: its restore path is driven by hand."""
    s = Scheduler(SchedulerSettings(common=settings))
    yield s
    s.restores.close()
    s._fences.shutdown()
    s._pool.shutdown()
    s.consumer.close()
    s._restore_consumer.close()


def previous_owner(settings: CommonSettings, done: list[str], still_open: list[str]) -> Producer:
    """A producer with the partition's transactional id, as its previous owner had: the
    states ``done`` committed, those ``still_open`` in a transaction it has not ended."""
    producer = Producer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "transactional.id": f"{settings.topic_prefix}scheduler.{PARTITION}",
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    write_states(producer, settings, done)
    producer.commit_transaction(10)
    producer.begin_transaction()
    write_states(producer, settings, still_open)
    return producer


def write_states(producer: Producer, settings: CommonSettings, keys: list[str]) -> None:
    """Changelog records (opaque values: a restore stores the bytes), in the open transaction."""
    for key in keys:
        producer.produce(
            Topics(settings.topic_prefix).state,
            key=key,
            value=os.urandom(64),
            partition=PARTITION,
            headers=[(WAKE_HEADER, b"4102444800000")],
        )
    producer.flush(10)


def test_a_commit_of_the_previous_owner_before_the_fence_is_restored(
    settings: CommonSettings, scheduler: Scheduler
) -> None:
    # open while the restore reads
    old = previous_owner(settings, [f"before-{i}" for i in range(50)], ["late-0", "late-1"])
    producer = scheduler._new_producer(PARTITION)
    owner = scheduler._new_owner(PARTITION, producer)
    calls: list[str] = []

    def fenced() -> None:
        # the changelog as it stood was read: the old owner commits, then is fenced
        calls.append("fenced")
        old.commit_transaction(10)
        producer.init_transactions(30)

    reader = scheduler._restore_reader()
    try:
        n, _ = owner.restore(reader, fenced=fenced)
        assert calls == ["fenced"]
        assert n == 52
        assert owner.store.get("late-1") is not None
        assert owner.store.get("before-49") is not None
    finally:
        owner.close()
        reader.close()
        old.flush(5)


def test_an_open_transaction_of_the_previous_owner_is_aborted_not_restored(
    settings: CommonSettings, scheduler: Scheduler
) -> None:
    # the dead owner's transaction, never ended
    old = previous_owner(settings, [f"kept-{i}" for i in range(20)], ["open-0"])
    reader = scheduler._restore_reader()
    try:
        restored = scheduler._build(PARTITION, reader)
        try:
            assert restored.states == 20
            assert restored.owner.store.get("kept-19") is not None
            assert restored.owner.store.get("open-0") is None
            assert 0 < restored.fence_s <= restored.seconds
            # fenced for real: the new producer writes, the old one can no longer commit
            restored.owner.producer.begin_transaction()
            restored.owner.producer.commit_transaction(10)
        finally:
            restored.owner.close()
    finally:
        reader.close()
    with pytest.raises(KafkaException):
        old.commit_transaction(10)


def test_an_empty_changelog_restores_after_the_fence(
    settings: CommonSettings, scheduler: Scheduler
) -> None:
    reader = scheduler._restore_reader()
    try:
        restored = scheduler._build(PARTITION, reader)
        restored.owner.close()
        assert restored.states == 0
    finally:
        reader.close()

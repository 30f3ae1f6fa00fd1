"""The warm standby (``schedulers/standby.py``): a scheduler follows the partitions it does
not own in local copies, and a partition given to it is restored from its copy plus the
changelog's tail past it. Against the real broker: the copy plus the tail must build exactly
the store (states, wake-ups, held commands, fairness shares) a whole restore builds, reading
only the tail; a copy that was taken is followed again from the start once released."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from duetime.core.config import CommonSettings
from duetime.core.jobspec import build_job
from duetime.core.topics import HELD_PREFIX, Topics
from duetime.schedulers import logic, metrics
from duetime.schedulers.fairness import SHARE_HEADER, Share
from duetime.schedulers.partition import WAKE_HEADER, PartitionOwner
from duetime.schedulers.service import Scheduler
from duetime.schedulers.settings import SchedulerSettings
from duetime.schedulers.standby import Standby
from tests.helpers import wait_for

PARTITION = 2
TARGET = {"type": "http", "url": "http://127.0.0.1:9/none"}
SHARE = Share(live={"team-a": 1}, held={}, held_count=0, rank=2, weight=1).encode()


@pytest.fixture
def scheduler(settings: CommonSettings) -> Iterator[Scheduler]:
    """A scheduler that never joins its group, with a standby following one partition."""
    s = Scheduler(SchedulerSettings(common=settings))
    s.standby = s._new_standby()
    s.standby.follow(frozenset({PARTITION}))
    yield s
    s.standby.close()
    s.restores.close()
    s._fences.shutdown()
    s._pool.shutdown()
    s.consumer.close()
    s._restore_consumer.close()


Record = tuple[str, bytes | None, list[tuple[str, str | bytes | None]]]


def write(settings: CommonSettings, records: list[Record]) -> None:
    """Commit changelog records (key, value or None for a tombstone, headers) in one
    transaction, as the partition's owner would."""
    producer = Producer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "transactional.id": f"{settings.topic_prefix}scheduler.{PARTITION}",
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for key, value, headers in records:
        producer.produce(
            Topics(settings.topic_prefix).state,
            key=key,
            value=value,
            partition=PARTITION,
            headers=headers,
        )
    producer.commit_transaction(10)


def state(i: int, wake: int | None = 4102444800000, share: bool = False) -> Record:
    headers: list[tuple[str, str | bytes | None]] = [
        (WAKE_HEADER, b"" if wake is None else str(wake).encode())
    ]
    if share:
        headers.append((SHARE_HEADER, SHARE))
    return (f"job-{i}", os.urandom(48), headers)


def contents(owner: PartitionOwner) -> tuple[list[tuple[object, ...]], ...]:
    db = owner.store._db
    owner.store.flush()
    return (
        sorted(db.execute("SELECT job_id, wake_at_ms, value FROM state")),
        sorted(db.execute("SELECT key, job_id, value FROM held")),
        sorted((k, s.encode()) for k, s in owner.fairness._shares.items()),
    )


def read(standby: Standby, records: int) -> bool:
    """The copy has read ``records`` and reached the changelog's end since."""
    with standby._lock:
        copy = standby._copies.get(PARTITION)
        return copy is not None and copy.records >= records and copy.caught_up_at is not None


def test_a_copy_and_its_tail_restore_what_the_whole_changelog_does(
    settings: CommonSettings, scheduler: Scheduler
) -> None:
    standby = scheduler.standby
    assert standby is not None
    held = f"{HELD_PREFIX}job-7/000000000000001/cmd-1"
    write(settings, [state(i, share=i % 10 == 0) for i in range(200)])
    write(settings, [(held, b"pause", []), ("job-3", None, []), state(5, wake=None)])
    wait_for(lambda: read(standby, 203), 30, "the standby to read the changelog")
    # the tail: written after the copy caught up, read by the restore itself
    tail = [state(10, wake=5), ("job-20", None, []), (held, None, []), state(300, share=True)]
    write(settings, tail)
    before = metrics.STANDBY_RESTORES._value.get()

    reader = scheduler._restore_reader()
    try:
        restored = scheduler._build(PARTITION, reader)
        try:
            assert metrics.STANDBY_RESTORES._value.get() == before + 1
            assert restored.states == len(tail)  # the tail only, not 207 records
            whole = scheduler._new_owner(PARTITION, restored.owner.producer)
            try:
                n, _ = whole.restore(reader)
                assert n == 200 + 3 + len(tail)
                assert contents(restored.owner) == contents(whole)
            finally:
                whole.store.close()
        finally:
            restored.owner.close()
    finally:
        reader.close()


def test_a_partition_taken_and_released_is_followed_again_from_the_start(
    settings: CommonSettings, scheduler: Scheduler
) -> None:
    standby = scheduler.standby
    assert standby is not None
    write(settings, [state(i) for i in range(20)])
    wait_for(lambda: read(standby, 20), 30, "the standby to read the changelog")
    copy = standby.take(PARTITION)
    assert copy is not None and copy.records == 20
    copy.store.close()
    assert standby.take(PARTITION) is None  # taken: nothing more to hand over
    write(settings, [state(i) for i in range(20, 25)])
    standby.follow(frozenset({PARTITION}))  # released by its owner here
    wait_for(lambda: read(standby, 25), 30, "the standby to read the changelog again")
    again = standby.take(PARTITION)
    assert again is not None
    try:
        assert again.records == 25  # all of it, from the start: not only what followed
        assert again.store.get("job-0") is not None
    finally:
        again.store.close()


def test_a_bad_wake_header_neither_stops_a_restore_nor_is_restored_from_a_copy(
    settings: CommonSettings, scheduler: Scheduler
) -> None:
    """Only schedulers write the changelog, but a record with a wake-up header that is not a
    number (corruption, or a writer that should not have been allowed) must not stop a restore:
    every owner of the partition would meet it in turn. The wake-up is worked out from the
    state itself; a standby copy that met it is not used (the restore reads everything)."""
    standby = scheduler.standby
    assert standby is not None
    at_ms = 4102444800000
    definition = build_job(
        {"name": "bad-header", "schedule": {"at": "2100-01-01T00:00:00Z"}, "target": TARGET},
        now_ms=1_790_000_000_000,
    )
    first = logic.new_state(definition, 1_790_000_000_000)
    value = scheduler.codec.dump(first, topic=Topics(settings.topic_prefix).state)
    bad: list[tuple[str, str | bytes | None]] = [(WAKE_HEADER, b"not-a-number")]
    write(settings, [state(i) for i in range(5)])
    write(settings, [(definition.job_id, value, bad), ("job-junk", os.urandom(40), bad)])
    wait_for(lambda: read(standby, 7), 30, "the standby to read the changelog")

    reader = scheduler._restore_reader()
    try:
        restored = scheduler._build(PARTITION, reader)
        try:
            assert restored.copied is None  # the copy met the bad header: not used
            assert restored.states == 7
            db = restored.owner.store._db
            wakes = dict(db.execute("SELECT job_id, wake_at_ms FROM state"))
            assert wakes[definition.job_id] == at_ms - scheduler.policy.fire_lead_ms
            assert wakes["job-junk"] is None  # not a state at all: no wake-up, no crash
            assert wakes["job-0"] == 4102444800000
        finally:
            restored.owner.close()
    finally:
        reader.close()

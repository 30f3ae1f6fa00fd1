"""One partition's input handling in-process (schedulers/partition.py), without a broker: the
records are built as the consumer hands them over, and nothing here commits a transaction.

What it pins: a new job's state is encoded once per definition (it was encoded twice: once
for the definition, again for its held commands, even when there were none), and commands
that overtook their job's definition are still applied when it arrives."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from confluent_kafka import Consumer, Message, Producer

from duetime.core.clock import ManualClock
from duetime.core.jobspec import build_job
from duetime.core.models import ControlKind, Status
from duetime.core.records import AvroRecord, ControlCommand, JobDefinition, SchedulerState
from duetime.core.topics import Topics
from duetime.schedulers import logic
from duetime.schedulers.partition import PartitionOwner
from duetime.schemas.codec import Codec

TOPICS = Topics("duetime.")
NOW_MS = 1_800_000_000_000
# nothing connects: the owner only produces in commit(), which these tests never reach
UNREACHABLE = "127.0.0.1:9"


class CountingCodec(Codec):
    """The scheduler's codec, counting the states it encodes."""

    def __init__(self) -> None:
        super().__init__(keep_definitions=True)
        self.states_dumped = 0

    def dump(self, record: AvroRecord, *, topic: str | None = None) -> bytes:
        if isinstance(record, SchedulerState):
            self.states_dumped += 1
        return super().dump(record, topic=topic)


@pytest.fixture
def owner() -> Iterator[PartitionOwner]:
    producer = Producer({"bootstrap.servers": UNREACHABLE})
    consumer = Consumer({"bootstrap.servers": UNREACHABLE, "group.id": "unused"})
    owner = PartitionOwner(
        0,
        topics=TOPICS,
        codec=CountingCodec(),
        producer=producer,
        make_producer=lambda _: producer,
        restore_consumer=consumer,
        store_path=None,
        window_ms=300_000,
        policy=logic.Policy(),
        rng=random.Random(1),
        clock=ManualClock(NOW_MS),
    )
    owner.store.advance(NOW_MS)
    yield owner
    owner.store.close()
    consumer.close()


def _definition() -> JobDefinition:
    at = datetime.fromtimestamp((NOW_MS + 60_000) / 1000, UTC).isoformat()
    return build_job(
        {"name": "once", "schedule": {"at": at}, "target": {"type": "python", "ref": "m:f"}},
        now_ms=NOW_MS,
        topic_prefix="duetime.",
    )


def _message(topic: str, offset: int, record: AvroRecord, key: str) -> Message:
    value = Codec().dump(record, topic=topic)
    return Message(topic=topic, partition=0, offset=offset, key=key.encode(), value=value)


def _pending_state(owner: PartitionOwner, job_id: str) -> SchedulerState:
    """The state the cycle will write, decoded from the bytes it will write."""
    return owner.codec.load(SchedulerState, owner.pending.encoded[job_id])


def test_a_new_jobs_state_is_encoded_once(owner: PartitionOwner) -> None:
    definition = _definition()
    assert owner.handle(_message(TOPICS.jobs, 0, definition, definition.job_id), NOW_MS)
    assert isinstance(owner.codec, CountingCodec)
    assert owner.codec.states_dumped == 1
    state = _pending_state(owner, definition.job_id)
    assert state.status is Status.PENDING
    assert state.next_run_at_ms == NOW_MS + 60_000
    assert owner.pending.dirty[definition.job_id] == state


def test_a_command_that_overtook_its_definition_is_applied_when_it_arrives(
    owner: PartitionOwner,
) -> None:
    definition = _definition()
    pause = ControlCommand(
        command_id=str(uuid.uuid4()),
        job_id=definition.job_id,
        kind=ControlKind.PAUSE,
        issued_at_ms=NOW_MS,
    )
    assert owner.handle(_message(TOPICS.control, 0, pause, definition.job_id), NOW_MS)
    assert owner.pending.held  # no definition yet: held
    assert owner.handle(_message(TOPICS.jobs, 0, definition, definition.job_id), NOW_MS)
    state = _pending_state(owner, definition.job_id)
    assert state.status is Status.PAUSED
    assert owner.pending.dirty[definition.job_id] == state
    # the held command is forgotten in the same cycle (its changelog key gets a tombstone)
    assert all(value is None for _, value in owner.pending.held.values())

"""The projector role: Kafka events → the PostgreSQL projection, exactly once.

Main loop, one screen: stop requested? → wait for records (a short poll, then whatever is
already fetched, up to a batch) → reduce them per key → write rows and offsets in one
PostgreSQL transaction. On assignment every partition is positioned at the offset stored in
PostgreSQL (not Kafka's committed offset), so a batch is projected exactly once even if the
process dies between the two commits. A failed write rolls back, rewinds the consumer to the
stored offsets and goes on. Partition creation ahead of time and retention run beside the loop.

Bad records never stop a partition: a record that does not decode, or that PostgreSQL refuses
for its content (a value no column accepts), is copied to the poison topic with its original
bytes and context headers before the offset past it is stored. A batch refused for its
content is written again record by record to find the culprits; an outage (a lost
connection) is not a content error: it rolls back and retries the same batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import psycopg
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaException,
    Message,
    TopicPartition,
)

# the defining module: confluent_kafka.admin re-exports OffsetSpec without declaring it
from confluent_kafka.admin._listoffsets import OffsetSpec

from duetime.core import kafka
from duetime.core.backoff import Backoff, retry_transient
from duetime.core.clock import SYSTEM_CLOCK, Clock
from duetime.core.errors import CONTENT_ERRORS
from duetime.core.models import ControlKind
from duetime.core.poison import PRODUCER_MAX_BYTES, park_record
from duetime.core.records import (
    BY_EVENT_TYPE,
    AvroRecord,
    ControlCommand,
    DagDefinition,
    DagRunEvent,
    DeadLetter,
    ExecutionRequest,
    ExecutionResult,
    JobDefinition,
    SchedulerState,
)
from duetime.core.state_head import HEAD_HEADER, decode_head
from duetime.core.topics import HELD_PREFIX, Topics
from duetime.schemas.codec import Codec

from . import metrics, rows
from .settings import ProjectorSettings
from .store import Batch, ProjectionStore

log = logging.getLogger("duetime.projector")

BatchHook = Callable[[Batch, list[float]], None]
"""Called after each committed batch with the lag of each of its records, in seconds."""

# What a record's content (not an outage) can make a write fail with: PostgreSQL refusing a
# value (a text that is not a UUID, a NUL character, a number out of range, a constraint),
# or a row that cannot be built from a decodable record (a timestamp past year 9999, a cron
# expression that never fires).
_CONTENT_ERRORS: tuple[type[BaseException], ...] = (
    *CONTENT_ERRORS,
    psycopg.DataError,
    psycopg.IntegrityError,
)
_HELD = HELD_PREFIX.encode()
_PARKED_MEMORY = 100_000
KAFKA_COMMIT_INTERVAL_S = 1.0
"""How often the projector commits its (informational) offsets to Kafka at most."""


class Projector:
    def __init__(
        self,
        settings: ProjectorSettings,
        *,
        on_batch: BatchHook | None = None,
        clock: Clock = SYSTEM_CLOCK,
        watch_idle: bool = False,
    ) -> None:
        """``watch_idle``: keep ``idle`` up to date (for a caller that waits on it)."""
        self.settings = settings
        self.common = settings.common
        self.clock = clock
        self.topics = Topics(self.common.topic_prefix)
        self.codec = Codec(registry_url=self.common.schema_registry_url)
        self._state_reader = self.codec.projection("state", rows.kept_fields(rows.StateHead))
        self.store = ProjectionStore(
            self.common.database_url, settings.group_id, settings.retention_days, clock=clock
        )
        self.on_batch = on_batch
        self.consumer = kafka.consumer(
            self.common,
            settings.group_id,
            # large fetches; no 128 KiB / 100 ms fetch waits (tried: a job's status
            # was projected a fetch ahead of its executions: tests/integration/test_cli.py saw
            # a `success` job with no execution listed yet). Metadata every 10 s (default
            # 5 min): the regex subscription to every queue's execution topics follows a queue
            # created after the projector started within that
            **{
                "fetch.max.bytes": 52428800,
                "queued.max.messages.kbytes": 65536,
                "topic.metadata.refresh.interval.ms": 10000,
            },
        )
        self.assigned: set[tuple[str, int]] = set()
        self._admin = kafka.admin(self.common)
        self.idle = threading.Event()
        """Set while every partition is read to its end: checked by an idle loop every 0.2 s,
        only with ``watch_idle`` or in a run until caught up (a check is a ListOffsets request
        naming every partition, and nothing else reads it)."""
        self._watch_idle = watch_idle
        self._checked_at = 0.0
        self._kafka_offsets: dict[tuple[str, int], int] = {}
        """Projected offsets not yet committed to Kafka (the latest per partition)."""
        self._kafka_committed_at = 0.0
        self._written_at = 0.0
        """When the last batch was written (monotonic): the next waits for ``gather_s``."""
        self._stop = threading.Event()
        # acks=all: a parked copy must outlive a broker failure once the offset moves past it
        self._poison = kafka.producer(
            self.common, **{"acks": "all", "message.max.bytes": PRODUCER_MAX_BYTES}
        )
        self._parked: set[tuple[str, int, int]] = set()
        """Bad records copied by this process (a retried batch does not copy them twice)."""
        self._types = {
            t: self.topics.event_type_of(t)
            for t in (
                self.topics.jobs,
                self.topics.state,
                *self.topics.executions,
                self.topics.results,
                self.topics.dlq,
                self.topics.dags,
                self.topics.dag_runs,
                self.topics.control,
            )
        }

    def _subscription(self) -> list[str]:
        """The named topics, and a pattern for every queue's execution topics (the default
        queue's are named too: they count in ``caught_up``)."""
        return [*sorted(self._types), self.topics.executions_regex]

    def _type_of(self, topic: str) -> str:
        """The event type of a subscribed topic's values; "" for a topic the pattern matched
        that is no queue's (``exec.a.b.c``): its records are parked as undecodable."""
        found = self._types.get(topic)
        if found is not None:
            return found
        return "execution" if self.topics.parse_execution(topic) is not None else ""

    # --- lifecycle ------------------------------------------------------------------------

    def stop(self, *_: Any) -> None:
        self._stop.set()

    def rebuild(self) -> None:
        """Empty the projection; the next run replays every topic from its beginning."""
        self.store.truncate()
        log.info("projection truncated: replaying the topics from the beginning")

    def run(self, *, until_caught_up: bool = False) -> None:
        self.consumer.subscribe(
            self._subscription(),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        housekeeping = threading.Thread(target=self._housekeeping, daemon=True)
        housekeeping.start()
        log.info("projector started", extra={"role": "projector"})
        try:
            while not self._stop.is_set():
                if self._cycle():
                    self.idle.clear()
                    continue
                self._flush_kafka_offsets()
                if not (until_caught_up or self._watch_idle):
                    continue
                if self._check_caught_up() and until_caught_up:
                    break
        finally:
            self._stop.set()
            self._poison.flush(10)
            self._flush_kafka_offsets(final=True)
            self.consumer.close()  # leaves the group: partitions move at once
            self.store.close()
            metrics.ASSIGNED.set(0)
            log.info("projector stopped")

    # --- the loop -------------------------------------------------------------------------

    def _cycle(self) -> int:
        # gather: the batch before this one was written less than gather_s ago (under load),
        # so wait out the rest and take everything fetched meanwhile in one transaction
        rest = self._written_at + self.settings.gather_s - time.monotonic()
        if rest > 0 and self._stop.wait(rest):
            return 0
        msgs = kafka.read_batch(self.consumer, self.settings.batch_size, self.settings.poll_s)
        if not msgs:
            metrics.LAG_SECONDS.set(0.0)
            return 0
        batch, bad = self._reduce(msgs)
        started = time.monotonic()
        try:
            self._park(bad)
            try:
                self.store.write(batch)
            except _CONTENT_ERRORS as exc:
                self._isolate(msgs, exc)
        except (psycopg.Error, KafkaException) as exc:
            metrics.FAILED_BATCHES.inc()
            log.error("batch of %s records failed, rewinding: %s", len(msgs), exc)
            self.store.close()
            self._stop.wait(1.0)
            self._rewind()
            return 0
        done = self.clock.now_ms() / 1000
        now = time.monotonic()
        # a full batch means a backlog: the next one is read at once
        self._written_at = now if len(msgs) < self.settings.batch_size else 0.0
        metrics.BATCH_SECONDS.observe(now - started)
        metrics.BATCHES.inc()
        metrics.ROWS.inc(batch.rows_written())
        lags = [max(0.0, done - m.timestamp()[1] / 1000) for m in msgs if m.error() is None]
        for lag in lags[:: max(1, len(lags) // 100)]:  # a sample: ≤ ~100 per batch
            metrics.EVENT_LAG_SECONDS.observe(lag)
        metrics.LAG_SECONDS.set(max(lags, default=0.0))
        self._commit_to_kafka(batch)
        if self.on_batch is not None:
            self.on_batch(batch, lags)
        return len(msgs)

    def _reduce(self, msgs: list[Message]) -> tuple[Batch, list[tuple[Message, str]]]:
        """The batch of rows, and the records that could not be made into rows (with why)."""
        batch = Batch()
        bad: list[tuple[Message, str]] = []
        # a state record is superseded by a later one of its job in the same batch: the
        # state topic is a changelog, only the newest is worth decoding
        newest_state: dict[tuple[int, bytes | None], int] = {}
        for i, msg in enumerate(msgs):
            if msg.topic() == self.topics.state and msg.error() is None:
                newest_state[(msg.partition() or 0, msg.key())] = i
        counts: Counter[str] = Counter()
        for i, msg in enumerate(msgs):
            if msg.error():
                log.warning("consume error: %s", msg.error())
                continue
            topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
            batch.offsets[(topic, partition)] = offset + 1
            value = msg.value()
            if value is None:
                continue  # a tombstone: nothing deletes projected rows
            if topic == self.topics.state and (msg.key() or b"").startswith(_HELD):
                continue  # a command the scheduler holds for a job it has not met: no state
            event_type = self._type_of(topic)
            counts[event_type] += 1
            if topic == self.topics.state and newest_state[(partition, msg.key())] != i:
                continue
            try:
                if topic == self.topics.state:
                    self._add_state(batch, msg, value, offset)
                    continue
                record = self.codec.load(BY_EVENT_TYPE[event_type], value)
                self._add(batch, record, offset)
            except Exception as exc:  # a record no row can be made of must not stop the rest
                metrics.UNDECODABLE.inc()
                bad.append((msg, f"{type(exc).__name__}: {exc}"))
                continue
        for event_type, n in counts.items():
            metrics.EVENTS.labels(event_type=event_type).inc(n)
        batch.events = sum(counts.values())
        return batch, bad

    def _isolate(self, msgs: list[Message], error: BaseException) -> None:
        """PostgreSQL refused a batch for its content: write its records one by one, park
        each one refused on its own, and store the offsets past it."""
        log.warning(
            "a batch of %s records was refused (%s: %s): writing them one by one",
            len(msgs),
            type(error).__name__,
            str(error).splitlines()[0] if str(error) else "",
        )
        for msg in msgs:
            if msg.error() is not None:
                continue
            single, bad = self._reduce([msg])
            self._park(bad)
            try:
                self.store.write(single)
            except _CONTENT_ERRORS as exc:
                metrics.UNDECODABLE.inc()
                self._park([(msg, f"{type(exc).__name__}: {str(exc).splitlines()[0]}")])
                past = Batch()
                past.offsets = dict(single.offsets)
                self.store.write(past)

    def _park(self, bad: list[tuple[Message, str]]) -> None:
        """Copy bad records to the poison topic and wait for the broker to have them (their
        offsets are stored right after); raises KafkaException when it does not."""
        fresh = [(m, why) for m, why in bad if _where(m) not in self._parked]
        if not fresh:
            return
        failed: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(str(err))

        for msg, why in fresh:
            topic, partition, offset = _where(msg)
            parked = park_record(
                topic=topic,
                partition=partition,
                offset=offset,
                key=msg.key(),
                value=msg.value(),
                headers=msg.headers(),
                error=why,
                role="projector",
                logger=log,
            )
            headers: list[tuple[str, str | bytes | None]] = [*parked.headers]
            self._poison.produce(
                self.topics.poison,
                parked.value,
                parked.key,
                partition=parked.partition,
                headers=headers,
                on_delivery=delivered,
            )
        remaining = self._poison.flush(30)
        if remaining or failed:
            raise KafkaException(
                f"poison copies not acknowledged: {remaining} pending, {failed[:1]} failed"
            )
        if len(self._parked) > _PARKED_MEMORY:
            self._parked.clear()
        self._parked.update(_where(m) for m, _ in fresh)

    def _add_state(self, batch: Batch, msg: Message, value: bytes, offset: int) -> None:
        """A state's head now: from its header (``duetime.core.state_head``), else decoded
        with its definition skipped, not built; the whole state only if the store needs its
        definition. A whole decode that fails then fails the batch for its content, and the
        record is found and parked one by one (``_isolate``)."""
        topic, partition = self.topics.state, msg.partition()
        head = _header_head(msg) or self.codec.load(
            rows.StateHead,
            value,
            topic=topic,
            partition=partition,
            offset=offset,
            reader=self._state_reader,
        )

        def whole() -> SchedulerState:
            return self.codec.load(
                SchedulerState, value, topic=topic, partition=partition, offset=offset
            )

        batch.add_state(head, offset, whole)

    @staticmethod
    def _add(batch: Batch, record: AvroRecord, offset: int) -> None:
        if isinstance(record, JobDefinition):
            batch.add_definition(record)
        elif isinstance(record, ExecutionRequest | ExecutionResult):
            batch.add_execution_event(record)
        elif isinstance(record, DeadLetter):
            batch.add_dead(record)
        elif isinstance(record, DagDefinition):
            batch.add_dag(record)
        elif isinstance(record, DagRunEvent):
            batch.dag_run_events.append(record)
        elif (
            isinstance(record, ControlCommand)
            and record.kind is ControlKind.REPLAY
            and record.execution_id
        ):
            batch.add_replay(record.execution_id, record.issued_at_ms)

    def _commit_to_kafka(self, batch: Batch) -> None:
        """Informational only (lag tools read it): the offsets that count are in PostgreSQL.
        At most one commit a KAFKA_COMMIT_INTERVAL_S (a commit per batch was ~15 % of the
        broker's requests at 200 jobs/s); the latest offset of each partition waits for it,
        or for an idle turn of the loop, or the close."""
        self._kafka_offsets.update(batch.offsets)
        self._flush_kafka_offsets()

    def _flush_kafka_offsets(self, *, final: bool = False) -> None:
        now = time.monotonic()
        if not self._kafka_offsets or (
            not final and now - self._kafka_committed_at < KAFKA_COMMIT_INTERVAL_S
        ):
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in self._kafka_offsets.items()]
        self._kafka_offsets.clear()
        self._kafka_committed_at = now
        try:  # asynchronous at the close too: a broker outage must not hold a stop up
            self.consumer.commit(offsets=offsets, asynchronous=True)
        except Exception as exc:  # e.g. a rebalance in progress: the next batch commits
            log.debug("kafka commit skipped: %s", exc)

    # --- positions ------------------------------------------------------------------------

    def _positions(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """Where each partition was projected up to, from PostgreSQL. Waits for PostgreSQL as
        long as it takes (a projector has nothing else to do meanwhile; giving up here, inside
        a rebalance callback, ended the process during an outage of a minute), unless the
        projector is stopping."""
        stored = retry_transient(
            self.store.offsets,
            transient=lambda exc: isinstance(exc, psycopg.Error),
            dependency="PostgreSQL",
            what="reading the stored offsets",
            logger=log,
            stopping=self._stop.is_set,
            sleep=self._stop.wait,  # a stop request ends the wait at once
            backoff=Backoff(first_s=0.5, cap_s=5.0),
            on_retry=lambda _exc: self.store.close(),  # reconnect on the next attempt
        )
        for tp in partitions:
            tp.offset = stored.get((tp.topic, tp.partition), OFFSET_BEGINNING)
        return partitions

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.store.forget()  # another projector may have written these partitions meanwhile
        consumer.assign(self._positions(partitions))
        self.assigned = {(tp.topic, tp.partition) for tp in partitions}
        metrics.ASSIGNED.set(len(self.assigned))
        log.info("assigned %s topic partitions", len(partitions), extra={"role": "projector"})

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.store.forget()
        for tp in partitions:  # its next owner commits it: an older offset would go back
            self._kafka_offsets.pop((tp.topic, tp.partition), None)
        self.assigned -= {(tp.topic, tp.partition) for tp in partitions}
        metrics.ASSIGNED.set(len(self.assigned))

    def _rewind(self) -> None:
        """After a rolled-back batch: go back to what PostgreSQL says was projected."""
        tps = [TopicPartition(t, p) for t, p in sorted(self.assigned)]
        if not tps:
            return
        try:
            for tp in self._positions(tps):
                self.consumer.seek(tp)
        except Exception as exc:
            log.error("rewind failed (%s): re-joining the group", exc)
            self.consumer.unsubscribe()
            self.consumer.subscribe(
                self._subscription(),
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_revoke,
            )

    def _check_caught_up(self) -> bool:
        """Called by the loop only (the consumer is not shared between threads)."""
        if time.monotonic() - self._checked_at < 0.2:
            return self.idle.is_set()
        self._checked_at = time.monotonic()
        try:
            done = self.caught_up()
        except Exception as exc:  # e.g. a leader moving: only this check fails, not the loop
            log.debug("caught-up check failed: %s", exc)
            done = False
        if done:
            self.idle.set()
        else:
            self.idle.clear()
        return done

    def caught_up(self) -> bool:
        """Every partition of every topic is assigned here and read to its end (the last
        stable offset: what a read_committed reader can reach)."""
        expected = len(self._types) * self.common.partitions
        if len(self.assigned) < expected:
            return False
        tps = [TopicPartition(t, p) for t, p in sorted(self.assigned)]
        positions = {(tp.topic, tp.partition): tp.offset for tp in self.consumer.position(tps)}
        # one ListOffsets request for all partitions (the consumer's own watermark queries
        # queue behind its long-poll fetches: ~0.5 s each)
        # confluent-kafka leaves OffsetSpec.latest() unannotated; it returns an OffsetSpec
        latest = cast(Callable[[], OffsetSpec], OffsetSpec.latest)()
        futures = self._admin.list_offsets(
            {tp: latest for tp in tps},
            isolation_level=IsolationLevel.READ_COMMITTED,
            request_timeout=10,
        )
        stored: dict[tuple[str, int], int] | None = None
        for tp, future in futures.items():
            end = future.result().offset
            pos = positions.get((tp.topic, tp.partition), -1)
            if pos < 0:  # nothing fetched since the assignment: use what PostgreSQL says
                stored = self.store.offsets() if stored is None else stored
                pos = stored.get((tp.topic, tp.partition), 0)
            if pos < end:
                return False
        return True

    # --- beside the loop ------------------------------------------------------------------

    def _housekeeping(self) -> None:
        next_retention = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_retention:
                next_retention = time.monotonic() + self.settings.housekeeping_interval_s
                try:
                    done = self.store.housekeeping()
                    metrics.PARTITIONS_DROPPED.inc(done["dropped"])
                    if any(done.values()):
                        log.info("housekeeping: %s", done)
                except Exception:
                    log.exception("housekeeping failed; trying again later")
            try:
                metrics.DLQ_DEPTH.set(self.store.dlq_depth())
            except Exception as exc:
                log.warning("reading the DLQ depth failed: %s", exc)
            self._stop.wait(15.0)


def _where(msg: Message) -> tuple[str, int, int]:
    return msg.topic() or "", msg.partition() or 0, msg.offset() or 0


def _header_head(msg: Message) -> rows.StateHead | None:
    """The state's head from its ``duetime-head`` header, or None (no header, one that does
    not parse, or a key that is not text): the caller decodes the value then."""
    key = msg.key()
    if not key:
        return None
    for header in msg.headers() or []:
        if header[0] == HEAD_HEADER:
            head = decode_head(header[1])
            if head is None:
                return None
            try:
                job_id = key.decode()
            except UnicodeDecodeError:
                return None
            revision, status, next_ms, updated_ms = head
            return rows.StateHead(
                job_id=job_id,
                definition=rows.DefinitionRevision(revision=revision),
                status=status,
                next_run_at_ms=next_ms,
                updated_at_ms=updated_ms,
            )
    return None

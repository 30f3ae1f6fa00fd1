"""One owned partition: its state store, its transactional producer, its cycle.

A cycle collects the partition's consumed input records and its due jobs, applies the pure
transform (``logic``), and writes everything in ONE Kafka transaction: execution requests,
dead letters, state changes and the consumed input offsets (sent with the consumer's group
metadata). The transactional id is per partition (``<prefix>scheduler.<p>``), so a new owner's
``init_transactions`` fences the old owner and aborts its open transaction at once instead of
waiting for it to time out: failover does not pay the transaction timeout.

Errors follow the transactional API's classes (``duetime.core.kafka.classify``):
abortable → abort, roll the store back, rewind the inputs to the committed offsets, retry;
unknown outcome (a commit that timed out) → recreate the producer and restore the partition
from its changelog; fenced / fatal → give the partition up.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from duetime.core import tracing
from duetime.core.clock import Clock
from duetime.core.errors import CONTENT_ERRORS, DecodeError
from duetime.core.jobspec import MAX_DEFINITION_BYTES
from duetime.core.kafka import ErrorClass, classify, watermarks
from duetime.core.poison import Parked, park_record
from duetime.core.records import (
    AvroRecord,
    ControlCommand,
    DagRunEvent,
    DeadLetter,
    ExecutionRequest,
    ExecutionResult,
    JobDefinition,
    SchedulerState,
)
from duetime.core.redact import redact_text
from duetime.core.state_head import HEAD_HEADER, encode_head
from duetime.core.topics import HELD_PREFIX, Topics
from duetime.schemas.codec import Codec

from . import logic, metrics
from .crowd import Crowd
from .fairness import SHARE_HEADER, FairnessGate, Share, share_of
from .store import CACHE_KIB, StateStore

log = logging.getLogger("duetime.scheduler")

WAKE_HEADER = "duetime-wake-ms"
CROWD_EVERY_MS = 1_000
"""The crowd lead is worked out again this often, when a later group's turn has come, or at
the first fire after the index gained a wake-up (a crowd arriving, maybe as its turn comes):
walking the index's counts costs ~50 us, a cycle runs every few milliseconds. It was worked
out at every fire and every 100 ms besides, 15 % of a scheduler's CPU at 350 jobs/s (py-spy
--gil, 2026-12-04). Jobs leaving the index only make turns later, and time makes them come
(``next_ms``, which also wakes the timer for groups coming within the cap: store.py
``CROWD_LOOKAHEAD_MS``), so nothing else needs a look. (Looking 100 ms after an addition
instead let a crowd ingested as its turn came go out ~100 ms late: the integration test caught
it.)"""
CROWD_MIN_LEAD_MS = 100
"""A group's turn less than this before its wake-up does not wake the timer (crowd.py
``min_lead_ms``): under a steady load every next job's turn is a few ms before its wake-up;
such a group goes out at the next look or at its wake-up, as without a crowd."""
CATCH_UP_LIMIT_MS = 10_000
"""A new owner fires at the latest this long after taking a partition, inputs read or not."""


_ANY_PARTITION = -1
"""librdkafka's ``RD_KAFKA_PARTITION_UA``: the producer's default partitioner places it."""

_INPUTS: dict[str, type[JobDefinition | ControlCommand | ExecutionResult]] = {
    "job": JobDefinition,
    "control": ControlCommand,
    "result": ExecutionResult,
}
"""The record class of each input topic's event type."""


class PartitionLost(Exception):
    """This process no longer owns the partition (fenced or fatal producer error)."""


@dataclass
class Pending:
    """What the current cycle will write."""

    dirty: dict[str, SchedulerState] = field(default_factory=dict)
    encoded: dict[str, bytes] = field(default_factory=dict)
    """Each dirty state as it will be written (encoded when the input that changed it was
    applied: a state that cannot be written is that input's fault, not the partition's)."""
    out: logic.Outputs = field(default_factory=logic.Outputs)
    """Execution requests, dead letters, commands to other jobs and DAG run events."""
    messages: list[_Message] = field(default_factory=list)
    """``out`` encoded, in the order of the routes' records (encoded as they are collected)."""
    poison: list[Parked] = field(default_factory=list)
    offsets: dict[str, int] = field(default_factory=dict)
    held: dict[str, tuple[str, bytes | None]] = field(default_factory=dict)
    """Changelog key → (job_id, command bytes, or None to forget it)."""
    since: float | None = None
    """Monotonic time of the first change not yet committed."""
    commit_by_ms: int | None = None
    """By when (scheduler clock, ms) the records someone waits for must be committed: at once
    for dead letters, commands to other jobs and DAG run events; for execution requests, half
    the fire lead before the earliest due time (the other half covers the commit and the
    workers' fetch; with no lead, at once). None: bookkeeping only (states, held commands,
    poison copies, input offsets), which waits for the commit interval: it is applied in
    memory at once."""

    def urgent(self, now_ms: int) -> bool:
        return self.commit_by_ms is not None and self.commit_by_ms <= now_ms

    def wait_for(self, out: logic.Outputs, slack_ms: int) -> None:
        """Move ``commit_by_ms`` forward for one input's or one fire's records (requests: by
        ``slack_ms`` before their due time; a crowd's is larger by its extra lead, so a crowd
        fired ahead commits at once)."""
        if out.dead_letters or out.controls or out.dag_run_events:
            by = 0
        elif out.executions:
            by = min(r.due_at_ms for r in out.executions) - slack_ms
        else:
            return
        self.commit_by_ms = by if self.commit_by_ms is None else min(self.commit_by_ms, by)

    def empty(self) -> bool:
        return not (self.dirty or self.out.records() or self.poison or self.offsets or self.held)


R = TypeVar("R", bound=AvroRecord)


@dataclass(frozen=True)  # not slotted: a slotted frozen generic cannot be built as _Route[X](...)
class _Route(Generic[R]):
    """Where one kind of the transform's output records goes."""

    records: Callable[[logic.Outputs], Sequence[R]]
    topic: Callable[[Topics, R], str]
    key: Callable[[R], str]
    own_partition: bool
    """True: the owner's partition number (job-keyed, co-partitioned topics); False: the
    producer's default partitioner on the key."""


_ROUTES: tuple[_Route[Any], ...] = (
    _Route[ExecutionRequest](
        records=lambda o: o.executions,
        topic=lambda t, r: t.execution(r.priority, r.queue),
        key=lambda r: r.job_id,
        own_partition=True,
    ),
    _Route[DeadLetter](
        records=lambda o: o.dead_letters,
        topic=lambda t, _: t.dlq,
        key=lambda r: r.job_id,
        own_partition=True,
    ),
    # commands to other jobs and DAG run events: keyed like the SDK writes them and placed by
    # the same default partitioner, so they reach their jobs' owners
    _Route[ControlCommand](
        records=lambda o: o.controls,
        topic=lambda t, _: t.control,
        key=lambda r: r.job_id,
        own_partition=False,
    ),
    _Route[DagRunEvent](
        records=lambda o: o.dag_run_events,
        topic=lambda t, _: t.dag_runs,
        key=lambda r: r.dag_id,
        own_partition=False,
    ),
)
"""The transaction's table: for each kind of output record, its topic, key and partition."""


@dataclass(frozen=True, slots=True)
class _Message:
    """One record of the transaction, ready for ``produce``."""

    topic: str
    key: str | bytes | None
    value: bytes | None
    partition: int = _ANY_PARTITION
    headers: list[tuple[str, str | bytes | None]] | None = None


@dataclass(frozen=True, slots=True)
class _Mark:
    """The cycle's pending work before one input, to roll that input back (``handle``)."""

    messages: int
    lengths: tuple[int, ...]
    """Of ``_lists(out)``, executions first."""
    state_changed: bool
    held: dict[str, tuple[str, bytes | None]]
    encoded: bytes | None
    was_dirty: bool


def _lists(out: logic.Outputs) -> tuple[list[Any], ...]:
    return (
        out.executions,
        out.dead_letters,
        out.controls,
        out.dag_run_events,
        out.rescues,
        out.skips,
    )


def _lengths(out: logic.Outputs) -> tuple[int, ...]:
    return tuple(len(records) for records in _lists(out))


class PartitionOwner:
    def __init__(
        self,
        partition: int,
        *,
        topics: Topics,
        codec: Codec,
        producer: Producer,
        make_producer: Callable[[int], Producer],
        restore_consumer: Consumer,
        store_path: Path | None,
        window_ms: int,
        policy: logic.Policy,
        rng: random.Random,
        clock: Clock,
        queue_exists: Callable[[str], bool | None] | None = None,
        store: StateStore | None = None,
    ) -> None:
        """``store``: a standby copy of the partition to restore onto (standby.py), or None
        (a new, empty one)."""
        self.partition = partition
        self.queue_exists = queue_exists
        """Whether a queue's topics exist (``QueueDirectory.exists``; None: not checked)."""
        self.topics = topics
        self.codec = codec
        self._make_producer = make_producer
        self._restore_consumer = restore_consumer
        self._store_path = store_path
        self._window_ms = window_ms
        self.policy = policy
        self.rng = rng
        self.clock = clock
        self.store = StateStore(store_path, window_ms) if store is None else store
        self.fairness = FairnessGate(policy.fairness_inflight)
        """Per fairness key: executions in flight and the held ones (schedulers/fairness.py)."""
        self.pending = Pending()
        self.producer = producer
        """Transactional, ``init_transactions`` done: the previous owner is fenced."""
        self.abandoned = False
        """Set by the scheduler when a commit's calls blocked past DUETIME_SCHEDULER_COMMIT_STALL_S
        and the partition started over: whatever the blocked call returns changes nothing."""
        self.owned_since_ms = clock.now_ms()
        """Occurrences due before this fell due while nobody owned the partition: misfires."""
        self.proven_at = time.monotonic()
        """When the producer last answered: made (``init_transactions`` done) or a transaction
        that sent input offsets committed (the call that stalls: a commit without offsets
        never asks for the group coordinator). A commit stall starts over the owners not
        proven since (the scheduler's ``_commit_all``)."""
        self._input_ends: dict[str, int] | None = None
        """Input offsets to read before firing (None: not looked up yet; empty: read)."""
        self._input_highs: dict[str, int] = {}
        """Each input's high watermark, looked up once the previous owner was fenced."""
        self._crowd = Crowd(-1, None)
        """The crowd lead as last worked out (``_crowd_until``), at ``_crowd_at_ms``."""
        self._crowd_at_ms = -(2**62)
        self._crowd_additions = 0
        """The store's ``wake_additions`` when the crowd lead was last worked out."""
        self._crowd_held = False
        """The last fire left jobs the crowd lead popped early to the next (its fire limit)."""
        self.hold_emits = False
        """Set while the scheduler's clock is not trusted (skew.py): an input whose transform
        would emit an execution request (a trigger, a release, a queued occurrence) is held
        back instead: ``handle`` returns False."""

    # --- restore --------------------------------------------------------------------------

    def restore(
        self,
        consumer: Consumer | None = None,
        fenced: Callable[[], object] | None = None,
        start: int | None = None,
        shares: dict[str, bytes] | None = None,
    ) -> tuple[int, float]:
        """Rebuild the store from the partition's state changelog; (records, seconds).
        ``start``: the store is a standby copy of the changelog up to this offset, whose
        records' fairness shares are ``shares`` (standby.py): only the rest is read, unless
        the log no longer starts at or before it (then the copy is dropped, all is read).
        ``consumer``: a group-less reader of its own, for a restore off the main thread (the
        owner's restore consumer otherwise). ``fenced``: returns once this owner's producer
        has fenced the previous owner's (its ``init_transactions``, running meanwhile): the
        changelog is read to its end as it stands, then, once fenced, to its end again, so
        whatever the previous owner committed before it was fenced is read, and it can
        commit nothing after. Without it the producer is fenced already."""
        started = time.monotonic()
        c = self._restore_consumer if consumer is None else consumer
        low, high = watermarks(c, self.topics.state, self.partition)
        start, shares_now = self._onto_copy(start, shares or {}, low, high)
        first = OFFSET_BEGINNING if start is None else start
        tp = TopicPartition(self.topics.state, self.partition, first)
        c.assign([tp])
        begin = low if start is None else start

        def read_to(end: int, any_eof: bool) -> Iterator[tuple[str, int | None, bytes | None]]:
            """Records up to ``end``, or to the end of the stable part (an end-of-partition
            event: any one, or one at ``end`` when an earlier one may still be queued)."""
            idle_deadline = time.monotonic() + 30
            while True:
                # consume() waits for a full batch or its timeout, even with the end reached:
                # keep the timeout short (0.1 s cost every restore 0.1 s at each end it read
                # to) and check the position, because the last offset is usually a marker
                msgs = c.consume(num_messages=5000, timeout=0.02)
                if msgs:
                    idle_deadline = time.monotonic() + 30
                elif time.monotonic() > idle_deadline:
                    raise KafkaException(f"restore of partition {self.partition} stalled for 30 s")
                done = False
                for m in msgs:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:  # caught up to the LSO
                            done = done or any_eof or (m.offset() or 0) >= end
                            continue
                        raise KafkaException(err)
                    key = (m.key() or b"").decode()
                    yield key, self._restored_headers(key, m, shares_now), m.value()
                if done or c.position([tp])[0].offset >= end:
                    return

        def rows() -> Iterator[tuple[str, int | None, bytes | None]]:
            if high > begin:
                yield from read_to(high, any_eof=True)
            if fenced is None:
                return
            fenced()
            # the previous owner's last commit, or the abort of its open transaction, moved
            # the end (the client signals the new end of the stable part once more)
            end = watermarks(c, self.topics.state, self.partition)[1]
            if end > max(high, begin):
                yield from read_to(end, any_eof=False)

        n = self.store.bulk_load(rows(), now_ms=self.clock.now_ms())
        self.fairness = FairnessGate(self.policy.fairness_inflight)
        self.fairness.load(shares_now)
        metrics.FAIRNESS_HELD.labels(partition=self.partition).set(self.fairness.held)
        c.unassign()
        self.store.advance(self.clock.now_ms())
        return n, time.monotonic() - started

    def _onto_copy(
        self, start: int | None, shares: dict[str, bytes], low: int, high: int
    ) -> tuple[int | None, dict[str, Share]]:
        """Where a restore starts reading (None: the beginning) and the fairness shares it
        starts from: a standby copy's, unless the changelog (``low``-``high``) no longer
        holds its offset (deleted past it, or truncated before it): then a new, empty store."""
        if start is None:
            return None, {}
        if not low <= start <= high:
            log.warning(
                "partition %s: the standby copy ends at offset %s, outside the changelog "
                "(%s-%s): restoring it all",
                self.partition,
                start,
                low,
                high,
                extra={"partition": self.partition},
            )
            self.store.close()
            self.store = StateStore(self._store_path, self._window_ms)
            return None, {}
        metrics.STANDBY_RESTORES.inc()
        self.store.cache_kib(CACHE_KIB)
        decoded = {key: self._share(key, raw) for key, raw in shares.items()}
        return start, {key: share for key, share in decoded.items() if share is not None}

    def _restored_headers(self, key: str, m: Message, shares: dict[str, Share]) -> int | None:
        """A changelog record's wake-up time; its fairness share goes to ``shares`` (the
        latest record of a key wins: an older share is dropped)."""
        wake = None
        shares.pop(key, None)
        for header in m.headers() or []:
            if header[0] == WAKE_HEADER and header[1]:
                wake = self._wake_header(key, header[1], m.value())
            elif header[0] == SHARE_HEADER and header[1] and m.value() is not None:
                share = self._share(key, header[1])
                if share is not None:
                    shares[key] = share
        return wake

    def _wake_header(self, key: str, raw: str | bytes, value: bytes | None) -> int | None:
        """A wake-up header's time. One that is not a number is corruption (only schedulers
        write the changelog): the time is worked out from the state itself, as its writer
        did, and a state that does not decode either gets none (it is met as unknown when
        its job is next touched); never an error that stops the restore, which every owner
        of the partition would meet in turn."""
        try:
            return int(raw)
        except ValueError:
            pass
        metrics.POISON.labels(topic=self.topics.state).inc()
        wake = None
        if value is not None and not key.startswith(HELD_PREFIX):
            with contextlib.suppress(*CONTENT_ERRORS):
                state = self.codec.load(SchedulerState, value, topic=self.topics.state)
                wake = logic.wake_at_ms(state, self.policy.fire_lead_ms)
        log.error(
            "the changelog's wake-up header of a job is not a number (%r): using %s",
            redact_text(str(raw))[:40],
            "none" if wake is None else "the one its state gives",
            extra={"job_id": key, "partition": self.partition},
        )
        return wake

    # --- a cycle --------------------------------------------------------------------------

    def _state(self, job_id: str) -> SchedulerState | None:
        if job_id in self.pending.dirty:
            return self.pending.dirty[job_id]
        kept = self.store.take_decoded(job_id)  # the state as last written, still decoded
        if kept is not None:
            return kept
        raw = self.store.get(job_id)
        if raw is None:
            return None
        try:
            return self.codec.load(SchedulerState, raw, topic=self.topics.state)
        except DecodeError as exc:
            # only schedulers write the changelog, so this is corruption, not traffic: the job
            # is treated as unknown (a new definition starts it afresh) rather than ending the
            # process at every restore
            metrics.POISON.labels(topic=self.topics.state).inc()
            log.error(
                "the changelog's state of a job does not decode: treating the job as unknown: %s",
                exc,
                extra={"job_id": job_id, "partition": self.partition},
            )
            return None

    def prefetch(self, job_ids: list[str]) -> None:
        """Read the states of a cycle's inputs (their keys: job ids) in a few statements
        before ``handle`` takes them one by one; a job the cycle changed is already here."""
        dirty = self.pending.dirty
        self.store.prefetch(j for j in job_ids if j not in dirty)

    def handle(self, msg: Message, now_ms: int) -> bool:
        """Apply one input record (jobs, control or results) to the cycle. False: held back
        (``hold_emits`` and it would emit an execution request): nothing of it was applied,
        and the caller must read it again later."""
        topic, offset = msg.topic() or "", msg.offset() or 0
        self.pending.offsets[topic] = offset + 1
        job_id: str | None = None
        try:
            record = self._decode(msg, topic, offset)
            job_id = record.job_id
            state = self._state(job_id)
            if isinstance(record, ControlCommand) and state is None:
                # a command can overtake its job's definition (another topic): hold it until
                # the definition arrives
                key = f"{HELD_PREFIX}{job_id}/{record.issued_at_ms:015d}/{record.command_id}"
                self.pending.held[key] = (job_id, msg.value() or b"")
                return True
            mark = self._mark(job_id) if self.hold_emits else None
            new, out = self._apply(state, record, now_ms)
            if mark is not None and (
                out.executions or len(self.pending.out.executions) > mark.lengths[0]
            ):
                self._roll_back(job_id, mark)
                self.pending.offsets[topic] = offset  # read again from this record
                return False
            self._collect(job_id, new, out)
        except CONTENT_ERRORS as exc:
            # undecodable, or valid Avro with content no job can have (e.g. a cron that never
            # fires written past the SDK), content our logic trips over, or a state or output
            # that cannot be written: park it with its bytes, move on (the job keeps the state
            # its last good input gave it)
            self._undo(job_id)
            self._park(msg, exc)
        return True

    def _mark(self, job_id: str) -> _Mark:
        p = self.pending
        return _Mark(
            messages=len(p.messages),
            lengths=_lengths(p.out),
            state_changed=p.out.state_changed,
            held=dict(p.held),
            encoded=p.encoded.get(job_id) if job_id in p.dirty else None,
            was_dirty=job_id in p.dirty,
        )

    def _roll_back(self, job_id: str, mark: _Mark) -> None:
        """Undo one input's effects on the cycle (a new job's definition collects its state,
        and its held commands, before the caller sees the outputs)."""
        p = self.pending
        del p.messages[mark.messages :]
        for records, n in zip(_lists(p.out), mark.lengths, strict=True):
            del records[n:]
        p.out.state_changed = mark.state_changed
        p.held = mark.held
        if mark.was_dirty and mark.encoded is not None:
            # the logic changed the dirty state in place: back to its bytes as collected
            p.dirty[job_id] = self.codec.load(SchedulerState, mark.encoded, topic=self.topics.state)
            p.encoded[job_id] = mark.encoded
            self.fairness.follow(job_id, p.dirty[job_id])
        else:
            p.dirty.pop(job_id, None)
            p.encoded.pop(job_id, None)
            self.fairness.revert(job_id)

    def _decode(
        self, msg: Message, topic: str, offset: int
    ) -> JobDefinition | ControlCommand | ExecutionResult:
        event_type = self.topics.event_type_of(topic)
        cls = _INPUTS[event_type or ""]
        value = msg.value() or b""
        if cls is JobDefinition and len(value) > MAX_DEFINITION_BYTES:
            # its state could not be written (the record limit): the partition would abort and
            # retry the same transaction forever
            raise ValueError(
                f"a definition of {len(value)} bytes is over the limit of {MAX_DEFINITION_BYTES}"
            )
        record = self.codec.load(cls, value, topic=topic, partition=self.partition, offset=offset)
        if isinstance(record, JobDefinition):  # the creating request's trace (core/tracing.py)
            record = tracing.keep_trace(record, msg.headers())
        logic.check_input(record)
        return record

    def _apply(
        self,
        state: SchedulerState | None,
        record: JobDefinition | ControlCommand | ExecutionResult,
        now_ms: int,
    ) -> tuple[SchedulerState | None, logic.Outputs]:
        """The transform of one decoded input (a held command's job is known here)."""
        if isinstance(record, JobDefinition):
            new, out = logic.on_definition(state, record, now_ms)
            if state is None and self._has_held(record.job_id):
                # the definition's effects first, then its held commands' (each collected:
                # the caller collects what the commands did). Without held commands the caller
                # collects the new state once (collected here too, it was encoded twice)
                self._collect(record.job_id, new, out)
                return self._apply_held(record.job_id, new, now_ms)
            return new, out
        if isinstance(record, ControlCommand):
            control_new, out = logic.on_control(state, record, now_ms, self.policy)
            self._check_sizes(out)
            return control_new, out
        return logic.on_result(state, record, now_ms, self.rng, self.policy)

    def _park(self, msg: Message, exc: Exception) -> None:
        """Send a record this scheduler cannot use to the poison topic, in the transaction."""
        topic = msg.topic() or ""
        self.pending.poison.append(
            park_record(
                topic=topic,
                partition=self.partition,
                offset=msg.offset() or 0,
                key=msg.key(),
                value=msg.value(),
                headers=msg.headers(),
                error=f"{type(exc).__name__}: {exc}",
                role="scheduler",
                logger=log,
            )
        )
        metrics.POISON.labels(topic=topic).inc()

    def _apply_held(
        self, job_id: str, state: SchedulerState, now_ms: int
    ) -> tuple[SchedulerState, logic.Outputs]:
        """A new job's held commands, in the order they were issued; then forget them."""
        total = logic.Outputs()
        held = dict(self.store.held_for(job_id))
        held.update(
            (k, v) for k, (j, v) in self.pending.held.items() if j == job_id and v is not None
        )
        for key in sorted(held):
            command = self.codec.load(ControlCommand, held[key], topic=self.topics.state)
            new, out = logic.on_control(state, command, now_ms, self.policy)
            state = new if new is not None else state
            total.extend(out)
            self.pending.held[key] = (job_id, None)
        return state, total

    def _has_held(self, job_id: str) -> bool:
        """Whether commands overtook this job's definition (the usual answer: no)."""
        return self.store.has_held(job_id) or any(
            j == job_id for j, _ in self.pending.held.values()
        )

    def fire(self, now_ms: int, limit: int, crowd_rate_per_s: float = 0.0) -> int:
        """Fire every job whose wake-up time has come, and a crowd's jobs ahead of theirs
        (``crowd_rate_per_s``: this partition's share of the crowd rate); returns how many
        jobs were handled."""
        self.store.advance(now_ms)
        until_ms = self._crowd_until(now_ms, crowd_rate_per_s)
        due = self.store.pop_due(now_ms, limit, until_ms)
        self._crowd_held = until_ms > now_ms and len(due) >= limit
        base_ms = self.policy.fire_lead_ms
        # the index and the changelog keep the base lead (a restart or another owner stays
        # right); the crowd's extra is applied here, to the jobs it pops
        policy = self.policy
        if until_ms > now_ms:
            policy = replace(policy, fire_lead_ms=base_ms + until_ms - now_ms)
        for job_id in due:
            state = self._state(job_id)
            if state is None:
                continue
            wake = logic.wake_at_ms(state, base_ms)
            if wake is None:
                continue
            if wake > now_ms and not _led_by(state, base_ms, until_ms):
                # indexed earlier than its time (an owner with a longer lead), or popped with
                # a crowd for a wake-up no lead moves (a rescue deadline, overlap skip)
                self.store.reindex(job_id, wake, unled=wake <= until_ms)
                continue
            try:
                out = logic.fire_due(state, now_ms, policy, self.owned_since_ms)
                self._check_sizes(out)
                self._collect(job_id, state, out, lead_ms=policy.fire_lead_ms)
            except CONTENT_ERRORS as exc:
                self._undo(job_id)
                self._fire_failed(job_id, exc, now_ms)
        self._release_held(now_ms)
        return len(due)

    def _crowd_until(self, now_ms: int, rate_per_s: float) -> int:
        """Fire the jobs waking by this instant now (crowd.py; ``now_ms`` without a crowd)."""
        cap_ms = self.policy.crowd_lead_max_ms
        if cap_ms <= 0 or rate_per_s <= 0:
            return now_ms
        crowd = self._crowd
        since_ms = now_ms - self._crowd_at_ms
        if (
            since_ms >= CROWD_EVERY_MS
            or since_ms < 0  # the clock stepped back
            or (crowd.next_ms is not None and crowd.next_ms <= now_ms)
            or self.store.wake_additions != self._crowd_additions
        ):
            crowd = self._crowd = self.store.crowd(
                now_ms, rate_per_s, cap_ms, min_lead_ms=CROWD_MIN_LEAD_MS
            )
            self._crowd_at_ms = now_ms
            self._crowd_additions = self.store.wake_additions
        return max(now_ms, crowd.until_ms)

    def _release_held(self, now_ms: int) -> None:
        """Emit the held executions whose fairness keys have credit (results freed it, or
        they were held in this very cycle while the key had room)."""
        for job_id, key in self.fairness.releasable():
            state = self._state(job_id)
            if state is None:  # gone from the store (a corrupt state): nothing to release
                self.fairness.set(job_id, None)
                continue
            try:
                self._collect(job_id, state, logic.release_held(state, key, now_ms, self.policy))
            except CONTENT_ERRORS as exc:
                self._undo(job_id)
                self._fire_failed(job_id, exc, now_ms)
                state = self._state(job_id)
                # whatever the job's state is now, the gate follows it (no endless retry)
                self.fairness.set(job_id, None if state is None else share_of(state))

    def _share(self, job_id: str, raw: bytes | str) -> Share | None:
        """A share header of the changelog; a bad one counts as none (logged): it was written by
        a scheduler, so it is corruption, and the job's state decides at its next change."""
        try:
            return Share.decode(raw.encode() if isinstance(raw, str) else raw)
        except ValueError as exc:
            log.error("%s", exc, extra={"job_id": job_id, "partition": self.partition})
            return None

    def _fire_failed(self, job_id: str, exc: Exception, now_ms: int) -> None:
        """Quarantine the job; if even that cannot be written, leave it out of the timer (its
        committed state stays as it was; it is met again only at the next restore)."""
        state = self._state(job_id)
        if state is None:
            return
        try:
            self._collect(job_id, state, self._quarantine(state, exc, now_ms))
        except CONTENT_ERRORS as again:
            self._undo(job_id)
            log.error(
                "job left out of the timer: its quarantine cannot be written either: %s",
                redact_text(f"{type(again).__name__}: {again}"),
                extra={"job_id": job_id, "partition": self.partition},
            )

    def _check_sizes(self, out: logic.Outputs) -> None:
        """A DAG run's ``started`` event lists every node: the one output that can outgrow
        its job's definition. One over the record limit would abort this partition's every
        transaction, so it fails here, as that job's content (the SDK and the API refuse
        such a DAG at creation; this holds for records written past them)."""
        for event in out.dag_run_events:
            size = len(self.codec.dump(event, topic=self.topics.dag_runs))
            if size > MAX_DEFINITION_BYTES:
                raise ValueError(
                    f"the DAG run event would be {size} bytes, over the record limit of "
                    f"{MAX_DEFINITION_BYTES}"
                )

    def _quarantine(self, state: SchedulerState, exc: Exception, now_ms: int) -> logic.Outputs:
        """One job's content broke the transform: that job stops (dead, on the DLQ, with the
        reason), the partition and the process go on; a restart does not meet it again."""
        reason = redact_text(f"{type(exc).__name__}: {exc}")
        metrics.QUARANTINED.inc()
        log.error(
            "job quarantined: the scheduler could not fire it: %s",
            reason,
            exc_info=exc,
            extra={"job_id": state.job_id, "partition": self.partition},
        )
        return logic.quarantine(state, reason, now_ms)

    def find_input_highs(self, reader: Consumer) -> None:
        """Look up each input's high watermark for ``inputs_read`` with ``reader``, a restore
        thread's: the loop's first cycle with this owner then makes one broker round trip
        (the committed offsets) instead of four, one after another. The group consumer's
        ``committed`` stays on the loop: called from the restore threads while the group
        consumer was being assigned, the first scheduler of test_scheduler_catch_up never
        owned its partitions."""
        self._input_highs = {
            t: watermarks(reader, t, self.partition)[1] for t in self.topics.scheduler_inputs
        }

    def inputs_read(self, consumer: Consumer, now_ms: int) -> bool:
        """Whether this new owner has read the inputs that were waiting for it.

        Until it has, it fires nothing: results of runs that ended while nobody owned the
        partition (a run still "live" in the restored state makes overlap=skip drop the job's
        misfire catch-up), commands and definition updates would otherwise be judged after
        the fires they should decide. The end is each input's high watermark once the
        previous owner was fenced (``find_input_highs``), or when the owner first asks (past
        the committed offset: else nothing waits); the wait is bounded by
        ``CATCH_UP_LIMIT_MS`` so a huge backlog delays firing, never stops it.
        """
        if self._input_ends is None:
            inputs = [TopicPartition(t, self.partition) for t in self.topics.scheduler_inputs]
            ends: dict[str, int] = {}
            for tp in consumer.committed(inputs, timeout=10):
                topic = tp.topic or ""
                high = self._input_highs.get(topic)
                if high is None:  # not looked up by a restore thread
                    high = watermarks(self._restore_consumer, topic, self.partition)[1]
                if high > max(tp.offset, 0):
                    ends[topic] = high
            self._input_ends = ends
        if self._input_ends and now_ms - self.owned_since_ms < CATCH_UP_LIMIT_MS:
            waiting = [TopicPartition(t, self.partition) for t in self._input_ends]
            if any(
                tp.offset < self._input_ends[tp.topic or ""] for tp in consumer.position(waiting)
            ):
                return False
            log.info(
                "partition %s: read the inputs that waited for it, firing now",
                self.partition,
                extra={"partition": self.partition},
            )
        self._input_ends = {}
        return True

    def _collect(
        self,
        job_id: str,
        state: SchedulerState | None,
        out: logic.Outputs,
        *,
        lead_ms: int | None = None,
    ) -> None:
        """Add one input's (or one fire's) effects to the cycle, encoded now: a value the
        schemas cannot hold raises here, for the caller to blame on its input, rather than
        in the transaction, which would fail the same way at every retry."""
        if state is not None and out.executions:
            self._refuse_unroutable(state, out)
        messages = [
            _Message(
                topic,
                route.key(record),
                self.codec.dump(record, topic=topic),
                self.partition if route.own_partition else _ANY_PARTITION,
                tracing.request_headers(state, record),
            )
            for route in _ROUTES
            for record in route.records(out)
            for topic in (route.topic(self.topics, record),)
        ]
        if state is not None and (out.state_changed or job_id in self.pending.dirty):
            # a state already dirty is encoded again whatever changed: the bytes are its latest
            self.pending.encoded[job_id] = self.codec.dump(state, topic=self.topics.state)
            self.pending.dirty[job_id] = state
            self.fairness.follow(job_id, state)
        self.pending.out.extend(out)
        self.pending.messages.extend(messages)
        # requests commit by half the base lead before their due time, earlier by a crowd's
        # extra lead (``lead_ms``: the lead they were fired with)
        base_ms = self.policy.fire_lead_ms
        extra_ms = 0 if lead_ms is None else lead_ms - base_ms
        self.pending.wait_for(out, base_ms // 2 + extra_ms)

    def _refuse_unroutable(self, state: SchedulerState, out: logic.Outputs) -> None:
        """Fail the requests whose queue has no topics (``logic.refuse_unroutable``): a
        produce to a missing topic would fail the transaction, and every retry of it, so the
        partition would stop. Repeated: the failure may fire an occurrence held back by
        ``overlap=queue_one``, in the same missing queue."""
        exists = self.queue_exists
        if exists is None:
            return
        while True:
            missing = [r for r in out.executions if exists(r.queue) is False]
            if not missing:
                return
            for request in missing:
                topic = self.topics.execution(request.priority, request.queue)
                reason = (
                    f"queue {request.queue!r} does not exist: its topic {topic} is missing "
                    f"(create it with `duetime queues create {request.queue}`)"
                )
                logic.refuse_unroutable(
                    state, request.execution_id, reason, self.clock.now_ms(), out
                )
                log.warning(
                    "execution %s dead-lettered: %s",
                    request.execution_id,
                    reason,
                    extra={"job_id": request.job_id, "execution_id": request.execution_id},
                )

    def _undo(self, job_id: str | None) -> None:
        """Forget what a failed input did to its job's in-memory state: back to the state as
        last collected in this cycle, or as committed."""
        if job_id is None or job_id not in self.pending.dirty:
            return
        if job_id in self.pending.encoded:
            state = self.pending.dirty[job_id] = self.codec.load(
                SchedulerState, self.pending.encoded[job_id], topic=self.topics.state
            )
            self.fairness.follow(job_id, state)
        else:
            del self.pending.dirty[job_id]
            self.fairness.revert(job_id)

    def next_wake_ms(self) -> int | None:
        """When the timer must run next: the earliest wake-up, or at once while a crowd's jobs
        wait to be popped, or when a crowd's next group's turn comes."""
        wake = self.store.next_wake_ms()
        crowd = self._crowd
        if self._crowd_held and wake is not None and wake <= crowd.until_ms:
            wake = self._crowd_at_ms  # a crowd's jobs the fire limit left for the next cycle
        if crowd.next_ms is not None and (wake is None or crowd.next_ms < wake):
            wake = crowd.next_ms
        return wake

    # --- the transaction ------------------------------------------------------------------

    def commit(self, consumer: Consumer, now_ms: int) -> int | None:
        """Write the pending work in one transaction; returns the number of executions
        emitted, or None when the transaction failed (the work is then undone: the store
        rolled back and the inputs rewound, or the partition started over)."""
        if self.pending.empty():
            return 0
        p = self.pending
        try:
            self.producer.begin_transaction()
            for m in self._messages(p):
                self.producer.produce(
                    m.topic, key=m.key, value=m.value, partition=m.partition, headers=m.headers
                )
            if p.offsets:
                self.producer.send_offsets_to_transaction(
                    [TopicPartition(t, self.partition, o) for t, o in p.offsets.items()],
                    consumer.consumer_group_metadata(),
                    10,
                )
            self.producer.commit_transaction(10)
        except KafkaException as exc:
            if self.abandoned:  # the scheduler gave this owner up while the call blocked
                return None
            self._recover(exc, consumer)
            return None
        if self.abandoned:
            return None
        if p.offsets:
            self.proven_at = time.monotonic()
        self.store.commit()
        self.fairness.commit()
        self._count(p, now_ms)
        self.pending = Pending()
        return len(p.out.executions)

    def _messages(self, p: Pending) -> Iterator[_Message]:
        """Every record of the transaction (the store takes the states and held commands as
        they go: rolled back if the transaction fails)."""
        yield from p.messages
        for parked in p.poison:
            yield _Message(
                self.topics.poison, parked.key, parked.value, self.partition, [*parked.headers]
            )
        for job_id, state in p.dirty.items():
            wake = logic.wake_at_ms(state, self.policy.fire_lead_ms)
            value = p.encoded[job_id]
            header = b"" if wake is None else str(wake).encode()
            headers: list[tuple[str, str | bytes | None]] = [
                (WAKE_HEADER, header),
                (HEAD_HEADER, encode_head(state)),  # the projector's status columns
            ]
            if job_id in self.fairness:  # its share, for a new owner's gate (restore)
                share = share_of(state)
                if share is not None:
                    headers.append((SHARE_HEADER, share.encode()))
            yield _Message(self.topics.state, job_id, value, self.partition, headers)
            self.store.put(job_id, wake, value, state, awaited=bool(state.inflight))
        for key, (job_id, held) in p.held.items():
            yield _Message(self.topics.state, key, held, self.partition)
            self.store.hold(key, job_id, held)

    def _count(self, p: Pending, now_ms: int) -> None:
        metrics.TRANSACTIONS.inc()
        metrics.FAIRNESS_HELD.labels(partition=self.partition).set(self.fairness.held)
        # a label lookup per series, not per request: in a burst it was 5 % of a fire's CPU
        emitted = Counter((r.priority, r.trigger) for r in p.out.executions)
        for (priority, trigger), n in emitted.items():
            metrics.EMITTED.labels(priority=priority, trigger=trigger).inc(n)
        for priority in {priority for priority, _ in emitted}:
            lateness = metrics.LATENESS.labels(priority=priority)
            for request in p.out.executions:
                if request.priority == priority:
                    lateness.observe(max(0, now_ms - request.due_at_ms) / 1000)
        metrics.DEAD_LETTERS.inc(len(p.out.dead_letters))
        for rescue in p.out.rescues:  # logged once committed: an aborted cycle rescued nothing
            self._report_rescue(rescue)
        for skip in p.out.skips:
            metrics.SKIPPED.labels(reason=skip.reason).inc()

    def _report_rescue(self, rescue: logic.Rescue) -> None:
        extra = {
            "job_id": rescue.job_id,
            "execution_id": rescue.execution_id,
            "attempt": rescue.attempt,
            "rescues": rescue.rescues,
            "status": rescue.status.value,
            "overdue_ms": rescue.overdue_ms,
            "partition": self.partition,
        }
        if rescue.lost:
            metrics.LOST.inc()
            log.warning(
                "execution %s attempt %s lost: no result after %s rescue(s)",
                rescue.execution_id,
                rescue.attempt,
                rescue.rescues,
                extra=extra,
            )
            return
        metrics.RESCUES.labels(status=rescue.status.value).inc()
        log.warning(
            "execution %s attempt %s rescued (%s): no result by its deadline, re-emitted",
            rescue.execution_id,
            rescue.attempt,
            rescue.rescues,
            extra=extra,
        )

    def _recover(self, exc: KafkaException, consumer: Consumer) -> None:
        kind = classify(exc)
        metrics.TXN_ABORTS.labels(reason=kind.value).inc()
        log.warning(
            "transaction failed (%s): %s", kind.value, exc, extra={"partition": self.partition}
        )
        self.pending = Pending()
        self.fairness.rollback()
        if kind is ErrorClass.FATAL:
            self.store.rollback()
            raise PartitionLost(str(exc)) from exc
        if kind is ErrorClass.RECREATE:
            self.reset(consumer)  # the commit's outcome is unknown: start over from the log
            return
        try:
            self.producer.abort_transaction(10)
        except KafkaException as abort_exc:
            if classify(abort_exc) is ErrorClass.FATAL:
                raise PartitionLost(str(abort_exc)) from abort_exc
        self.store.rollback()
        self.rewind(consumer)

    def reset(self, consumer: Consumer) -> None:
        """Forget everything local and start over from the changelog and committed offsets:
        a new fenced producer, a store restored from the state topic, inputs rewound."""
        self.pending = Pending()
        self.producer = self._make_producer(self.partition)
        self.proven_at = time.monotonic()
        self.store.close()
        self.store = StateStore(self._store_path, self._window_ms)
        self.restore()
        self.rewind(consumer)

    def discard(self) -> None:
        """Forget the cycle's uncommitted bookkeeping (states, offsets, held commands, parked
        copies): the store and the committed offsets still agree, so whoever owns the
        partition next reads those inputs again and derives the same. (Anything someone
        waits for was committed in the cycle that made it.)"""
        self.pending = Pending()
        self.fairness.rollback()

    def rewind(self, consumer: Consumer, topics: Sequence[str] | None = None) -> None:
        """An aborted transaction does not move the consumer back: seek to the committed offsets
        (of every input, or of ``topics``)."""
        names = self.topics.scheduler_inputs if topics is None else topics
        inputs = [TopicPartition(t, self.partition) for t in names]
        for tp in consumer.committed(inputs, timeout=10):
            tp.offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            consumer.seek(tp)

    def close(self) -> None:
        with contextlib.suppress(KeyError):  # an owner that never restored set no value
            metrics.FAIRNESS_HELD.remove(str(self.partition))
        try:
            self.producer.flush(5)
        finally:
            self.store.close()


def _led_by(state: SchedulerState, base_ms: int, until_ms: int) -> bool:
    """Whether a crowd popping the index up to ``until_ms`` fires ``state`` now: a wake-up a
    lead moves (a retry, the next occurrence) is there by then."""
    led = logic.led_wake_ms(state, base_ms)
    return led is not None and led <= until_ms

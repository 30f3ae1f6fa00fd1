"""Warm standby copies of the partitions this scheduler does not own (issue 15, failover).

A partition given to a scheduler used to be restored from its whole changelog: at 1,000 jobs/s
a failover's survivor read ~25,000 states a partition, 1.05-1.1 s of the 3.9 s a job waited,
and a join's or a leave's heir 0.5-0.9 s. With a standby, every scheduler follows the state
topic's partitions it does not own, in a thread of its own, and writes each record into a local
copy of that partition (``StateStore.apply``: the bytes as they are, no decoding, no in-memory
index). A partition it is given is then restored from the copy plus the changelog's tail past
it (``PartitionOwner.restore`` with ``start``): the fencing and the read of the tail after it
are unchanged, so a copy only saves reading what it already holds.

A copy is the changelog read in order with ``read_committed``, as a restore reads it, so the
copy plus its tail is what a whole restore would build. It is given up (the restore then reads
everything) when it has not reached the changelog's end for ``STALE_S``: a tombstone is kept
only ``delete.retention.ms`` (a day by default) after compaction, and a copy that old could
miss one. A partition this scheduler releases is followed again from the beginning (the owner's
store is not handed back: its last offset in the changelog is not known).

Before joining the group a scheduler waits (at most ``DUETIME_SCHEDULER_STANDBY_WARM_S``) for
its copies to reach the changelog's end once, so that a join takes its partitions from copies
too. The cost: each scheduler reads and writes every other scheduler's changelog records
(~3 a job), in C and SQLite mostly; one scheduler alone follows nothing once it owns
everything.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from . import metrics
from .fairness import SHARE_HEADER
from .partition import WAKE_HEADER
from .store import StateStore

log = logging.getLogger("duetime.scheduler")

STALE_S = 3600.0
"""A copy that has not reached the changelog's end for this long is not used (see above)."""
STANDBY_CACHE_KIB = 2_000
"""SQLite's page cache per copy (an owner's store keeps 16 MB): a copy is written, not read,
until it is restored from."""
BATCH = 2000
"""Records read per turn of the standby's thread."""


@dataclass
class Copy:
    """A standby copy of one partition's changelog."""

    store: StateStore
    next_offset: int = 0
    """The changelog offset after the last one read (where a restore goes on from)."""
    shares: dict[str, bytes] = field(default_factory=dict)
    """Each job's fairness share header, as its latest record carries it."""
    caught_up_at: float | None = None
    """When (monotonic) the copy last reached the changelog's end; None: never yet."""
    records: int = 0
    broken: bool = False
    """A record the copy could not read (a bad header): a restore reads everything."""


class Standby:
    """Follows the state topic's partitions this scheduler does not own (a thread)."""

    def __init__(
        self,
        topic: str,
        partitions: int,
        make_reader: Callable[[], Consumer],
        make_store: Callable[[Path | None], StateStore],
        state_dir: Path | None,
    ) -> None:
        self.topic = topic
        self._make_reader = make_reader
        self._make_store = make_store
        self._state_dir = state_dir
        self._names = itertools.count()
        if state_dir is not None and state_dir.is_dir():
            for stale in state_dir.glob("standby-p*.sqlite*"):  # an earlier process's copies
                stale.unlink(missing_ok=True)
        self._lock = threading.Lock()
        self._wanted: set[int] = set(range(partitions))
        """Partitions to follow: every one neither owned nor being taken here."""
        self._copies: dict[int, Copy] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="standby", daemon=True)
        self._thread.start()

    # --- the scheduler's side ---------------------------------------------------------------

    def take(self, p: int) -> Copy | None:
        """Stop following ``p`` (it is being taken here) and hand its copy over, if it is fit
        to restore from; the caller owns (and closes) what it gets."""
        with self._lock:
            self._wanted.discard(p)
            copy = self._copies.pop(p, None)
        if copy is None:
            return None
        fresh = copy.caught_up_at is not None and time.monotonic() - copy.caught_up_at < STALE_S
        if not fresh or copy.broken:
            copy.store.close()
            return None
        return copy

    def follow(self, partitions: frozenset[int]) -> None:
        """Follow these partitions (and no others): the ones not owned here. One newly
        followed (released by this scheduler) is read again from the beginning."""
        with self._lock:
            self._wanted = set(partitions)

    def describe(self) -> str:
        """Each followed partition's records read and whether it reached the end."""
        with self._lock:
            return (
                ", ".join(
                    f"p{p} {c.records} records{'' if c.caught_up_at is not None else ' (reading)'}"
                    for p, c in sorted(self._copies.items())
                    if p in self._wanted
                )
                or "no partitions to follow"
            )

    def caught_up(self) -> bool:
        """Every partition followed has a copy that reached the changelog's end once."""
        with self._lock:
            return all(
                p in self._copies and self._copies[p].caught_up_at is not None for p in self._wanted
            )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._drop_copies()

    def _drop_copies(self) -> None:
        with self._lock:
            for copy in self._copies.values():
                copy.store.close()
            self._copies.clear()

    # --- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        reader: Consumer | None = None
        followed: set[int] = set()
        while not self._stop.is_set():
            try:
                if reader is None:
                    reader = self._make_reader()
                    followed = set()
                followed = self._follow(reader, followed)
                if not followed:
                    self._stop.wait(0.2)
                    continue
                self._apply(reader.consume(num_messages=BATCH, timeout=0.2))
            except Exception as exc:  # a broker away, a disk error: start over, never exit
                log.warning("scheduler standby: %s (following again from the start)", exc)
                metrics.STANDBY_ERRORS.inc()
                self._drop_copies()
                if reader is not None:
                    reader.close()
                    reader = None
                self._stop.wait(1.0)
        if reader is not None:
            reader.close()

    def _follow(self, reader: Consumer, followed: set[int]) -> set[int]:
        """Assign the reader what is wanted now: a new copy (from the beginning) for each
        partition newly wanted or whose copy was taken since, nothing more for one no longer
        wanted."""
        with self._lock:
            wanted = set(self._wanted)
            again = {p for p in wanted & followed if p not in self._copies}
            for p in (wanted - followed) | again:
                old = self._copies.pop(p, None)
                if old is not None:
                    old.store.close()
                self._copies[p] = Copy(self._new_store(p))
        stop = (followed - wanted) | again
        start = (wanted - followed) | again
        if stop:
            reader.incremental_unassign([TopicPartition(self.topic, p) for p in sorted(stop)])
        if start:
            reader.incremental_assign(
                [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in sorted(start)]
            )
        metrics.STANDBY_PARTITIONS.set(len(wanted))
        return wanted

    def _new_store(self, p: int) -> StateStore:
        path = None
        if self._state_dir is not None:
            path = self._state_dir / f"standby-p{p}-{next(self._names)}.sqlite"
        return self._make_store(path)

    def _apply(self, messages: list[Message]) -> None:
        batch = _Batch()
        for m in messages:
            batch.add(m)
        now = time.monotonic()
        with self._lock:
            for p in set(batch.rows) | set(batch.ends):
                copy = self._copies.get(p)
                if copy is None or p not in self._wanted:
                    continue  # taken meanwhile: what was read of it is the new owner's to read
                if p in batch.broken and not copy.broken:
                    # a restore meets the same record and decides; the copy is not used
                    log.error("scheduler standby: partition %s has a bad wake-up header", p)
                    copy.broken = True
                if p in batch.rows:
                    rows = batch.rows[p]
                    copy.store.apply(rows)
                    copy.records += len(rows)
                    for key, share in batch.shares[p]:
                        if share is None:
                            copy.shares.pop(key, None)
                        else:
                            copy.shares[key] = share
                    copy.next_offset = max(copy.next_offset, batch.nexts[p])
                    metrics.STANDBY_RECORDS.inc(len(rows))
                if p in batch.ends:
                    copy.next_offset = max(copy.next_offset, batch.ends[p])
                    copy.caught_up_at = now


@dataclass
class _Batch:
    """One read of the standby's reader, by partition."""

    rows: dict[int, list[tuple[str, int | None, bytes | None]]] = field(default_factory=dict)
    shares: dict[int, list[tuple[str, bytes | None]]] = field(default_factory=dict)
    nexts: dict[int, int] = field(default_factory=dict)
    """The offset after each partition's last record."""
    ends: dict[int, int] = field(default_factory=dict)
    """The end each partition reached (an end-of-partition event)."""
    broken: set[int] = field(default_factory=set)

    def add(self, m: Message) -> None:
        p = m.partition() or 0
        err = m.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                self.ends[p] = m.offset() or 0
            elif err.fatal():
                raise KafkaException(err)
            else:  # a broker away, a leader moving: librdkafka retries on its own
                log.debug("scheduler standby: %s", err)
            return
        key = (m.key() or b"").decode(errors="replace")
        value = m.value()
        wake: int | None = None
        share: bytes | None = None
        for header in m.headers() or []:
            name, raw = header[0], header[1]
            if name == WAKE_HEADER and raw:
                try:
                    wake = int(raw)
                except ValueError:  # only schedulers write it: corruption, not traffic
                    self.broken.add(p)
            elif name == SHARE_HEADER and raw and value is not None:
                share = raw if isinstance(raw, bytes) else raw.encode()
        self.rows.setdefault(p, []).append((key, wake, value))
        self.shares.setdefault(p, []).append((key, share))
        self.nexts[p] = (m.offset() or 0) + 1

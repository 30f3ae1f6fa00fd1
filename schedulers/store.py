"""A partition's job states on local disk (SQLite), plus the near-term due-time index in RAM.

The compacted ``state`` topic is the source of truth; this store is a cache rebuilt from it on
every assignment, so it needs no durability of its own (synchronous=OFF). Only jobs that wake
within ``window_ms`` are held in memory (a heap and a dict); everything else stays on disk,
indexed by wake-up time, and is loaded as the window moves. That keeps RSS flat with millions
of far-future jobs.

Writes of one scheduling cycle happen inside one SQLite transaction that is committed only
after the Kafka transaction commits, and rolled back when it aborts. The cycle's states are
written in one statement when it commits (or before a read of the table that needs them), and
the states of the jobs a fire pops, or a cycle's inputs name, are read in a few statements, not
one a job.

The states written last are also kept decoded (``decoded_limit`` of them and ``decoded_bytes``
at most, only for jobs in the near-term window or waiting for a result), so that firing a job
and applying its results skip the SQLite read and the Avro decoding. A kept object is handed
out once (``take_decoded``) and comes back with the next write of that job: the caller may
change it in place without touching what is kept, and dropping it only costs a decoding. A
rollback forgets them all.
"""

from __future__ import annotations

import heapq
import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path

from duetime.core.records import SchedulerState
from duetime.core.topics import HELD_PREFIX

from .crowd import Crowd, crowd_lead

DECODED_LIMIT = 16_384
"""Decoded states kept per partition. 4,096 made most fires of a 100,000-job burst in six
partitions (16,700 each) read and decode their state: a fire cost ~110 us instead of ~90."""
DECODED_BYTES = 40 * 2**20
"""...and at most this much memory per partition, as estimated by ``decoded_size``: ~40 MB
for 16,384 small states (bench/README.md, "The 100,000-job burst")."""


def decoded_size(value: bytes) -> int:
    """What a state of these encoded bytes costs kept decoded: ~1.9 KB for a state of 218 bytes
    (measured with tracemalloc, its definition's kept bytes included); the payload is there
    twice, as text and in the definition's bytes."""
    return 2048 + 2 * len(value)


CROWD_BUCKET_MS = 25
"""The near-term index counts its jobs per this much wake-up time, for the crowd lead
(``crowd``): a few hundred counts to walk over a 10 s cap, at most 12,000 kept for a 300 s
window. A group's wake-up is its bucket's last millisecond, so a crowd is led up to one bucket
less than exactly (never more)."""
CROWD_LOOKBACK_MS = 1_000
"""Jobs overdue by at most this much count for the crowd lead (they go out first); a backlog
older than that is being fired at full speed anyway."""

CROWD_LOOKAHEAD_MS = 1_000
"""The crowd lead also walks the groups this far past its cap, and looks again this soon
while later ones wait: a group's turn comes no earlier than its coming within the cap, so each
group is seen before its turn. (Walking only the cap let a crowd come within it between two
looks a second apart and go out up to a second after its turn: the integration test, 5 of 7
runs.)"""

WAKE_INDEX = "CREATE INDEX IF NOT EXISTS state_wake ON state (wake_at_ms, job_id)"
"""The wake-up index (``bulk_load`` drops it while it loads, and builds it again after). It
covers the window's load (job ids by wake-up), which then never reads the ~1.4 KB rows:
30,000 jobs in 12.5 ms instead of 45."""

LOAD_CHUNK = 20_000
"""Jobs whose latest restored state ``bulk_load`` keeps in memory before writing them: ~30 MB
of states of ~1.4 KB (the failover benchmark's), ~5 MB of small ones (the 1 M-job memory
benchmark's), for the length of a restore."""

CACHE_KIB = 16_000
"""SQLite's page cache per store: at most ~16 MB in RAM (a standby copy keeps less)."""

READ_CHUNK = 500
"""Job ids per ``SELECT ... IN (...)`` when reading the states of due jobs (SQLite builds
before 3.32 allow at most 999 parameters a statement)."""


class StateStore:
    def __init__(
        self,
        path: Path | None,
        window_ms: int,
        decoded_limit: int = DECODED_LIMIT,
        decoded_bytes: int = DECODED_BYTES,
        cache_kib: int = CACHE_KIB,
    ) -> None:
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            for suffix in ("", "-journal", "-wal"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
        # one owner uses its store from one thread at a time (the loop, or a commit worker)
        self._db = sqlite3.connect(
            ":memory:" if path is None else str(path), isolation_level=None, check_same_thread=False
        )
        self._db.execute("PRAGMA synchronous=OFF")  # a cache of the changelog: no fsync needed
        self._db.execute("PRAGMA journal_mode=MEMORY")  # rollback on an aborted Kafka transaction
        self.cache_kib(cache_kib)
        # a rowid table, not WITHOUT ROWID: a state is ~1.5 KB, and a clustered B-tree of rows
        # that large holds two a page, so every write moved pages around (measured: a put cost
        # 35 us, 9 us in a rowid table keyed by a unique index; a state is written twice a job)
        self._db.execute(
            "CREATE TABLE state (job_id TEXT PRIMARY KEY, wake_at_ms INTEGER, value BLOB)"
        )
        self._db.execute(WAKE_INDEX)
        # control commands that arrived before their job's definition (see partition.py)
        self._db.execute(
            "CREATE TABLE held (key TEXT PRIMARY KEY, job_id TEXT, value BLOB) WITHOUT ROWID"
        )
        self._db.execute("CREATE INDEX held_job ON held (job_id)")
        self.window_ms = window_ms
        self._heap: list[tuple[int, str]] = []
        self._near: dict[str, int] = {}
        self._wake_counts: dict[int, int] = {}
        """Jobs of ``_near`` per ``CROWD_BUCKET_MS`` of wake-up time (wake // bucket → jobs)."""
        self.wake_additions = 0
        """Wake-ups the in-memory index gained so far (a rebuild counts as one): the crowd
        lead is worked out again when it changed (partition.py ``CROWD_EVERY_MS``)."""
        self._unled: set[str] = set()
        """Jobs of ``_near`` whose wake-up no lead moves (a rescue deadline, an occurrence that
        overlap ``skip`` judges at its time): a crowd does not pop them before it."""
        self._loaded_until_ms = -1
        self._in_txn = False
        self._held_jobs: set[str] = set()
        """Jobs with held commands: a new job queries the held table only if it is here."""
        self._decoded: dict[str, tuple[SchedulerState, int]] = {}
        """Job id → its state as last written, decoded (near-term jobs only; oldest first)."""
        self._decoded_limit = decoded_limit
        self._decoded_bytes = decoded_bytes
        self._decoded_used = 0
        """The kept states' ``decoded_size``, summed."""
        self._writes: dict[str, tuple[str, int | None, bytes]] = {}
        """Job id → its state put since the last ``flush`` (job_id, wake, value), the latest of
        each job: written in one statement by ``flush`` or ``commit`` (or a read of the table by
        wake-up time), not one a put. ``get`` answers from it first."""
        self._absent: set[str] = set()
        """Job ids ``prefetch`` found without a state and nobody put since: ``get`` answers
        None without asking SQLite (a new job's definition, read with its batch)."""
        self._fetched: dict[str, bytes] = {}
        """Job id → its state's bytes, read with the other due jobs' by ``pop_due`` (or a
        cycle's inputs' by ``prefetch``) for the fires and inputs that follow (one query per
        chunk instead of one a job). A write of the job drops its entry, so ``get`` never
        returns bytes older than the table's."""

    def cache_kib(self, kib: int) -> None:
        """Let SQLite keep at most ``kib`` KiB of pages in RAM."""
        self._db.execute(f"PRAGMA cache_size=-{int(kib)}")

    # --- transactions ---------------------------------------------------------------------

    def begin(self) -> None:
        if not self._in_txn:
            self._db.execute("BEGIN")
            self._in_txn = True

    def commit(self) -> None:
        self.flush()
        if self._in_txn:
            self._db.execute("COMMIT")
            self._in_txn = False

    def flush(self) -> None:
        """Write the states put so far into the open transaction. ``commit`` does, after the
        Kafka transaction committed: should the disk fail then, the owner starts the
        partition over from its changelog, which has these states (partition.py)."""
        if self._writes:
            # an upsert updates the row in place: INSERT OR REPLACE deleted it and inserted it
            # again, both indexes twice
            self._db.executemany(
                "INSERT INTO state (job_id, wake_at_ms, value) VALUES (?, ?, ?) ON CONFLICT "
                "(job_id) DO UPDATE SET wake_at_ms = excluded.wake_at_ms, value = excluded.value",
                self._writes.values(),
            )
            self._writes.clear()

    def rollback(self) -> None:
        """Undo the cycle's writes and rebuild the in-memory index from what is committed."""
        self._writes.clear()
        if self._in_txn:
            self._db.execute("ROLLBACK")
            self._in_txn = False
        self._heap.clear()
        self._near.clear()
        self._wake_counts.clear()
        self.wake_additions += 1
        self._unled.clear()
        self._forget_decoded()
        self._fetched.clear()
        self._absent.clear()
        until, self._loaded_until_ms = self._loaded_until_ms, -1
        self._load(-(2**62), until)
        self._held_jobs = {str(j) for (j,) in self._db.execute("SELECT DISTINCT job_id FROM held")}

    # --- reads and writes -----------------------------------------------------------------

    def get(self, job_id: str) -> bytes | None:
        written = self._writes.get(job_id)
        if written is not None:  # put in this cycle, not flushed yet: the newest there is
            return written[2]
        fetched = self._fetched.pop(job_id, None)
        if fetched is not None:
            return fetched
        if job_id in self._absent:
            return None
        # a lookup by key needs no flush: the unflushed writes are answered above
        row = self._db.execute("SELECT value FROM state WHERE job_id = ?", (job_id,)).fetchone()
        return None if row is None else bytes(row[0])

    def prefetch(self, job_ids: Iterable[str]) -> None:
        """Read the states of ``job_ids`` (a cycle's inputs, or the jobs a fire pops) for
        ``get`` in a few statements: what has a state waits in the fetched entries, what has
        none is remembered as absent. Jobs kept decoded need no read, nor jobs put since the
        last flush (``get`` answers from the write, and the table's older bytes must not
        outlive the flush in the fetched entries). What an earlier call read and nobody took
        is dropped: the entries stay a cycle's worth."""
        self._fetched.clear()
        wanted = [j for j in set(job_ids) if j not in self._decoded and j not in self._writes]
        for i in range(0, len(wanted), READ_CHUNK):
            chunk = wanted[i : i + READ_CHUNK]
            marks = ",".join("?" * len(chunk))
            self._fetched.update(
                (str(job_id), bytes(value))
                for job_id, value in self._db.execute(
                    f"SELECT job_id, value FROM state WHERE job_id IN ({marks})", chunk
                )
            )
        self._absent = {j for j in wanted if j not in self._fetched}

    def take_decoded(self, job_id: str) -> SchedulerState | None:
        """The job's state as last written here, if it is kept; it is kept no longer."""
        kept = self._decoded.pop(job_id, None)
        if kept is None:
            return None
        self._decoded_used -= kept[1]
        return kept[0]

    def put(
        self,
        job_id: str,
        wake_at_ms: int | None,
        value: bytes,
        decoded: SchedulerState | None = None,
        *,
        awaited: bool = False,
    ) -> None:
        """Write a job's state; ``decoded``: the same state as an object, kept while the job
        wakes within the loaded window (its next fire or result will want it), or when
        ``awaited``: a result is on its way (a fired job's wake-up is its rescue deadline,
        past the window, but its result usually comes within seconds), while there is room."""
        self.begin()
        self._writes[job_id] = (job_id, wake_at_ms, value)
        self._index(job_id, wake_at_ms)
        self._fetched.pop(job_id, None)
        self._absent.discard(job_id)
        self.take_decoded(job_id)  # re-inserted last: the dict's order is its age
        if decoded is None:
            return
        size = decoded_size(value)
        if job_id in self._near:
            while self._decoded and not self._room(size):
                self.take_decoded(next(iter(self._decoded)))  # the oldest
        elif not awaited:
            return
        # a job waiting for its result goes only into room: in a burst larger than the
        # limit, fired jobs evicting the ones still to fire would turn every later fire into
        # a read and a decode
        if self._room(size):
            self._decoded[job_id] = (decoded, size)
            self._decoded_used += size

    def _room(self, size: int) -> bool:
        return (
            len(self._decoded) < self._decoded_limit
            and self._decoded_used + size <= self._decoded_bytes
        )

    def _forget_decoded(self) -> None:
        self._decoded.clear()
        self._decoded_used = 0

    def has_held(self, job_id: str) -> bool:
        return job_id in self._held_jobs

    def held_for(self, job_id: str) -> list[tuple[str, bytes]]:
        """(key, command bytes) held for ``job_id``, oldest first."""
        if job_id not in self._held_jobs:
            return []
        return [
            (str(k), bytes(v))
            for k, v in self._db.execute(
                "SELECT key, value FROM held WHERE job_id = ? ORDER BY key", (job_id,)
            )
        ]

    def hold(self, key: str, job_id: str, value: bytes | None) -> None:
        """Keep (value) or forget (None) a held command."""
        self.begin()
        if value is None:
            self._db.execute("DELETE FROM held WHERE key = ?", (key,))
            left = self._db.execute("SELECT 1 FROM held WHERE job_id = ? LIMIT 1", (job_id,))
            if left.fetchone() is None:
                self._held_jobs.discard(job_id)
        else:
            self._db.execute(
                "INSERT OR REPLACE INTO held (key, job_id, value) VALUES (?, ?, ?)",
                (key, job_id, value),
            )
            self._held_jobs.add(job_id)

    def bulk_load(
        self, rows: Iterable[tuple[str, int | None, bytes | None]], *, now_ms: int
    ) -> int:
        """Restore: (job_id, wake, value) in changelog order; a None value deletes. Returns
        the records read; the in-memory index covers [now, now + window] after it.

        Only each job's latest record is written: a changelog not compacted yet holds ~3
        records a job (bench/README.md, "Scheduler hand-over"), and the inserts and their
        indexes were most of a restore's CPU. The latest ones are gathered in memory, up to
        ``LOAD_CHUNK`` jobs at a time, and written in one statement, sorted by job id (the
        key's index is then appended to, not split); the wake-up index is built once, after
        the load, and the in-memory index from the rows as they are written."""
        self.flush()
        self._forget_decoded()  # the changelog's values replace whatever was kept
        self._fetched.clear()
        self._absent.clear()
        self.advance(now_ms)  # what the table holds already (a standby copy's, or nothing)
        self.begin()
        # a copy's tail is a few records: updating its index costs less than building it again
        empty = self._db.execute("SELECT 1 FROM state LIMIT 1").fetchone() is None
        if empty:
            self._db.execute("DROP INDEX IF EXISTS state_wake")
        try:
            n = self._write_rows(rows)
        finally:
            self._db.execute(WAKE_INDEX)
        self.commit()
        return n

    def apply(self, rows: Iterable[tuple[str, int | None, bytes | None]]) -> int:
        """A standby copy (standby.py): write each job's latest state of ``rows`` (changelog
        order, a None value deletes) and the held commands, in one transaction, without the
        in-memory index (a copy has none until it is restored from). Returns the records."""
        self.begin()
        self._absent.clear()  # rows written past ``put``
        n = self._write_rows(rows)
        self.commit()
        return n

    def _write_rows(self, rows: Iterable[tuple[str, int | None, bytes | None]]) -> int:
        """Write changelog records into the open transaction: held commands as they come, each
        job's latest state ``LOAD_CHUNK`` jobs at a time. Returns the records."""
        n = 0
        latest: dict[str, tuple[int | None, bytes | None]] = {}
        for job_id, wake, value in rows:
            n += 1
            if job_id.startswith(HELD_PREFIX):
                self.hold(job_id, job_id.split("/")[1], value)
                continue
            latest[job_id] = (wake, value)
            if len(latest) >= LOAD_CHUNK:
                self._write_latest(latest)
        self._write_latest(latest)
        return n

    def _write_latest(self, latest: dict[str, tuple[int | None, bytes | None]]) -> None:
        """Write (or delete) each job's latest restored state, index it, and forget them.

        One statement for the lot: the states' bytes as one blob, and where each starts in
        it as JSON. ``executemany`` let go of the GIL at every row and waited to take it
        back behind the scheduler's loop each time (up to the 5 ms switch interval): in
        process, a restore of 30,000 records took 22 s beside a thread busy in Python, 0.3 s
        alone; in the failover benchmark, 1.2-2.6 s beside the loop firing 1,000 jobs/s."""
        gone = [job_id for job_id, (_, value) in latest.items() if value is None]
        if gone:
            self._db.execute(
                "DELETE FROM state WHERE job_id IN (SELECT value FROM json_each(?))",
                (json.dumps(gone),),
            )
        kept = sorted(
            (job_id, wake, value) for job_id, (wake, value) in latest.items() if value is not None
        )
        if kept:
            where: list[tuple[str, int | None, int, int]] = []
            start = 1  # substr() counts from 1
            for job_id, wake, state in kept:
                where.append((job_id, wake, start, len(state)))
                start += len(state)
            self._db.execute(
                "INSERT OR REPLACE INTO state (job_id, wake_at_ms, value) "
                "SELECT r.value ->> 0, r.value ->> 1, "
                "coalesce(substr(?2, r.value ->> 2, r.value ->> 3), x'') "
                "FROM json_each(?1) AS r",
                (json.dumps(where), b"".join(state for _, _, state in kept)),
            )
        for job_id, (wake, value) in latest.items():
            self._index(job_id, None if value is None else wake)
        latest.clear()

    def pending(self) -> int:
        """Jobs with a wake-up time (scheduled runs or retries)."""
        self.flush()
        return int(
            self._db.execute("SELECT count(*) FROM state WHERE wake_at_ms IS NOT NULL").fetchone()[
                0
            ]
        )

    # --- the due-time index ---------------------------------------------------------------

    def reindex(self, job_id: str, wake_at_ms: int, *, unled: bool = False) -> None:
        """Put a job popped before its time back in the in-memory index; ``unled``: no lead
        moves that wake-up (a crowd popped it): no crowd pops it again before its time."""
        self._index(job_id, wake_at_ms)
        if unled:
            self._unled.add(job_id)

    def _index(self, job_id: str, wake_at_ms: int | None) -> None:
        if wake_at_ms is not None and wake_at_ms <= self._loaded_until_ms:
            if self._near.get(job_id) != wake_at_ms:
                self._set_near(job_id, wake_at_ms)
        else:
            self._drop_near(job_id)

    def _set_near(self, job_id: str, wake_at_ms: int) -> None:
        self._drop_near(job_id)
        self._near[job_id] = wake_at_ms
        self.wake_additions += 1
        bucket = wake_at_ms // CROWD_BUCKET_MS
        self._wake_counts[bucket] = self._wake_counts.get(bucket, 0) + 1
        heapq.heappush(self._heap, (wake_at_ms, job_id))

    def _drop_near(self, job_id: str) -> None:
        """Out of the index (its heap entry goes stale: skipped when met)."""
        wake = self._near.pop(job_id, None)
        if wake is not None:
            if self._unled:
                self._unled.discard(job_id)
            bucket = wake // CROWD_BUCKET_MS
            left = self._wake_counts[bucket] - 1
            if left:
                self._wake_counts[bucket] = left
            else:
                del self._wake_counts[bucket]

    def _load(self, after_ms: int, until_ms: int) -> None:
        self.flush()
        rows = self._db.execute(
            "SELECT job_id, wake_at_ms FROM state WHERE wake_at_ms > ? AND wake_at_ms <= ?",
            (after_ms, until_ms),
        )
        if self._near:
            for job_id, wake in rows:
                self._set_near(job_id, wake)
        else:
            # an empty index (a restore, a new owner): built in one go, the heap heapified
            # once (a new owner's restore ends with this, beside a loop firing its other
            # partitions)
            self._near = dict(rows)
            counts = self._wake_counts
            for wake in self._near.values():
                bucket = wake // CROWD_BUCKET_MS
                counts[bucket] = counts.get(bucket, 0) + 1
            self._heap = [(wake, job_id) for job_id, wake in self._near.items()]
            heapq.heapify(self._heap)
            self.wake_additions += 1
        self._loaded_until_ms = max(self._loaded_until_ms, until_ms)

    def advance(self, now_ms: int) -> None:
        """Keep the in-memory window covering [now, now + window]."""
        if self._loaded_until_ms < now_ms + self.window_ms // 2:
            start = self._loaded_until_ms if self._loaded_until_ms >= 0 else -(2**62)
            self._load(start, now_ms + self.window_ms)

    def next_wake_ms(self) -> int | None:
        while self._heap:
            wake, job_id = self._heap[0]
            if self._near.get(job_id) == wake:
                return wake
            heapq.heappop(self._heap)
        return None

    def crowd(self, now_ms: int, rate_per_s: float, cap_ms: int, min_lead_ms: float = 0) -> Crowd:
        """The crowd lead over the index's counts (crowd.py): which wake-ups to fire now."""
        counts = self._wake_counts
        if not counts:
            return Crowd(now_ms, None)
        width = CROWD_BUCKET_MS
        first = (now_ms - CROWD_LOOKBACK_MS) // width
        # the groups within the cap, and those within CROWD_LOOKAHEAD_MS past it: their turns
        # (no earlier than their coming within the cap) set ``next_ms`` too
        last = (now_ms + cap_ms + CROWD_LOOKAHEAD_MS) // width
        groups = (
            (bucket * width + width - 1, jobs)
            for bucket in range(first, last + 1)
            if (jobs := counts.get(bucket))
        )
        # no ``total``: it stopped the walk early with a bound on the next turn (the window's
        # jobs at the rate) that stayed a few ms ahead of every wake-up, so the partition
        # walked again at each fire; the walk is ~1,100 buckets at most (a 25 s cap)
        crowd = crowd_lead(groups, now_ms, rate_per_s, cap_ms, min_lead_ms=min_lead_ms)
        if crowd.walked < len(self._near):
            # jobs waking later still (or overdue past the lookback: they fire anyway): one
            # may come within the lookahead before the next look, so look by then
            lookahead_ms = now_ms + CROWD_LOOKAHEAD_MS
            if crowd.next_ms is None or lookahead_ms < crowd.next_ms:
                crowd = Crowd(crowd.until_ms, lookahead_ms, crowd.walked)
        return crowd

    def pop_due(self, now_ms: int, limit: int, until_ms: int | None = None) -> list[str]:
        """Job ids whose wake-up time has come (removed from the in-memory index), earliest
        first; with ``until_ms`` (a crowd's, past ``now_ms``) those waking by then too, but
        the ``unled`` ones only at their time."""
        due: list[str] = []
        until = now_ms if until_ms is None else max(now_ms, until_ms)
        unled: list[tuple[int, str]] = []
        while self._heap and self._heap[0][0] <= until and len(due) < limit:
            wake, job_id = heapq.heappop(self._heap)
            if self._near.get(job_id) != wake:
                continue  # stale
            if wake > now_ms and job_id in self._unled:
                unled.append((wake, job_id))
                continue
            self._drop_near(job_id)
            due.append(job_id)
        for entry in unled:
            heapq.heappush(self._heap, entry)
        self.prefetch(due)
        return due

    def close(self) -> None:
        self._writes.clear()  # never committed: the changelog has them, or they never were
        self._db.close()
        if self.path is not None:
            for suffix in ("", "-journal"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)

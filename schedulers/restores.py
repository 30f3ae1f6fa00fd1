"""Partition restores off the scheduler's main loop.

A partition given to this scheduler is fenced (a new transactional producer) and restored
from its changelog in a worker thread, so that the partitions it owns already keep firing
meanwhile (a failover's survivor, a leave's heir), and each new partition fires as soon as its
own restore ends rather than after every other one. Every partition taken at once restores at
once (up to ``workers``): a restore mostly waits for the broker's fetches, so a third partition
queued behind two others waited a whole restore for nothing (a join at 1,000 jobs/s: owned
6.6 s after the first two). The main loop installs a finished restore
(``done``); a partition revoked while it restores is closed when its restore ends, never
installed. Each thread reads the changelog with a group-less reader of its own (readers are
reused, and a few made ahead: a new one's first fetch waits for its connection).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException

from .partition import PartitionOwner

log = logging.getLogger("duetime.scheduler")


@dataclass(frozen=True, slots=True)
class Restored:
    owner: PartitionOwner
    states: int
    seconds: float
    fence_s: float = 0.0
    """Of ``seconds``, the new producer's ``init_transactions`` (read beside the changelog)."""
    copied: int | None = None
    """Records of the standby copy it was restored onto (standby.py); None: no copy."""


class Restores:
    def __init__(
        self,
        build: Callable[[int, Consumer], Restored],
        make_reader: Callable[[], Consumer],
        workers: int = 8,
        ready: int = 0,
    ) -> None:
        """``ready``: readers made at once (off the caller's thread), before any restore
        needs them: a new reader's first fetch came ~0.5 s after its assign (its connection
        and the topic's metadata), a fifth of a whole restore of 30,000 states."""
        self._build = build
        self._make_reader = make_reader
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="restore")
        self._readers: queue.SimpleQueue[Consumer] = queue.SimpleQueue()
        self._made: list[Consumer] = []
        self._lock = threading.Lock()
        self._running: dict[int, Future[Restored]] = {}
        for _ in range(min(ready, workers)):
            self._pool.submit(self._make_ready)

    def _make_ready(self) -> None:
        try:
            self._readers.put(self._new_reader())
        except Exception as exc:  # a restore makes its own when it needs one
            log.warning("could not make a restore reader ahead of time: %s", exc)

    def _new_reader(self) -> Consumer:
        reader = self._make_reader()
        with self._lock:
            self._made.append(reader)
        return reader

    def start(self, p: int) -> None:
        if p not in self._running:
            self._running[p] = self._pool.submit(self._restore, p)

    def _restore(self, p: int) -> Restored:
        try:
            reader = self._readers.get_nowait()
        except queue.Empty:
            reader = self._new_reader()
        try:
            return self._build(p, reader)
        finally:
            self._readers.put(reader)

    def pending(self) -> set[int]:
        return set(self._running)

    def cancel(self, p: int) -> bool:
        """Revoked while restoring: close the owner when its restore ends. True if it was."""
        future = self._running.pop(p, None)
        if future is None:
            return False
        future.add_done_callback(_close_result)
        return True

    def done(self) -> list[tuple[int, Restored | BaseException]]:
        """The restores that ended since the last call (a result or the error that ended it)."""
        ended = [p for p, future in self._running.items() if future.done()]
        out: list[tuple[int, Restored | BaseException]] = []
        for p in sorted(ended):
            future = self._running.pop(p)
            exc = future.exception()
            out.append((p, exc if exc is not None else future.result()))
        return out

    def close(self) -> None:
        """Wait for every restore, close what they built, then the readers."""
        for p in list(self._running):
            self.cancel(p)
        self._pool.shutdown(wait=True)
        with self._lock:
            for reader in self._made:
                reader.close()
            self._made.clear()


def _close_result(future: Future[Restored]) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    owner = future.result().owner
    try:
        owner.close()
    except KafkaException as exc:
        log.warning("closing partition %s: %s", owner.partition, exc)
    log.info("released partition %s (revoked while restoring)", owner.partition)

"""Which queues exist, read from the cluster's topic metadata (the topics are the registry).

A queue exists when its four execution topics do (``Topics.complete_queues``). Every role that
must know asks a :class:`QueueDirectory`: the API and the SDK refuse a job naming a missing
queue, the scheduler dead-letters an execution whose queue went away instead of aborting its
transaction on a topic that does not exist, a worker says at start which of its queues are
missing. The default queue always counts as existing: its topics are created with every other
topic by ``duetime topics create``, and a cluster without them is not running duetime at all.

Metadata is cached for ``refresh_s``; a queue missing from the cache re-reads it (at most once
per ``recheck_s``), so a queue created a moment ago is seen at once and a flood of jobs naming
a missing queue costs one metadata request a second. When the metadata cannot be read, the
answer is None ("cannot tell"): callers decide (the scheduler goes on as if it existed, since a
real write would fail the same way and be retried; nothing is dead-lettered on a broker glitch).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from .topics import DEFAULT_QUEUE, Topics

log = logging.getLogger("duetime.queues")

ListTopics = Callable[[float], Mapping[str, int]]
"""``timeout_s`` → every topic in the cluster with its partition count (raises when the
cluster cannot answer)."""


def partition_counts(metadata: object) -> dict[str, int]:
    """Topic → partitions, from a confluent-kafka ``ClusterMetadata``."""
    topics = metadata.topics  # type: ignore[attr-defined]  # ClusterMetadata is unannotated
    return {name: len(t.partitions) for name, t in topics.items() if t.error is None}


def metadata_lister(client: object) -> ListTopics:
    """A :data:`ListTopics` over any confluent-kafka client (Producer, Consumer, AdminClient)."""

    def list_topics(timeout_s: float) -> Mapping[str, int]:
        return partition_counts(client.list_topics(timeout=timeout_s))  # type: ignore[attr-defined]

    return list_topics


class QueueDirectory:
    """A cached answer to "does queue Q exist?" (thread-safe: the API asks from many threads)."""

    def __init__(
        self,
        topics: Topics,
        list_topics: ListTopics,
        *,
        refresh_s: float = 10.0,
        recheck_s: float = 1.0,
        timeout_s: float = 5.0,
        min_partitions: int = 1,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topics = topics
        self.min_partitions = min_partitions
        """A queue whose topics have fewer partitions counts as missing: the scheduler that
        owns partition p writes its requests to partition p of the queue's topic."""
        self._list_topics = list_topics
        self._refresh_s = refresh_s
        self._recheck_s = recheck_s
        self._timeout_s = timeout_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._queues: set[str] | None = None
        self._read_at: float | None = None
        self._failed_at: float | None = None

    def refresh(self) -> set[str] | None:
        """Read the metadata now; the queues that exist, or None when it cannot be read."""
        try:
            counts = self._list_topics(self._timeout_s)
        except Exception as exc:  # any client error: "cannot tell", never a crash of the caller
            log.warning("cannot read the topic metadata to list queues: %s", exc)
            with self._lock:
                # do not ask a broker that cannot answer again for refresh_s: a caller on an
                # event loop (the API) must not block on every request while Kafka is down
                self._failed_at = self._monotonic()
            return None
        usable = [name for name, n in counts.items() if n >= self.min_partitions]
        queues = self.topics.complete_queues(usable) | {DEFAULT_QUEUE}
        with self._lock:
            self._queues, self._read_at = queues, self._monotonic()
        return set(queues)

    def exists(self, queue: str) -> bool | None:
        """True / False from metadata at most ``refresh_s`` old, or None: cannot tell."""
        if queue == DEFAULT_QUEUE:
            return True
        with self._lock:
            queues, read_at, failed_at = self._queues, self._read_at, self._failed_at
        now = self._monotonic()
        if queues is not None and read_at is not None:
            age = now - read_at
            if age < self._refresh_s and queue in queues:
                return True
            if age < self._recheck_s:
                return queue in queues
        if failed_at is not None and now - failed_at < self._refresh_s:
            return None  # the last read failed a moment ago
        fresh = self.refresh()
        return None if fresh is None else queue in fresh

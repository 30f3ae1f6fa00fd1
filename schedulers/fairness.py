"""Fairness keys in one owned partition (issue 18, item 4): a cap on the executions in flight
per fairness key, and the held executions that wait for its credit.

Why here and not only in the workers: once a tenant's backlog of 100,000 requests sits in an
execution partition ahead of another tenant's, a worker sees only its buffer of them. So the
scheduler never lets more than ``cap x weight`` executions of one key be in flight (emitted,
no result yet) per partition; a due execution of a key at its cap is *held* in the job's state
(``InflightExecution.held``: no request emitted) and released, FIFO within the key (priority
first, then due time), as results free the key's credit. Another key's execution then waits
behind at most ``cap x weight`` requests of the busy key in its execution partition, and the
workers serve the keys in their buffers round-robin (``duetime.core.priority.FairQueue``).
Keys never wait for each other's credit, so no round robin across keys is needed here: a key
with credit is never held.

Everything is derived from the jobs' states: :func:`share_of` reads one state, the gate sums
the shares. Held executions are pending state in the changelog, so they survive a failover;
each state record carries its share in a header (:data:`SHARE_HEADER`), so a new owner
rebuilds the gate while restoring, without decoding every state. Jobs without fairness keys
have no share and cost one ``is None`` test per state written.

The gate follows the partition's transaction: :meth:`FairnessGate.set` during a cycle,
:meth:`commit` when it committed, :meth:`rollback` when it did not.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from duetime.core.keys import MAX_WEIGHT
from duetime.core.models import Status
from duetime.core.records import SchedulerState

SHARE_HEADER = "duetime-fair"
"""Header of a state record whose job has fairness executions: its :class:`Share` (JSON)."""

DEFAULT_INFLIGHT = 32
"""Default per-key cap per partition (DUETIME_SCHEDULER_FAIRNESS_INFLIGHT). About four times
a default worker's slots (100) over the default partitions (12): a lone tenant can keep
12 x 32 = 384 executions in flight (about four default workers busy), and another tenant's
execution waits behind at most 32 of its requests in an execution partition, a third of one
worker's slots."""


@dataclass(frozen=True, slots=True)
class Share:
    """One job's part in its partition's fairness."""

    live: Mapping[str, int]
    """Per key: executions emitted and not answered (queued or running, not held)."""
    held: Mapping[str, int]
    """Per key: the due time (ms) of the job's earliest held execution of that key."""
    held_count: int
    rank: int
    """The job's priority rank (0 = critical): held entries are released priority first."""
    weight: int

    def encode(self) -> bytes:
        return json.dumps(
            {
                "l": self.live,
                "h": self.held,
                "n": self.held_count,
                "r": self.rank,
                "w": self.weight,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Share:
        """The header as written by :meth:`encode`; ValueError (naming what) otherwise."""
        try:
            d = json.loads(raw)
            live = {str(k): int(v) for k, v in d["l"].items()}
            held = {str(k): int(v) for k, v in d["h"].items()}
            share = cls(live, held, int(d["n"]), int(d["r"]), int(d["w"]))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"fairness share header does not decode: {exc}") from None
        if share.held_count < len(held) or min(live.values(), default=1) < 1:
            raise ValueError("fairness share header has inconsistent counts")
        return share


def share_of(state: SchedulerState) -> Share | None:
    """The job's share, or None when it has no execution with a fairness key."""
    live: Counter[str] = Counter()
    held: dict[str, int] = {}
    held_count = 0
    for entry in state.inflight:
        key = entry.fairness_key
        if key is None:
            continue
        if entry.held:
            held_count += 1
            held[key] = min(held.get(key, entry.due_at_ms), entry.due_at_ms)
        elif entry.status is Status.QUEUED or entry.status is Status.RUNNING:
            live[key] += 1
    if not live and not held:
        return None
    definition = state.definition
    weight = 1 if definition.fairness is None else definition.fairness.weight
    return Share(
        dict(live),
        held,
        held_count,
        definition.priority.rank,
        min(max(weight, 1), MAX_WEIGHT),
    )


class FairnessGate:
    """The partition's credit per fairness key and its held executions, in release order."""

    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"the fairness cap must be at least 1, got {cap}")
        self.cap = cap
        self._shares: dict[str, Share] = {}
        self._versions: dict[str, int] = {}
        """Per job, the sequence number of its current share (unique: a stale heap entry
        never matches a later share)."""
        self._live: Counter[str] = Counter()
        self._heads: dict[str, list[tuple[int, int, int, str, int]]] = {}
        """Per key, a heap of (rank, due_ms, seq, job_id, version): a job's earliest held
        execution of that key; stale when the job's version moved on (skipped when met)."""
        self._undo: dict[str, Share | None] = {}
        self._ready: set[str] = set()
        """Keys whose credit or held executions changed: the ones a release looks at."""
        self._seq = 0
        self.held = 0
        """Held executions in the partition (the gauge)."""

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._shares

    def inflight(self, key: str) -> int:
        return self._live[key]

    def set(self, job_id: str, share: Share | None) -> None:
        """The job's share is now ``share`` (its state as collected in this cycle)."""
        if job_id not in self._undo:
            self._undo[job_id] = self._shares.get(job_id)
        self._replace(job_id, share)

    def follow(self, job_id: str, state: SchedulerState) -> None:
        """``state`` is the job's state as collected in this cycle: the gate takes its share when
        the job has a fairness key or had one (a job that never had one costs two tests)."""
        if state.definition.fairness is not None or job_id in self._shares:
            self.set(job_id, share_of(state))

    def revert(self, job_id: str) -> None:
        """The job left the cycle: back to its committed share."""
        if job_id in self._undo:
            self._replace(job_id, self._undo.pop(job_id))

    def commit(self) -> None:
        self._undo.clear()

    def rollback(self) -> None:
        for job_id, share in self._undo.items():
            self._replace(job_id, share)
        self._undo.clear()

    def load(self, shares: Mapping[str, Share]) -> None:
        """The committed shares of a restored partition."""
        for job_id, share in shares.items():
            self._replace(job_id, share)
        self._undo.clear()
        self._ready.update(self._heads)

    def releasable(self) -> Iterator[tuple[str, str]]:
        """(job_id, key) of held executions that the keys' credit lets go now, in release
        order per key. The caller releases each one and calls :meth:`set` with the job's new
        share before asking for the next (that takes the credit)."""
        while self._ready:
            key = self._ready.pop()
            heap = self._heads.get(key)
            while heap:
                *_, job_id, version = heap[0]
                share = self._shares.get(job_id)
                if self._versions.get(job_id) != version or share is None:
                    heapq.heappop(heap)  # stale: the job's state moved on since
                    continue
                if self._live[key] >= self.cap * share.weight:
                    break
                heapq.heappop(heap)
                yield job_id, key
            if not heap:
                self._heads.pop(key, None)

    def _replace(self, job_id: str, share: Share | None) -> None:
        old = self._shares.pop(job_id, None)
        if old is not None:
            for key, n in old.live.items():
                self._live[key] -= n
                if self._live[key] <= 0:
                    del self._live[key]
                self._ready.add(key)  # credit may have come free
            self.held -= old.held_count
        if share is None:
            self._versions.pop(job_id, None)
            return
        self._seq += 1
        version = self._versions[job_id] = self._seq
        self._shares[job_id] = share
        self._live.update(share.live)
        self.held += share.held_count
        for key, due_ms in share.held.items():
            self._seq += 1
            heapq.heappush(
                self._heads.setdefault(key, []), (share.rank, due_ms, self._seq, job_id, version)
            )
            self._ready.add(key)

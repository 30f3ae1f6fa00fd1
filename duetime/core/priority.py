"""Priority selection: which waiting execution a worker starts next.

Role: a worker consumes the four execution topics (critical, high, normal, low) into one
FIFO queue of :class:`Waiting` per priority. Whenever a slot may be free it asks
:func:`select_next` which queue's head to start. Pure: no clock, no randomness, no I/O;
the caller passes ``now`` (seconds on the same clock as ``enqueued_at``).

The policy:

- **Slots.** A worker runs at most ``slots`` executions at once. ``reserved_critical`` of
  them (from :func:`reserved_slots`: a configured share, e.g. 10%, at least 1 when the
  share is positive and ``slots > 1``, never all of them) are kept for critical work:
  a non-critical execution may start only while ``running_total < slots -
  reserved_critical``; a critical one while ``running_total < slots``. So whenever
  non-critical work starts, at least ``reserved_critical`` slots are still free for
  critical work, whatever is already running.
- **Aging.** A non-critical execution that has waited ``aging_s`` or more is promoted one
  level per full ``aging_s`` waited: low → normal → high, never higher. Aging never makes
  work critical, so it never grants the reserved slots and never overtakes a waiting
  critical execution: critical is always first among the startable heads.
- **Choice.** Among the queue heads that may start, the best *effective* priority wins;
  ties go to the earliest ``enqueued_at``, then to the more urgent base priority.
- **No starvation.** A low execution reaches effective high after ``2 * aging_s``; from
  then on only critical work and the finitely many non-critical executions enqueued before
  it go first, so it starts within bounded time as long as critical work leaves some
  non-critical capacity free.
- **Heads only.** Only heads are ever chosen, so each call costs O(number of priorities).
  A queue without fairness keys is FIFO: its head is the oldest, hence also the most
  promoted, so looking at heads only is exact.
- **Fairness within a priority** (issue 18, item 4). A priority's queue is a
  :class:`FairQueue`: its fairness keys (tenants) take turns by stride scheduling, a key of
  weight ``w`` getting ``w`` turns for one of a weight-1 key, FIFO within a key. Executions
  without a key share one key of their own. A key that starts waiting joins at the current
  turn, so it is served within one round of the keys already waiting, whatever their
  backlogs. Its head is the next one to start; aging reads that head's age.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from duetime.core.errors import ConfigError
from duetime.core.keys import MAX_WEIGHT
from duetime.core.models import PRIORITY_ORDER, Priority

_BEST_AGED_RANK = Priority.HIGH.rank  # aging stops here: it never makes work critical


@dataclass(frozen=True, slots=True)
class Waiting:
    """An execution waiting in a worker's queue since ``enqueued_at`` (seconds)."""

    enqueued_at: float
    key: str
    fairness_key: str | None = None
    """The execution's tenant (None: none; such executions share one key of their own)."""
    weight: int = 1
    """The fairness key's weight (clamped to 1..MAX_WEIGHT: a hostile request cannot stall
    the stride arithmetic)."""


_STRIDE = math.lcm(*range(1, MAX_WEIGHT + 1))
"""Turn length of a weight-1 key: divisible by every weight, so passes are exact integers."""


class FairQueue:
    """Waiting executions of one priority: weighted round robin across fairness keys, FIFO
    within a key (stride scheduling: the key with the smallest *pass* goes next and its pass
    grows by ``_STRIDE / weight``; ties go to the key that started waiting first).

    ``appendleft`` puts an execution back at the head, before every key's turn (it was
    already chosen and comes back from a wait: a lease held elsewhere, a limit, early
    arrival). Pure: no clock, no I/O."""

    __slots__ = ("_front", "_keys", "_now", "_seq", "_size", "_turns")

    def __init__(self, items: Iterator[Waiting] | None = None) -> None:
        self._front: deque[Waiting] = deque()
        self._keys: dict[str | None, deque[Waiting]] = {}
        self._turns: list[tuple[int, int, str | None]] = []  # (pass, arrival seq, key)
        self._now = 0  # the pass of the last turn taken: where a newly waiting key joins
        self._seq = 0
        self._size = 0
        for item in items or ():
            self.append(item)

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[Waiting]:
        """Every waiting execution: the head's returned ones, then each key's in FIFO order
        (not the turn order: for rebuilding a queue without some of them)."""
        yield from self._front
        for queue in self._keys.values():
            yield from queue

    def __getitem__(self, index: int) -> Waiting:
        """Only ``[0]``, the next one :meth:`popleft` returns (what ``select_next`` reads)."""
        if index != 0 or not self._size:
            raise IndexError(index)
        if self._front:
            return self._front[0]
        return self._keys[self._turns[0][2]][0]

    def append(self, item: Waiting) -> None:
        key = item.fairness_key
        queue = self._keys.get(key)
        if queue is None:
            self._keys[key] = deque((item,))
            self._seq += 1
            heapq.heappush(self._turns, (self._now, self._seq, key))
        else:
            queue.append(item)
        self._size += 1

    def appendleft(self, item: Waiting) -> None:
        self._front.appendleft(item)
        self._size += 1

    def popleft(self) -> Waiting:
        if not self._size:
            raise IndexError("pop from an empty FairQueue")
        self._size -= 1
        if self._front:
            return self._front.popleft()
        turn, seq, key = self._turns[0]
        queue = self._keys[key]
        item = queue.popleft()
        self._now = turn
        if queue and len(self._turns) == 1:
            return item  # one key alone (the usual case: no fairness keys) keeps its turn
        if queue:
            weight = min(max(item.weight, 1), MAX_WEIGHT)
            heapq.heapreplace(self._turns, (turn + _STRIDE // weight, seq, key))
        else:
            heapq.heappop(self._turns)
            del self._keys[key]
        return item


class HeadQueue(Protocol):
    """What ``select_next`` reads of a queue: its length and its head (a list, a deque or a
    :class:`FairQueue`)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Waiting: ...


def reserved_slots(slots: int, share: float) -> int:
    """How many of ``slots`` only critical work may use, for a share in ``[0, 1)``.

    ``floor(slots * share)``, raised to 1 when ``share > 0`` and ``slots > 1`` and capped
    at ``slots - 1`` so non-critical work always keeps at least one slot.
    """
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ConfigError(f"worker slots must be a positive integer, got {slots!r}")
    if not 0.0 <= share < 1.0:  # also refuses NaN
        raise ConfigError(f"the critical share of slots must be in [0, 1), got {share!r}")
    if share == 0.0 or slots == 1:
        return 0
    reserved = math.floor(slots * share + 1e-9)  # 0.29 * 100 is 28.999…; mean 29
    return min(max(reserved, 1), slots - 1)


def effective_priority(base: Priority, waited_s: float, aging_s: float) -> Priority:
    """``base`` promoted one level per full ``aging_s`` waited, never into critical."""
    if base is Priority.CRITICAL or waited_s <= 0 or math.isinf(aging_s):
        return base
    steps = math.floor(waited_s / aging_s)
    return PRIORITY_ORDER[max(base.rank - steps, _BEST_AGED_RANK)]


def select_next(
    queues: Mapping[Priority, HeadQueue],
    running_by_class: Mapping[Priority, int],
    slots: int,
    reserved_critical: int,
    aging_s: float,
    now: float,
) -> Priority | None:
    """The priority whose queue head the worker should start now, or None.

    ``queues`` holds the waiting executions per base priority, oldest first (a missing
    priority is an empty queue); ``running_by_class`` counts running executions per base
    priority. None means nothing may start: no slot is usable by any waiting head.
    ``aging_s`` is positive; ``math.inf`` disables aging.
    """
    if slots < 1 or not 0 <= reserved_critical <= slots:
        raise ValueError(
            f"need slots >= 1 and 0 <= reserved_critical <= slots, got {slots}, {reserved_critical}"
        )
    if not aging_s > 0:
        raise ValueError(f"aging_s must be positive, got {aging_s!r}")
    running_total = sum(running_by_class.values())
    if running_total >= slots:
        return None
    critical = queues.get(Priority.CRITICAL)
    if critical:
        return Priority.CRITICAL
    if running_total >= slots - reserved_critical:
        return None
    best: Priority | None = None
    best_order: tuple[int, float, int] | None = None
    for base in PRIORITY_ORDER[1:]:
        queue = queues.get(base)
        if not queue:
            continue
        head = queue[0]
        rank = effective_priority(base, now - head.enqueued_at, aging_s).rank
        order = (rank, head.enqueued_at, base.rank)
        if best_order is None or order < best_order:
            best, best_order = base, order
    return best

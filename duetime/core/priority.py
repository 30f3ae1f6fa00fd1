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
- **FIFO within a priority.** Only heads are ever chosen. Within one queue the head is the
  oldest, hence also the most promoted, so looking at heads only is exact and each call
  costs O(number of priorities).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from duetime.core.errors import ConfigError
from duetime.core.models import PRIORITY_ORDER, Priority

_BEST_AGED_RANK = Priority.HIGH.rank  # aging stops here: it never makes work critical


@dataclass(frozen=True, slots=True)
class Waiting:
    """An execution waiting in a worker's queue since ``enqueued_at`` (seconds)."""

    enqueued_at: float
    key: str


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
    queues: Mapping[Priority, Sequence[Waiting]],
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

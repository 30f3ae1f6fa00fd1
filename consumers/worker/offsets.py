"""In-order offset commits for out-of-order completions (pure: no Kafka calls).

Executions finish in any order, but a Kafka offset commit says "everything before this is
done". :class:`OffsetTracker` therefore remembers, per partition, the offsets handed out in
order and which of them are done; a partition's committable position is the first offset
that is not done yet (or one past the last, when all are). Committing that position never
skips a message whose result has not been durably published: at-least-once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

TP = tuple[str, int]
"""(topic, partition)."""


@dataclass
class _Partition:
    order: deque[int] = field(default_factory=deque)
    done: set[int] = field(default_factory=set)
    position: int | None = None
    """Committable position (next offset to read), advanced as the head becomes done."""
    committed: int | None = None
    """The last position handed to a commit."""


class OffsetTracker:
    """Offsets taken from the consumer, per partition, in the order they were consumed."""

    def __init__(self) -> None:
        self._parts: dict[TP, _Partition] = {}

    def add(self, tp: TP, offset: int) -> bool:
        """Track ``offset``; False (and ignored) when it is not after what was seen before."""
        part = self._parts.setdefault(tp, _Partition())
        last = part.order[-1] if part.order else part.position
        if last is not None and offset < (last + 1 if part.order else last):
            return False
        part.order.append(offset)
        return True

    def done(self, tp: TP, offset: int) -> None:
        """The message at ``offset`` is finished (its result is durably published)."""
        part = self._parts.get(tp)
        if part is None:
            return  # the partition was revoked meanwhile: its new owner redoes the work
        part.done.add(offset)
        while part.order and part.order[0] in part.done:
            head = part.order.popleft()
            part.done.discard(head)
            part.position = head + 1

    def outstanding(self, tp: TP | None = None) -> int:
        """Messages taken but not done (in one partition, or in all)."""
        if tp is not None:
            part = self._parts.get(tp)
            return 0 if part is None else len(part.order) - len(part.done)
        return sum(len(p.order) - len(p.done) for p in self._parts.values())

    def first_pending(self, tp: TP) -> int | None:
        """The oldest offset of ``tp`` not done yet (None: nothing outstanding)."""
        part = self._parts.get(tp)
        if part is None:
            return None
        for offset in part.order:
            if offset not in part.done:
                return offset
        return None

    def to_commit(self) -> dict[TP, int]:
        """Positions that advanced since the last call (marks them as handed to a commit)."""
        out: dict[TP, int] = {}
        for tp, part in self._parts.items():
            if part.position is not None and part.position != part.committed:
                out[tp] = part.position
                part.committed = part.position
        return out

    def uncommitted(self, tps: list[TP]) -> None:
        """A commit of these partitions failed: offer their positions again."""
        for tp in tps:
            part = self._parts.get(tp)
            if part is not None:
                part.committed = None

    def positions(self, tps: list[TP] | None = None) -> dict[TP, int]:
        """Every known committable position (for a synchronous commit on revoke or close)."""
        return {
            tp: part.position
            for tp, part in self._parts.items()
            if part.position is not None and (tps is None or tp in tps)
        }

    def forget(self, tp: TP) -> None:
        """The partition was revoked: its offsets are no longer ours to commit."""
        self._parts.pop(tp, None)

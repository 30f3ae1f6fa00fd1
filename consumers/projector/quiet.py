"""Quiet partitions: left out of the projector's fetches until the broker says they have more.

librdkafka has no incremental fetch sessions (KIP-227): every fetch request names every
partition its consumer reads, and the broker looks at each one when it answers, and again
for each parked fetch at every append to any of them. The projector reads every topic (11 of
them, ~130 partitions with the default queue; 4 more topics per queue): at 350 jobs/s it
fetched ~36 times a second, the broker's largest single cost (bench/README.md, "Quiet
partitions"). Most of those partitions are quiet at any time (other priorities, other queues,
DAG topics, dead letters, control commands; the jobs topic once creation stops).

A partition that brought no record for ``after_s`` is paused (no longer fetched); every
``probe_s`` one ListOffsets request (read_committed: the last stable offset) for the paused
ones resumes each whose end is past the projector's position. What it costs: a record landing
in a quiet partition is projected up to ~``probe_s`` later (plus the loop's poll). Nothing is
skipped: a paused partition keeps its position, and one whose end cannot be read is resumed.

Pure bookkeeping here (property-tested); the projector does the pausing and the probing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Key = tuple[str, int]
"""(topic, partition)"""


@dataclass
class QuietPartitions:
    after_s: float
    """A partition that brought nothing for this long is paused (0: never)."""
    probe_s: float
    """How often the paused partitions' ends are read."""
    last_record_at: dict[Key, float] = field(default_factory=dict)
    """Each assigned, fetched partition: when it last brought a record (or was assigned)."""
    paused: set[Key] = field(default_factory=set)
    probed_at: float = float("-inf")

    @property
    def enabled(self) -> bool:
        return self.after_s > 0

    def assigned(self, keys: Iterable[Key], now: float) -> None:
        """Newly assigned partitions are fetched (librdkafka assigns them unpaused)."""
        for key in keys:
            self.paused.discard(key)
            self.last_record_at[key] = now

    def revoked(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self.paused.discard(key)
            self.last_record_at.pop(key, None)

    def clear(self) -> None:
        """The assignment is being rebuilt (a re-join): forget everything."""
        self.paused.clear()
        self.last_record_at.clear()

    def saw(self, keys: Iterable[Key], now: float) -> None:
        """These partitions brought records (a paused one's were fetched before its pause)."""
        for key in keys:
            if key in self.last_record_at:
                self.last_record_at[key] = now

    def due(self, now: float) -> bool:
        """Time to pause the idle and probe the paused."""
        return self.enabled and now - self.probed_at >= self.probe_s

    def begin(self, now: float) -> list[Key]:
        """A probe starts: the fetched partitions idle for ``after_s``, which the caller
        pauses (and reports with :meth:`paused_now`)."""
        self.probed_at = now
        limit = now - self.after_s
        return sorted(k for k, at in self.last_record_at.items() if at <= limit)

    def paused_now(self, keys: Iterable[Key]) -> None:
        for key in keys:
            if self.last_record_at.pop(key, None) is not None:
                self.paused.add(key)

    def to_resume(self, ends: Mapping[Key, int | None], positions: Mapping[Key, int]) -> list[Key]:
        """The paused partitions to fetch again: their end (last stable offset) is past the
        position, or either is unknown (None, missing or negative: fail open)."""
        out = []
        for key in sorted(self.paused):
            end, pos = ends.get(key), positions.get(key, -1)
            if end is None or end < 0 or pos < 0 or end > pos:
                out.append(key)
        return out

    def resumed(self, keys: Iterable[Key], now: float) -> None:
        for key in keys:
            if key in self.paused:
                self.paused.discard(key)
                self.last_record_at[key] = now

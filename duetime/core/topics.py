"""Topic names and their configuration, in one place.

Every job-keyed topic has the same partition count, so the owner of partition p of one topic
owns partition p of all (DESIGN.md). Names carry a configurable prefix (default ``duetime.``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .models import PRIORITY_ORDER, Priority
from .poison import TOPIC_MAX_BYTES

# Compaction keeps only the latest record per key, which is what a definition or a changelog
# needs; min.compaction.lag keeps a few seconds of history for consumers that are just behind.
_COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": "10000"}
# Event topics are deleted by time: 7 days is enough to rebuild the projection after an outage.
_EVENTS = {"cleanup.policy": "delete", "retention.ms": str(7 * 24 * 3600 * 1000)}
# The schedulers' clock probes (schedulers/skew.py): the broker stamps each on append, which is
# the one way Kafka tells a client its time; nobody reads them back, an hour is plenty.
_CLOCK = {
    "cleanup.policy": "delete",
    "message.timestamp.type": "LogAppendTime",
    "retention.ms": str(3600 * 1000),
}
# The dead-letter topics keep their records as long as the 30-day execution history.
_DEAD = {"cleanup.policy": "delete", "retention.ms": str(30 * 24 * 3600 * 1000)}


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]
    event_type: str | None
    """The Avro event type of its values (None: raw bytes, the poison topic)."""


@dataclass(frozen=True)
class Topics:
    prefix: str = "duetime."

    @property
    def jobs(self) -> str:
        return self.prefix + "jobs"

    @property
    def control(self) -> str:
        return self.prefix + "control"

    @property
    def results(self) -> str:
        return self.prefix + "results"

    @property
    def scheduler_inputs(self) -> tuple[str, str, str]:
        """The topics the schedulers consume (co-partitioned: partition p of each belongs to
        the owner of p): definitions, control commands and workers' results."""
        return (self.jobs, self.control, self.results)

    @property
    def state(self) -> str:
        return self.prefix + "state"

    @property
    def dlq(self) -> str:
        return self.prefix + "dlq"

    @property
    def dags(self) -> str:
        return self.prefix + "dags"

    @property
    def dag_runs(self) -> str:
        return self.prefix + "dag_runs"

    @property
    def poison(self) -> str:
        """Records that could not be decoded, with their original bytes and context headers."""
        return self.prefix + "poison"

    @property
    def clock(self) -> str:
        """The schedulers' clock probes (LogAppendTime: the broker's time; one partition)."""
        return self.prefix + "clock"

    def execution(self, priority: Priority | str) -> str:
        return f"{self.prefix}exec.{Priority(priority).value}"

    @property
    def executions(self) -> list[str]:
        return [self.execution(p) for p in PRIORITY_ORDER]

    def specs(self, partitions: int) -> list[TopicSpec]:
        """Every topic duetime uses, with its configuration."""
        specs = [
            TopicSpec(self.jobs, partitions, dict(_COMPACTED), "job"),
            TopicSpec(self.control, partitions, dict(_EVENTS), "control"),
            TopicSpec(self.results, partitions, dict(_EVENTS), "result"),
            TopicSpec(self.state, partitions, dict(_COMPACTED), "state"),
            TopicSpec(self.dlq, partitions, dict(_DEAD), "dead_letter"),
            TopicSpec(self.dags, partitions, dict(_COMPACTED), "dag"),
            TopicSpec(self.dag_runs, partitions, dict(_EVENTS), "dag_run"),
            # a parked record is a copy of an input record plus headers: room for the largest
            TopicSpec(
                self.poison, partitions, {**_DEAD, "max.message.bytes": str(TOPIC_MAX_BYTES)}, None
            ),
        ]
        specs += [TopicSpec(t, partitions, dict(_EVENTS), "execution") for t in self.executions]
        specs.append(TopicSpec(self.clock, 1, dict(_CLOCK), None))
        return specs

    def event_type_of(self, topic: str) -> str | None:
        """The Avro event type of ``topic``'s values (looked up per record: kept cheap)."""
        try:
            return _event_types(self.prefix)[topic]
        except KeyError:
            raise KeyError(f"{topic} is not a duetime topic under prefix {self.prefix!r}") from None


@functools.lru_cache(maxsize=64)
def _event_types(prefix: str) -> dict[str, str | None]:
    return {spec.name: spec.event_type for spec in Topics(prefix).specs(1)}

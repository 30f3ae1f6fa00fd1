"""Topic names and their configuration, in one place.

Every job-keyed topic has the same partition count, so the owner of partition p of one topic
owns partition p of all (DESIGN.md). Names carry a configurable prefix (default ``duetime.``).

Queues: the ``default`` queue's execution topics are ``<prefix>exec.<priority>`` (the names
from before queues existed); queue ``Q`` has ``<prefix>exec.<Q>.<priority>``. A queue name has
no dot, so a name maps to one (queue, priority) and back (:meth:`Topics.parse_execution`). A
queue exists when its four topics do: the topics are the registry (docs/decisions.md).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .models import PRIORITY_ORDER, Priority
from .poison import TOPIC_MAX_BYTES

DEFAULT_QUEUE = "default"
QUEUE_PATTERN = r"[a-z0-9][a-z0-9_-]{0,47}"
"""A queue name: lower-case letters, digits, ``_`` and ``-``, at most 48 characters, no dot
(the dot separates it from the priority in a topic name)."""
_QUEUE_RE = re.compile(QUEUE_PATTERN)


def check_queue(name: object) -> str:
    """``name`` if it is a valid queue name, else ValueError saying what is wrong."""
    if not isinstance(name, str):
        raise ValueError(f"a queue name is a string, not {type(name).__name__}")
    if not _QUEUE_RE.fullmatch(name):
        shown = name if len(name) <= 60 else name[:60] + "..."
        raise ValueError(
            f"invalid queue name {shown!r}: 1 to 48 characters of a-z, 0-9, '_' and '-', "
            "starting with a letter or digit"
        )
    return name


HELD_PREFIX = "held/"
"""State changelog keys ``held/<job_id>/<issued_at_ms>/<command_id>``: a control command the
scheduler holds until its job arrives (the value is the ControlCommand), not a job's state."""

# Compaction keeps only the latest record per key, which is what a definition or a changelog
# needs; min.compaction.lag keeps a few seconds of history for consumers that are just behind.
_COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": "10000"}
# The schedulers' changelog is read whole by every new owner of a partition (failover, a join,
# a restart), and Kafka never compacts a partition's active segment: with the broker's default
# segments (1 GiB, rolled weekly) a restore could read up to 1 GiB of superseded states a
# partition. Segments of 64 MiB rolled at least hourly bound what a restore reads beyond the
# live states, at ~3 state records a job (docs/operations.md, "Disk").
_CHANGELOG = {**_COMPACTED, "segment.bytes": str(64 * 2**20), "segment.ms": str(3600 * 1000)}
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

    def execution(self, priority: Priority | str, queue: str = DEFAULT_QUEUE) -> str:
        """The execution topic of ``queue`` for ``priority`` (the queue name is not checked
        here: callers validate it at their edge, see :func:`check_queue`)."""
        if queue == DEFAULT_QUEUE:
            return f"{self.prefix}exec.{Priority(priority).value}"
        return f"{self.prefix}exec.{queue}.{Priority(priority).value}"

    def executions_of(self, queue: str) -> list[str]:
        """The four execution topics of ``queue``, most urgent first."""
        return [self.execution(p, queue) for p in PRIORITY_ORDER]

    @property
    def executions(self) -> list[str]:
        """The default queue's execution topics."""
        return self.executions_of(DEFAULT_QUEUE)

    @property
    def executions_regex(self) -> str:
        """A subscription pattern matching every queue's execution topics (librdkafka treats
        a name starting with ``^`` as a regex, and re-checks it as topics appear)."""
        return "^" + re.escape(self.prefix) + r"exec\..*"

    def parse_execution(self, topic: str) -> tuple[str, Priority] | None:
        """(queue, priority) of an execution topic under this prefix, else None."""
        head = self.prefix + "exec."
        if not topic.startswith(head):
            return None
        parts = topic[len(head) :].split(".")
        queue = DEFAULT_QUEUE
        if len(parts) == 2:
            queue = parts[0]
            # the default queue has one spelling only: exec.<priority>
            if queue == DEFAULT_QUEUE or not _QUEUE_RE.fullmatch(queue):
                return None
        elif len(parts) != 1:
            return None
        try:
            return queue, Priority(parts[-1])
        except ValueError:
            return None

    def queues_in(self, topic_names: Iterable[str]) -> dict[str, set[Priority]]:
        """Queue → the priorities whose execution topic is among ``topic_names``."""
        found: dict[str, set[Priority]] = {}
        for name in topic_names:
            parsed = self.parse_execution(name)
            if parsed is not None:
                found.setdefault(parsed[0], set()).add(parsed[1])
        return found

    def complete_queues(self, topic_names: Iterable[str]) -> set[str]:
        """The queues all four of whose execution topics are among ``topic_names``: the
        queues that exist."""
        return {
            q for q, ps in self.queues_in(topic_names).items() if len(ps) == len(PRIORITY_ORDER)
        }

    def queue_specs(self, queue: str, partitions: int) -> list[TopicSpec]:
        """The topics of one queue, configured like the default queue's."""
        return [
            TopicSpec(t, partitions, dict(_EVENTS), "execution") for t in self.executions_of(queue)
        ]

    def specs(self, partitions: int) -> list[TopicSpec]:
        """Every topic duetime uses, with its configuration."""
        specs = [
            TopicSpec(self.jobs, partitions, dict(_COMPACTED), "job"),
            TopicSpec(self.control, partitions, dict(_EVENTS), "control"),
            TopicSpec(self.results, partitions, dict(_EVENTS), "result"),
            TopicSpec(self.state, partitions, dict(_CHANGELOG), "state"),
            TopicSpec(self.dlq, partitions, dict(_DEAD), "dead_letter"),
            TopicSpec(self.dags, partitions, dict(_COMPACTED), "dag"),
            TopicSpec(self.dag_runs, partitions, dict(_EVENTS), "dag_run"),
            # a parked record is a copy of an input record plus headers: room for the largest
            TopicSpec(
                self.poison, partitions, {**_DEAD, "max.message.bytes": str(TOPIC_MAX_BYTES)}, None
            ),
        ]
        specs += self.queue_specs(DEFAULT_QUEUE, partitions)
        specs.append(TopicSpec(self.clock, 1, dict(_CLOCK), None))
        return specs

    def event_type_of(self, topic: str) -> str | None:
        """The Avro event type of ``topic``'s values (looked up per record: kept cheap)."""
        try:
            return _event_types(self.prefix)[topic]
        except KeyError:
            if self.parse_execution(topic) is not None:  # another queue's execution topic
                return "execution"
            raise KeyError(f"{topic} is not a duetime topic under prefix {self.prefix!r}") from None


@functools.lru_cache(maxsize=64)
def _event_types(prefix: str) -> dict[str, str | None]:
    return {spec.name: spec.event_type for spec in Topics(prefix).specs(1)}

"""Domain vocabulary shared by every role: priorities, statuses, policies, target kinds."""

from __future__ import annotations

from enum import StrEnum


class Priority(StrEnum):
    CRITICAL = "critical"
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def rank(self) -> int:
        """0 is the most urgent."""
        return PRIORITY_ORDER.index(self)


PRIORITY_ORDER: tuple[Priority, ...] = (
    Priority.CRITICAL,
    Priority.HIGH,
    Priority.NORMAL,
    Priority.LOW,
)


class Status(StrEnum):
    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    DEAD = "dead"
    BLOCKED = "blocked"
    SKIPPED = "skipped"
    PAUSED = "paused"
    CANCELLED = "cancelled"


class Misfire(StrEnum):
    SKIP = "skip"
    RUN_ONCE = "run_once"
    RUN_ALL = "run_all"


class Overlap(StrEnum):
    SKIP = "skip"
    ALLOW = "allow"
    QUEUE_ONE = "queue_one"


class TargetType(StrEnum):
    HTTP = "http"
    PYTHON = "python"
    KAFKA = "kafka"

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
    EXPIRED = "expired"
    """Not started within the job's ``start_within_s`` of its due time: not run (issue 14)."""


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


class Trigger(StrEnum):
    """Why an execution exists."""

    SCHEDULE = "schedule"
    MANUAL = "manual"
    RETRY = "retry"
    REPLAY = "replay"
    RELEASE = "release"
    MISFIRE = "misfire"
    BACKFILL = "backfill"


class ControlKind(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    TRIGGER = "trigger"
    RELEASE = "release"
    SKIP = "skip"
    REPLAY = "replay"
    DAG_RUN_START = "dag_run_start"
    DAG_RUN_END = "dag_run_end"
    BACKFILL = "backfill"


class ResultStatus(StrEnum):
    RUNNING = "running"
    SUCCESS = "success"
    FAILURE = "failure"


class ErrorReason(StrEnum):
    ERROR = "error"
    TIMEOUT = "timeout"
    HTTP_STATUS = "http_status"
    UNKNOWN_TARGET = "unknown_target"
    LOST_LEASE = "lost_lease"
    CANCELLED = "cancelled"
    LOST = "lost"
    """No result came for the attempt through the scheduler's bounded rescues (issue 14)."""
    EXPIRED = "expired"
    """The attempt could not start within the job's ``start_within_s``: not run (issue 14)."""
    NON_RETRYABLE = "non_retryable"
    """The job's retry policy names this failure's HTTP status or exception type (issue 18)."""
    SNOOZED = "snoozed"
    """The task asked to run again later without using an attempt: RetryLater(snooze=True)."""


class DagRunEventKind(StrEnum):
    STARTED = "started"
    NODE_STATUS = "node_status"
    COMPLETED = "completed"
    RETRY = "retry"  # a request to repair a run (to the resolver)
    REOPENED = "reopened"  # the resolver put a finished run back to running
    NODE_CANCELLED = "node_cancelled"  # a member job was cancelled (from its scheduler)


class DagRunStatus(StrEnum):
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    CANCELLED = "cancelled"  # a member job was cancelled before the run ended

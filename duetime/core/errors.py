"""The one error hierarchy of duetime.

Two branches: :class:`RetryableError` (the same call may succeed later: a broker or database
hiccup, a target that timed out) and :class:`PermanentError` (it will never succeed as asked:
bad input, an unknown target). Validation errors are permanent and carry a machine-readable
``code`` and ``details`` so the REST API can answer with the documented error body.
"""

from __future__ import annotations

from typing import Any


class DuetimeError(Exception):
    """Base of every error duetime raises on purpose."""

    code = "error"

    def __init__(self, message: str, *, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    def to_body(self) -> dict[str, Any]:
        """The REST error body of API.md."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


class RetryableError(DuetimeError):
    """Trying again later may succeed."""

    code = "retryable"


class PermanentError(DuetimeError):
    """Trying again will not help."""

    code = "permanent"


class ValidationError(PermanentError):
    """A well-formed request that is not a valid job, schedule or DAG (REST 422)."""

    code = "invalid"

    def __init__(
        self, message: str, *, field: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        merged = dict(details or {})
        if field is not None:
            merged.setdefault("field", field)
        super().__init__(message, details=merged)
        self.field = field


class InvalidSchedule(ValidationError):
    code = "invalid_schedule"


class UnknownTimezone(InvalidSchedule):
    code = "unknown_timezone"


class DagCycleError(ValidationError):
    """A DAG whose dependencies form a cycle.

    ``details["cycle"]`` is the cycle's path with its first node repeated at the end.
    """

    code = "dag_cycle"


class PayloadTooLarge(PermanentError):
    """REST 413."""

    code = "payload_too_large"


class NotFound(PermanentError):
    """REST 404."""

    code = "not_found"


class Conflict(PermanentError):
    """A state change the current state does not allow (REST 409)."""

    code = "conflict"


class IllegalTransition(Conflict):
    code = "illegal_transition"


class ConfigError(PermanentError):
    """An invalid configuration value; the message names the environment variable."""

    code = "config"


class DecodeError(PermanentError):
    """Bytes on a topic that do not decode; says where they came from."""

    code = "undecodable"

    def __init__(
        self,
        message: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        where = f" (topic={topic} partition={partition} offset={offset})" if topic else ""
        super().__init__(
            message + where, details={"topic": topic, "partition": partition, "offset": offset}
        )
        self.topic = topic
        self.partition = partition
        self.offset = offset


CONTENT_ERRORS: tuple[type[Exception], ...] = (
    DuetimeError,
    ArithmeticError,
    AttributeError,
    LookupError,
    TypeError,
    ValueError,
    RecursionError,
    AssertionError,
)
"""What one record's or one job's content can make a role's pure handling raise. Every role
contains these to that record or job (parked on the poison topic, or the job quarantined),
never to its partition or process. Infrastructure errors (Kafka, SQLite, PostgreSQL, the OS)
are not in it: they are retried or end the cycle as before."""


# Typed exceptions a Python task may raise to steer its own outcome.
class RetryLater(RetryableError):
    """Raised by a task: fail this attempt and retry after ``delay_s`` (or the policy's delay).

    With ``snooze=True`` the execution runs again after ``delay_s`` without using an attempt
    of the retry policy, up to ``duetime.core.retry_rules.MAX_SNOOZES`` times per execution;
    past that a snooze counts as an attempt (a job cannot snooze forever). The attempt shows
    in the execution's history with reason ``snoozed``."""

    code = "retry_later"

    def __init__(
        self,
        message: str = "task asked to retry",
        *,
        delay_s: float | None = None,
        snooze: bool = False,
    ):
        super().__init__(message, details={"delay_s": delay_s, "snooze": snooze})
        self.delay_s = delay_s
        self.snooze = snooze


class FailPermanently(PermanentError):
    """Raised by a task: fail now, no more retries (the execution goes dead)."""

    code = "fail_permanently"

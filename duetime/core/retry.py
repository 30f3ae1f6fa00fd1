"""Retry policy and backoff: how often a failed execution is tried again, and after how long.

Role: the per-job retry policy (validated once, at the edge) and the pure delay math. No
clock and no global randomness: callers pass the attempt number and a ``random.Random``.

Guarantees:

* ``backoff_s(retry, p) = min(p.max_delay_s, p.base_delay_s * 2**retry)`` for the retry
  counting from 0 (the first retry waits ``base_delay_s``); non-decreasing in ``retry``, never
  overflows, whatever ``retry`` is.
* ``retry_delay_s`` adds jitter on top of the backoff, uniform in
  ``[0, JITTER_FRACTION * backoff]``: the delay lies in ``[backoff, 1.1 * backoff]`` and so
  never exceeds ``1.1 * max_delay_s``. The jitter is added after the cap on purpose, so that
  jobs that all reached the cap after an outage still spread out instead of retrying in step.
* Attempts are 1-based: attempt 1 is the first run, and ``max_retries = 3`` allows up to 4
  attempts. When attempt ``n`` fails and ``should_retry(n, p)``, the next attempt waits
  ``retry_delay_s(n - 1, p, rng)``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from duetime.core.errors import ValidationError
from duetime.core.inputs import check_number

from .retry_rules import check_error_names, check_http_statuses

__all__ = [
    "JITTER_FRACTION",
    "MAX_DELAY_LIMIT_S",
    "MAX_RETRIES_LIMIT",
    "MIN_BASE_DELAY_S",
    "RetryPolicy",
    "backoff_s",
    "retry_delay_s",
    "should_retry",
]

JITTER_FRACTION = 0.1
MAX_RETRIES_LIMIT = 100
MIN_BASE_DELAY_S = 0.001
MAX_DELAY_LIMIT_S = 7 * 24 * 3600.0  # a week; execution history is kept 30 days
# base >= 1 ms and cap <= a week: 2**40 ms already exceeds the cap, so larger exponents
# change nothing and are clamped (this also keeps 2.0**retry from overflowing).
_MAX_EXPONENT = 64


@dataclass(frozen=True)
class RetryPolicy:
    """How a job's failed executions are retried; validated on construction."""

    max_retries: int = 3
    base_delay_s: float = 10.0
    max_delay_s: float = 3600.0
    jitter: bool = True
    non_retryable_http_statuses: tuple[int, ...] = ()
    """Statuses after which an HTTP target's attempt is not retried (``retry_rules``)."""
    non_retryable_errors: tuple[str, ...] = ()
    """Exception type names after which a task's attempt is not retried (``retry_rules``)."""
    respect_retry_after: bool = True
    """An HTTP target's ``Retry-After`` sets the retry's delay (capped at ``max_delay_s``)."""

    def __post_init__(self) -> None:
        check_number(
            self.max_retries, "retry.max_retries", lo=0, hi=MAX_RETRIES_LIMIT, integer=True
        )
        for name in ("base_delay_s", "max_delay_s"):
            value = check_number(
                getattr(self, name), f"retry.{name}", lo=MIN_BASE_DELAY_S, hi=MAX_DELAY_LIMIT_S
            )
            object.__setattr__(self, name, float(value))
        if self.base_delay_s > self.max_delay_s:
            raise ValidationError(
                f"base_delay_s ({self.base_delay_s}) is larger than max_delay_s "
                f"({self.max_delay_s})",
                field="retry.base_delay_s",
            )
        if not isinstance(self.jitter, bool):
            raise ValidationError("jitter must be true or false", field="retry.jitter")
        if not isinstance(self.respect_retry_after, bool):
            raise ValidationError(
                "respect_retry_after must be true or false", field="retry.respect_retry_after"
            )
        statuses = check_http_statuses(self.non_retryable_http_statuses)
        object.__setattr__(self, "non_retryable_http_statuses", statuses)
        object.__setattr__(
            self, "non_retryable_errors", check_error_names(self.non_retryable_errors)
        )

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any] | None) -> RetryPolicy:
        """From the API body form; missing keys take the defaults, unknown keys are refused."""
        if obj is None:
            return cls()
        if not isinstance(obj, Mapping):
            raise ValidationError("retry must be an object", field="retry")
        known = {
            "max_retries",
            "base_delay_s",
            "max_delay_s",
            "jitter",
            "non_retryable_http_statuses",
            "non_retryable_errors",
            "respect_retry_after",
        }
        for key in obj:
            if key not in known:
                raise ValidationError(
                    f"unknown retry field {key!r}; allowed: {', '.join(sorted(known))}",
                    field=f"retry.{key}",
                )
        return cls(**dict(obj))

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_retries": self.max_retries,
            "base_delay_s": self.base_delay_s,
            "max_delay_s": self.max_delay_s,
            "jitter": self.jitter,
            "non_retryable_http_statuses": list(self.non_retryable_http_statuses),
            "non_retryable_errors": list(self.non_retryable_errors),
            "respect_retry_after": self.respect_retry_after,
        }


def backoff_s(retry: int, policy: RetryPolicy) -> float:
    """``min(max_delay_s, base_delay_s * 2**retry)``; ``retry`` counts from 0."""
    if retry < 0:
        raise ValueError(f"retry must be >= 0 (got {retry})")
    return min(policy.max_delay_s, policy.base_delay_s * 2.0 ** min(retry, _MAX_EXPONENT))


def retry_delay_s(retry: int, policy: RetryPolicy, rng: random.Random) -> float:
    """The backoff plus jitter uniform in [0, JITTER_FRACTION * backoff] (none if disabled)."""
    backoff = backoff_s(retry, policy)
    if not policy.jitter:
        return backoff
    return backoff + rng.uniform(0.0, JITTER_FRACTION * backoff)


def should_retry(attempt: int, policy: RetryPolicy) -> bool:
    """After 1-based ``attempt`` failed, is another attempt allowed?"""
    if attempt < 1:
        raise ValueError(f"attempt is 1-based (got {attempt})")
    return attempt <= policy.max_retries

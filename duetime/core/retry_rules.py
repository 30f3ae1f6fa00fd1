"""Per-error-class retry (issue 18, item 6): which failures the retry policy refuses to retry,
how a target's ``Retry-After`` sets a delay, and how far a task may snooze. Pure: no clock, no
I/O, no import of any name a user gave.

- **Non-retryable HTTP statuses**: ``retry.non_retryable_http_statuses`` (300-599; a 2xx is a
  success and a 1xx never final). An HTTP target's failure whose status is listed goes to the
  dead-letter queue at once, reason ``non_retryable``.
- **Non-retryable exception types**: ``retry.non_retryable_errors``. The worker records the
  raised exception's class and its bases as ``module:qualname`` (:func:`exception_types`, most
  derived first); a policy name matches one of them when it is

  * ``module:qualname`` exactly (``mypkg.errors:Fatal``),
  * ``module.qualname`` (``mypkg.errors.Fatal``, ``builtins.ValueError``), or
  * the bare qualified name without its module (``ValueError``, ``Fatal``, ``Outer.Inner``).

  So ``ValueError`` also refuses ``json.JSONDecodeError`` (a subclass), and a bare name
  matches a class of that name in any module: qualify it to be precise. Names are only
  compared as text: the scheduler never imports what a job names.
- **Retry-After**: with ``retry.respect_retry_after`` (the default), an HTTP target's
  ``Retry-After`` sets that retry's delay, capped at ``retry.max_delay_s``; without it, the
  backoff applies. A task's own ``RetryLater(delay_s=...)`` is not a ``Retry-After``: it
  always applies (bounded by the scheduler's week limit, as before).
- **Snooze**: ``RetryLater(snooze=True)`` runs the execution again after its delay without
  using an attempt, at most :data:`MAX_SNOOZES` times per execution; later snoozes count as
  attempts (a job cannot snooze forever).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .errors import ValidationError
from .models import ErrorReason
from .records import ErrorInfo

if TYPE_CHECKING:  # retry.py imports the checks below: no import cycle at run time
    from .retry import RetryPolicy

__all__ = [
    "MAX_ERROR_NAME_CHARS",
    "MAX_EXCEPTION_TYPES",
    "MAX_NON_RETRYABLE",
    "MAX_SNOOZES",
    "apply_policy",
    "check_error_names",
    "check_http_statuses",
    "exception_types",
    "matching_error_name",
    "non_retryable_verdict",
    "retry_after_delay_s",
]

MAX_SNOOZES = 100
"""Snoozes per execution that do not use an attempt; the 101st counts as one. With a snooze
delay of a minute that is well over an hour of waiting, and the state record stays bounded."""
MAX_NON_RETRYABLE = 50
"""Entries per list (statuses, error names): a policy is part of every state record."""
MAX_ERROR_NAME_CHARS = 200
MAX_EXCEPTION_TYPES = 32
"""Classes recorded per exception (its MRO, most derived first): deeper hierarchies are rare,
and the names travel in every failed result."""

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_IDENT}(?:\.{_IDENT})*"
_ERROR_NAME_RE = re.compile(rf"^{_DOTTED}(?::{_DOTTED})?$")
_MIN_STATUS = 300
_MAX_STATUS = 599


def _bounded_list(raw: Any, field: str, what: str) -> list[Any]:
    """``raw`` as a list of at most ``MAX_NON_RETRYABLE`` items (None: empty)."""
    if raw is None:
        return []
    if isinstance(raw, str | bytes) or not isinstance(raw, Iterable):
        raise ValidationError(f"{field} must be a list of {what}", field=field)
    items = list(raw)
    if len(items) > MAX_NON_RETRYABLE:
        raise ValidationError(
            f"{field} has {len(items)} entries; at most {MAX_NON_RETRYABLE}", field=field
        )
    return items


def check_http_statuses(
    raw: Any, field: str = "retry.non_retryable_http_statuses"
) -> tuple[int, ...]:
    """A list of HTTP statuses in [300, 599], as a sorted tuple without repeats."""
    items = _bounded_list(raw, field, "HTTP statuses")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int):
            raise ValidationError(
                f"{field}: {str(item)[:40]!r} is not an HTTP status (an integer)", field=field
            )
        if not _MIN_STATUS <= item <= _MAX_STATUS:
            raise ValidationError(
                f"{field}: {item} is not a failure status ({_MIN_STATUS}-{_MAX_STATUS}; a 2xx "
                "is a success)",
                field=field,
            )
    return tuple(sorted(set(items)))


def check_error_names(raw: Any, field: str = "retry.non_retryable_errors") -> tuple[str, ...]:
    """A list of exception type names (``ValueError``, ``pkg.mod:Cls``, ``pkg.mod.Cls``), as a
    tuple in the given order without repeats."""
    items = _bounded_list(raw, field, "exception type names")
    seen: dict[str, None] = {}
    for item in items:
        if (
            not isinstance(item, str)
            or len(item) > MAX_ERROR_NAME_CHARS
            or not _ERROR_NAME_RE.match(item)
        ):
            raise ValidationError(
                f"{field}: {str(item)[:60]!r} is not an exception type name (a class name, "
                "optionally qualified as 'package.module:Class' or 'package.module.Class', at "
                f"most {MAX_ERROR_NAME_CHARS} characters)",
                field=field,
            )
        seen[item] = None
    return tuple(seen)


_TYPE_MRO: Any = type.__dict__.get("__mro__")
_TYPE_MODULE: Any = type.__dict__.get("__module__")
_TYPE_QUALNAME: Any = type.__dict__.get("__qualname__")


def exception_types(cls: type) -> list[str]:
    """``cls`` and its bases as ``module:qualname``, most derived first, ``object`` left out.

    A task's exception class is hostile input: a metaclass may make ``__mro__``,
    ``__module__`` or ``__qualname__`` anything, so what is not text is skipped."""
    try:
        mro = tuple(_TYPE_MRO.__get__(cls))  # type's own descriptors: no metaclass override
    except Exception:
        return []
    names: list[str] = []
    for klass in mro:
        if klass is object or len(names) >= MAX_EXCEPTION_TYPES:
            continue
        try:
            module = _TYPE_MODULE.__get__(klass)
            qualname = _TYPE_QUALNAME.__get__(klass)
        except Exception:
            continue
        if isinstance(module, str) and isinstance(qualname, str):
            names.append(f"{module}:{qualname}"[:MAX_ERROR_NAME_CHARS])
    return names


def matching_error_name(policy_names: Iterable[str], recorded: Iterable[str]) -> str | None:
    """The first of ``policy_names`` that matches one of the ``recorded`` ``module:qualname``
    entries (see the module docstring), or None."""
    forms: set[str] = set()
    for entry in recorded:
        module, sep, qualname = entry.partition(":")
        if not sep:
            continue
        forms.update((entry, f"{module}.{qualname}", qualname))
    return next((name for name in policy_names if name in forms), None)


def non_retryable_verdict(
    *,
    http_status: int | None,
    recorded_types: Iterable[str],
    statuses: Iterable[int],
    error_names: Iterable[str],
) -> str | None:
    """Why the policy refuses to retry this failure (a sentence), or None when it does not."""
    if http_status is not None and http_status in set(statuses):
        return f"HTTP {http_status} is in the job's retry.non_retryable_http_statuses: not retried"
    name = matching_error_name(error_names, recorded_types)
    if name is not None:
        return (
            f"the exception matches {name!r} in the job's retry.non_retryable_errors: not retried"
        )
    return None


def retry_after_delay_s(
    retry_after_s: float | None,
    *,
    from_http: bool,
    respect_retry_after: bool,
    max_delay_s: float,
) -> float | None:
    """The delay a failure's own ``retry_after_s`` sets, or None for the policy's backoff.

    From an HTTP target (a ``Retry-After`` answer): only with ``respect_retry_after``, and
    never above ``max_delay_s``. From a task (``RetryLater(delay_s=...)``): as given."""
    if retry_after_s is None:
        return None
    if not from_http:
        return retry_after_s
    if not respect_retry_after:
        return None
    return min(retry_after_s, max_delay_s)


def apply_policy(error: ErrorInfo, policy: RetryPolicy) -> ErrorInfo:
    """``error`` as the job's retry policy judges it: a retryable failure the policy names
    becomes non-retryable with reason ``non_retryable`` and a message saying which rule (the
    original message kept after it); anything else is returned as it is."""
    if not error.retryable:
        return error
    why = non_retryable_verdict(
        http_status=error.http_status,
        recorded_types=error.exception_types,
        statuses=policy.non_retryable_http_statuses,
        error_names=policy.non_retryable_errors,
    )
    if why is None:
        return error
    return replace(
        error,
        retryable=False,
        reason=ErrorReason.NON_RETRYABLE,
        message=f"{why}; {error.message}",
    )

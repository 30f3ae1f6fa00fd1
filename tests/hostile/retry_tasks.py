"""Python tasks of the per-error-class retry scenario (tests/hostile/test_retry_classes.py)."""

from __future__ import annotations

import json
from typing import Any

import duetime


class LedgerClosed(json.JSONDecodeError):
    """A subclass of a subclass of ValueError: a policy naming ``ValueError`` refuses it."""


def snooze_then_succeed(ctx: Any) -> dict[str, int]:
    """Snoozes until its attempt number passes ``payload.snoozes``, then succeeds."""
    if ctx.attempt <= int(ctx.payload["snoozes"]):
        raise duetime.RetryLater("not ready yet", delay_s=0.2, snooze=True)
    return {"attempt": ctx.attempt}


def fail_with_a_value_error(ctx: Any) -> None:
    raise LedgerClosed("ledger closed", "{}", 0)

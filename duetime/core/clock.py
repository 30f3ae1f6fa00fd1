"""Time, passed in: every role and the SDK take a Clock, so tests can drive time.

Wall-clock time (``now_ms``) is what schedules, due times, lateness and records use. Waiting
and timeouts inside a process use ``time.monotonic`` directly: they must not jump with the
wall clock, and no test needs to drive them.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch (UTC). (A protocol: SystemClock and ManualClock
        below are its implementations.)"""


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


SYSTEM_CLOCK: Clock = SystemClock()
"""The default of every role and the SDK."""


class ManualClock:
    """A clock a test moves by hand (``advance``/``set``)."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = now_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, ms: int) -> None:
        self._now_ms += ms

    def set(self, now_ms: int) -> None:
        self._now_ms = now_ms

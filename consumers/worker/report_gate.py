"""Starts before reports: a finished run's report waits while due work waits for a slot.

A run's report is its lease completion (PostgreSQL), its result (the broker), and what that
result then costs the scheduler and the projector. On a box the roles share, a burst's reports
take the CPU its starts need: 100,000 jobs due at one instant on two cores started within 27-36
s with both interleaved, and within ~11 s once the reports waited for the starts (bench/README.md,
"Starts before reports"). So while the worker has due work waiting for a slot, a report waits
for its turn: until no start waits any more, or for at most ``max_wait_s``
(DUETIME_WORKER_REPORT_DEFER_S), whichever comes first. The run's slot is already free and
its lease stays held and renewed; only its result (and its status) arrives later.

Pure asyncio bookkeeping: the worker says when starts wait (``starts_waiting``) and lets the
overdue go at each housekeeping round (``let_overdue_go``); the executor awaits ``turn()``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque


class ReportGate:
    def __init__(self, max_wait_s: float) -> None:
        self.max_wait_s = max_wait_s
        self._closed = False
        self._waiting: deque[tuple[float, asyncio.Future[None]]] = deque()
        """Reports waiting for their turn: when each began to wait (monotonic), and the future
        that lets it go (in arrival order, so the overdue are at the left)."""

    def __len__(self) -> int:
        return len(self._waiting)

    def starts_waiting(self, waiting: bool) -> None:
        """Due work waits for a slot (True: reports wait from now on) or not (False: every
        waiting report goes now)."""
        self._closed = waiting and self.max_wait_s > 0
        if not self._closed:
            self._let_go(math.inf)

    def let_overdue_go(self, now: float | None = None) -> None:
        """Let the reports that have waited ``max_wait_s`` go (``now``: time.monotonic())."""
        if self._waiting:
            self._let_go((time.monotonic() if now is None else now) - self.max_wait_s)

    def _let_go(self, began_by: float) -> None:
        waiting = self._waiting
        while waiting and waiting[0][0] <= began_by:
            _, turn = waiting.popleft()
            if not turn.done():
                turn.set_result(None)

    async def turn(self) -> None:
        """Return at once, or when this report's turn comes."""
        if not self._closed:
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((time.monotonic(), turn))
        await turn

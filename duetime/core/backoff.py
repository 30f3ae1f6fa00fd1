"""Waiting out a dependency that is down (PostgreSQL, the broker): the one recipe.

Role: every role that retries a transient failure of a dependency (a lease batch, reading the
projector's offsets, a store write) waits the same way and says so in the same log line:
capped exponential backoff with jitter, reset by the first success, and a stop check so that
a shutdown is never held up by an outage.

This is not a job's retry policy (``duetime.core.retry``): that one decides when a failed
*execution* runs again; this one keeps a *role* alive while something it needs is away.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

_JITTER = random.Random()
"""The jitter's generator when the caller gives none: seeding one per Backoff read the OS's
entropy for every PostgreSQL statement a worker made (each gets its own Backoff)."""


class Backoff:
    """Capped exponential waits with jitter: ``first_s``, doubling up to ``cap_s``, each
    stretched by up to ``jitter`` of itself so that many clients do not retry in step."""

    def __init__(
        self,
        first_s: float = 0.05,
        cap_s: float = 5.0,
        jitter: float = 0.5,
        rng: random.Random | None = None,
    ) -> None:
        if first_s <= 0 or cap_s < first_s or jitter < 0:
            raise ValueError("backoff needs 0 < first_s <= cap_s and jitter >= 0")
        self.first_s, self.cap_s, self.jitter = first_s, cap_s, jitter
        self._rng = rng or _JITTER
        self._next_s = first_s

    def next(self) -> float:
        """The wait before the next attempt (and double the one after it)."""
        wait = self._next_s * (1 + self._rng.random() * self.jitter)
        self._next_s = min(self._next_s * 2, self.cap_s)
        return wait

    def reset(self) -> None:
        """The dependency answered: the next outage starts from ``first_s`` again."""
        self._next_s = self.first_s


def log_retry(
    logger: logging.Logger, dependency: str, what: str, exc: BaseException, wait_s: float
) -> None:
    """The one log line of a transient failure (the same text in every role)."""
    logger.warning(
        "%s unavailable during %s (%s): retrying in %.2f s",
        dependency,
        what,
        exc,
        wait_s,
        extra={"dependency": dependency, "operation": what},
    )


def retry_transient(
    call: Callable[[], T],
    *,
    transient: Callable[[BaseException], bool],
    dependency: str,
    what: str,
    logger: logging.Logger,
    stopping: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], object] = time.sleep,
    backoff: Backoff | None = None,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """``call()``, retried while it fails transiently; a permanent failure, or any failure
    once ``stopping()`` is true, is raised. ``on_retry`` runs before each wait (e.g. drop a
    broken connection, count the error)."""
    waits = backoff or Backoff()
    while True:
        try:
            result = call()
        except Exception as exc:
            if not transient(exc) or stopping():
                raise
            if on_retry is not None:
                on_retry(exc)
            wait_s = waits.next()
            log_retry(logger, dependency, what, exc, wait_s)
            sleep(wait_s)
            continue
        waits.reset()
        return result


async def retry_transient_async(
    call: Callable[[], Awaitable[T]],
    *,
    transient: Callable[[BaseException], bool],
    dependency: str,
    what: str,
    logger: logging.Logger,
    stopping: Callable[[], bool] = lambda: False,
    backoff: Backoff | None = None,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """:func:`retry_transient` for a coroutine (the wait is ``asyncio.sleep``)."""
    waits = backoff or Backoff()
    while True:
        try:
            result = await call()
        except Exception as exc:
            if not transient(exc) or stopping():
                raise
            if on_retry is not None:
                on_retry(exc)
            wait_s = waits.next()
            log_retry(logger, dependency, what, exc, wait_s)
            await asyncio.sleep(wait_s)
            continue
        waits.reset()
        return result

"""The one recipe for waiting out a dependency that is down (duetime.core.backoff)."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.backoff import Backoff, retry_transient, retry_transient_async


@given(
    first=st.floats(0.001, 1.0),
    factor=st.floats(1.0, 100.0),
    jitter=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32),
    n=st.integers(1, 40),
)
def test_waits_double_up_to_the_cap_within_the_jitter(
    first: float, factor: float, jitter: float, seed: int, n: int
) -> None:
    cap = first * factor
    b = Backoff(first, cap, jitter, random.Random(seed))
    base = first
    for _ in range(n):
        wait = b.next()
        assert base <= wait <= base * (1 + jitter) + 1e-12
        base = min(base * 2, cap)
    b.reset()
    assert first <= b.next() <= first * (1 + jitter) + 1e-12


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="first_s"):
        Backoff(0.5, 0.1)


def test_transient_failures_are_retried_with_one_log_line_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []
    slept: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("down")
        return "up"

    with caplog.at_level(logging.WARNING):
        got = retry_transient(
            flaky,
            transient=lambda e: isinstance(e, ConnectionError),
            dependency="PostgreSQL",
            what="a test",
            logger=logging.getLogger("t"),
            sleep=slept.append,
        )
    assert got == "up" and len(calls) == 3 and len(slept) == 2
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "PostgreSQL unavailable during a test"
    ] * 2


def test_a_permanent_failure_or_a_stop_raises_at_once() -> None:
    def broken() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError):
        retry_transient(
            broken,
            transient=lambda e: isinstance(e, ConnectionError),
            dependency="x",
            what="y",
            logger=logging.getLogger("t"),
            sleep=lambda s: None,
        )

    def down() -> None:
        raise ConnectionError("down")

    with pytest.raises(ConnectionError):
        retry_transient(
            down,
            transient=lambda e: True,
            dependency="x",
            what="y",
            logger=logging.getLogger("t"),
            stopping=lambda: True,
        )


def test_the_async_form_retries_the_same_way() -> None:
    calls: list[int] = []

    async def flaky() -> int:
        calls.append(1)
        if len(calls) < 2:
            raise ConnectionError("down")
        return 7

    got = asyncio.run(
        retry_transient_async(
            flaky,
            transient=lambda e: True,
            dependency="x",
            what="y",
            logger=logging.getLogger("t"),
            backoff=Backoff(0.001, 0.002),
        )
    )
    assert got == 7 and len(calls) == 2

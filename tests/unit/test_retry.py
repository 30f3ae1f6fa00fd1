"""Retry policy and backoff (duetime.core.retry): validation, bounds, properties."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.core.errors import ValidationError
from duetime.core.retry import (
    JITTER_FRACTION,
    MAX_DELAY_LIMIT_S,
    RetryPolicy,
    backoff_s,
    retry_delay_s,
    should_retry,
)

FAST = settings(max_examples=200, deadline=None)


@st.composite
def policies(draw: st.DrawFn) -> RetryPolicy:
    base = draw(st.floats(0.001, 3600))
    cap = draw(st.floats(base, MAX_DELAY_LIMIT_S))
    return RetryPolicy(draw(st.integers(0, 100)), base, cap, draw(st.booleans()))


def test_defaults_match_the_design() -> None:
    p = RetryPolicy()
    assert (p.max_retries, p.base_delay_s, p.max_delay_s, p.jitter) == (3, 10.0, 3600.0, True)
    assert [backoff_s(r, p) for r in range(10)] == [10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600]


def test_dict_round_trip() -> None:
    p = RetryPolicy.from_dict({"max_retries": 5, "base_delay_s": 1, "max_delay_s": 60})
    assert p == RetryPolicy(5, 1.0, 60.0, True)
    assert RetryPolicy.from_dict(p.to_dict()) == p
    assert RetryPolicy.from_dict(None) == RetryPolicy()
    assert RetryPolicy.from_dict({}) == RetryPolicy()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_retries": -1}, "retry.max_retries"),
        ({"max_retries": 101}, "retry.max_retries"),
        ({"max_retries": 2.5}, "retry.max_retries"),
        ({"max_retries": True}, "retry.max_retries"),
        ({"max_retries": "3"}, "retry.max_retries"),
        ({"base_delay_s": -1}, "retry.base_delay_s"),
        ({"base_delay_s": 0}, "retry.base_delay_s"),
        ({"base_delay_s": float("nan")}, "retry.base_delay_s"),
        ({"base_delay_s": "10"}, "retry.base_delay_s"),
        ({"max_delay_s": float("inf")}, "retry.max_delay_s"),
        ({"max_delay_s": 10 * 24 * 3600}, "retry.max_delay_s"),
        ({"base_delay_s": 100, "max_delay_s": 50}, "retry.base_delay_s"),
        ({"jitter": "yes"}, "retry.jitter"),
        ({"retries": 3}, "retry.retries"),
    ],
)
def test_invalid_policies_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        RetryPolicy.from_dict(body)
    assert info.value.field == field


def test_not_a_mapping() -> None:
    with pytest.raises(ValidationError):
        RetryPolicy.from_dict([1, 2])  # type: ignore[arg-type]  # deliberately wrong


def test_attempts_are_one_based() -> None:
    p = RetryPolicy(max_retries=3)
    assert [should_retry(a, p) for a in range(1, 6)] == [True, True, True, False, False]
    assert not should_retry(1, RetryPolicy(max_retries=0))
    with pytest.raises(ValueError):
        should_retry(0, p)


def test_huge_retry_numbers_do_not_overflow() -> None:
    p = RetryPolicy(base_delay_s=0.001, max_delay_s=MAX_DELAY_LIMIT_S)
    assert backoff_s(10**6, p) == MAX_DELAY_LIMIT_S
    assert backoff_s(2000, p) == MAX_DELAY_LIMIT_S
    with pytest.raises(ValueError):
        backoff_s(-1, p)


def test_no_jitter_is_exact_and_jitter_is_reproducible() -> None:
    p = RetryPolicy(jitter=False)
    assert retry_delay_s(2, p, random.Random(1)) == 40.0
    q = RetryPolicy(jitter=True)
    assert retry_delay_s(2, q, random.Random(7)) == retry_delay_s(2, q, random.Random(7))


@FAST
@given(p=policies(), retry=st.integers(0, 5000))
def test_backoff_bounds_and_monotonic(p: RetryPolicy, retry: int) -> None:
    b = backoff_s(retry, p)
    assert p.base_delay_s <= b <= p.max_delay_s
    assert b <= backoff_s(retry + 1, p)
    if retry < 60:
        assert b == min(p.max_delay_s, p.base_delay_s * 2**retry)


@FAST
@given(p=policies(), retry=st.integers(0, 5000), seed=st.integers(0, 2**32))
def test_jitter_bounds(p: RetryPolicy, retry: int, seed: int) -> None:
    b = backoff_s(retry, p)
    d = retry_delay_s(retry, p, random.Random(seed))
    assert b <= d <= b + JITTER_FRACTION * b
    assert d <= p.max_delay_s * (1 + JITTER_FRACTION) * (1 + 1e-12)
    if not p.jitter:
        assert d == b


def test_jitter_spreads() -> None:
    p = RetryPolicy(max_delay_s=3600)
    rng = random.Random(0)
    delays = {retry_delay_s(50, p, rng) for _ in range(100)}
    assert len(delays) == 100
    assert min(delays) >= 3600 and max(delays) <= 3960

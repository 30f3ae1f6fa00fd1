"""parse_cron keeps the specs of valid expressions (a create parses its schedule three times):
a kept spec must be exactly what a fresh parse gives, and an invalid expression must raise
every time (nothing is kept for it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.errors import InvalidSchedule
from duetime.core.schedule import _parse_cron, parse_cron

_FIELD = st.one_of(
    st.just("*"),
    st.integers(0, 59).map(str),
    st.tuples(st.integers(0, 20), st.integers(21, 59)).map(lambda r: f"{r[0]}-{r[1]}"),
    st.integers(1, 15).map(lambda n: f"*/{n}"),
)


@given(st.lists(_FIELD, min_size=5, max_size=5).map(" ".join))
def test_a_kept_spec_equals_a_fresh_parse(expr: str) -> None:
    try:
        fresh = _parse_cron.__wrapped__(expr)
    except InvalidSchedule:
        with pytest.raises(InvalidSchedule):
            parse_cron(expr)
        return
    assert parse_cron(expr) == fresh
    assert parse_cron(expr) is parse_cron(expr)  # the second call is the kept one


def test_an_invalid_expression_raises_every_time() -> None:
    for _ in range(3):
        with pytest.raises(InvalidSchedule, match="out of range"):
            parse_cron("0 25 * * *")


def test_the_type_and_length_checks_run_before_the_cache() -> None:
    with pytest.raises(InvalidSchedule):
        parse_cron(["* * * * *"])  # type: ignore[arg-type]  # hostile input: unhashable
    with pytest.raises(InvalidSchedule, match="longer than"):
        parse_cron("* " * 1000)

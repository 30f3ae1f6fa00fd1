"""The crowd lead (schedulers/crowd.py): which near-term jobs to fire now, ahead of their
wake-up, so that a crowd goes out at the planned rate and is out by its time. Pure arithmetic:
property tests over (wake, jobs) groups."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from duetime.schedulers.crowd import Crowd, crowd_lead

NOW = 1_000_000


@st.composite
def crowds(draw: st.DrawFn) -> list[tuple[int, int]]:
    """Groups in ascending wake order, some overdue, some past any cap."""
    wakes = sorted(
        set(draw(st.lists(st.integers(NOW - 2_000, NOW + 30_000), min_size=0, max_size=30)))
    )
    return [(w, draw(st.integers(1, 5_000))) for w in wakes]


rates = st.floats(1.0, 50_000.0)
caps = st.integers(0, 20_000)


def _turn_came(groups: list[tuple[int, int]], now: int, rate: float, cap: int) -> list[int]:
    """The wake-ups whose jobs must start going out by ``now`` (the definition, walked)."""
    seen, came = 0, []
    for wake, jobs in groups:
        seen += jobs
        if now < wake <= now + cap and wake - (seen - 1) * 1000 / rate <= now:
            came.append(wake)
    return came


@settings(max_examples=300)
@given(crowds(), rates, caps)
def test_never_earlier_than_the_cap_nor_later_than_the_base_lead(
    groups: list[tuple[int, int]], rate: float, cap: int
) -> None:
    crowd = crowd_lead(groups, NOW, rate, cap)
    assert NOW <= crowd.until_ms <= NOW + cap
    # it fires nothing for no reason: the last group it reaches had its turn
    if crowd.until_ms > NOW:
        assert crowd.until_ms in _turn_came(groups, NOW, rate, cap)


@settings(max_examples=300)
@given(crowds(), rates, caps)
def test_every_group_whose_turn_came_fires_with_all_before_it(
    groups: list[tuple[int, int]], rate: float, cap: int
) -> None:
    """Monotone in due order: the jobs fired are a prefix of the wake order, and it reaches
    every group whose jobs (with all those before them) take until its wake-up to go out."""
    crowd = crowd_lead(groups, NOW, rate, cap)
    for wake in _turn_came(groups, NOW, rate, cap):
        assert crowd.until_ms >= wake


@settings(max_examples=200)
@given(
    st.integers(1, 1_000),
    st.floats(1.01, 20.0),
    st.integers(1, 300),
    st.integers(0, 20_000),
    st.integers(0, 5),
)
def test_a_steady_load_under_the_rate_gets_no_extra_lead(
    gap_ms: int, slower: float, jobs: int, cap: int, due_now: int
) -> None:
    """One job every ``gap_ms`` from now on (and a few due now), the rate above that: nothing
    fires before its wake-up (a job alone neither)."""
    rate = 1000 / gap_ms * slower
    groups = [(NOW, due_now)] if due_now else []
    groups += [(NOW + (i + 1) * gap_ms + due_now * gap_ms, 1) for i in range(jobs)]
    assert crowd_lead(groups, NOW, rate, cap).until_ms == NOW


@settings(max_examples=300)
@given(st.integers(1, 200_000), rates, st.integers(1, 20_000), st.integers(1, 30_000))
def test_a_burst_of_n_goes_out_n_over_the_rate_ahead(
    n: int, rate: float, cap: int, ahead_ms: int
) -> None:
    """A burst of N waking at W starts going out no later than W − (N − 1) / rate (when the
    cap allows): its last job is out by W at the rate."""
    wake = NOW + ahead_ms
    crowd = crowd_lead([(wake, n)], NOW, rate, cap)
    if ahead_ms <= cap and ahead_ms <= (n - 1) * 1000 / rate:
        assert crowd.until_ms == wake
    else:
        assert crowd.until_ms == NOW
        if ahead_ms <= cap:
            assert crowd.next_ms is not None
            assert crowd.next_ms <= wake - (n - 1) * 1000 / rate + 1


@settings(max_examples=300)
@given(crowds(), rates, caps, st.data())
def test_more_jobs_never_fire_later(
    groups: list[tuple[int, int]], rate: float, cap: int, data: st.DataObject
) -> None:
    more = [(w, jobs + data.draw(st.integers(0, 1_000))) for w, jobs in groups]
    assert crowd_lead(more, NOW, rate, cap).until_ms >= crowd_lead(groups, NOW, rate, cap).until_ms


@settings(max_examples=300)
@given(crowds(), rates, caps, st.data())
def test_the_next_turn_is_when_the_next_group_must_start(
    groups: list[tuple[int, int]], rate: float, cap: int, data: st.DataObject
) -> None:
    """Nothing more is fired before ``next_ms`` (the timer may sleep until then); at it, more
    is. Also with ``total`` (the walk stops early; ``next_ms`` may come sooner, never later)."""
    crowd = crowd_lead(groups, NOW, rate, cap)
    total = sum(jobs for _, jobs in groups)
    short = crowd_lead(groups, NOW, rate, cap, total=total)
    assert short.until_ms == crowd.until_ms
    if crowd.next_ms is not None:
        assert short.next_ms is not None and short.next_ms <= crowd.next_ms
    if crowd.next_ms is None:
        return
    assert crowd.next_ms > NOW
    before = data.draw(st.integers(NOW, crowd.next_ms - 1))
    # later, the same groups: the ones waking by then are due anyway
    assert crowd_lead(groups, before, rate, cap).until_ms == max(before, crowd.until_ms)
    assert crowd_lead(groups, crowd.next_ms, rate, cap).until_ms > crowd.until_ms


def test_off_without_a_cap_or_a_rate() -> None:
    assert crowd_lead([(NOW + 10, 10**6)], NOW, 1000.0, 0).until_ms == NOW
    assert crowd_lead([(NOW + 10, 10**6)], NOW, 0.0, 10_000).until_ms == NOW


def test_overdue_jobs_go_out_first() -> None:
    """1,000 overdue jobs at 1,000/s take a second: a group waking 1.5 s ahead with 600 more
    must start now (1.6 s of jobs before its wake-up; without the overdue, 0.6 s)."""
    groups = [(NOW - 100, 1_000), (NOW + 1_500, 600)]
    assert crowd_lead(groups, NOW, 1000.0, 10_000).until_ms == NOW + 1_500
    assert crowd_lead(groups[1:], NOW, 1000.0, 10_000).until_ms == NOW


def test_a_crowd_beyond_the_cap_has_its_turn_when_it_comes_within_it() -> None:
    """A group beyond the cap whose turn has long come is due once it is within the cap: the
    timer must wake then, not at a nearer group's later turn (hypothesis found it: the walk
    stopped at the cap, and 459 ms before next_ms the same groups fired 19 s ahead)."""
    groups = [(NOW + 100, 1), (NOW + 1_010, 200)]
    crowd = crowd_lead(groups, NOW, 167.0, 1_000)
    assert crowd == Crowd(NOW, NOW + 10)
    assert crowd_lead(groups, NOW + 9, 167.0, 1_000).until_ms == NOW + 9
    assert crowd_lead(groups, NOW + 10, 167.0, 1_000).until_ms == NOW + 1_010


def _turns(
    groups: list[tuple[int, int]], now: int, rate: float, cap: int
) -> list[tuple[int, float]]:
    """(wake, turn) of every group waking after ``now``: the instant its jobs, with all those
    before them, must start going out (no earlier than the cap before its wake-up)."""
    seen, out = 0, []
    for wake, jobs in groups:
        seen += jobs
        if wake > now:
            out.append((wake, max(wake - (seen - 1) * 1000 / rate, wake - cap)))
    return out


@settings(max_examples=500)
@given(crowds(), rates, caps, st.integers(1, 2_000))
def test_a_minimum_lead_only_lets_the_timer_sleep_through_small_turns(
    groups: list[tuple[int, int]], rate: float, cap: int, min_lead: int
) -> None:
    """With ``min_lead_ms`` the same jobs fire now, and the timer may sleep longer, but only
    through turns less than ``min_lead_ms`` before their wake-up: a group asleep through its
    turn goes out no later than that after it (at the caller's next look, or its wake-up)."""
    exact = crowd_lead(groups, NOW, rate, cap)
    for total in (None, sum(jobs for _, jobs in groups)):
        lax = crowd_lead(groups, NOW, rate, cap, total=total, min_lead_ms=min_lead)
        assert lax.until_ms == exact.until_ms
        end = math.inf if lax.next_ms is None else lax.next_ms
        for wake, turn in _turns(groups, NOW, rate, cap):
            if wake > lax.until_ms and NOW < math.ceil(turn) < end:
                assert wake - turn < min_lead, (wake, turn, lax)

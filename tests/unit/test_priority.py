"""Priority selection (duetime.core.priority): examples and hypothesis properties."""

from __future__ import annotations

import math
from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.errors import ConfigError
from duetime.core.models import PRIORITY_ORDER, Priority
from duetime.core.priority import Waiting, effective_priority, reserved_slots, select_next

C, H, N, L = PRIORITY_ORDER
NON_CRITICAL = (H, N, L)


# --- strategies -------------------------------------------------------------------------


@st.composite
def queues(draw: st.DrawFn) -> dict[Priority, list[Waiting]]:
    """FIFO queues per priority: enqueue times ascending within each queue."""
    result: dict[Priority, list[Waiting]] = {}
    for p in PRIORITY_ORDER:
        times = sorted(draw(st.lists(st.integers(0, 1000), max_size=5)))
        result[p] = [Waiting(float(t), f"{p}-{i}") for i, t in enumerate(times)]
    return result


@st.composite
def capacity(draw: st.DrawFn) -> tuple[int, int, dict[Priority, int]]:
    slots = draw(st.integers(1, 12))
    reserved = draw(st.integers(0, slots))
    total = draw(st.integers(0, slots))
    split = sorted(draw(st.lists(st.integers(0, total), min_size=3, max_size=3)))
    counts = [a - b for a, b in zip([*split, total], [0, *split], strict=True)]
    return slots, reserved, dict(zip(PRIORITY_ORDER, counts, strict=True))


aging = st.one_of(st.floats(0.5, 500.0), st.just(math.inf))
nows = st.integers(0, 3000).map(float)


def startable(
    qs: dict[Priority, list[Waiting]], slots: int, reserved: int, running_total: int
) -> set[Priority]:
    """Oracle: the queues whose head is allowed to start."""
    ok = {p for p in NON_CRITICAL if qs[p] and running_total < slots - reserved}
    if qs[C] and running_total < slots:
        ok.add(C)
    return ok


def qs_of(waiting: dict[Priority, deque[Waiting]]) -> dict[Priority, list[Waiting]]:
    return {p: list(q) for p, q in waiting.items()}


def oracle_rank(p: Priority, w: Waiting, aging_s: float, now: float) -> int:
    if p is C:
        return 0
    waited = now - w.enqueued_at
    steps = 0 if waited <= 0 or math.isinf(aging_s) else int(waited // aging_s)
    return max(1, p.rank - steps)


# --- properties of one call ----------------------------------------------------------------


@given(queues(), capacity(), aging, nows)
def test_choice_matches_oracle(
    qs: dict[Priority, list[Waiting]],
    cap: tuple[int, int, dict[Priority, int]],
    aging_s: float,
    now: float,
) -> None:
    slots, reserved, running = cap
    total = sum(running.values())
    chosen = select_next(qs, running, slots, reserved, aging_s, now)
    allowed = startable(qs, slots, reserved, total)
    # None iff nothing may start.
    assert (chosen is None) == (not allowed)
    if chosen is None:
        return
    assert chosen in allowed
    # Reserved capacity is never taken by non-critical work.
    if chosen is not C:
        assert total < slots - reserved
    # Critical always first when it may start.
    if C in allowed:
        assert chosen is C

    # The best effective priority, then the oldest, then the more urgent base.
    def key(p: Priority) -> tuple[int, float, int]:
        return (oracle_rank(p, qs[p][0], aging_s, now), qs[p][0].enqueued_at, p.rank)

    assert key(chosen) == min(key(p) for p in allowed)


@given(queues(), capacity(), aging, nows, st.data())
def test_drain_is_fifo_per_priority_and_respects_reservation(
    qs: dict[Priority, list[Waiting]],
    cap: tuple[int, int, dict[Priority, int]],
    aging_s: float,
    now: float,
    data: st.DataObject,
) -> None:
    slots, reserved, running = cap
    running = dict(running)
    waiting = {p: deque(q) for p, q in qs.items()}
    started: dict[Priority, list[Waiting]] = {p: [] for p in PRIORITY_ORDER}
    for _ in range(200):
        chosen = select_next(waiting, running, slots, reserved, aging_s, now)
        total = sum(running.values())
        assert (chosen is None) == (not startable(qs_of(waiting), slots, reserved, total))
        if chosen is None:
            busy = [p for p in PRIORITY_ORDER if running[p]]
            if not busy or not any(waiting.values()):
                break
            running[data.draw(st.sampled_from(busy))] -= 1  # something finished
            now += data.draw(st.integers(0, 100))
            continue
        if chosen is not C:
            assert total + 1 <= slots - reserved
        assert total + 1 <= slots
        started[chosen].append(waiting[chosen].popleft())
        running[chosen] += 1
    for p in PRIORITY_ORDER:
        assert started[p] == qs[p][: len(started[p])]


# --- starvation -----------------------------------------------------------------------------


def simulate(
    aging_s: float,
    slots: int,
    reserved: int,
    critical_per_tick: int,
    high_per_tick: int,
    high_backlog: int,
    ticks: int,
) -> int | None:
    """One low item enqueued at t=0 under a constant stream of critical and high work.

    Every tick (1 s) the arrivals are enqueued, everything started last tick has finished,
    and the worker starts whatever select_next allows. Returns the tick the low item
    started, or None.
    """
    waiting: dict[Priority, deque[Waiting]] = {p: deque() for p in PRIORITY_ORDER}
    waiting[H].extend(Waiting(float(t - high_backlog), f"old-{t}") for t in range(high_backlog))
    waiting[L].append(Waiting(0.0, "low"))
    for tick in range(ticks):
        now = float(tick)
        waiting[C].extend(Waiting(now, f"c{tick}-{i}") for i in range(critical_per_tick))
        waiting[H].extend(Waiting(now, f"h{tick}-{i}") for i in range(high_per_tick))
        running = dict.fromkeys(PRIORITY_ORDER, 0)
        while (chosen := select_next(waiting, running, slots, reserved, aging_s, now)) is not None:
            item = waiting[chosen].popleft()
            running[chosen] += 1
            if item.key == "low":
                return tick
        assert not waiting[C], "critical work left waiting with capacity free"
        assert sum(running.values()) - running[C] <= slots - reserved
    return None


@given(
    aging_s=st.floats(0.5, 20.0),
    slots=st.integers(2, 16),
    share=st.floats(0.0, 0.5),
    data=st.data(),
)
def test_aging_prevents_starvation_under_constant_critical_load(
    aging_s: float, slots: int, share: float, data: st.DataObject
) -> None:
    reserved = reserved_slots(slots, share)
    free_for_others = slots - reserved
    critical_per_tick = data.draw(st.integers(1, free_for_others - 1)) if free_for_others > 1 else 0
    non_critical_per_tick = free_for_others - critical_per_tick
    assert non_critical_per_tick >= 1  # "provided non-critical capacity exists"
    # High work arrives at least as fast as it can be served, so without aging it starves
    # the low item forever.
    high_per_tick = data.draw(st.integers(non_critical_per_tick, non_critical_per_tick + 5))
    high_backlog = data.draw(st.integers(0, 50))
    # Low reaches effective high at 2 * aging_s; then only the high work enqueued no later
    # than it (the backlog and tick 0's arrivals) goes first.
    ahead = high_backlog + high_per_tick
    bound = math.ceil(2 * aging_s) + math.ceil(ahead / non_critical_per_tick)
    args = (slots, reserved, critical_per_tick, high_per_tick, high_backlog)
    started = simulate(aging_s, *args, ticks=bound + 1)
    assert started is not None and started <= bound
    assert simulate(math.inf, *args, ticks=bound + 20) is None  # control: it does starve


# --- examples -------------------------------------------------------------------------------


def test_effective_priority_ages_one_level_per_period_up_to_high() -> None:
    assert effective_priority(L, 0.0, 10.0) is L
    assert effective_priority(L, 9.99, 10.0) is L
    assert effective_priority(L, 10.0, 10.0) is N
    assert effective_priority(L, 20.0, 10.0) is H
    assert effective_priority(L, 1e9, 10.0) is H  # never critical
    assert effective_priority(N, 10.0, 10.0) is H
    assert effective_priority(H, 1e9, 10.0) is H
    assert effective_priority(C, 1e9, 10.0) is C
    assert effective_priority(L, -5.0, 10.0) is L  # clock skew: no promotion
    assert effective_priority(L, 1e9, math.inf) is L


def test_aged_low_beats_fresh_high_but_not_critical() -> None:
    qs = {H: [Waiting(100.0, "h")], L: [Waiting(0.0, "l")]}
    idle = dict.fromkeys(PRIORITY_ORDER, 0)
    assert select_next(qs, idle, 4, 1, 60.0, 100.0) is H  # low aged to normal only
    assert select_next(qs, idle, 4, 1, 50.0, 100.0) is L  # low aged to high, older
    qs[C] = [Waiting(100.0, "c")]
    assert select_next(qs, idle, 4, 1, 50.0, 100.0) is C


def test_reserved_slot_is_kept_for_critical() -> None:
    qs = {H: [Waiting(0.0, "h")]}
    running = {C: 0, H: 3, N: 0, L: 0}
    assert select_next(qs, running, 4, 1, 60.0, 0.0) is None
    qs[C] = [Waiting(5.0, "c")]
    assert select_next(qs, running, 4, 1, 60.0, 0.0) is C
    assert select_next(qs, {**running, C: 1}, 4, 1, 60.0, 0.0) is None  # all slots busy
    assert select_next({}, dict.fromkeys(PRIORITY_ORDER, 0), 4, 1, 60.0, 0.0) is None


def test_select_next_refuses_bad_arguments() -> None:
    idle = dict.fromkeys(PRIORITY_ORDER, 0)
    with pytest.raises(ValueError):
        select_next({}, idle, 0, 0, 60.0, 0.0)
    with pytest.raises(ValueError):
        select_next({}, idle, 4, 5, 60.0, 0.0)
    with pytest.raises(ValueError):
        select_next({}, idle, 4, 1, 0.0, 0.0)


@pytest.mark.parametrize(
    ("slots", "share", "expected"),
    [
        (10, 0.1, 1),
        (20, 0.1, 2),
        (15, 0.1, 1),
        (2, 0.1, 1),
        (1, 0.5, 0),
        (10, 0.0, 0),
        (10, 0.99, 9),
        (100, 0.29, 29),
        (3, 0.9, 2),
    ],
)
def test_reserved_slots_examples(slots: int, share: float, expected: int) -> None:
    assert reserved_slots(slots, share) == expected


shares = st.floats(0.0, 1.0, exclude_max=True)


@given(st.integers(1, 10_000), shares, shares)
def test_reserved_slots_bounds_and_monotonic(slots: int, a: float, b: float) -> None:
    low, high = sorted((a, b))
    r_low, r_high = reserved_slots(slots, low), reserved_slots(slots, high)
    assert 0 <= r_low <= r_high <= max(slots - 1, 0)
    if high > 0 and slots > 1:
        assert r_high >= 1
    if high == 0:
        assert r_high == 0


@pytest.mark.parametrize(
    ("slots", "share"),
    [(0, 0.1), (-1, 0.1), (True, 0.1), (2.0, 0.1), (10, -0.1), (10, 1.0), (10, math.nan)],
)
def test_reserved_slots_refuses_bad_config(slots: object, share: float) -> None:
    with pytest.raises(ConfigError):
        reserved_slots(slots, share)  # type: ignore[arg-type]  # deliberately wrong input

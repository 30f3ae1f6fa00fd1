"""The scheduler's clock check (schedulers/skew.py): the offset estimate, the verdict, and
when a scheduler fires, stays in its group, gives up and comes back. Pure: no broker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from duetime.core.config import Env
from duetime.core.errors import ConfigError
from duetime.schedulers.settings import SchedulerSettings
from duetime.schedulers.skew import Decision, Sample, SkewGuard, Verdict, classify, sample_of

WALL = 1_800_000_000_000  # a wall clock reading (ms); the monotonic clock starts at 0 below


@given(
    true_offset_ms=st.integers(-(10**8), 10**8),
    rtt_ms=st.integers(0, 60_000),
    at=st.floats(0, 1),
    sent_ms=st.integers(10**12, 3 * 10**12),
)
def test_the_true_offset_lies_within_the_estimate_s_error(
    true_offset_ms: int, rtt_ms: int, at: float, sent_ms: int
) -> None:
    """Wherever within the round trip the broker stamped the probe (whole ms, truncated),
    the true offset is within ``error_ms`` of the estimate."""
    broker_now = sent_ms + at * rtt_ms - true_offset_ms  # the broker's clock then
    sample = sample_of(sent_ms, rtt_ms / 1000, int(broker_now // 1), taken_s=1.0)
    assert abs(sample.offset_ms - true_offset_ms) <= sample.error_ms + 1e-6


@given(
    true_offset_ms=st.integers(-120_000, 120_000),
    rtt_ms=st.integers(0, 5000),
    at=st.floats(0, 1),
    bound_ms=st.integers(10, 60_000),
)
def test_a_conclusive_verdict_is_right_whatever_the_true_offset(
    true_offset_ms: int, rtt_ms: int, at: float, bound_ms: int
) -> None:
    """GOOD only if the true offset is within the bound; SKEWED only if it is beyond: a
    verdict never errs, it says UNKNOWN instead."""
    sent_ms = WALL
    broker_now = sent_ms + at * rtt_ms - true_offset_ms
    sample = sample_of(sent_ms, rtt_ms / 1000, int(broker_now // 1), taken_s=1.0)
    verdict = classify(sample, bound_ms)
    if verdict is Verdict.GOOD:
        assert abs(true_offset_ms) <= bound_ms
    elif verdict is Verdict.SKEWED:
        assert abs(true_offset_ms) > bound_ms


def test_a_fast_probe_of_a_good_clock_is_good_and_of_a_skewed_one_is_skewed() -> None:
    good = sample_of(WALL, 0.004, WALL + 2, taken_s=1.0)
    assert classify(good, 1000) is Verdict.GOOD
    ahead = sample_of(WALL + 30_000, 0.004, WALL + 2, taken_s=1.0)
    assert 29_990 <= ahead.offset_ms <= 30_010 and classify(ahead, 1000) is Verdict.SKEWED
    behind = sample_of(WALL - 30_000, 0.004, WALL + 2, taken_s=1.0)
    assert classify(behind, 1000) is Verdict.SKEWED
    slow = sample_of(WALL + 500, 2.0, WALL + 1000, taken_s=1.0)  # ±1 s around +0.5 s
    assert classify(slow, 1000) is Verdict.UNKNOWN


@given(step_ms=st.integers(-(10**7), 10**7), elapsed_s=st.floats(0, 100))
def test_a_wall_clock_step_after_the_probe_shows_at_once(step_ms: int, elapsed_s: float) -> None:
    """Carried forward on the monotonic clock: only a step of the wall clock moves it."""
    probe = Sample(offset_ms=12.0, error_ms=3.0, taken_s=5.0, wall_ms=WALL)
    now = probe.at(5.0 + elapsed_s, WALL + elapsed_s * 1000 + step_ms)
    assert now.offset_ms == pytest.approx(12.0 + step_ms, abs=1e-3)
    assert now.error_ms == probe.error_ms


def guard() -> SkewGuard:
    return SkewGuard(bound_ms=1000, give_up_s=30, stale_s=15)


def probe(g: SkewGuard, offset_ms: float, at_s: float, error_ms: float = 2.0) -> None:
    g.observe(Sample(offset_ms, error_ms, at_s, WALL + at_s * 1000 + offset_ms))


def wall(at_s: float, offset_ms: float = 0.0) -> float:
    """The wall clock at monotonic ``at_s`` of a machine ``offset_ms`` from the broker."""
    return WALL + at_s * 1000 + offset_ms


def test_nothing_fires_and_nobody_joins_before_the_first_probe() -> None:
    g = guard()
    d = g.decide(0.0, wall(0.0))
    assert (d.fire, d.member, d.verdict) == (False, False, Verdict.UNKNOWN)
    assert "not measured yet" in d.reason and d.offset_ms is None
    assert not g.decide(100.0, wall(100.0)).member  # however long it waits


def test_a_good_clock_fires_and_a_scheduler_started_skewed_never_joins() -> None:
    g = guard()
    probe(g, 3.0, 1.0)
    d = g.decide(1.1, wall(1.1, 3.0))
    assert (d.fire, d.member, d.verdict) == (True, True, Verdict.GOOD)

    bad = guard()
    probe(bad, 30_000.0, 1.0)
    for t in (1.0, 10.0):
        d = bad.decide(t, wall(t, 30_000.0))
        assert (d.fire, d.member, d.verdict) == (False, False, Verdict.SKEWED)
    assert "+30.000 s" in d.reason and "DUETIME_SCHEDULER_MAX_CLOCK_SKEW_S=1 s" in d.reason
    assert not bad.decide(100.0, wall(100.0, 30_000.0)).member  # stale: unknown, still out


def test_a_step_stops_firing_in_the_same_cycle_gives_up_later_and_comes_back() -> None:
    g = guard()
    probe(g, 0.0, 1.0)
    assert g.decide(2.0, wall(2.0)).fire
    # the clock is set 30 s ahead at t=3 s: no probe needed to see it
    d = g.decide(3.0, wall(3.0, 30_000.0))
    assert (d.fire, d.member, d.verdict) == (False, True, Verdict.SKEWED)
    assert d.offset_ms == pytest.approx(30_000.0)
    probe(g, 30_000.0, 5.0)
    probe(g, 30_000.0, 30.0)  # the probes go on every few seconds
    assert g.decide(32.9, wall(32.9, 30_000.0)).member  # within DUETIME_..._GIVE_UP_S
    d = g.decide(33.0, wall(33.0, 30_000.0))
    assert (d.fire, d.member) == (False, False)
    # set right again: the carried-forward probe shows it; the next probe confirms it
    d = g.decide(40.0, wall(40.0))
    assert (d.fire, d.member, d.verdict) == (True, True, Verdict.GOOD)
    probe(g, 1.0, 41.0)
    assert g.decide(41.0, wall(41.0, 1.0)).fire


def test_a_skew_that_ends_before_the_give_up_keeps_the_partitions() -> None:
    g = guard()

    def tick(at_s: float, offset_ms: float) -> Decision:
        probe(g, offset_ms, at_s)  # a probe right before each decision: never stale
        return g.decide(at_s, wall(at_s, offset_ms))

    assert tick(0.0, 0.0).fire
    assert tick(1.0, 5000.0).member
    assert tick(20.0, 0.0).fire
    # a new skew counts its give-up time afresh
    assert tick(21.0, 5000.0).member
    assert tick(50.9, 5000.0).member
    assert not tick(51.0, 5000.0).member


def test_an_inconclusive_probe_keeps_the_last_conclusive_verdict_while_it_is_fresh() -> None:
    g = guard()
    probe(g, 0.0, 0.0)
    probe(g, 900.0, 5.0, error_ms=500.0)  # the clock moved; a slow round trip: cannot tell
    d = g.decide(6.0, wall(6.0, 900.0))  # the probe at 0 s, carried forward: +0.9 s ±2 ms
    assert d.fire and d.offset_ms == pytest.approx(900.0)
    d = g.decide(15.5, wall(15.5, 900.0))  # that probe is stale, the slow one cannot tell
    assert (d.fire, d.verdict) == (False, Verdict.UNKNOWN)
    assert "cannot tell" in d.reason
    skewed = guard()
    probe(skewed, 30_000.0, 0.0)
    probe(skewed, 900.0, 5.0, error_ms=500.0)
    assert skewed.decide(6.0, wall(6.0, 30_000.0)).verdict is Verdict.SKEWED


def test_a_dead_probe_stops_firing_then_gives_up() -> None:
    g = guard()
    probe(g, 0.0, 0.0)
    assert g.decide(15.0, wall(15.0)).fire
    d = g.decide(15.1, wall(15.1))  # no probe for stale_s: unknown
    assert (d.fire, d.member, d.verdict) == (False, True, Verdict.UNKNOWN)
    assert "no clock probe for 15 s" in d.reason
    assert not g.decide(45.1, wall(45.1)).member


def test_clock_settings_defaults_and_bounds() -> None:
    s = SchedulerSettings.from_env(Env({}))
    assert (s.max_clock_skew_s, s.clock_give_up_s, s.clock_probe_s) == (1.0, 30.0, 5.0)
    assert s.clock_stale_s == 15.0
    s = SchedulerSettings.from_env(
        Env(
            {
                "DUETIME_SCHEDULER_MAX_CLOCK_SKEW_S": "0.25",
                "DUETIME_SCHEDULER_CLOCK_GIVE_UP_S": "2",
                "DUETIME_SCHEDULER_CLOCK_PROBE_S": "0.5",
            }
        )
    )
    assert (s.max_clock_skew_s, s.clock_give_up_s, s.clock_probe_s) == (0.25, 2.0, 0.5)
    assert s.clock_stale_s == 5.0  # the floor: one late probe is not a dead one


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DUETIME_SCHEDULER_MAX_CLOCK_SKEW_S", "0"),
        ("DUETIME_SCHEDULER_MAX_CLOCK_SKEW_S", "one"),
        ("DUETIME_SCHEDULER_MAX_CLOCK_SKEW_S", "nan"),
        ("DUETIME_SCHEDULER_CLOCK_GIVE_UP_S", "-1"),
        ("DUETIME_SCHEDULER_CLOCK_PROBE_S", "0"),
        ("DUETIME_SCHEDULER_CLOCK_PROBE_S", "inf"),
    ],
)
def test_bad_clock_settings_name_the_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        SchedulerSettings.from_env(Env({variable: value}))
    assert variable in info.value.message

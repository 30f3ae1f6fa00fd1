"""The projector's quiet-partition bookkeeping (pure logic, property-tested)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from duetime.consumers.projector.quiet import QuietPartitions

KEYS = [("jobs", 0), ("jobs", 1), ("state", 0), ("exec.normal", 2), ("dags", 1)]
key = st.sampled_from(KEYS)
step = st.one_of(
    st.tuples(st.just("assign"), st.lists(key, max_size=3)),
    st.tuples(st.just("revoke"), st.lists(key, max_size=3)),
    st.tuples(st.just("saw"), st.lists(key, max_size=3)),
    st.tuples(st.just("probe"), st.dictionaries(key, st.integers(-1, 5))),
    st.tuples(st.just("wait"), st.floats(0, 3)),
)


@given(st.lists(step, max_size=40))
def test_bookkeeping_never_strands_a_partition_with_records(steps: list[tuple[str, Any]]) -> None:
    q = QuietPartitions(after_s=1.0, probe_s=0.2)
    now, assigned, last = 0.0, set(), {}
    positions = dict.fromkeys(KEYS, 2)
    for kind, arg in steps:
        if kind == "assign":
            q.assigned(arg, now)
            assigned |= set(arg)
            last.update(dict.fromkeys(arg, now))
        elif kind == "revoke":
            q.revoked(arg)
            assigned -= set(arg)
        elif kind == "saw":
            q.saw(arg, now)
            last.update({k: now for k in arg if k in assigned and k not in q.paused})
        elif kind == "wait":
            now += arg
        else:
            if not q.due(now):
                continue
            idle = q.begin(now)
            # only partitions that brought nothing for after_s are paused
            assert all(now - last[k] >= q.after_s for k in idle)
            q.paused_now(idle)
            wake = q.to_resume(arg, positions)
            for k in q.paused:  # a partition with more, or an unknown end, is woken up
                end = arg.get(k)
                assert (k in wake) == (end is None or end < 0 or end > positions[k])
            q.resumed(wake, now)
            last.update(dict.fromkeys(wake, now))
            assert not (set(wake) & q.paused)
        # every tracked partition is assigned, either fetched or paused, never both
        assert q.paused | set(q.last_record_at) <= assigned
        assert not (q.paused & set(q.last_record_at))


def test_a_disabled_tracker_is_never_due() -> None:
    q = QuietPartitions(after_s=0, probe_s=0.2)
    q.assigned(KEYS, 0.0)
    assert not q.due(100.0)


def test_a_partition_that_brings_records_stays_fetched() -> None:
    q = QuietPartitions(after_s=1.0, probe_s=0.2)
    q.assigned(KEYS, 0.0)
    q.saw([("state", 0)], 0.9)
    idle = q.begin(1.5)
    assert ("state", 0) not in idle and ("jobs", 0) in idle
    q.paused_now(idle)
    assert q.to_resume({k: 2 for k in idle}, dict.fromkeys(idle, 2)) == []
    assert q.to_resume({("jobs", 0): 3}, {("jobs", 0): 2}) == sorted(idle)  # others unknown

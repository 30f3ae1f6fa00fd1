"""The scheduler cycle's pure choices in a burst (schedulers/service.py): which partition fires
first, and how many input records a cycle reads while a burst is being fired."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from duetime.schedulers.service import fire_order, read_limit, unproven

partitions = st.sets(st.integers(0, 255), max_size=64)


@given(owned=partitions, first=st.integers(0, 300))
def test_every_owned_partition_fires_once_a_cycle_from_where_the_last_stopped(
    owned: set[int], first: int
) -> None:
    order = fire_order(owned, first)
    assert sorted(order) == sorted(owned)  # each once
    later = sorted(p for p in owned if p >= first)
    earlier = sorted(p for p in owned if p < first)
    # from the first partition at or after `first`, ascending, wrapping around
    assert order == later + earlier


def test_the_partition_the_budget_ran_out_after_goes_last() -> None:
    # the budget ran out in partition 4: the next cycle starts at 5, and 4 waits its turn
    assert fire_order([0, 2, 4, 5, 9], 5) == [5, 9, 0, 2, 4]
    assert fire_order([0, 2, 4], 5) == [0, 2, 4]


@given(
    bursting=st.booleans(),
    batch_size=st.integers(1, 100_000),
    cycle_fire_limit=st.integers(1, 1_000_000),
)
def test_a_burst_reads_a_fifth_of_the_fire_budget_never_nothing(
    bursting: bool, batch_size: int, cycle_fire_limit: int
) -> None:
    limit = read_limit(bursting, batch_size, cycle_fire_limit)
    assert 1 <= limit <= batch_size  # inputs always progress, never past a batch
    if bursting:
        assert limit == max(1, min(batch_size, cycle_fire_limit // 5))
    else:
        assert limit == batch_size


@dataclass(eq=False)
class _Owner:
    proven_at: float


def test_a_stall_starts_over_the_idle_partitions_not_proven_since_the_round_began() -> None:
    owners = {0: _Owner(5.0), 1: _Owner(12.0), 2: _Owner(3.0), 3: _Owner(9.0)}
    # the round began at 10: 0 was committing (its own stall decides), 1 committed since
    assert unproven(owners, [owners[0]], 10.0) == [owners[2], owners[3]]


@given(
    proven=st.dictionaries(st.integers(0, 63), st.floats(0, 100), max_size=32),
    committing=st.sets(st.integers(0, 63)),
    since=st.floats(0, 100),
)
def test_every_idle_unproven_owner_is_started_over_and_no_other(
    proven: dict[int, float], committing: set[int], since: float
) -> None:
    owners = {p: _Owner(at) for p, at in proven.items()}
    busy = [owners[p] for p in sorted(committing) if p in owners]
    again = unproven(owners, busy, since)
    assert not any(o in busy or o.proven_at >= since for o in again)
    left = [o for o in owners.values() if o not in again]
    assert all(o in busy or o.proven_at >= since for o in left)
    assert again == [o for _, o in sorted(owners.items()) if o in again]  # partition order

"""Incremental rebalancing of the schedulers' group (KIP-848, the broker's range assignor).

A scheduler joining or leaving moves only the partitions that change owner: the partitions a
member keeps stay with the very same ``PartitionOwner`` (never revoked, never restored again),
a joining one takes its partitions from its warm standby's copies,
every input topic of a partition goes to one member, and what falls due meanwhile fires once.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from duetime.core.config import CommonSettings
from duetime.producers.sdk import JobClient
from duetime.schedulers import metrics
from duetime.schedulers.partition import PartitionOwner
from duetime.schedulers.settings import SchedulerSettings
from tests.helpers import RunningScheduler, TopicReader, execution_reader, wait_for

TARGET = {"type": "http", "url": "http://127.0.0.1:9/none"}


@pytest.fixture
def executions(settings: CommonSettings) -> Iterator[TopicReader]:
    reader = execution_reader(settings)
    yield reader
    reader.close()


def start(settings: CommonSettings, name: str) -> RunningScheduler:
    common = replace(settings, instance_id=f"{settings.instance_id}-{name}")
    return RunningScheduler(SchedulerSettings(common=common, misfire_threshold_s=30.0))


def owners(running: RunningScheduler) -> dict[int, PartitionOwner]:
    return dict(running.scheduler.owners)


def split(a: RunningScheduler, b: RunningScheduler, partitions: int) -> bool:
    """Both own some partitions, none twice, all of them, each with every input assigned."""
    pa, pb = set(owners(a)), set(owners(b))
    if not (pa and pb and not pa & pb and len(pa | pb) == partitions):
        return False
    for running, mine in ((a, pa), (b, pb)):
        held = {(tp.topic, tp.partition) for tp in running.scheduler.consumer.assignment()}
        topics = running.scheduler.topics.scheduler_inputs
        if held != {(t, p) for p in mine for t in topics}:
            return False
    return True


def test_a_join_and_a_leave_move_only_the_partitions_that_change_owner(
    settings: CommonSettings, executions: TopicReader
) -> None:
    a = start(settings, "a")
    b: RunningScheduler | None = None
    try:
        wait_for(lambda: a.owned() == settings.partitions, 30, "a to own every partition")
        before = owners(a)
        # jobs due while b joins and while it leaves: each must fire exactly once
        now = datetime.now(UTC)
        ids: list[str] = []
        with JobClient(settings=settings) as client:
            for i in range(30):
                at = (now + timedelta(seconds=2 + i * 0.25)).isoformat()
                job = client.create_job(
                    name=f"rebalance-{i}",
                    job_id=str(uuid.uuid4()),
                    schedule={"at": at},
                    target=TARGET,
                )
                ids.append(job.job_id)

        from_copies = metrics.STANDBY_RESTORES._value.get()
        joined = b = start(settings, "b")
        wait_for(
            lambda: split(a, joined, settings.partitions), 30, "a and b to split the partitions"
        )
        kept = owners(a)
        # what a kept was never revoked: the same owners, not restored afresh
        assert all(kept[p] is before[p] for p in kept), "a kept partition was taken again"
        assert set(before) - set(kept) == set(owners(joined))
        # b warmed its standby up before it joined: what it took came from its copies
        assert metrics.STANDBY_RESTORES._value.get() - from_copies == len(owners(joined))

        moved = owners(joined)
        joined.stop()
        b = None
        wait_for(lambda: a.owned() == settings.partitions, 30, "a to take b's partitions back")
        after = owners(a)
        assert all(after[p] is kept[p] for p in kept), "the leave disturbed a's own partitions"
        assert all(after[p] is not before[p] for p in moved), "a moved partition was not retaken"

        def all_fired() -> bool:
            seen = {r["job_id"] for r in executions.snapshot()}
            return set(ids) <= seen

        wait_for(all_fired, 30, "every job due across the join and the leave to fire")
        counts = Counter(r["job_id"] for r in executions.snapshot() if r["job_id"] in set(ids))
        assert {job: n for job, n in counts.items() if n != 1} == {}
    finally:
        if b is not None:
            b.stop()
        a.stop()

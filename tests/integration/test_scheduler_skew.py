"""The scheduler's clock check against the real broker (issue 14 item 8): the probe reads the
broker's time, and a scheduler whose wall clock is set 30 s ahead stops firing at once, holds
back the inputs that would emit, leaves its group, and comes back when its clock is right."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import REGISTRY

from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.producers.sdk import JobClient
from duetime.schedulers.service import Scheduler
from duetime.schedulers.settings import SchedulerSettings
from duetime.schedulers.skew import ClockProbe, SkewGuard, Verdict
from tests.helpers import TopicReader, execution_reader, reader, wait_for
from tests.offset_clock import OffsetClock

HTTP_TARGET = {"type": "http", "url": "http://127.0.0.1:9/none"}


@pytest.mark.parametrize("offset_ms", [0, 30_000, -30_000])
def test_the_probe_measures_the_clock_against_the_broker_s(
    settings: CommonSettings, offset_ms: int
) -> None:
    guard = SkewGuard(bound_ms=1000, give_up_s=30, stale_s=15)
    probe = ClockProbe(
        settings, Topics(settings.topic_prefix).clock, OffsetClock(offset_ms), guard, 1.0
    )
    try:
        sample = probe.probe_once()
        assert sample is not None, "the probe got no broker timestamp"
        # the broker runs on this machine: the true offset is the one the clock adds
        assert abs(sample.offset_ms - offset_ms) <= sample.error_ms + 2
        assert sample.error_ms < 1000, "a local broker answers well within a second"
        expected = Verdict.GOOD if offset_ms == 0 else Verdict.SKEWED
        assert probe.decide(OffsetClock(offset_ms).now_ms()).verdict is expected
    finally:
        probe.stop()


def test_the_probe_without_its_topic_fails_and_nothing_fires(settings: CommonSettings) -> None:
    guard = SkewGuard(bound_ms=1000, give_up_s=30, stale_s=15)
    probe = ClockProbe(settings, f"{settings.topic_prefix}no-such-clock", OffsetClock(), guard, 1)
    before = REGISTRY.get_sample_value("duetime_scheduler_clock_probe_failures_total") or 0
    try:
        assert probe.probe_once() is None
        after = REGISTRY.get_sample_value("duetime_scheduler_clock_probe_failures_total")
        assert after == before + 1
        decision = probe.decide(OffsetClock().now_ms())
        assert not decision.fire and not decision.member
    finally:
        probe.stop()


class Threaded:
    """A scheduler with its own clock in a thread of the test process."""

    def __init__(self, settings: SchedulerSettings, clock: OffsetClock) -> None:
        self.scheduler = Scheduler(settings, clock)
        self.thread = threading.Thread(target=self.scheduler.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.scheduler.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "scheduler did not stop within 30 s"


@pytest.fixture
def executions(settings: CommonSettings) -> Iterator[TopicReader]:
    got = execution_reader(settings)
    yield got
    got.close()


def execution_records_written(settings: CommonSettings) -> int:
    """Offsets used in the execution topics (records and transaction markers): 0 while no
    transaction has ever written an execution request."""
    consumer: Consumer = reader(settings.bootstrap_servers, "skew-watermarks")
    try:
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for topic in Topics(settings.topic_prefix).executions
            for p in range(settings.partitions)
        )
    finally:
        consumer.close()


def test_a_clock_set_ahead_stops_firing_gives_the_partitions_up_and_comes_back(
    settings: CommonSettings, executions: TopicReader, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="duetime.scheduler")
    clock = OffsetClock(0)
    running = Threaded(
        SchedulerSettings(
            common=settings, clock_give_up_s=2.0, clock_probe_s=0.2, misfire_threshold_s=60
        ),
        clock,
    )
    s = running.scheduler
    try:
        wait_for(lambda: len(s.owners) == settings.partitions and s.firing, 30, "owning, firing")
        with JobClient(settings=settings) as client:
            manual = client.create_job(name="manual", target=HTTP_TARGET)  # trigger only
            clock.set_offset(30_000)  # someone sets the clock 30 s ahead
            wait_for(lambda: not s.firing, 5, "firing to stop at the next cycle")
            due = datetime.now(UTC) + timedelta(seconds=10)
            one = client.create_job(
                name="one", schedule={"at": due.isoformat()}, target=HTTP_TARGET
            )
            client.trigger(manual.job_id)  # would emit at once: held back instead
            wait_for(
                lambda: "input held until firing resumes" in caplog.text, 10, "the trigger held"
            )
            wait_for(lambda: not s.member and not s.owners, 15, "the partitions given up")
        offset_s = REGISTRY.get_sample_value("duetime_scheduler_clock_offset_seconds")
        assert offset_s is not None and 29.9 <= offset_s <= 30.1
        assert REGISTRY.get_sample_value("duetime_scheduler_firing") == 0
        # the offset as measured against the broker's clock: 30 s to within the probe's error
        # (logged as +29.999 or +30.000 s)
        assert "giving up my partitions" in caplog.text
        assert re.search(r"wall clock \+(29\.99\d|30\.00\d) s", caplog.text), caplog.text
        # the one-time job was due 20 s ago by the scheduler's clock, the trigger wanted a run
        # now: not one execution request was ever written
        assert execution_records_written(settings) == 0

        clock.set_offset(0)  # set right: it joins again and fires on time
        wait_for(lambda: len(s.owners) == settings.partitions and s.firing, 60, "back, firing")
        wait_for(
            lambda: {r["job_id"] for r in executions.snapshot()} >= {manual.job_id, one.job_id},
            60,
            "the held trigger and the one-time job",
        )
        seen_ms = datetime.now(UTC).timestamp() * 1000
        by_job = {r["job_id"]: r for r in executions.snapshot()}
        due_ms = int(due.timestamp() * 1000)  # the job's time, in whole ms
        assert by_job[one.job_id]["scheduled_at_ms"] == due_ms
        # emitted no earlier than its fire lead before its time (the worker holds it till then)
        lead_ms = SchedulerSettings.fire_lead_ms
        assert by_job[one.job_id]["emitted_at_ms"] >= due_ms - lead_ms, "fired early"
        assert seen_ms >= due_ms - lead_ms
        assert by_job[manual.job_id]["trigger"] == "manual"
        assert [r["job_id"] for r in executions.snapshot()].count(manual.job_id) == 1
    finally:
        running.stop()

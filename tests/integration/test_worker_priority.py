"""Priorities in a real worker: a critical job overtakes a backlog, reserved critical slots,
aging under sustained load. Requests are produced straight to the execution topics (no
scheduler), so the figures measure the worker alone."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition

from duetime.consumers.worker.settings import WorkerSettings
from duetime.core.config import CommonSettings
from duetime.core.models import Priority
from duetime.core.topics import Topics
from duetime.schemas.codec import Codec
from tests.helpers import wait_for
from tests.integration import test_worker_support as support
from tests.integration.test_worker_support import RunningWorker

TRACKED = "tests.integration.test_worker_support:tracked"


def request(priority: str, payload: dict[str, Any]) -> dict[str, Any]:
    now_ms = time.time_ns() // 1_000_000
    return {
        "execution_id": str(uuid.uuid4()),
        "job_id": str(uuid.uuid4()),
        "name": f"{priority}-job",
        "attempt": 1,
        "scheduled_at_ms": now_ms,
        "due_at_ms": now_ms,
        "emitted_at_ms": now_ms,
        "priority": priority,
        "target": {"ref": TRACKED},
        "payload_json": json.dumps(payload),
        "timeout_s": 60.0,
        "trigger": "schedule",
    }


class Requests:
    def __init__(self, settings: CommonSettings) -> None:
        self.topics = Topics(settings.topic_prefix)
        self.codec = Codec()
        self.producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "linger.ms": 5})

    def send(
        self, priority: str, payload: dict[str, Any], partition: int | None = None
    ) -> dict[str, Any]:
        record = request(priority, payload)
        while True:
            try:
                self.producer.produce(
                    self.topics.execution(priority),
                    self.codec.encode("execution", record),
                    key=record["job_id"],
                    partition=-1 if partition is None else partition,  # -1: by the key
                )
                break
            except BufferError:
                self.producer.poll(0.05)
        self.producer.poll(0)
        return record

    def flush(self) -> None:
        self.producer.flush(30)


@pytest.fixture
def requests(settings: CommonSettings) -> Iterator[Requests]:
    support.reset()
    requests = Requests(settings)
    yield requests
    requests.flush()


def start(settings: CommonSettings, **overrides: Any) -> RunningWorker:
    ws = WorkerSettings(
        common=replace(settings, instance_id=f"prio-{uuid.uuid4().hex[:4]}"),
        shutdown_s=1.0,
        **overrides,
    )
    running = RunningWorker(ws)
    wait_for(lambda: running.assigned() == 4 * settings.partitions, 30, "the assignment")
    return running


def test_a_critical_job_overtakes_a_backlog_of_5000_low_ones(
    settings: CommonSettings, requests: Requests
) -> None:
    worker = start(settings, concurrency=10, critical_share=0.2, buffer=1000)
    try:
        for _ in range(5000):
            requests.send("low", {"sleep_s": 0.05})
        requests.flush()
        wait_for(lambda: len(support.STARTED) >= 50, 30, "the low backlog to be running")
        low_topic = Topics(settings.topic_prefix).execution(Priority.LOW)
        wait_for(
            lambda: low_topic in worker.worker.state.paused,
            30,
            "the buffer to fill and the low partitions to be paused",
        )
        sent_at = time.time()
        critical = requests.send("critical", {"sleep_s": 0})
        requests.flush()
        wait_for(lambda: critical["execution_id"] in support.STARTED, 10, "the critical start")
        start_s = support.STARTED[critical["execution_id"]] - sent_at
        low_done = len(support.STARTED) - 1
        print(
            f"critical started {start_s * 1000:.0f} ms after it was produced "
            f"({low_done} of 5000 low started so far)"
        )
        assert start_s < 2.0, f"the critical job waited {start_s:.2f} s behind the backlog"
        assert low_done < 5000, "the backlog must still be there for the test to mean something"
        # 2 of 10 slots are reserved: non-critical work never ran in more than 8
        assert support.MAX_RUNNING["non_critical"] == 8
    finally:
        worker.stop()


def test_a_partition_given_back_after_its_topic_resumed_is_fetched_again(
    settings: CommonSettings, requests: Requests
) -> None:
    # librdkafka keeps a partition's pause flag across a revocation and a new assignment: a
    # partition paused (a full buffer) when it was revoked, given back after its topic was
    # resumed (which reaches only the partitions assigned then), stayed paused for good and
    # its jobs never ran (the limits fault scenario at full size). Here the stale flag is set
    # on the real consumer and the assignment's notice given as the rebalance gives it; the
    # topic is not paused in the worker, so the partition must be fetched.
    worker = start(settings)
    try:
        low_topic = Topics(settings.topic_prefix).execution(Priority.LOW)
        consumer = worker.worker.consumer.consumer
        stale = [TopicPartition(low_topic, 0)]
        worker.worker.consumer.call(lambda: consumer.pause(stale))
        worker.loop.call_soon_threadsafe(worker.worker._on_assigned, [(low_topic, 0)])
        record = requests.send("low", {"sleep_s": 0}, partition=0)
        requests.flush()
        wait_for(lambda: record["execution_id"] in support.STARTED, 15, "the job to start")
    finally:
        worker.stop()


def test_aging_lets_low_jobs_through_sustained_higher_priority_load(
    settings: CommonSettings, requests: Requests
) -> None:
    # 3 non-critical slots x 20 jobs/s each = 60/s; the high stream brings 100/s
    worker = start(settings, concurrency=4, critical_share=0.25, buffer=2000, aging_s=0.3)
    stop = threading.Event()
    high_sent: list[dict[str, Any]] = []

    def load() -> None:
        while not stop.is_set():
            for _ in range(10):
                high_sent.append(requests.send("high", {"sleep_s": 0.05}))
            requests.send("critical", {"sleep_s": 0.05})
            time.sleep(0.1)  # the load's pace (100 high and 10 critical a second)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        # the high stream outruns its 3 slots: highs run and a backlog of them waits when the
        # lows arrive
        def high_backlog() -> bool:
            started = [r["execution_id"] in support.STARTED for r in list(high_sent)]
            return started.count(True) >= 3 and started.count(False) >= 50

        wait_for(high_backlog, 30, "high jobs running with a backlog behind them")
        lows = [requests.send("low", {"sleep_s": 0.05}) for _ in range(5)]
        requests.flush()
        low_ids = {r["execution_id"] for r in lows}
        wait_for(lambda: low_ids <= set(support.STARTED), 15, "the low jobs to start")
        last_low_start = max(support.STARTED[e] for e in low_ids)
        time.sleep(0.5)  # the subject: the high load goes on after the lows started
        stop.set()
        loader.join(5)
        waits = [support.STARTED[r["execution_id"]] - r["emitted_at_ms"] / 1000 for r in lows]
        later_high = [
            r
            for r in high_sent
            if r["execution_id"] in support.STARTED
            and support.STARTED[r["execution_id"]] > last_low_start
        ]
        not_started = [r for r in high_sent if r["execution_id"] not in support.STARTED]
        print(f"low waits {[round(w, 2) for w in waits]} s; high still waiting: {len(not_started)}")
        # the high backlog was still growing, yet the low jobs did not wait for it to drain
        assert later_high or not_started, "the high load was not sustained"
        assert max(waits) < 5.0
    finally:
        stop.set()
        worker.stop()

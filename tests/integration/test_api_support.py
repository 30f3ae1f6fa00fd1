"""Test support for the API and CLI tests (no tests here): the API served by uvicorn in a
thread of the test process on a free port, and checks that nothing was written."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import httpx
import psycopg
import uvicorn
from confluent_kafka import Consumer, KafkaException, TopicPartition

from duetime.consumers.worker.settings import WorkerSettings
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.producers.api.app import create_app
from duetime.producers.api.server import HTTP_PROTOCOL, LOOP
from duetime.producers.api.settings import ApiSettings
from duetime.schedulers.settings import SchedulerSettings
from tests.helpers import RunningScheduler, wait_for
from tests.integration.test_projector_support import RunningProjector
from tests.integration.test_worker_support import RunningWorker, Sink


class RunningApi:
    def __init__(self, settings: CommonSettings, **overrides: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        port = self.sock.getsockname()[1]
        self.settings = replace(ApiSettings(common=settings, port=port), **overrides)
        config = uvicorn.Config(
            create_app(self.settings),
            http=HTTP_PROTOCOL,
            loop=LOOP,
            log_config=None,
            access_log=False,
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )
        self.thread.start()
        self.url = f"http://127.0.0.1:{port}"
        wait_for(lambda: self.server.started, 30, "the API to start")

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def topic_record_count(settings: CommonSettings, only: Sequence[str] = ()) -> int:
    """Records on every job-related topic, or on the topics ``only`` names (end offsets
    summed)."""
    topics = Topics(settings.topic_prefix)
    names = list(only) or [
        topics.jobs,
        topics.control,
        topics.dags,
        topics.dag_runs,
        topics.state,
        *topics.executions,
    ]
    consumer = Consumer(
        {"bootstrap.servers": settings.bootstrap_servers, "group.id": f"count-{uuid.uuid4()}"}
    )
    try:
        total = 0
        for name in names:
            for p in range(settings.partitions):
                total += _high_watermark(consumer, TopicPartition(name, p))
        return total
    finally:
        consumer.close()


def _high_watermark(consumer: Consumer, tp: TopicPartition) -> int:
    deadline = time.monotonic() + 15
    while True:
        try:
            return int(consumer.get_watermark_offsets(tp, timeout=10)[1])
        except KafkaException:  # a topic created a moment ago may have no leader yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def table_counts(settings: CommonSettings) -> dict[str, int]:
    out = {}
    with psycopg.connect(settings.database_url) as conn:
        for table in ("jobs", "executions", "dags", "dag_runs", "dead_letters", "dlq_replays"):
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            out[table] = 0 if row is None else int(row[0])
    return out


@contextmanager
def running_stack(settings: CommonSettings) -> Iterator[Sink]:
    """Scheduler, worker and projector running; yields the HTTP sink the jobs call."""
    sink = Sink().start()
    scheduler = RunningScheduler(SchedulerSettings(common=settings, misfire_threshold_s=1.0))
    worker = RunningWorker(
        WorkerSettings(
            common=replace(settings, instance_id=f"api-w-{uuid.uuid4().hex[:4]}"),
            shutdown_s=1.0,
        )
    )
    projector = RunningProjector(settings)
    try:
        wait_for(lambda: scheduler.owned() == settings.partitions, 30, "the scheduler")
        wait_for(lambda: worker.assigned() == 4 * settings.partitions, 30, "the worker")
        yield sink
    finally:
        projector.stop()
        worker.stop()
        scheduler.stop()
        sink.stop()


def settle() -> None:
    """Give an event that should not have been written the time to show up anyway (a sleep
    that is the subject of the checks after it: nothing may arrive, so there is no condition
    to wait for)."""
    time.sleep(0.3)

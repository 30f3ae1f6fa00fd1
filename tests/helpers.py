"""Shared test helpers: waiting with a deadline, reading topics as a read_committed consumer."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import Consumer, TopicPartition

from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.schemas.codec import Codec

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.05
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail saying what we waited for."""
    deadline = time.monotonic() + timeout_s
    last: T = predicate()
    while not last:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s} s waiting for {what} (last: {last!r})"
            )
        time.sleep(interval_s)
        last = predicate()
    return last


class TopicReader:
    """A read_committed consumer over some topics, collecting decoded records in a thread."""

    def __init__(self, settings: CommonSettings, topics: list[str], event_type: str | None) -> None:
        self.codec = Codec()
        self.event_type = event_type
        self.records: list[dict[str, Any]] = []
        self.raw: list[Any] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": settings.bootstrap_servers,
                "group.id": f"test-reader-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        md = self._consumer.list_topics(timeout=10)
        self._consumer.assign(
            [TopicPartition(t, p, 0) for t in topics for p in md.topics[t].partitions]
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(500, 0.1):
                if msg.error():
                    continue
                with self._lock:
                    self.raw.append(msg)
                    if self.event_type is not None:
                        record = self.codec.decode(self.event_type, msg.value() or b"")
                        record["_topic"] = msg.topic()
                        record["_partition"] = msg.partition()
                        self.records.append(record)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.records)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


def execution_reader(settings: CommonSettings) -> TopicReader:
    return TopicReader(settings, Topics(settings.topic_prefix).executions, "execution")


class RunningScheduler:
    """A scheduler in a thread of the test process (for process-level tests use subprocesses)."""

    def __init__(self, settings: Any) -> None:
        from duetime.schedulers.service import Scheduler

        self.scheduler = Scheduler(settings)
        self.thread = threading.Thread(target=self.scheduler.run, daemon=True)
        self.thread.start()

    def owned(self) -> int:
        return len(self.scheduler.owners)

    def stop(self) -> None:
        self.scheduler.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "scheduler did not stop within 30 s"

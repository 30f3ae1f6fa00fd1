"""Test support for the projector, API and CLI tests (no tests here).

``RunningProjector`` runs the projector in a thread of the test process; ``SimWorker`` plays a
worker's part on the wire (a request in, ``running`` then ``success``/``failure`` out) for
tests that need results but are not about workers.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer

from duetime.consumers.projector.service import Projector
from duetime.consumers.projector.settings import ProjectorSettings
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.schemas.codec import Codec
from tests.helpers import wait_for


class RunningProjector:
    def __init__(
        self,
        settings: CommonSettings,
        *,
        rebuild: bool = False,
        projector_settings: ProjectorSettings | None = None,
        watch_idle: bool = True,
    ) -> None:
        """``projector_settings``: instead of the default ones (a 50 ms poll); ``watch_idle``:
        keep ``idle`` up to date (``caught_up`` waits on it)."""
        self.projector = Projector(
            projector_settings or ProjectorSettings(common=settings, poll_s=0.05),
            watch_idle=watch_idle,
        )
        if rebuild:
            self.projector.rebuild()
        self.thread = threading.Thread(target=self.projector.run, daemon=True)
        self.thread.start()

    def caught_up(self, timeout_s: float = 30) -> None:
        """Wait until the projector has read every partition to its end. Twice: a check in
        flight when this is called may have read the ends before the caller's last records
        (and set ``idle`` after the clear); the second set comes from a check begun after
        the first one ended."""
        for _ in range(2):
            self.projector.idle.clear()
            wait_for(
                lambda: self.projector.idle.is_set(),
                timeout_s,
                "the projector to read every partition to its end",
                interval_s=0.2,
            )

    def stop(self) -> None:
        self.projector.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "projector did not stop within 30 s"


def project_all(settings: CommonSettings, *, rebuild: bool = False) -> None:
    """Run a projector until it has read everything, then stop it."""
    projector = Projector(ProjectorSettings(common=settings, poll_s=0.05))
    if rebuild:
        projector.rebuild()
    thread = threading.Thread(target=lambda: projector.run(until_caught_up=True), daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "projector did not catch up within 60 s"


class SimWorker:
    """Answers every execution request: running, then success, or failure for jobs whose
    name starts with ``fail``."""

    def __init__(self, settings: CommonSettings) -> None:
        self.topics = Topics(settings.topic_prefix)
        self.codec = Codec()
        self.handled: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": settings.bootstrap_servers,
                "group.id": f"sim-worker-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self._consumer.subscribe(self.topics.executions)
        self._producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _result(self, request: dict[str, Any], status: str, now_ms: int) -> bytes:
        failed = status == "failure"
        return self.codec.encode(
            "result",
            {
                "execution_id": request["execution_id"],
                "job_id": request["job_id"],
                "attempt": request["attempt"],
                "status": status,
                "worker_id": "sim-worker",
                "lease_token": 1,
                "scheduled_at_ms": request["scheduled_at_ms"],
                "started_at_ms": now_ms,
                "finished_at_ms": None if status == "running" else now_ms + 5,
                "error": {
                    "type": "SimulatedError",
                    "message": "the test asked for a failure",
                    "retryable": True,
                    "reason": "error",
                    "http_status": None,
                }
                if failed
                else None,
                "retry_after_s": 0.1 if failed else None,
                "output_json": None,
                "priority": request["priority"],
                "dag_id": request.get("dag_id"),
                "dag_run_id": request.get("dag_run_id"),
                "dag_key": request.get("dag_key"),
            },
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(100, 0.05):
                if msg.error() or msg.value() is None:
                    continue
                request = self.codec.decode("execution", msg.value() or b"")
                now_ms = time.time_ns() // 1_000_000
                final = "failure" if request["name"].startswith("fail") else "success"
                for status in ("running", final):
                    self._producer.produce(
                        self.topics.results,
                        key=request["job_id"],
                        value=self._result(request, status, now_ms),
                        partition=msg.partition() or 0,  # co-partitioned with its job
                    )
                self._producer.flush(10)
                self.handled.append(request)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


def pg_rows(settings: CommonSettings, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(settings.database_url) as conn:
        return conn.execute(query, args).fetchall()

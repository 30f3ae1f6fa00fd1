"""What the DAG tests and the DAG benchmark share: a resolver process and a simulated worker.

``RoleProcess`` (alias ``ResolverProcess``) runs ``python -m duetime.cli resolver`` (or
another role) as a real process, so it can be SIGKILLed. ``SimWorker`` plays a worker on the
wire: it reads execution requests like a worker (read_committed) and publishes the results a
worker would (``success`` or ``failure``), with outcomes chosen per request by the test, and
may hold some results back until told. Nothing here is mocked: the broker, the scheduler and
the resolver are the real ones.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from confluent_kafka import Consumer, Producer, TopicPartition

from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.schemas.codec import Codec

Outcome = Literal["success", "failure", "fatal", "hold"]
"""success; failure (retryable: the job's retry policy decides); fatal (not retryable: dead at
once); hold (report nothing until :meth:`SimWorker.release_held`, then success)."""

LOG_DIR = Path(__file__).resolve().parents[1] / ".duetime" / "test-logs"


def role_env(settings: CommonSettings, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DUETIME_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
        "DUETIME_DATABASE_URL": settings.database_url,
        "DUETIME_TOPIC_PREFIX": settings.topic_prefix,
        "DUETIME_PARTITIONS": str(settings.partitions),
        "DUETIME_LOG_LEVEL": "INFO",
        # workers (tests/e2e/test_dag_worker.py): tasks under tests.*
        "DUETIME_WORKER_EGRESS_ALLOW": "loopback",
        "DUETIME_WORKER_PYTHON_MODULES": "tests,bench",
        **extra,
    }


@dataclass
class RoleProcess:
    """``duetime <role>`` (the resolver by default) as a child process, its output in a file."""

    settings: CommonSettings
    extra_env: dict[str, str] = field(default_factory=dict)
    role: str = "resolver"
    python_args: list[str] = field(default_factory=list)
    """Interpreter options (e.g. ``-X importtime``) or a wrapper module before ``-m``."""
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    def start(self) -> RoleProcess:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log_path = LOG_DIR / f"{self.role}-{self.settings.topic_prefix}{time.time_ns()}.log"
        with open(self.log_path, "wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, *self.python_args, "-m", "duetime.cli", self.role],
                env=role_env(self.settings, DUETIME_INSTANCE_ID=self.role, **self.extra_env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def log(self) -> str:
        return "" if self.log_path is None else self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self, timeout_s: float = 20) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode


ResolverProcess = RoleProcess


@dataclass
class Report:
    """One result the simulated worker published."""

    request: dict[str, Any]
    status: str
    at_ms: int


class SimWorker:
    """Reads execution requests, publishes results; ``outcome(request)`` decides each one."""

    def __init__(
        self,
        settings: CommonSettings,
        outcome: Callable[[dict[str, Any]], Outcome] | None = None,
        *,
        duration_s: float = 0.0,
        report_running: bool = False,
    ) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        self.codec = Codec()
        self.outcome = outcome or (lambda request: "success")
        self.duration_s = duration_s
        self.report_running = report_running
        self.requests: list[tuple[dict[str, Any], int]] = []
        """Every execution request seen, with the time it was read (ms)."""
        self.reports: list[Report] = []
        self.held: list[dict[str, Any]] = []
        self._delayed: list[tuple[float, dict[str, Any], Outcome]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._producer = Producer(
            {"bootstrap.servers": settings.bootstrap_servers, "linger.ms": 0, "acks": "all"}
        )
        self._consumer = Consumer(
            {
                "bootstrap.servers": settings.bootstrap_servers,
                "group.id": f"sim-worker-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
            }
        )
        md = self._consumer.list_topics(timeout=10)
        self._consumer.assign(
            [
                TopicPartition(t, p, 0)
                for t in self.topics.executions
                for p in md.topics[t].partitions
            ]
        )
        self._thread = threading.Thread(target=self._run, daemon=True, name="sim-worker")
        self._thread.start()

    # --- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(500, 0.005):
                if msg.error():
                    continue
                request = self.codec.decode("execution", msg.value() or b"")
                now_ms = time.time_ns() // 1_000_000
                with self._lock:
                    self.requests.append((request, now_ms))
                outcome = self.outcome(request)
                if self.report_running:
                    self._publish(request, "running")
                if outcome == "hold":
                    with self._lock:
                        self.held.append(request)
                elif self.duration_s:
                    self._delayed.append((time.monotonic() + self.duration_s, request, outcome))
                else:
                    self._publish(request, outcome)
            self._finish_due()
            self._producer.poll(0)

    def _finish_due(self) -> None:
        if not self._delayed:
            return
        now = time.monotonic()
        due = [d for d in self._delayed if d[0] <= now]
        self._delayed = [d for d in self._delayed if d[0] > now]
        for _, request, outcome in due:
            self._publish(request, outcome)

    def _publish(self, request: dict[str, Any], outcome: Outcome | str) -> None:
        now_ms = time.time_ns() // 1_000_000
        status = {"success": "success", "running": "running"}.get(outcome, "failure")
        error = None
        if status == "failure":
            error = {
                "type": "SimulatedFailure",
                "message": f"the simulated worker says {outcome}",
                "retryable": outcome != "fatal",
                "reason": "error",
                "http_status": None,
            }
        result = {
            "execution_id": request["execution_id"],
            "job_id": request["job_id"],
            "attempt": request["attempt"],
            "status": status,
            "worker_id": "sim-worker",
            "lease_token": 1,
            "scheduled_at_ms": request["scheduled_at_ms"],
            "started_at_ms": now_ms,
            "finished_at_ms": None if status == "running" else now_ms,
            "error": error,
            "retry_after_s": None,
            "output_json": None,
            "priority": request["priority"],
            "dag_id": request["dag_id"],
            "dag_run_id": request["dag_run_id"],
            "dag_key": request["dag_key"],
        }
        self._producer.produce(
            self.topics.results, key=request["job_id"], value=self.codec.encode("result", result)
        )
        self._producer.poll(0)
        with self._lock:
            self.reports.append(Report(request, status, now_ms))

    # --- what tests call -------------------------------------------------------------------

    def release_held(self, which: Callable[[dict[str, Any]], bool] = lambda r: True) -> int:
        """Publish ``success`` for the held requests ``which`` selects; returns how many."""
        with self._lock:
            chosen = [r for r in self.held if which(r)]
            self.held = [r for r in self.held if not which(r)]
        for request in chosen:
            self._publish(request, "success")
        self._producer.flush(10)
        return len(chosen)

    def requests_of(self, dag_run_id: str, key: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [
                r
                for r, _ in self.requests
                if r["dag_run_id"] == dag_run_id and (key is None or r["dag_key"] == key)
            ]

    def reports_of(self, dag_run_id: str) -> list[Report]:
        with self._lock:
            return [r for r in self.reports if r.request["dag_run_id"] == dag_run_id]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._producer.flush(10)
        self._consumer.close()

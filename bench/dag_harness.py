"""What the DAG tests and the DAG benchmark share: a resolver process and a simulated worker.

``RoleProcess`` (alias ``ResolverProcess``) runs ``python -m duetime.cli resolver`` (or
another role) as a real process of the shared harness (:mod:`duetime.infra.harness`), so it
can be SIGKILLed. ``SimWorker`` plays a worker on the
wire: it reads execution requests like a worker (read_committed) and publishes the results a
worker would (``success`` or ``failure``), with outcomes chosen per request by the test, and
may hold some results back until told. Nothing here is mocked: the broker, the scheduler and
the resolver are the real ones.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import Producer

from duetime.core.clock import SYSTEM_CLOCK, Clock
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.infra.harness import FAST_FETCH, RoleProc, assign_all, reader, role_env
from duetime.schemas.codec import Codec

Outcome = Literal["success", "failure", "fatal", "hold"]
"""success; failure (retryable: the job's retry policy decides); fatal (not retryable: dead at
once); hold (report nothing until :meth:`SimWorker.release_held`, then success)."""


@dataclass
class RoleProcess:
    """``duetime <role>`` (the resolver by default) as a process of the shared harness
    (:class:`duetime.infra.harness.RoleProc`), its output in a file of its own."""

    settings: CommonSettings
    extra_env: dict[str, str] = field(default_factory=dict)
    role: str = "resolver"
    python_args: list[str] = field(default_factory=list)
    """Interpreter options (e.g. ``-X importtime``) or a wrapper module before ``-m``."""
    proc: RoleProc | None = None

    def start(self) -> RoleProcess:
        name = f"{self.role}-{self.settings.topic_prefix}{uuid.uuid4().hex[:6]}"
        env = role_env(self.settings, DUETIME_INSTANCE_ID=self.role, **self.extra_env)
        self.proc = RoleProc.start(name, [self.role], env, python_args=self.python_args)
        return self

    def log(self) -> str:
        return "" if self.proc is None else self.proc.log()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.running

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def stop(self, timeout_s: float = 20) -> int | None:
        return None if self.proc is None else self.proc.stop(timeout_s)


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
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.settings = settings
        self.clock = clock
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
        self._consumer = reader(settings.bootstrap_servers, "sim-worker", **FAST_FETCH)
        assign_all(self._consumer, self.topics.executions, 10)
        self._thread = threading.Thread(target=self._run, daemon=True, name="sim-worker")
        self._thread.start()

    # --- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(500, 0.005):
                if msg.error():
                    continue
                request = self.codec.decode("execution", msg.value() or b"")
                now_ms = self.clock.now_ms()
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
        now_ms = self.clock.now_ms()
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

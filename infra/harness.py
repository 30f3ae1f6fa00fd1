"""The one process harness of the end-to-end tests, the fault campaign and the benchmarks.

Role: run duetime's roles as real processes (``python -m duetime.cli <role>``) with the
environment that points them at a stack, stop them (SIGTERM, then SIGKILL), SIGKILL them,
pause them, wait for their readiness (a log line, a metrics endpoint) and read their logs;
and read topics the way the checks of those tests do (a read_committed reader that assigns
every partition itself and never commits).

Guarantees:
- every wait has a deadline and its error names what it waited for; a role that exits while
  we wait for it to be ready fails the wait at once, with the tail of its log;
- a role runs in its own session (process group), so SIGKILL reaches everything it started and
  only that; ``stop`` is :func:`duetime.infra.process.terminate`, the one SIGTERM → wait → kill;
- a log file is only ever appended to (a restart adds a header line, never truncates).

``bench`` and ``tests`` both import this module; it imports neither of them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar

from confluent_kafka import Consumer, TopicPartition

from duetime.core.clock import SYSTEM_CLOCK, Clock
from duetime.core.config import CommonSettings
from duetime.core.topics import Topics
from duetime.schemas.codec import Codec

from .process import kill_group, tail, terminate

if TYPE_CHECKING:
    from duetime.producers.sdk import DagCreated

ROOT = Path(__file__).resolve().parents[1]
LOG_DIR = ROOT / ".duetime" / "test-logs"
"""Where a role's log goes when its starter names no file."""

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.05
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; fail with an
    ``AssertionError`` naming what we waited for (and the last value) at the deadline."""
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


# --- roles as processes ----------------------------------------------------------------------


def role_env(
    settings: CommonSettings, *, python_modules: str = "tests,bench", **extra: str
) -> dict[str, str]:
    """This process's environment, pointed at ``settings``' broker, database, topics and
    partitions, plus ``extra``. Workers may reach 127.0.0.1 (the tests' and benchmarks' HTTP
    sinks are there) and import tasks from ``python_modules``."""
    path = os.environ.get("PYTHONPATH")
    env = {
        **os.environ,
        # the roles import tasks from tests.* and bench.*, wherever they are started from
        "PYTHONPATH": str(ROOT) if not path else f"{ROOT}{os.pathsep}{path}",
        "DUETIME_KAFKA_BOOTSTRAP": settings.bootstrap_servers,
        "DUETIME_DATABASE_URL": settings.database_url,
        "DUETIME_TOPIC_PREFIX": settings.topic_prefix,
        "DUETIME_PARTITIONS": str(settings.partitions),
        "DUETIME_LOG_LEVEL": "INFO",
        "DUETIME_WORKER_EGRESS_ALLOW": "loopback",
        "DUETIME_WORKER_PYTHON_MODULES": python_modules,
        # a test's or benchmark's topics are new and its jobs are often written before its
        # workers have their partitions: read from the beginning (the production default,
        # the end, is what tests/e2e/test_queue_pools.py runs)
        "DUETIME_WORKER_NEW_GROUP_START": "beginning",
    }
    env.update(extra)
    return env


class RoleProc:
    """One role, ``python [python_args] -m duetime.cli <argv>``, in its own process group,
    its output (stdout and stderr) appended to ``log_path``.

    ``RoleProc.start(name, argv, env)`` builds and starts one; ``spawn()`` starts (again) one
    that was built or has ended. ``DUETIME_INSTANCE_ID`` defaults to ``name``.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        log_path: Path | None = None,
        python_args: Sequence[str] = (),
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = {"DUETIME_INSTANCE_ID": name, **env}
        self.python_args = list(python_args)
        # a fresh file per role by default: tests that reuse a name never read another's log
        self.log_path = log_path or LOG_DIR / f"{name}-{clock.now_ms()}.log"
        self.starts = 0
        self._process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        log_path: Path | None = None,
        python_args: Sequence[str] = (),
    ) -> Self:
        return cls(name, argv, env, log_path=log_path, python_args=python_args).spawn()

    def spawn(self) -> Self:
        """Start the process unless it runs already."""
        if self.running:
            return self
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with open(self.log_path, "ab") as out:
            out.write(f"--- harness: start #{self.starts} at {time.ctime()} ---\n".encode())
            out.flush()
            self._process = subprocess.Popen(
                [sys.executable, *self.python_args, "-m", "duetime.cli", *self.argv],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=str(ROOT),
                start_new_session=True,
            )
        return self

    @property
    def process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError(f"{self.name} was never started")
        return self._process

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def alive(self) -> bool:
        return self.running

    def returncode(self) -> int | None:
        """The exit status once the process has ended, else None."""
        return None if self._process is None else self._process.poll()

    def stop(self, timeout_s: float = 20) -> int | None:
        """SIGTERM, wait up to ``timeout_s`` for a clean exit, else SIGKILL; the exit status."""
        if self._process is None:
            return None
        return terminate(self._process, timeout_s, self.name)

    def kill(self) -> None:
        """SIGKILL the process group (continued first if paused) and reap the process."""
        if self._process is not None:
            kill_group(self._process, self.name, 15)

    def _signal_group(self, sig: int) -> None:
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)

    def pause(self) -> None:
        self._signal_group(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal_group(signal.SIGCONT)

    def restart(self) -> Self:
        self.kill()
        return self.spawn()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_since_start(self) -> str:
        """The log of the current run only (after the last start's header line)."""
        return self.log().rpartition(f"--- harness: start #{self.starts} at ")[2]

    def log_count(self, needle: str) -> int:
        return self.log().count(needle)

    def wait_ready(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Wait for ``ready``; fail at once, with the log's tail, if the process ends first."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            if not self.running:
                raise AssertionError(
                    f"{self.name} exited ({self.returncode()}) before {what}:\n"
                    f"{tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s} s waiting for {self.name}: {what}\n"
                    f"{tail(self.log_path)}"
                )
            time.sleep(0.1)

    def wait_log(self, pattern: str, timeout_s: float = 120, *, since_start: bool = False) -> None:
        """Wait until the log (``since_start``: of the current run only) holds a match of the
        regular expression ``pattern``."""
        compiled = re.compile(pattern)
        read = self.log_since_start if since_start else self.log
        self.wait_ready(lambda: compiled.search(read()) is not None, timeout_s, pattern)

    def wait_http(self, url: str, timeout_s: float = 60) -> str:
        """Wait until a GET of ``url`` answers 200 (the role's readiness or metrics endpoint);
        return the body."""
        body: list[str] = []

        def answers() -> bool:
            text = http_get(url)
            if text is not None:
                body.append(text)
            return text is not None

        self.wait_ready(answers, timeout_s, f"{url} to answer 200")
        return body[-1]

    def wait_metrics(self, port: int, timeout_s: float = 60) -> str:
        """Wait until ``http://127.0.0.1:<port>/metrics`` answers 200; return its body."""
        return self.wait_http(f"http://127.0.0.1:{port}/metrics", timeout_s)


def stop_all(roles: Iterable[RoleProc], timeout_s: float = 20) -> dict[str, int | None]:
    """Stop several roles at once (each :meth:`RoleProc.stop`, in parallel: a sequence of
    clean shutdowns would add up); their exit statuses by name."""
    chosen = list(roles)
    if not chosen:
        return {}
    with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
        codes = list(pool.map(lambda role: role.stop(timeout_s), chosen))
    return {role.name: code for role, code in zip(chosen, codes, strict=True)}


def http_get(url: str, timeout_s: float = 2) -> str | None:
    """The body of a GET of ``url``, or None when it does not answer 200 (or at all)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.read().decode() if response.status == 200 else None
    except (OSError, urllib.error.URLError, ValueError):
        return None


def scrape(port: int, host: str = "127.0.0.1") -> str | None:
    """The body of ``http://host:port/metrics``, or None when it does not answer 200."""
    return http_get(f"http://{host}:{port}/metrics")


# --- reading topics ----------------------------------------------------------------------------


FAST_FETCH = {"fetch.wait.max.ms": 10}
"""``reader`` overrides for a measuring reader: the broker answers a fetch after 10 ms, not
500, so a record's receive time is close to when it became visible."""


def reader(bootstrap_servers: str, group_prefix: str, **overrides: Any) -> Consumer:
    """A consumer for checks and measurements: it reads only committed records
    (read_committed), from the earliest offset, and never commits (a fresh group id, so it
    takes no part in any group: assign its partitions with :func:`assign_all`)."""
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"{group_prefix}-{uuid.uuid4().hex[:8]}",
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "log_level": 3,
    }
    conf.update(overrides)
    return Consumer(conf)


def assign_all(consumer: Consumer, topics: Iterable[str], timeout_s: float = 30) -> None:
    """Assign every partition of ``topics`` from offset 0."""
    names = list(topics)
    md = consumer.list_topics(timeout=timeout_s)
    consumer.assign([TopicPartition(t, p, 0) for t in names for p in md.topics[t].partitions])


class TopicReader:
    """A read_committed reader over some topics, collecting decoded records in a thread
    (``event_type`` None: only the raw messages)."""

    def __init__(self, settings: CommonSettings, topics: list[str], event_type: str | None) -> None:
        self.codec = Codec()
        self.event_type = event_type
        self.records: list[dict[str, Any]] = []
        self.raw: list[Any] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = reader(settings.bootstrap_servers, "test-reader")
        assign_all(self._consumer, topics, 10)
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
                        record["_timestamp_ms"] = msg.timestamp()[1]  # the producer's clock
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


def wait_known(settings: CommonSettings, dag: DagCreated, timeout_s: float = 30) -> None:
    """Wait until the scheduler has taken in every job of the DAG (its state is written).

    A control command that overtakes its job's definition (they travel on two topics) finds
    no job and is dropped by the scheduler, so a test triggers a DAG only after this.
    """
    wanted = {dag.trigger_job_id, *dag.job_ids.values()}
    state = TopicReader(settings, [Topics(settings.topic_prefix).state], "state")
    try:
        wait_for(
            lambda: wanted <= {s["job_id"] for s in state.snapshot()},
            timeout_s,
            "the scheduler to take in the DAG's jobs",
        )
    finally:
        state.close()

"""The fault-campaign harness: a private broker and database, the roles as real processes, an
HTTP sink, a read_committed recorder, and a history for the offline checker (``checker.py``).

- :class:`FaultStack` starts its own Kafka broker and PostgreSQL on free ports under
  ``.duetime/faults/<run>/`` (never the shared test stack), and can SIGKILL, SIGSTOP and
  restart the broker and stop and start PostgreSQL. ``partition_dir`` puts the broker's topic
  partitions elsewhere (a small tmpfs); the metadata log stays under the run directory.
- :class:`Scenario` is one test on that stack: its own topic prefix and database, a
  :class:`~tests.faults.history.History`, an :class:`HttpSink`, a :class:`Recorder`, and the
  roles it started (:class:`~duetime.infra.harness.RoleProc`, the shared harness).
  ``role_bootstrap`` / ``role_database_url`` are what the roles are given (point them at a
  proxy to cut their traffic). ``finish()`` stops the roles, audits the topics and the
  projection, and returns the checker's report.

Nothing here is mocked: the roles are ``python -m duetime.cli <role>`` processes, each in
its own process group, killed by the pid the harness holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from duetime.core.config import CommonSettings, Env
from duetime.core.states import TERMINAL
from duetime.core.topics import Topics
from duetime.infra.harness import ROOT, RoleProc, assign_all, reader, role_env, wait_for
from duetime.infra.process import kill_group
from duetime.schemas.codec import Codec

from .checker import Report, check
from .history import History, now_ms

if TYPE_CHECKING:
    from duetime.producers.sdk import JobCreated

__all__ = ["FaultStack", "RoleProc", "Scenario", "size", "utc_ms", "wait_for", "write_figures"]

FAULTS_HOME = ROOT / ".duetime" / "faults"
RESULTS = ROOT / "bench" / "results"


# --- the servers -----------------------------------------------------------------------------


class FaultStack:
    """A private broker and PostgreSQL for fault scenarios (their own ports and files)."""

    def __init__(
        self,
        name: str = "stack",
        *,
        partition_dir: Path | None = None,
        kafka_heap_mb: int = 768,
        keep_data: bool = False,
    ) -> None:
        from duetime.infra.local_kafka import LocalKafka
        from duetime.infra.local_postgres import LocalPostgres
        from duetime.infra.process import free_port

        self.home = FAULTS_HOME / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}-{os.getpid()}"
        self.home.mkdir(parents=True, exist_ok=True)
        self.kafka = LocalKafka(
            self.home,
            port=free_port(),
            controller_port=free_port(),
            heap_mb=kafka_heap_mb,
            partition_dir=partition_dir,
        )
        self.postgres = LocalPostgres(self.home, port=free_port())
        self.keep_data = keep_data
        self._started = False

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    def start(self) -> Self:
        # marked started first: a half-started stack (the broker up, PostgreSQL failing) is
        # still stopped by close()
        self._started = True
        self.kafka.ensure_jars()
        self.kafka.start()
        self.postgres.start()
        return self

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop both servers (idempotent); drop their data unless ``keep_data``."""
        if not self._started:
            return
        self._started = False
        with contextlib.suppress(Exception):
            self.kafka.stop(timeout_s=20)
        with contextlib.suppress(Exception):
            self.postgres.stop(timeout_s=20)
        if not self.keep_data:
            import shutil

            for d in (self.kafka.data_dir, self.postgres.data_dir):
                shutil.rmtree(d, ignore_errors=True)
            if self.kafka.partition_dir is not None:
                for child in self.kafka.partition_dir.iterdir():
                    shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()

    # --- faults of the servers ----------------------------------------------------------

    def kill_broker(self) -> None:
        """SIGKILL the broker's process group and wait until it is gone."""
        pid = self.kafka.pid
        if pid is None:
            return
        kill_group(pid, f"broker pid {pid}", 30)
        self.kafka.pid_file.unlink(missing_ok=True)
        self.kafka._proc = None

    def pause_broker(self) -> None:
        pid = self.kafka.pid
        if pid is not None:
            os.killpg(pid, signal.SIGSTOP)

    def resume_broker(self) -> None:
        pid = self.kafka.pid
        if pid is not None:
            os.killpg(pid, signal.SIGCONT)

    def start_broker(self) -> float:
        """Start the broker again on the same storage; seconds until it answered."""
        return self.kafka.start(timeout_s=180)

    def stop_postgres(self) -> None:
        self.postgres.stop(timeout_s=30)

    def start_postgres(self) -> float:
        return self.postgres.start(timeout_s=120)

    # --- scenarios ------------------------------------------------------------------------

    def scenario(self, name: str, partitions: int = 6, **config: Any) -> Scenario:
        """A fresh topic prefix and database on this stack, with a history and a sink."""
        return Scenario(self, name, partitions, config)


# --- the HTTP sink ---------------------------------------------------------------------------


class HttpSink:
    """A downstream service on 127.0.0.1 that records every request in the history.

    It answers 200 unless told otherwise; a job's payload may ask for ``sleep_s`` (answer
    after sleeping: keeps executions in flight). Idempotency is judged by the checker from the
    recorded keys, so the sink itself keeps only counters.
    """

    def __init__(self, history: History) -> None:
        self.history = history
        self.deliveries = 0
        self.keys: set[str] = set()
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.0: one connection per call. Kept-alive HTTP/1.1 connections made this
            # sink six times slower (1,000 calls of 0.3 s at 150 in flight: 33 s against 5 s)
            protocol_version = "HTTP/1.0"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {}
                sink._handle(self, body)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            # bursts of a few hundred calls at once: the default backlog of 5 refuses them
            request_queue_size = 1024

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a killed worker resets its connections: expected, not news

        self.server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def _handle(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        key = handler.headers.get("Idempotency-Key", "")
        payload = body.get("payload") if isinstance(body.get("payload"), dict) else {}
        assert isinstance(payload, dict)
        arrived_ms = now_ms()
        time.sleep(float(payload.get("sleep_s", 0)))
        status = 200
        try:
            handler.send_response(status)
            handler.send_header("Content-Length", "2")
            handler.end_headers()
            handler.wfile.write(b"{}")
        except OSError:
            status = -1  # the worker went away before the answer: no effect
        scheduled = body.get("scheduled_at")
        self.history.add(
            "delivery",
            key=key,
            job_id=handler.headers.get("X-Duetime-Job-Id", ""),
            attempt=int(handler.headers.get("X-Duetime-Attempt") or 0),
            scheduled_at_ms=_iso_ms(scheduled) if isinstance(scheduled, str) else None,
            status=status,
            at_ms=arrived_ms,
            answered_ms=now_ms(),
        )
        with self.lock:
            self.deliveries += 1
            if status == 200:
                self.keys.add(key)

    def effects(self) -> int:
        with self.lock:
            return len(self.keys)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _iso_ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


# --- the read_committed recorder ---------------------------------------------------------------


class Recorder:
    """A read_committed consumer beside the roles: every execution request and result it sees
    goes into the history with its topic, partition and offset."""

    def __init__(self, settings: CommonSettings, history: History) -> None:
        self.history = history
        self.topics = Topics(settings.topic_prefix)
        self.codec = Codec()
        self.requests = 0
        self.executions: set[str] = set()
        self.results: dict[str, tuple[str, str | None]] = {}
        self.undecodable = 0
        self.positions: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.consumer = reader(settings.bootstrap_servers, "fault-recorder")
        assign_all(self.consumer, [*self.topics.executions, self.topics.results])
        self._thread = threading.Thread(target=self._run, name="recorder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = self.consumer.consume(1000, 0.2)
            except KafkaException:
                time.sleep(0.2)
                continue
            for msg in batch:
                if msg.error():
                    continue
                self._record(msg)
            if not batch:
                self._step_over_markers()

    def _step_over_markers(self) -> None:
        """The consumer's position steps over transaction markers (which are never delivered),
        so a partition whose last record is a commit marker still counts as read to its end."""
        try:
            tps = self.consumer.position(self.consumer.assignment())
        except KafkaException:
            return
        with self._lock:
            for tp in tps:
                key = (tp.topic, tp.partition)
                if tp.offset > self.positions.get(key, 0):
                    self.positions[key] = tp.offset

    def _record(self, msg: Any) -> None:
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        with self._lock:
            self.positions[(topic, partition)] = offset + 1
        where = {"topic": topic, "partition": partition, "offset": offset}
        is_result = topic == self.topics.results
        try:
            record = self.codec.decode("result" if is_result else "execution", msg.value() or b"")
        except Exception as exc:
            self.undecodable += 1
            self.history.add("undecodable", **where, error=str(exc)[:200])
            return
        if is_result:
            reason = (record.get("error") or {}).get("reason")
            self.history.add(
                "result",
                **where,
                **{
                    k: record.get(k)
                    for k in (
                        "execution_id", "job_id", "attempt", "status", "worker_id",
                        "lease_token", "scheduled_at_ms", "started_at_ms", "finished_at_ms",
                    )
                },
                reason=reason,
            )  # fmt: skip
            with self._lock:
                self.results[record["execution_id"]] = (record["status"], reason)
            return
        self.history.add(
            "request",
            **where,
            **{
                k: record.get(k)
                for k in (
                    "execution_id", "job_id", "attempt", "scheduled_at_ms", "due_at_ms",
                    "emitted_at_ms", "trigger",
                )
            },
        )  # fmt: skip
        with self._lock:
            self.requests += 1
            self.executions.add(record["execution_id"])

    def seen_jobs(self) -> int:
        return self.requests

    def final_statuses(self) -> dict[str, tuple[str, str | None]]:
        """Each execution's last result: its status and, for a failure, the error's reason."""
        with self._lock:
            return dict(self.results)

    def caught_up_to(self, ends: dict[tuple[str, int], int]) -> bool:
        with self._lock:
            return all(self.positions.get(tp, 0) >= end for tp, end in ends.items() if end > 0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with contextlib.suppress(Exception):
            self.consumer.close()


# --- one scenario ----------------------------------------------------------------------------


class Scenario:
    """One test on a :class:`FaultStack`: topics, database, history, sink, recorder, roles."""

    def __init__(
        self, stack: FaultStack, name: str, partitions: int, config: dict[str, Any]
    ) -> None:
        from duetime.infra.migrate import migrate
        from duetime.infra.topics import create_topics

        self.stack = stack
        self.name = name
        run = uuid.uuid4().hex[:8]
        self.dir = stack.home / f"{name}-{run}"
        self.dir.mkdir(parents=True, exist_ok=True)
        db = f"f_{name.replace('-', '_')}_{run}"
        stack.postgres.create_database(db)
        self.settings = replace(
            CommonSettings.from_env(Env({})),
            bootstrap_servers=stack.bootstrap,
            database_url=stack.postgres.url(db),
            topic_prefix=f"f{run}.",
            partitions=partitions,
            instance_id=f"harness-{run}",
        )
        self.topics = Topics(self.settings.topic_prefix)
        create_topics(stack.bootstrap, self.topics.specs(partitions))
        migrate(self.settings.database_url)
        self.role_bootstrap = stack.bootstrap
        """What roles are told the broker is (point it at a proxy to cut their traffic)."""
        self.role_database_url = self.settings.database_url
        self.history = History(self.dir / "history.jsonl")
        self.history.add("config", scenario=name, partitions=partitions, **config)
        self.sink = HttpSink(self.history)
        self.recorder = Recorder(self.settings, self.history)
        self.roles: dict[str, RoleProc] = {}
        self.report: Report | None = None
        self._admin: Any = None

    # --- roles ----------------------------------------------------------------------------

    def role_env(self, name: str, **extra: str) -> dict[str, str]:
        """The shared harness's environment, pointed at ``role_bootstrap`` and
        ``role_database_url``, with a scheduler state directory of the role's own."""
        settings = replace(
            self.settings,
            bootstrap_servers=self.role_bootstrap,
            database_url=self.role_database_url,
        )
        return role_env(
            settings,
            DUETIME_INSTANCE_ID=name,
            DUETIME_SCHEDULER_STATE_DIR=str(self.dir / "state" / name),
            **extra,
        )

    def role(self, name: str, argv: list[str], **env: str) -> RoleProc:
        """A role of this scenario (not started), its log in the scenario's ``logs``."""
        return RoleProc(
            name, argv, self.role_env(name, **env), log_path=self.dir / "logs" / f"{name}.log"
        )

    def start_role(self, kind: str, name: str | None = None, *args: str, **env: str) -> RoleProc:
        """Start ``duetime <kind> [args]`` as ``name`` (default: kind-N) with extra env."""
        name = name or f"{kind}-{sum(1 for r in self.roles.values() if r.argv[0] == kind) + 1}"
        role = self.role(name, [kind, *args], **env)
        self.roles[name] = role
        return role.spawn()

    def of_kind(self, kind: str) -> list[RoleProc]:
        return [r for r in self.roles.values() if r.argv[0] == kind]

    def schedulers_own_all(self, members: int, timeout_s: float = 90) -> None:
        """Wait until ``members`` schedulers share every partition (a stable group)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.settings.bootstrap_servers})
        group = f"{self.settings.topic_prefix}schedulers"
        jobs_topic = self.topics.jobs

        def ready() -> bool:
            try:
                # a first call on a fresh broker can hang for the default 60 s: ask again instead
                desc = admin.describe_consumer_groups([group], request_timeout=5)[group].result()
            except Exception:
                return False
            if str(desc.state).split(".")[-1] != "STABLE" or len(desc.members) != members:
                return False
            owned = {
                tp.partition
                for m in desc.members
                for tp in m.assignment.topic_partitions
                if tp.topic == jobs_topic
            }
            return owned == set(range(self.settings.partitions))

        wait_for(ready, timeout_s, f"{members} schedulers to own all partitions", 0.5)

    def workers_assigned(self, timeout_s: float = 90) -> None:
        for w in self.of_kind("worker"):
            w.wait_log("assigned", timeout_s)

    # --- jobs -----------------------------------------------------------------------------

    def job_client(self) -> Any:
        from duetime.producers.sdk import JobClient

        return JobClient(settings=self.settings)

    def record_job(
        self,
        created: JobCreated,
        expect_ms: list[int] | None,
        *,
        exact: bool = False,
    ) -> None:
        d = created.definition
        self.history.add(
            "job",
            job_id=created.job_id,
            name=d.name,
            expect_ms=expect_ms,
            exact=exact,
            misfire=d.misfire.value,
            overlap=d.overlap.value,
        )

    @contextlib.contextmanager
    def fault(self, name: str) -> Iterator[dict[str, Any]]:
        """Record a fault: its start when entered, its end (healed) when left."""
        info: dict[str, Any] = {"name": name, "start_ms": now_ms()}
        try:
            yield info
        finally:
            info["end_ms"] = now_ms()
            self.history.add("fault", **info)

    def mark_fault(self, name: str, start_ms: int, end_ms: int | None = None, **extra: Any) -> None:
        self.history.add("fault", name=name, start_ms=start_ms, end_ms=end_ms or start_ms, **extra)

    # --- the end: audit and check ---------------------------------------------------------

    def finish(
        self,
        *,
        settle_s: float = 90,
        statuses: bool = True,
        stop_roles: bool = True,
    ) -> Report:
        """Stop the roles, audit the logs and the projection, and check the history."""
        if stop_roles:
            for role in self.roles.values():
                role.stop(timeout_s=30)
        self._audit_topics(settle_s)
        if statuses:
            self._record_statuses()
        self.recorder.close()
        self.report = check(self.history.events())
        return self.report

    def end_offsets(
        self, committed: bool, timeout_s: float = 30, topics: list[str] | None = None
    ) -> dict[tuple[str, int], int]:
        """Per partition of ``topics`` (default: the execution topics): the last stable offset
        (``committed``) or the high watermark, from the broker (ListOffsets)."""
        from confluent_kafka import IsolationLevel
        from confluent_kafka.admin import AdminClient, OffsetSpec

        level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        tps = [
            TopicPartition(t, p)
            for t in (topics or self.topics.executions)
            for p in range(self.settings.partitions)
        ]
        deadline = time.monotonic() + timeout_s
        while True:
            if self._admin is None:
                self._admin = AdminClient({"bootstrap.servers": self.settings.bootstrap_servers})
            try:
                futures = self._admin.list_offsets(
                    {tp: OffsetSpec.latest() for tp in tps}, isolation_level=level
                )
                return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
            except KafkaException:
                # e.g. FENCED_LEADER_EPOCH from metadata older than a broker restart: a new
                # client reads fresh metadata
                if time.monotonic() > deadline:
                    raise
                self._admin = None
                time.sleep(0.5)

    def open_transactions(self) -> list[tuple[str, int]]:
        """Execution partitions with an open transaction right now (last stable offset behind
        the high watermark)."""
        high = self.end_offsets(committed=False)
        stable = self.end_offsets(committed=True)
        return sorted(tp for tp in high if stable[tp] < high[tp])

    def _audit_topics(self, settle_s: float) -> None:
        # every topic the scheduler writes in its transactions
        t = self.topics
        written = [*t.executions, t.state, t.dlq, t.control, t.dag_runs]

        # 1. hanging transactions: the last stable offset must catch up with the high watermark
        lso_rows: list[dict[str, Any]] = []
        deadline = time.monotonic() + settle_s
        while True:
            all_high = self.end_offsets(committed=False, topics=written)
            all_stable = self.end_offsets(committed=True, topics=written)
            behind = {tp for tp in all_high if all_stable[tp] < all_high[tp]}
            if not behind or time.monotonic() > deadline:
                break
            time.sleep(1)
        for tp in all_high:
            row = {"topic": tp[0], "partition": tp[1], "lso": all_stable[tp], "high": all_high[tp]}
            lso_rows.append({**row, "settled": all_stable[tp] >= all_high[tp]})
        high = {tp: n for tp, n in all_high.items() if tp[0] in t.executions}
        stable = {tp: n for tp, n in all_stable.items() if tp[0] in t.executions}
        # 2. the recorder has read everything committed
        with contextlib.suppress(AssertionError):
            wait_for(lambda: self.recorder.caught_up_to(stable), 60, "the recorder to catch up")
        # 3. which offsets hold records of aborted transactions
        uncommitted = _read_offsets(self.settings.bootstrap_servers, high, "read_uncommitted")
        committed = _read_offsets(self.settings.bootstrap_servers, stable, "read_committed")
        aborted = [
            [t, p, o]
            for (t, p), offs in uncommitted.items()
            for o in sorted(offs - committed[(t, p)])
        ]
        self.history.add(
            "audit",
            lso=lso_rows,
            aborted=aborted,
            uncommitted=[[t, p, sorted(o)] for (t, p), o in uncommitted.items()],
        )

    def _record_statuses(self, timeout_s: float = 90) -> None:
        """Final execution statuses from the projection, once it holds every execution."""
        import psycopg

        want = set(self.recorder.executions)
        rows: list[tuple[Any, ...]] = []

        def complete() -> bool:
            nonlocal rows
            try:
                with psycopg.connect(self.settings.database_url, connect_timeout=5) as conn:
                    rows = conn.execute(
                        "SELECT execution_id::text, job_id::text, scheduled_at, status, attempt "
                        "FROM executions"
                    ).fetchall()
            except psycopg.Error:
                return False
            got = {r[0]: r[3] for r in rows}
            return want <= set(got) and all(got[e] in TERMINAL for e in want)

        projectors = [r for r in self.of_kind("projector")]
        if projectors:
            # the projector was stopped with the roles: run one more until it has caught up
            catch_up = self.role("projector-final", ["projector", "--until-caught-up"]).spawn()
            try:
                catch_up.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                catch_up.kill()
        with contextlib.suppress(AssertionError):
            wait_for(complete, 10 if projectors else 0.1, "the projection to hold every execution")
        for execution_id, job_id, scheduled_at, status, attempt in rows:
            self.history.add(
                "status",
                execution_id=execution_id,
                job_id=job_id,
                scheduled_at_ms=int(scheduled_at.timestamp() * 1000),
                status=status,
                attempt=attempt,
            )

    def close(self) -> None:
        """Kill whatever still runs and stop the sink (idempotent; call in a finalizer)."""
        for role in self.roles.values():
            role.kill()
        with contextlib.suppress(Exception):
            self.recorder.close()
        with contextlib.suppress(Exception):
            self.sink.close()
        self.history.close()


def _read_offsets(
    bootstrap: str, ends: dict[tuple[str, int], int], isolation: str, timeout_s: float = 120
) -> dict[tuple[str, int], set[int]]:
    """The offsets of the data records in [0, end) of each partition at this isolation level."""
    out: dict[tuple[str, int], set[int]] = {tp: set() for tp in ends}
    todo = {tp: end for tp, end in ends.items() if end > 0}
    if not todo:
        return out
    consumer = reader(
        bootstrap, "fault-audit", **{"isolation.level": isolation, "enable.partition.eof": True}
    )
    try:
        consumer.assign([TopicPartition(t, p, 0) for (t, p) in todo])
        done: set[tuple[str, int]] = set()
        deadline = time.monotonic() + timeout_s
        while len(done) < len(todo) and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                tp = (str(msg.topic()), msg.partition() or 0)
                error = msg.error()
                if error is not None:
                    # end of partition: as far as this isolation level can read (the ends
                    # were taken with the roles stopped, so nothing is written after them)
                    if error.code() == KafkaError._PARTITION_EOF:
                        done.add(tp)
                    continue
                offset = msg.offset() or 0
                out[tp].add(offset)
                if offset >= todo[tp] - 1:
                    done.add(tp)
    finally:
        consumer.close()
    return out


# --- results -------------------------------------------------------------------------------------


def write_figures(
    name: str, report: Report | dict[str, Any], size: str, config: dict[str, Any]
) -> Path:
    """``bench/results/faults-<name>.json`` (``faults-<name>-ci.json`` at the CI size, so
    that ``./run test`` never overwrites the campaign's figures): the report's figures (or
    a scenario's own counts) with the machine record."""
    from bench.common import machine

    RESULTS.mkdir(parents=True, exist_ok=True)
    figures = report.figures() if isinstance(report, Report) else report
    result = {
        **figures,
        "size": size,
        "config": config,
        "machine": machine(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = RESULTS / f"faults-{name}{'' if size == 'full' else '-' + size}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return path


def size() -> str:
    """``ci`` (default) or ``full`` (``DUETIME_FAULTS_SIZE=full``, set by ``./run faults``)."""
    value = os.environ.get("DUETIME_FAULTS_SIZE", "ci")
    if value not in ("ci", "full"):
        raise ValueError(f"DUETIME_FAULTS_SIZE={value!r} must be ci or full")
    return value


def utc_ms(dt: datetime) -> int:
    return int(dt.astimezone(UTC).timestamp() * 1000)

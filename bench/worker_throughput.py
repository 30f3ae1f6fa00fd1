"""Worker benchmarks (issue 4): end-to-end throughput, worker-only throughput, start lateness at
a sustained rate, and the cost of the lease per execution.

    python -m bench.worker_throughput e2e --workers 1 2 4 --jobs 20000
    python -m bench.worker_throughput drain --workers 1 2 4 --jobs 20000
    python -m bench.worker_throughput rate --rate 350 --duration-s 30 --workers 2
    python -m bench.worker_throughput lease --executions 20000

With ``DUETIME_KAFKA_BOOTSTRAP`` and ``DUETIME_DATABASE_URL`` set it runs on those servers
(its own database and topic prefix) instead of starting the shared bench stack.

How it runs: the bench stack of ``bench.common`` (a local Kafka and PostgreSQL), ONE scheduler
process and N worker processes (``duetime worker``), all on this machine's cores together with
the load generator and the reader of the results topic. Targets are a no-op async Python
function (``bench.worker_throughput:noop``), so the figures are the cost of duetime itself.

- ``e2e``: create J one-time jobs due now with the SDK, as fast as it publishes; throughput is
  J / (last success received − first create). ``lost``: jobs without a success at the end;
  ``duplicates``: executions started more than once.
- ``drain``: J execution requests written straight to the execution topics, then N workers
  started; throughput is J / (last success − first start). The worker alone, no scheduler.
- ``rate``: jobs due at a steady rate R for D seconds (created ahead of time); start lateness
  is the worker's ``started_at`` minus the due time: the scheduler's emit, the transaction
  commit, the fetch, the lease claim and the start, all included.
- ``rate`` and ``burst`` also run one projector (jobs are queryable only through it, as River's
  are through its table) and report CPU per job: the CPU seconds of the broker, PostgreSQL and
  every role (``bench.cpu``), from just before the jobs are created until the last start,
  divided by the jobs that succeeded (``cpu_s``; each process's CPU over its whole life, its
  start-up included, in ``cpu_s_lifetime``). The SDK creating the jobs runs in this bench
  process and is not counted (as the peers' producers and duetime's REST load generator are
  not).
- ``lease``: claim + complete of E executions against PostgreSQL, one at a time and in the
  batches concurrent executions form; reported as µs per execution and round trips.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import signal
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from confluent_kafka import Producer

from bench import kafka_count
from bench.common import (
    bench_stack,
    percentiles,
    plot_series,
    progress,
    role_env,
    start_role,
    warm_bench_stack,
    write_result,
)
from bench.cpu import SAMPLE_S, CpuMeter, per_job, pid_listening, window_figures
from duetime.consumers.worker.settings import WorkerSettings
from duetime.infra.harness import RoleProc, assign_all, reader, stop_all

NOOP = "bench.worker_throughput:noop"
PARTITIONS = 12
WORKER_CONCURRENCY = 500
METRICS_BASE_PORT = 19400
SCHEDULER_METRICS_PORT = 19399
SDK_TIMEOUT_S = 120.0
"""The SDK's wait for acknowledgements: on a box shared with other work, 10,000 creates at
once outwaited the default 15 s."""
READER_FETCH = {"fetch.wait.max.ms": 500, "fetch.min.bytes": 1 << 20}
RATE_LEAD_S = 10.0
"""``worker rate``: the first job is due this long after the roles are up, the peers' lead
(bench.peers.common.Workload.effective_lead_s), so every system's CPU window spans the same
seconds; creating all the jobs up front takes 1.5 s at 350/s."""


async def noop(ctx: Any) -> None:
    """The benchmark's target: nothing, so the figures are duetime's own cost."""
    return None


@contextmanager
def stack(partitions: int) -> Iterator[Any]:
    """``DUETIME_KAFKA_BOOTSTRAP`` and ``DUETIME_DATABASE_URL`` set: those servers (a fresh
    database and topic prefix on them); otherwise the shared bench stack of ``bench.common``."""
    import psycopg

    from duetime.core.config import CommonSettings, Env
    from duetime.infra.migrate import migrate

    env = Env()
    bootstrap, url = env.opt_str("DUETIME_KAFKA_BOOTSTRAP"), env.opt_str("DUETIME_DATABASE_URL")
    if not (bootstrap and url):
        with bench_stack(partitions) as common:
            yield common
        return
    db = f"wbench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    database_url = f"{url.rpartition('/')[0]}/{db}"
    migrate(database_url)
    common = replace(
        CommonSettings.from_env(env),
        bootstrap_servers=bootstrap,
        database_url=database_url,
        partitions=partitions,
    )
    try:
        yield common
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


# --- the results topic ----------------------------------------------------------------------


class Results:
    """Reads the results topic (read_committed) and keeps what the figures need."""

    def __init__(self, common: Any) -> None:
        from duetime.core.topics import Topics
        from duetime.schemas.codec import Codec

        self.codec = Codec()
        # execution_id -> one (started_at_ms, worker_id, lease_token, scheduled_at_ms) per lease
        self.running: dict[str, list[tuple[int, str, int, int]]] = {}
        self.success: dict[str, int] = {}  # eid -> finished_at_ms
        self.failures = 0
        self.lock = threading.Lock()
        self._stop = threading.Event()
        # the instrument, not the system, yet the broker's CPU is charged to the system: it
        # fetches a MiB or every 0.5 s, not at every append (33 fetches a second at 350 jobs/s
        # with librdkafka's fetch.min.bytes of 1: ~29 ms a second of the broker's request
        # threads, bench/README.md "Quiet partitions"). A 10 ms wait (FAST_FETCH) made the
        # broker spend ~0.3 core on this reader's empty fetches. The figures come from the
        # records' own times, so when the reader gets them does not matter
        self.consumer = reader(common.bootstrap_servers, "bench-results", **READER_FETCH)
        topics = Topics(common.topic_prefix)
        # the requests too: when each was emitted.
        # Only the normal priority's topic, the one every job of these scenarios goes to:
        # this reader is the bench's instrument, not the system, and the broker's CPU is
        # charged to the system. librdkafka names every assigned partition in every fetch
        # (no incremental fetch sessions), so the three idle priorities' 36 partitions cost
        # the broker a look at each, ~33 times a second (bench/README.md, "Quiet partitions")
        self.requests: dict[str, int] = {}  # eid -> emitted_at_ms
        assign_all(self.consumer, (topics.results, topics.execution("normal")))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msgs = self.consumer.consume(2000, 0.1)
            with self.lock:
                for m in msgs:
                    if m.error():
                        continue
                    if not (m.topic() or "").endswith("results"):
                        q = self.codec.decode("execution", m.value() or b"")
                        self.requests.setdefault(q["execution_id"], q["emitted_at_ms"])
                        continue
                    r = self.codec.decode("result", m.value() or b"")
                    eid = r["execution_id"]
                    # a start is known from the running event or, for attempts shorter than
                    # the worker's running-event delay, from the outcome (same fields)
                    starts = self.running.setdefault(eid, [])
                    start = (
                        r["started_at_ms"],
                        r["worker_id"],
                        r["lease_token"],
                        r["scheduled_at_ms"],
                    )
                    if all(s[2] != start[2] for s in starts):
                        starts.append(start)
                    if r["status"] == "success":
                        self.success.setdefault(eid, r["finished_at_ms"])
                    elif r["status"] == "failure":
                        self.failures += 1

    def done(self) -> int:
        with self.lock:
            return len(self.success)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(10)
        self.consumer.close()


# --- processes ------------------------------------------------------------------------------


def start_workers(common: Any, n: int, tag: str, hold_buffer: int | None = None) -> list[RoleProc]:
    """``n`` workers; ``hold_buffer``: their DUETIME_WORKER_HOLD_BUFFER (None: the default)."""
    procs = []
    more = {} if hold_buffer is None else {"DUETIME_WORKER_HOLD_BUFFER": str(hold_buffer)}
    for i in range(n):
        name = f"{tag}-worker-{i}"
        env = role_env(
            common,
            DUETIME_INSTANCE_ID=name,
            DUETIME_LOG_LEVEL="INFO",
            DUETIME_WORKER_CONCURRENCY=str(WORKER_CONCURRENCY),
            DUETIME_WORKER_BUFFER=str(WORKER_CONCURRENCY * 10),
            DUETIME_METRICS_PORT=str(METRICS_BASE_PORT + i),
            **more,
        )
        procs.append(start_role(["worker"], env, name))
    try:
        for proc in procs:
            proc.wait_log(r"assigned \d+ partitions")
    except BaseException:  # never leave a started role running
        stop(procs)
        raise
    return procs


def start_scheduler(common: Any, tag: str) -> RoleProc:
    from bench.scheduler import wait_owned

    name = f"{tag}-sched"
    env = role_env(
        common, DUETIME_INSTANCE_ID=name, DUETIME_METRICS_PORT=str(SCHEDULER_METRICS_PORT)
    )
    proc = start_role(["scheduler"], env, name)
    try:
        wait_owned(proc, common.partitions)
    except BaseException:  # never leave a started role running
        stop([proc])
        raise
    return proc


def stop(procs: list[RoleProc]) -> None:
    stop_all(procs, 60)


def scrape(n: int) -> dict[str, float]:
    """Sum the lease metrics of ``n`` workers' /metrics endpoints."""
    totals: dict[str, float] = {}
    pattern = re.compile(
        r'^duetime_worker_lease_batch_(seconds|size)_(sum|count)\{op="(\w+)"\} ([0-9.e+-]+)$'
    )
    for i in range(n):
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{METRICS_BASE_PORT + i}/metrics", timeout=5
            ) as response:
                text = response.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            match = pattern.match(line)
            if match:
                kind, stat, op, value = match.groups()
                key = f"{op}_{kind}_{stat}"
                totals[key] = totals.get(key, 0.0) + float(value)
    return totals


def lease_figures(metrics: dict[str, float], executions: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for op in ("claim", "complete"):
        batches = metrics.get(f"{op}_size_count", 0.0)
        if batches:
            out[f"{op}_round_trips"] = int(batches)
            out[f"{op}_mean_batch"] = round(metrics.get(f"{op}_size_sum", 0.0) / batches, 1)
            out[f"{op}_mean_round_trip_ms"] = round(
                1000 * metrics.get(f"{op}_seconds_sum", 0.0) / max(1.0, batches), 2
            )
    seconds = metrics.get("claim_seconds_sum", 0.0) + metrics.get("complete_seconds_sum", 0.0)
    if executions:
        out["db_wall_time_per_execution_us"] = round(1e6 * seconds / executions, 1)
    return out


# --- job and request generation -------------------------------------------------------------


def create_jobs(common: Any, times_ms: list[int]) -> tuple[list[str], float]:
    from duetime.producers.sdk import JobClient

    started = time.monotonic()
    ids = []
    with JobClient(settings=common, timeout_s=SDK_TIMEOUT_S) as client:
        for i, at_ms in enumerate(times_ms):
            at = datetime.fromtimestamp(at_ms / 1000, UTC).isoformat()
            ids.append(
                client.create_job(
                    name=f"wb-{i}",
                    schedule={"at": at},
                    target={"type": "python", "ref": NOOP},
                    retry={"max_retries": 3, "base_delay_s": 1},
                    wait=False,
                ).job_id
            )
    return ids, time.monotonic() - started


def produce_requests(
    common: Any, n: int, extra: Callable[[int], dict[str, Any]] | None = None
) -> list[str]:
    """``n`` execution requests straight onto exec.normal (the scheduler's part skipped);
    ``extra(i)``: fields the i-th request has besides (``bench.limits``: its limits)."""
    from duetime.core.topics import Topics
    from duetime.schemas.codec import Codec

    codec = Codec()
    topic = Topics(common.topic_prefix).execution("normal")
    producer = Producer({"bootstrap.servers": common.bootstrap_servers, "linger.ms": 20})
    ids: list[str] = []
    now_ms = time.time_ns() // 1_000_000
    for i in range(n):
        record: dict[str, Any] = {
            "execution_id": str(uuid.uuid4()),
            "job_id": str(uuid.uuid4()),
            "name": "drain",
            "attempt": 1,
            "scheduled_at_ms": now_ms,
            "due_at_ms": now_ms,
            "emitted_at_ms": now_ms,
            "priority": "normal",
            "target": {"ref": NOOP},
            "payload_json": "null",
            "timeout_s": 60.0,
            "trigger": "schedule",
        }
        if extra is not None:
            record.update(extra(i))
        ids.append(record["execution_id"])
        while True:
            try:
                producer.produce(topic, codec.encode("execution", record), key=record["job_id"])
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)
    return ids


@contextmanager
def fresh(common: Any) -> Iterator[Any]:
    """The same servers, new topics (one run of a scenario must not see another's), deleted
    at the end: left behind, every run's 144 partitions slowed the bench broker's start until
    it timed out (5,000 partition directories after ~36 runs)."""
    from confluent_kafka.admin import AdminClient

    from duetime.core.topics import Topics
    from duetime.infra.topics import create_topics

    run = replace(common, topic_prefix=f"wb{uuid.uuid4().hex[:8]}.")
    specs = Topics(run.topic_prefix).specs(run.partitions)
    create_topics(run.bootstrap_servers, specs)
    try:
        yield run
    finally:
        admin = AdminClient({"bootstrap.servers": run.bootstrap_servers})
        for future in admin.delete_topics([s.name for s in specs]).values():
            try:
                future.result()
            except Exception as exc:  # best effort: a leftover topic costs disk, not results
                progress(f"could not delete a bench topic: {exc}")


def wait_done(results: Results, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = -1
    while time.monotonic() < deadline:
        done = results.done()
        if done >= n:
            return
        if done != last:
            progress(f"{done:,}/{n:,} successes")
            last = done
        time.sleep(1)
    progress(f"gave up waiting: {results.done():,}/{n:,} successes")


# --- scenarios ------------------------------------------------------------------------------


def scenario_e2e(workers: list[int], jobs: int) -> dict[str, Any]:
    runs = []
    with stack(PARTITIONS) as base, ExitStack() as runs_topics:
        for n in workers:
            common = runs_topics.enter_context(fresh(base))
            tag = f"e2e-{n}"
            procs = [start_scheduler(common, tag), *start_workers(common, n, tag)]
            results = Results(common)
            try:
                t0 = time.time()
                _, create_s = create_jobs(common, [int(t0 * 1000)] * jobs)
                progress(f"{n} workers: {jobs:,} jobs created in {create_s:.1f} s")
                wait_done(results, jobs, 120 + jobs / 100)
                metrics = scrape(n)
            finally:
                results.close()
                stop(procs)
            runs.append(summarize_run(f"e2e, {n} workers", results, jobs, t0, metrics, n))
            runs[-1]["create_s"] = round(create_s, 2)
    return report("worker-e2e", runs, jobs, workers, "create → success")


def scenario_drain(workers: list[int], jobs: int) -> dict[str, Any]:
    runs = []
    with stack(PARTITIONS) as base, ExitStack() as runs_topics:
        for n in workers:
            common = runs_topics.enter_context(fresh(base))
            tag = f"drain-{n}"
            produce_requests(common, jobs)
            results = Results(common)
            t0 = time.time()
            procs = start_workers(common, n, tag)
            try:
                wait_done(results, jobs, 120 + jobs / 100)
                metrics = scrape(n)
            finally:
                results.close()
                stop(procs)
            first_start = min(r[0][0] for r in results.running.values()) / 1000
            runs.append(
                summarize_run(f"drain, {n} workers", results, jobs, first_start, metrics, n)
            )
            runs[-1]["startup_s"] = round(first_start - t0, 2)
    return report("worker-drain", runs, jobs, workers, "first start → last success")


def summarize_run(
    label: str, results: Results, jobs: int, t0_s: float, metrics: dict[str, float], n: int
) -> dict[str, Any]:
    last_ms = max(results.success.values(), default=int(t0_s * 1000))
    duration_s = max(0.001, last_ms / 1000 - t0_s)
    starts = Counter({e: len(r) for e, r in results.running.items()})
    run = {
        "label": label,
        "workers": n,
        "jobs": jobs,
        "succeeded": len(results.success),
        "duration_s": round(duration_s, 2),
        "throughput_jobs_per_s": round(len(results.success) / duration_s, 1),
        "lost": jobs - len(results.success),
        "duplicates": sum(c - 1 for c in starts.values() if c > 1),
        "failures": results.failures,
        "lease": lease_figures(metrics, len(results.success)),
    }
    progress(
        f"{label}: {run['throughput_jobs_per_s']:,} jobs/s over {duration_s:.1f} s, "
        f"lost {run['lost']}, duplicates {run['duplicates']}, lease {run['lease']}"
    )
    return run


def report(
    name: str, runs: list[dict[str, Any]], jobs: int, workers: list[int], measured: str
) -> dict[str, Any]:
    best = max(runs, key=lambda r: r["throughput_jobs_per_s"])
    result = {
        "scenario": name,
        "jobs": jobs,
        "duration_s": best["duration_s"],
        "throughput_jobs_per_s": best["throughput_jobs_per_s"],
        "lateness_ms": {"p50": None, "p99": None, "max": None},
        "lost": sum(r["lost"] for r in runs),
        "duplicates": sum(r["duplicates"] for r in runs),
        "runs": runs,
        "config": {
            "workers": workers,
            "partitions": PARTITIONS,
            "worker_concurrency": WORKER_CONCURRENCY,
            "target": NOOP,
            "measured": measured,
            "command": f"python -m bench.worker_throughput {name.split('-')[1]} "
            f"--workers {' '.join(map(str, workers))} --jobs {jobs}",
        },
    }
    plot_series(
        name,
        f"worker throughput ({measured}), {jobs:,} no-op jobs",
        {"jobs/s": ([r["workers"] for r in runs], [r["throughput_jobs_per_s"] for r in runs])},
        "worker processes",
        "executions per second",
    )
    write_result(name, result)
    return result


@dataclass
class TimedRun:
    """What ``_timed_run`` measured."""

    results: Results
    create_s: float
    metrics: dict[str, float]  # the workers' lease metrics
    t0_ms: int
    times_ms: list[int]
    # CPU seconds per process (broker, PostgreSQL, each role): ``cpu_s`` over the window
    # (first create → last start), ``cpu_s_lifetime`` and ``cpu_window`` (bench.cpu)
    cpu: dict[str, Any]
    kafka_written: dict[str, Any]  # what the run wrote to the broker (bench.kafka_count)
    workers_peak_rss_mb: dict[str, float]  # each worker's largest RSS over the run

    def cpu_figures(self) -> dict[str, Any]:
        """CPU seconds per process in the window and over each one's life, their total and
        CPU ms per succeeded job (the window's), and what Kafka wrote."""
        return {
            **self.cpu,
            **per_job(self.cpu["cpu_s"], len(self.results.success)),
            "kafka_written": self.kafka_written,
            "workers_peak_rss_mb": self.workers_peak_rss_mb,
        }


CPU_MEASURED = (
    "CPU per job = CPU seconds of the broker, PostgreSQL and every role from just before the "
    "first create to the last start (cpu_s, cpu_window) ÷ jobs succeeded; cpu_s_lifetime: "
    "each process from its own start (its start-up included) to the end of the run"
)


def system_meter(common: Any, procs: dict[str, RoleProc], **more: int | None) -> CpuMeter:
    """A sampling CPU meter over the broker, PostgreSQL, ``procs`` (by role name) and ``more``
    (name → pid)."""
    kafka_port = int(common.bootstrap_servers.rsplit(":", 1)[1])
    pg_port = re.search(r":(\d+)/", common.database_url)
    return CpuMeter(
        {
            "kafka": pid_listening(kafka_port),
            "postgresql": pid_listening(int(pg_port.group(1))) if pg_port else None,
            **{role: proc.process.pid for role, proc in procs.items()},
            **more,
        },
        interval_s=SAMPLE_S,
    )


def last_start_s(results: Results) -> float | None:
    """When the last job first started (unix seconds), from the workers' ``started_at``."""
    firsts = [min(run[0] for run in runs) for runs in results.running.values() if runs]
    return max(firsts) / 1000 if firsts else None


def _timed_run(
    name: str,
    due_ms: Callable[[int], list[int]],
    workers: int,
    lead_s: float,
    feed_ahead_s: float | None = None,
    hold_buffer: int | None = None,
) -> TimedRun:
    """Scheduler + ``workers`` + a projector on fresh topics; once they are up, T0 = now +
    ``lead_s`` and one-time jobs due at ``due_ms(T0)`` (sorted); waits until every job succeeded
    (or gave up). With ``feed_ahead_s`` the jobs are created by a feeder thread that keeps
    ``feed_ahead_s`` seconds of them ahead of their due time, as producers do in production;
    otherwise all are created up front. CPU is measured from just before the first create to
    the last start (each process's lifetime beside it), and each worker's peak RSS."""
    with stack(PARTITIONS) as base, fresh(base) as common:
        procs: dict[str, RoleProc] = {}
        try:  # a start that fails or is interrupted stops the roles started so far
            procs["scheduler"] = start_scheduler(common, name)
            for i, proc in enumerate(start_workers(common, workers, name, hold_buffer)):
                procs[f"worker_{i}"] = proc
            procs["projector"] = start_role(
                ["projector"], role_env(common, DUETIME_INSTANCE_ID=f"{name}-projector"),
                f"{name}-projector",
            )  # fmt: skip
        except BaseException:
            stop(list(procs.values()))
            raise
        results = Results(common)
        try:
            meter = system_meter(common, procs)
            kafka_before = kafka_count.snapshot(common.bootstrap_servers, common.topic_prefix)
            meter.start()
            t0_ms = int((time.time() + lead_s) * 1000)
            times_ms = due_ms(t0_ms)
            if feed_ahead_s is None:
                _, create_s = create_jobs(common, times_ms)
            else:
                feeder = Feeder(common, times_ms, feed_ahead_s)
                create_s = 0.0
            span_s = (times_ms[-1] - time.time() * 1000) / 1000
            wait_done(results, len(times_ms), max(0.0, span_s) + 120)
            meter.stop()
            workers_rss_mb = {
                name: round(size / 1e6, 1)
                for name, size in meter.peak_rss_bytes.items()
                if name.startswith("worker")
            }
            kafka_after = kafka_count.snapshot(common.bootstrap_servers, common.topic_prefix)
            if feed_ahead_s is not None:
                feeder.close()
            metrics = scrape(workers)
            # read now: the run's topics are deleted when fresh() exits
            written = kafka_count.count(
                common.bootstrap_servers, common.topic_prefix, kafka_before, kafka_after,
                len(times_ms),
            )  # fmt: skip
        finally:
            results.close()
            stop(list(procs.values()))
    # the window: just before the first create to the last start (as the peers measure it)
    assert meter.started_s is not None and meter.stopped_s is not None
    end_s = last_start_s(results) or meter.stopped_s
    cpu = window_figures(meter, meter.started_s, end_s)
    # where a burst's starts compete: each process's CPU from the first due time to the end
    first_due_s = min(times_ms) / 1000 if times_ms else end_s
    cpu["cpu_s_from_first_due"] = meter.window(min(first_due_s, end_s), end_s)
    return TimedRun(results, create_s, metrics, t0_ms, times_ms, cpu, written, workers_rss_mb)


class Feeder:
    """Creates one-time jobs ``ahead_s`` before they fall due, in a thread (a producer service
    publishing its jobs as it learns of them, not a week's worth up front)."""

    def __init__(self, common: Any, times_ms: list[int], ahead_s: float) -> None:
        self.common, self.times_ms, self.ahead_ms = common, times_ms, int(ahead_s * 1000)
        self.created = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from duetime.producers.sdk import JobClient

        with JobClient(settings=self.common, timeout_s=SDK_TIMEOUT_S) as client:
            for i, at_ms in enumerate(self.times_ms):
                while at_ms - self.ahead_ms > time.time_ns() // 1_000_000:
                    if self._stop.wait(0.05):
                        return
                client.create_job(
                    name=f"wb-{i}",
                    schedule={"at": datetime.fromtimestamp(at_ms / 1000, UTC).isoformat()},
                    target={"type": "python", "ref": NOOP},
                    retry={"max_retries": 3, "base_delay_s": 1},
                    wait=False,
                )
                self.created = i + 1
                if self._stop.is_set():
                    return

    def close(self) -> None:
        self._stop.set()
        self.thread.join(60)


def start_figures(results: Results, n: int) -> dict[str, Any]:
    """Start lateness (first start − occurrence), the worker's share of it, throughput as the
    peers measure it (distinct jobs started ÷ (last start − first due)), lost and duplicates."""
    firsts = sorted(min(runs)[0:4:3] for runs in results.running.values())
    lateness = [started - scheduled for started, scheduled in firsts]
    # the worker's share: from the request's emission to the start (when a read_committed
    # reader could see it is not measured: the bench's reader fetches every 0.5 s, see Results)
    after_emit = []
    for eid, runs in results.running.items():
        emitted = results.requests.get(eid)
        if emitted is not None:
            after_emit.append(min(run[0] for run in runs) - emitted)
    span_ms = max(s for s, _ in firsts) - min(d for _, d in firsts) if len(firsts) > 1 else 0
    # the timeline's other end: when the scheduler emitted each request (its emitted_at),
    # against the first due time (T in a burst)
    first_due = min((d for _, d in firsts), default=0)
    return {
        "lateness_ms": percentiles(lateness),
        "emitted_after_first_due_ms": percentiles(
            [e - first_due for e in results.requests.values()]
        ),
        "start_after_emit_ms": percentiles(after_emit),
        "started_throughput_jobs_per_s": round(len(firsts) / max(0.001, span_ms / 1000), 1),
        "lost": n - len(results.success),
        "duplicates": sum(len(r) - 1 for r in results.running.values() if len(r) > 1),
        "_series": ([(s - d) for s, d in firsts], [d for _, d in firsts]),
    }


def steady_due(rate: float, n: int, t0_ms: int) -> list[int]:
    """``n`` due times from ``t0_ms`` at ``rate`` a second."""
    return [t0_ms + int(i * 1000 / rate) for i in range(n)]


def scenario_rate(rate: float, duration_s: float, workers: int) -> dict[str, Any]:
    name = f"worker-rate-{int(rate)}"
    n = int(rate * duration_s)
    lead_s = RATE_LEAD_S
    progress(f"{n:,} jobs due from T0 = (roles up) + {lead_s:.0f} s at {rate:g}/s")
    run = _timed_run(name, partial(steady_due, rate, n), workers, lead_s)
    results, create_s, metrics, t0_ms = run.results, run.create_s, run.metrics, run.t0_ms
    figures = start_figures(results, n)
    lateness, scheduled = figures.pop("_series")
    result = {
        "scenario": name,
        "jobs": n,
        "duration_s": duration_s,
        "throughput_jobs_per_s": round(len(results.success) / duration_s, 1),
        **figures,
        **run.cpu_figures(),
        "lease": lease_figures(metrics, len(results.success)),
        "config": {
            "rate_jobs_per_s": rate,
            "workers": workers,
            "partitions": PARTITIONS,
            "worker_concurrency": WORKER_CONCURRENCY,
            "create_s": round(create_s, 1),
            "measured": "worker started_at − due time (scheduler emit + delivery + worker); "
            + CPU_MEASURED,
            "command": f"./run bench worker rate --rate {rate:g} "
            f"--duration-s {duration_s:g} --workers {workers}",
        },
    }
    progress(
        f"{name}: lateness {result['lateness_ms']}, after emit {result['start_after_emit_ms']}"
    )
    plot_series(
        name,
        f"start lateness at {rate:g} jobs/s ({workers} workers)",
        {"due → worker start": ([(d - t0_ms) / 1000 for d in scheduled], lateness)},
        "seconds since the first job was due",
        "ms",
        logy=True,
    )
    write_result(name, result)
    return result


WARM_UP_RATE = 700.0
WARM_UP_S = 60.0


def warm_up(rate: float = WARM_UP_RATE, duration_s: float = WARM_UP_S, workers: int = 2) -> str:
    """The ``rate`` scenario's workload, unmeasured (nothing written): a round of what
    ``compare --run`` runs first on the broker it holds, so the measured runs see a broker
    past its JIT's start (bench.common.warm_bench_stack). Returns what it ran."""
    n = int(rate * duration_s)
    lead_s = RATE_LEAD_S + n / 3000  # the SDK creates every job first (~3,000/s here)
    progress(f"warm-up (not measured): {n:,} no-op jobs at {rate:g}/s")
    started = time.monotonic()
    _timed_run("warm-up", partial(steady_due, rate, n), workers, lead_s)
    progress(f"warm-up done in {time.monotonic() - started:.0f} s")
    return f"worker rate: {n:,} no-op jobs at {rate:g}/s, {workers} workers"


def burst_hold_buffer(jobs: int, workers: int) -> int | None:
    """A burst larger than the workers' hold buffers together gets workers sized for it, as
    the operations guide says (docs/operations.md: a worker's share of the largest burst
    must fit in its hold buffer; 5 % over an even share); None: the default fits."""
    share = math.ceil(jobs / workers * 1.05)
    return share if share > WorkerSettings.hold_buffer else None


def scenario_burst(jobs: int, workers: int) -> dict[str, Any]:
    """The peers' burst workload end to end: ``jobs`` no-op one-time jobs all due at one
    instant T (created before T), scheduler + workers; lateness = first start − T."""
    name = f"worker-burst-{jobs}"
    lead_s = 15 + jobs / 2000
    hold = burst_hold_buffer(jobs, workers)
    progress(f"{jobs:,} jobs all due at T0 = (roles up) + {lead_s:.0f} s")
    run = _timed_run(name, lambda t0: [t0] * jobs, workers, lead_s, hold_buffer=hold)
    results, create_s, metrics, t0_ms = run.results, run.create_s, run.metrics, run.t0_ms
    figures = start_figures(results, jobs)
    lateness, _ = figures.pop("_series")
    starts = sorted(t0_ms + late for late in lateness)
    result = {
        "scenario": name,
        "jobs": jobs,
        "duration_s": round((starts[-1] - t0_ms) / 1000, 2) if starts else None,
        "throughput_jobs_per_s": figures.pop("started_throughput_jobs_per_s"),
        **figures,
        **run.cpu_figures(),
        "lease": lease_figures(metrics, len(results.success)),
        "config": {
            "workers": workers,
            "partitions": PARTITIONS,
            "worker_concurrency": WORKER_CONCURRENCY,
            "worker_hold_buffer": hold or WorkerSettings.hold_buffer,
            "create_s": round(create_s, 1),
            "measured": "worker started_at − T (all due at T); throughput = distinct jobs "
            "started ÷ (last start − T), as bench/peers measures it; " + CPU_MEASURED,
            "command": f"./run bench worker burst --jobs {jobs} --workers {workers}",
        },
    }
    progress(f"{name}: {result['throughput_jobs_per_s']} jobs/s, lateness {result['lateness_ms']}")
    plot_series(
        name,
        f"{jobs:,} no-op jobs due at one instant: starts over time ({workers} workers)",
        {"started": ([(s - t0_ms) / 1000 for s in starts], list(range(1, len(starts) + 1)))},
        "seconds since T",
        "jobs started",
    )
    write_result(name, result)
    return result


def scenario_lease(executions: int) -> dict[str, Any]:
    from duetime.consumers.worker.leases import LeaseStore

    name = "worker-lease"
    out: dict[str, Any] = {}
    with stack(PARTITIONS) as common:

        async def measure(concurrency: int) -> tuple[float, float, int]:
            store = LeaseStore(common.database_url, f"bench-{concurrency}", 30.0)
            await store.open()
            ids = [str(uuid.uuid4()) for _ in range(executions)]
            sem = asyncio.Semaphore(concurrency)
            claim_s = complete_s = 0.0

            async def one(eid: str) -> None:
                nonlocal claim_s, complete_s
                async with sem:
                    t = time.perf_counter()
                    claim = await store.claim(eid, 1)
                    claim_s += time.perf_counter() - t
                    assert claim.token is not None
                    t = time.perf_counter()
                    assert await store.complete(eid, claim.token, "success", b"x" * 200)
                    complete_s += time.perf_counter() - t

            started = time.perf_counter()
            await asyncio.gather(*(one(e) for e in ids))
            wall = time.perf_counter() - started
            await store.close()
            return wall, (claim_s + complete_s) / executions, executions

        for concurrency in (1, 10, 100, 500):
            wall, per_call_s, n = asyncio.run(measure(concurrency))
            out[str(concurrency)] = {
                "executions_per_s": round(n / wall, 1),
                "wall_us_per_execution": round(1e6 * wall / n, 1),
                "latency_ms_claim_plus_complete": round(1000 * per_call_s, 2),
            }
            progress(f"lease, {concurrency} concurrent: {out[str(concurrency)]}")
    result = {
        "scenario": name,
        "jobs": executions,
        "duration_s": None,
        "throughput_jobs_per_s": max(v["executions_per_s"] for v in out.values()),
        "lateness_ms": {"p50": None, "p99": None, "max": None},
        "lost": 0,
        "duplicates": 0,
        "by_concurrency": out,
        "config": {
            "measured": "claim + complete (200-byte result) per execution, batched by concurrency",
            "command": f"python -m bench.worker_throughput lease --executions {executions}",
        },
    }
    plot_series(
        name,
        "lease cost (claim + complete) per execution",
        {
            "µs per execution (wall)": (
                [int(k) for k in out],
                [v["wall_us_per_execution"] for v in out.values()],
            )
        },
        "concurrent executions",
        "µs",
        logy=True,
    )
    write_result(name, result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_throughput")
    sub = parser.add_subparsers(dest="scenario", required=True)
    for name in ("e2e", "drain"):
        p = sub.add_parser(name)
        p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
        p.add_argument("--jobs", type=int, default=20_000)
    rate = sub.add_parser("rate")
    rate.add_argument("--rate", type=float, default=350)
    rate.add_argument("--duration-s", type=float, default=30)
    rate.add_argument("--workers", type=int, default=2)
    burst = sub.add_parser("burst")
    burst.add_argument("--jobs", type=int, default=10_000)
    burst.add_argument("--workers", type=int, default=2)
    for p in (rate, burst):
        p.add_argument(
            "--warm-broker",
            action="store_true",
            help="run on a broker with the JVM's default JIT, warmed first (as compare --run)",
        )
    lease = sub.add_parser("lease")
    lease.add_argument("--executions", type=int, default=20_000)
    args = parser.parse_args(argv)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # unwind: stop the roles, drop the database

    signal.signal(signal.SIGTERM, on_term)
    with warm_bench_stack(warm_up) if getattr(args, "warm_broker", False) else nullcontext():
        result = _scenario(args)
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=2))
    return 0


def _scenario(args: argparse.Namespace) -> dict[str, Any]:
    if args.scenario == "e2e":
        return scenario_e2e(args.workers, args.jobs)
    if args.scenario == "drain":
        return scenario_drain(args.workers, args.jobs)
    if args.scenario == "rate":
        return scenario_rate(args.rate, args.duration_s, args.workers)
    if args.scenario == "burst":
        return scenario_burst(args.jobs, args.workers)
    return scenario_lease(args.executions)


if __name__ == "__main__":
    raise SystemExit(main())

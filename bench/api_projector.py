"""Projector and REST API benchmarks (issue 5).

    python -m bench.api_projector projector --jobs 20000
    python -m bench.api_projector api --jobs 10000 --concurrency 64 --workers 1 2
    python -m bench.api_projector lag --rate 1000 --duration-s 30

With ``DUETIME_KAFKA_BOOTSTRAP`` and ``DUETIME_DATABASE_URL`` set it runs on those servers
(a fresh database and topic prefix); otherwise on the shared bench stack of ``bench.common``.
Everything (broker, PostgreSQL, roles, load generator) shares this machine's cores.

- ``projector``: J jobs' worth of events (definition, scheduler states, execution request,
  running and success results: 6 events a job) written to the topics first, then one
  projector (in this process) reads them all; throughput is events / (last commit − first
  fetch). ``lateness_ms`` is unused (null) here.
- ``api``: ``duetime api`` as a process (1 or more uvicorn workers); C concurrent clients POST
  J jobs (cron, far from due: no scheduler involved); throughput is J / wall time;
  ``lateness_ms`` holds the create latency (Kafka ack included). Each create is readable by
  GET at once (the API writes the row in the request): checked on a sample.
- ``lag``: a load generator (its own process) creates one-time jobs due 1 s later at R/s for
  D s through the SDK; a scheduler and a worker (processes, no-op Python target) run them; the
  projector (in this process) projects everything. ``lateness_ms`` is the projection lag:
  the commit of an event's row minus the event's Kafka timestamp, over every event.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from bench.common import (
    ROOT,
    bench_stack,
    percentiles,
    plot_series,
    progress,
    role_env,
    start_role,
    write_result,
)
from bench.cpu import CpuMeter, pid_listening
from bench.rawhttp import RawHttpConnection
from duetime.infra.harness import stop_all

HTTP_TARGET = {"type": "http", "url": "http://127.0.0.1:9/none"}


@contextmanager
def stack(partitions: int) -> Iterator[Any]:
    import psycopg

    from duetime.core.config import CommonSettings, Env
    from duetime.core.topics import Topics
    from duetime.infra.migrate import migrate
    from duetime.infra.topics import create_topics

    env = Env()
    bootstrap, url = env.opt_str("DUETIME_KAFKA_BOOTSTRAP"), env.opt_str("DUETIME_DATABASE_URL")
    if not (bootstrap and url):
        with bench_stack(partitions) as common:
            yield common
        return
    run = uuid.uuid4().hex[:8]
    db = f"pbench_{run}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db}"')
    common = replace(
        CommonSettings.from_env(env),
        bootstrap_servers=bootstrap,
        database_url=f"{url.rpartition('/')[0]}/{db}",
        topic_prefix=f"pbench{run}.",
        partitions=partitions,
    )
    migrate(common.database_url)
    create_topics(bootstrap, Topics(common.topic_prefix).specs(partitions))
    try:
        yield common
    finally:
        from confluent_kafka.admin import AdminClient

        names = [s.name for s in Topics(common.topic_prefix).specs(partitions)]
        for future in AdminClient({"bootstrap.servers": bootstrap}).delete_topics(names).values():
            try:
                future.result()
            except Exception:
                continue
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


class Recorder:
    """The projector's batch hook: when batches landed and how late each event was."""

    def __init__(self) -> None:
        self.events = 0
        self.rows = 0
        self.first_at: float | None = None
        self.last_at = 0.0
        self.lags_ms: list[float] = []
        self.timeline: list[tuple[float, float]] = []  # (seconds since start, lag ms)
        self.lock = threading.Lock()

    def __call__(self, batch: Any, lags: list[float]) -> None:
        now = time.time()
        with self.lock:
            if self.first_at is None:
                self.first_at = now
            self.last_at = now
            self.events += len(lags)
            self.rows += batch.rows_written()
            self.lags_ms += [lag * 1000 for lag in lags]
            self.timeline += [(now, lag * 1000) for lag in lags[:: max(1, len(lags) // 50)]]


def _run_projector(common: Any, recorder: Recorder, until_caught_up: bool) -> Any:
    from duetime.consumers.projector.service import Projector
    from duetime.consumers.projector.settings import ProjectorSettings

    projector = Projector(ProjectorSettings(common=common, poll_s=0.05), on_batch=recorder)
    thread = threading.Thread(
        target=lambda: projector.run(until_caught_up=until_caught_up), daemon=True
    )
    thread.start()
    return projector, thread


# --- projector throughput --------------------------------------------------------------------


def _events_for(job_index: int, now_ms: int, client: Any) -> list[tuple[str, str, bytes]]:
    """The events one job produces in its life: definition, 2 states, request, 2 results."""
    definition = client.build(
        name=f"bench-{job_index}",
        schedule={"at": "2026-01-01T00:00:00Z"},
        target=HTTP_TARGET,
        payload={"i": job_index},
    ).to_avro()  # the records below are written as plain Avro dicts
    job_id, codec, topics = definition["job_id"], client.codec, client.topics
    execution_id = str(uuid.uuid4())
    state = {
        "job_id": job_id,
        "definition": definition,
        "status": "queued",
        "next_run_at_ms": None,
        "last_scheduled_at_ms": now_ms,
        "paused_at_ms": None,
        "inflight": [],
        "queued_occurrence_ms": None,
        "fired_count": 1,
        "updated_at_ms": now_ms,
        "dag_runs": {},
    }
    request = {
        "execution_id": execution_id,
        "job_id": job_id,
        "name": definition["name"],
        "attempt": 1,
        "scheduled_at_ms": now_ms,
        "due_at_ms": now_ms,
        "emitted_at_ms": now_ms + 3,
        "priority": "normal",
        "target": definition["target"],
        "payload_json": definition["payload_json"],
        "timeout_s": 300.0,
        "trigger": "schedule",
        "dag_id": None,
        "dag_run_id": None,
        "dag_key": None,
    }
    result = {
        "execution_id": execution_id,
        "job_id": job_id,
        "attempt": 1,
        "worker_id": "bench",
        "lease_token": 1,
        "scheduled_at_ms": now_ms,
        "started_at_ms": now_ms + 10,
        "finished_at_ms": None,
        "error": None,
        "retry_after_s": None,
        "output_json": None,
        "priority": "normal",
        "dag_id": None,
        "dag_run_id": None,
        "dag_key": None,
    }
    return [
        (topics.jobs, job_id, codec.encode("job", definition)),
        (topics.state, job_id, codec.encode("state", state)),
        (topics.execution("normal"), job_id, codec.encode("execution", request)),
        (topics.results, job_id, codec.encode("result", {**result, "status": "running"})),
        (
            topics.results,
            job_id,
            codec.encode("result", {**result, "status": "success", "finished_at_ms": now_ms + 20}),
        ),
        (topics.state, job_id, codec.encode("state", {**state, "status": "success"})),
    ]


def scenario_projector(args: argparse.Namespace) -> None:
    from confluent_kafka import Producer

    from duetime.core.records import JobDefinition
    from duetime.producers.sdk import JobClient

    with stack(args.partitions) as common:
        progress(f"writing {args.jobs} jobs' events ({args.jobs * 6} records)")
        producer = Producer(
            {"bootstrap.servers": common.bootstrap_servers, "linger.ms": 20, "acks": "all"}
        )
        now_ms = int(time.time() * 1000)
        definitions: list[Any] = []
        with JobClient(settings=common) as client:
            for i in range(args.jobs):
                job_events = _events_for(i, now_ms, client)
                if args.api_rows:
                    definitions.append(client.codec.load(JobDefinition, job_events[0][2]))
                for topic, key, value in job_events:
                    while True:
                        try:
                            producer.produce(topic, key=key, value=value)
                            break
                        except BufferError:
                            producer.poll(0.05)
                producer.poll(0)
        producer.flush(60)
        if args.api_rows:
            _insert_rows_as_the_api(common, definitions)
        recorder = Recorder()
        progress("projecting")
        started = time.time()
        # the projector runs in this process, which does nothing else meanwhile: the process's
        # CPU (all threads, librdkafka's included) is the projector's
        cpu_before = time.process_time()
        _, thread = _run_projector(common, recorder, until_caught_up=True)
        thread.join(600)
        projector_cpu_s = time.process_time() - cpu_before
        assert recorder.first_at is not None
        # the first batch's fetch began at most one poll before its commit
        duration_s = recorder.last_at - started
        events = recorder.events
        rows = _count_rows(common)
        result = {
            "scenario": "projector-throughput",
            "jobs": args.jobs,
            "events": events,
            "rows_upserted": recorder.rows,
            "duration_s": round(duration_s, 2),
            "throughput_jobs_per_s": round(args.jobs / duration_s, 1),
            "throughput_events_per_s": round(events / duration_s, 1),
            # without the consumer-group join and the first fetch
            "steady_events_per_s": round(events / (recorder.last_at - recorder.first_at), 1),
            "lateness_ms": {"p50": None, "p99": None, "max": None},
            "lost": args.jobs - rows["jobs"],
            "duplicates": 0,
            "projector_cpu_s": round(projector_cpu_s, 2),
            "projector_cpu_ms_per_job": round(projector_cpu_s * 1000 / args.jobs, 3),
            "load_average_1m": round(os.getloadavg()[0], 1),
            "tables": rows,
            "config": {
                "command": " ".join(["python -m bench.api_projector", *sys.argv[1:]]),
                "partitions": args.partitions,
                "batch_size": 5000,
                "events_per_job": 6,
                "api_rows": args.api_rows,
                "measured": "projector start → last commit (includes the group join)",
            },
        }
        write_result("projector-throughput", result)
        print(json.dumps({k: result[k] for k in ("events", "duration_s")}, indent=None))
        print(
            f"{result['throughput_events_per_s']:.0f} events/s "
            f"({result['steady_events_per_s']:.0f} after the first batch), "
            f"projector CPU {result['projector_cpu_ms_per_job']} ms a job (6 events), "
            f"load {result['load_average_1m']}"
        )


def _insert_rows_as_the_api(common: Any, definitions: list[Any]) -> None:
    """``--api-rows``: each job's row as ``POST /v1/jobs`` writes it at create, before the
    projector reads the job's events (the live path; without it every row starts from the
    topics, as in a rebuild)."""
    import psycopg

    from duetime.core.projection import JOB_COLUMNS, job_row

    progress(f"writing {len(definitions)} job rows as the API does")
    insert = (
        f"INSERT INTO jobs ({', '.join(JOB_COLUMNS)}) "
        f"VALUES ({', '.join(['%s'] * len(JOB_COLUMNS))})"
    )
    with psycopg.connect(common.database_url) as conn, conn.cursor() as cur:
        cur.executemany(
            insert, [[row[c] for c in JOB_COLUMNS] for row in map(job_row, definitions)]
        )


def _count_rows(common: Any) -> dict[str, int]:
    import psycopg

    with psycopg.connect(common.database_url) as conn:
        out = {}
        for table in ("jobs", "executions"):
            row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
            out[table] = int(row[0]) if row else 0
        row = conn.execute("SELECT count(*) FROM executions WHERE status = 'success'").fetchone()
        out["executions_success"] = int(row[0]) if row else 0
    return out


# --- API creates -----------------------------------------------------------------------------


def _job_body(i: int) -> dict[str, Any]:
    return {
        "name": f"api-bench-{i}",
        "schedule": {"cron": "0 3 1 1 *", "timezone": "Europe/Berlin"},
        "target": HTTP_TARGET,
        "payload": {"i": i},
    }


async def _load_api(
    url: str, jobs: int, concurrency: int, batch: int = 1
) -> tuple[list[float], int, float]:
    """C clients create J jobs: one ``POST /v1/jobs`` each, or ``POST /v1/jobs:batch`` with
    ``batch`` jobs a call (each latency is then one call's). Errors count jobs."""
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    errors = 0
    next_index = 0
    sample: list[str] = []

    async def client_loop() -> None:
        nonlocal next_index, errors
        conn = RawHttpConnection(host, int(port))
        try:
            while next_index < jobs:
                first = next_index
                next_index = min(jobs, next_index + batch)
                bodies = [_job_body(i) for i in range(first, next_index)]
                path, body = (
                    ("/v1/jobs", bodies[0]) if batch == 1 else ("/v1/jobs:batch", {"jobs": bodies})
                )
                t0 = time.perf_counter()
                status, payload = await conn.request("POST", path, json.dumps(body).encode())
                latencies.append((time.perf_counter() - t0) * 1000)
                if status != 201:
                    errors += len(bodies)
                elif first % 500 < len(bodies):
                    answer = json.loads(payload)
                    sample.append(answer["job_id"] if batch == 1 else answer["items"][0]["job_id"])
        finally:
            conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    duration = time.perf_counter() - started
    check = RawHttpConnection(host, int(port))
    for job_id in sample:  # read-your-writes: every sampled create is readable at once
        assert (await check.request("GET", f"/v1/jobs/{job_id}"))[0] == 200
    check.close()
    return latencies, errors, duration


def _run_async(coro: Any) -> Any:
    """The load generator on uvloop when installed: it shares the cores with the API."""
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def scenario_api(args: argparse.Namespace) -> None:

    from duetime.infra.process import free_port

    runs = []
    series: dict[str, tuple[Sequence[float], Sequence[float]]] = {}
    for workers in args.workers:
        with stack(args.partitions) as common:
            port = free_port()
            env = role_env(common, DUETIME_API_PORT=str(port), DUETIME_API_WORKERS=str(workers))
            api = start_role(["api"], env, f"api-bench-{workers}")
            url = f"http://127.0.0.1:{port}"
            try:
                api.wait_http(f"{url}/readyz", 60)
                # warm-up
                _run_async(_load_api(url, min(500, args.jobs), args.concurrency, args.batch))
                # the API's CPU (its uvicorn workers included) and PostgreSQL's (the postmaster
                # tree: every backend) over the measured creates only
                pg_port = int(common.database_url.rsplit(":", 1)[1].split("/", 1)[0])
                meter = CpuMeter({"api": api.pid, "postgresql": pid_listening(pg_port)})
                meter.start()
                progress(
                    f"{workers} worker(s): {args.jobs} creates, {args.concurrency} clients, "
                    f"{args.batch} a call"
                )
                latencies, errors, duration = _run_async(
                    _load_api(url, args.jobs, args.concurrency, args.batch)
                )
                meter.stop()
            finally:
                api.stop(30)
        rate = args.jobs / duration
        cpu_s = meter.seconds()
        api_cpu_s, pg_cpu_s = cpu_s["api"], cpu_s["postgresql"]
        cpu_ms = None if api_cpu_s is None else round(api_cpu_s * 1000 / args.jobs, 3)
        pg_ms = None if pg_cpu_s is None else round(pg_cpu_s * 1000 / args.jobs, 3)
        progress(
            f"{workers} worker(s): {rate:.0f} creates/s, {errors} errors, "
            f"API CPU {api_cpu_s} s = {cpu_ms} ms a job, PostgreSQL {pg_ms} ms a job, "
            f"load {os.getloadavg()[0]:.1f}"
        )
        runs.append(
            {
                "label": f"{workers} API process(es)",
                "workers": workers,
                "batch": args.batch,
                "jobs": args.jobs,
                "duration_s": round(duration, 2),
                "throughput_jobs_per_s": round(rate, 1),
                "latency_ms": percentiles(latencies),
                "errors": errors,
                "api_cpu_s": api_cpu_s,
                "api_cpu_ms_per_job": cpu_ms,
                "postgresql_cpu_s": pg_cpu_s,
                "postgresql_cpu_ms_per_job": pg_ms,
                "group_max_jobs": os.environ.get("DUETIME_API_GROUP_MAX_JOBS", "default"),
                "load_average_1m": round(os.getloadavg()[0], 1),
            }
        )
        series[f"{workers} API process(es)"] = (
            [float(i) for i in range(len(latencies))],
            latencies,
        )
    best = max(runs, key=lambda r: r["throughput_jobs_per_s"])
    name = "api-creates" if args.batch == 1 else f"api-creates-batch-{args.batch}"
    result = {
        "scenario": name,
        "jobs": args.jobs,
        "duration_s": best["duration_s"],
        "throughput_jobs_per_s": best["throughput_jobs_per_s"],
        "lateness_ms": best["latency_ms"],
        "lost": sum(r["errors"] for r in runs),
        "duplicates": 0,
        "runs": runs,
        "config": {
            "command": " ".join(["python -m bench.api_projector", *sys.argv[1:]]),
            "concurrency": args.concurrency,
            "partitions": args.partitions,
            "batch": args.batch,
            "measured": (
                "POST /v1/jobs answered 201 (validated, row written, Kafka acks=all)"
                if args.batch == 1
                else f"POST /v1/jobs:batch with {args.batch} jobs a call answered 201 "
                "(all validated, rows in one transaction, every job acknowledged by Kafka)"
            ),
            "lateness_ms": "create latency of the best run (per call)",
        },
    }
    write_result(name, result)
    plot_series(
        name,
        "POST /v1/jobs latency (each create, in order)",
        series,
        "request",
        "latency (ms)",
        logy=True,
    )


# --- projection lag at a steady rate ---------------------------------------------------------


def _generate(args: argparse.Namespace) -> None:
    """Hidden scenario: the load generator process of ``lag``."""
    from datetime import UTC, datetime, timedelta

    from duetime.core.config import CommonSettings, Env
    from duetime.producers.sdk import JobClient

    common = CommonSettings.from_env(Env())
    step_s = 0.01
    per_step = max(1, round(args.rate * step_s))
    with JobClient(settings=common) as client:
        started = time.monotonic()
        made = 0
        while made < args.rate * args.duration_s:
            due = datetime.now(UTC) + timedelta(seconds=1)
            for _ in range(per_step):
                client.create_job(
                    name="lag-bench",
                    schedule={"at": due.isoformat()},
                    target={"type": "python", "ref": "bench.worker_throughput:noop"},
                    wait=False,
                )
                made += 1
            client.poll(0)
            sleep = started + made / args.rate - time.monotonic()
            if sleep > 0:
                time.sleep(sleep)
    print(made)


def scenario_lag(args: argparse.Namespace) -> None:
    with stack(args.partitions) as common:
        env = role_env(common)
        roles = [
            start_role(["scheduler"], env, "lag-scheduler"),
            start_role(["worker"], {**env, "DUETIME_WORKER_CONCURRENCY": "500"}, "lag-worker"),
        ]
        recorder = Recorder()
        projector, thread = _run_projector(common, recorder, until_caught_up=False)
        try:
            # the roles have joined their groups
            roles[0].wait_log("owning partition")
            roles[1].wait_log(r"assigned \d+ partitions")
            progress(f"creating {args.rate} jobs/s for {args.duration_s} s")
            started = time.time()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.api_projector",
                    "_generate",
                    "--rate",
                    str(args.rate),
                    "--duration-s",
                    str(args.duration_s),
                ],
                env=env,
                cwd=ROOT,
                check=True,
                capture_output=True,
            )
            expected = args.rate * args.duration_s
            deadline = time.time() + 120
            while time.time() < deadline:
                rows = _count_rows(common)
                if rows["executions_success"] >= expected:
                    break
                time.sleep(1)
            time.sleep(2)
        finally:
            projector.stop()
            thread.join(30)
            stop_all(roles, 60)
        rows = _count_rows(common)
        by_second: dict[int, list[float]] = defaultdict(list)
        for at, lag_ms in recorder.timeline:
            by_second[int(at - started)].append(lag_ms)
        lag = percentiles(recorder.lags_ms)
        result = {
            "scenario": f"projection-lag-{args.rate}",
            "jobs": expected,
            "events": recorder.events,
            "duration_s": args.duration_s,
            "throughput_jobs_per_s": args.rate,
            "lateness_ms": lag,
            "lost": expected - rows["executions_success"],
            "duplicates": max(0, rows["executions"] - expected),
            "tables": rows,
            "config": {
                "command": " ".join(["python -m bench.api_projector", *sys.argv[1:]]),
                "partitions": args.partitions,
                "measured": "projection lag: row committed − event's Kafka timestamp",
                "roles": "1 scheduler, 1 worker (no-op python target), 1 projector",
            },
        }
        write_result(f"projection-lag-{args.rate}", result)
        xs = sorted(by_second)
        plot_series(
            f"projection-lag-{args.rate}",
            f"projection lag at {args.rate} jobs/s (p99 per second)",
            {
                "p99": (xs, [percentiles(by_second[x])["p99"] or 0 for x in xs]),
                "p50": (xs, [percentiles(by_second[x])["p50"] or 0 for x in xs]),
            },
            "seconds since the load started",
            "lag (ms)",
        )
        print(json.dumps(lag))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_projector")
    sub = parser.add_subparsers(dest="scenario", required=True)
    p = sub.add_parser("projector")
    p.add_argument("--jobs", type=int, default=20000)
    p.add_argument("--partitions", type=int, default=12)
    p.add_argument(
        "--api-rows",
        action="store_true",
        help="write each job's row first, as POST /v1/jobs does (the live path)",
    )
    a = sub.add_parser("api")
    a.add_argument("--jobs", type=int, default=10000)
    a.add_argument("--concurrency", type=int, default=16)
    a.add_argument("--batch", type=int, default=1, help="jobs per call (>1: POST /v1/jobs:batch)")
    a.add_argument("--workers", type=int, nargs="+", default=[1])
    a.add_argument("--partitions", type=int, default=12)
    lag = sub.add_parser("lag")
    lag.add_argument("--rate", type=int, default=1000)
    lag.add_argument("--duration-s", type=int, default=30)
    lag.add_argument("--partitions", type=int, default=12)
    g = sub.add_parser("_generate")
    g.add_argument("--rate", type=int, required=True)
    g.add_argument("--duration-s", type=int, required=True)
    args = parser.parse_args(argv)
    {
        "projector": scenario_projector,
        "api": scenario_api,
        "lag": scenario_lag,
        "_generate": _generate,
    }[args.scenario](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

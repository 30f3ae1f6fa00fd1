"""DAG benchmark: release latency (upstream success → downstream execution request) and runs/s.

    python -m bench.dag_bench latency      # runs of a 10-node DAG, one at a time
    python -m bench.dag_bench throughput   # many runs of the same DAG at once

A scheduler and a resolver run as real processes (``duetime scheduler``, ``duetime
resolver``); a simulated worker in this process answers every execution request at once with
a ``success`` result (``finished_at_ms`` = when it was sent). Release latency of a node is the
emission time of its execution request minus the latest ``finished_at_ms`` of its upstreams in
the same run: the whole path results → resolver → control → scheduler transaction → exec
topic, as a worker would see it. Everything runs on one host, so the clocks agree.

Services: ``DUETIME_KAFKA_BOOTSTRAP`` and ``DUETIME_DATABASE_URL`` if set, else the local
bench stack of ``bench/common.py``. Results: ``bench/results/dag-<scenario>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from bench.common import LOGS
from bench.dag_harness import ResolverProcess, SimWorker
from duetime.core.config import CommonSettings, Env
from duetime.core.topics import Topics
from duetime.infra.harness import RoleProc, TopicReader, role_env, wait_for, wait_known
from duetime.schemas.codec import Codec

TEN_NODES: dict[str, list[str]] = {
    "n0": [],
    "n1": ["n0"],
    "n2": ["n0"],
    "n3": ["n0"],
    "n4": ["n1", "n2"],
    "n5": ["n2", "n3"],
    "n6": ["n1", "n3"],
    "n7": ["n4", "n5"],
    "n8": ["n5", "n6"],
    "n9": ["n7", "n8"],
}
"""Five layers, fan-out and fan-in: 9 releases per run, 4 on the critical path."""


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _services(partitions: int) -> Iterator[CommonSettings]:
    env = Env()
    if env.opt_str("DUETIME_KAFKA_BOOTSTRAP") and env.opt_str("DUETIME_DATABASE_URL"):
        from confluent_kafka.admin import AdminClient

        from duetime.infra.topics import create_topics

        common = replace(
            CommonSettings.from_env(env),
            topic_prefix=f"benchdag{uuid.uuid4().hex[:8]}.",
            partitions=partitions,
        )
        specs = Topics(common.topic_prefix).specs(partitions)
        create_topics(common.bootstrap_servers, specs)
        try:
            yield common
        finally:
            admin = AdminClient({"bootstrap.servers": common.bootstrap_servers})
            names = [
                t for t in admin.list_topics(timeout=10).topics if t.startswith(common.topic_prefix)
            ]
            for future in admin.delete_topics(names).values():
                with contextlib.suppress(Exception):
                    future.result()
    else:
        from bench.common import bench_stack

        with bench_stack(partitions) as common:
            yield common


def _wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    wait_for(predicate, timeout_s, what, interval_s=0.02)  # a finer poll: latencies are measured


class Run:
    """Roles up, a DAG created, runs triggered, completions followed."""

    def __init__(self, common: CommonSettings) -> None:
        from duetime.producers.sdk import JobClient

        self.common = common
        self.scheduler = RoleProc.start(
            "dag-bench-scheduler",
            ["scheduler"],
            role_env(common, DUETIME_LOG_LEVEL="WARNING"),
            log_path=LOGS / f"dag-bench-scheduler-{common.topic_prefix}log",
        )
        self.resolver = ResolverProcess(common, {"DUETIME_LOG_LEVEL": "WARNING"}).start()
        self.worker = SimWorker(common)
        self.dag_runs = TopicReader(common, [Topics(common.topic_prefix).dag_runs], "dag_run")
        self.control = TopicReader(common, [Topics(common.topic_prefix).control], None)
        self.client = JobClient(settings=common)
        jobs = [
            {
                "key": key,
                "name": f"bench-{key}",
                "target": {"type": "python", "ref": "bench.noop:run"},
                "depends_on": deps,
            }
            for key, deps in TEN_NODES.items()
        ]
        self.dag = self.client.create_dag("bench-ten", jobs)
        self.run_ids: list[str] = []

    def warm_up(self) -> None:
        """One run end to end: every role is up, assigned and has its topics."""
        _progress("warming up (roles start, groups form)")
        wait_known(self.common, self.dag, timeout_s=60)  # a trigger must not overtake its job
        self.run_ids.append(self.client.trigger_dag(self.dag.dag_id))
        _wait_for(lambda: self.completed(self.run_ids[0]), 120, "the warm-up run")
        self.run_ids.clear()

    def completed(self, run_id: str) -> dict[str, Any] | None:
        return next(
            (
                e
                for e in self.dag_runs.snapshot()
                if e["dag_run_id"] == run_id and e["kind"] == "completed"
            ),
            None,
        )

    def trigger(self) -> str:
        run_id = self.client.trigger_dag(self.dag.dag_id, wait=False)
        self.run_ids.append(run_id)
        return run_id

    def measure(self) -> dict[str, Any]:
        """Release latencies, executions per node per run, completions."""
        self.client.flush()
        ends = {
            e["dag_run_id"]: e
            for e in self.dag_runs.snapshot()
            if e["kind"] == "completed" and e["dag_run_id"] in set(self.run_ids)
        }
        latencies: list[float] = []
        at: list[float] = []
        resolver_ms: list[float] = []  # upstream success → release command sent
        scheduler_ms: list[float] = []  # release command sent → execution request emitted
        codec = Codec()
        released_at: dict[tuple[str, str], int] = {}
        for msg in list(self.control.raw):
            command = codec.decode("control", msg.value() or b"")
            if command["kind"] == "release":
                ref = (command["dag_run_id"], command["job_id"])
                released_at.setdefault(ref, msg.timestamp()[1])
        executions = Counter[tuple[str, str]]()
        for run_id in self.run_ids:
            requests = {r["dag_key"]: r for r in self.worker.requests_of(run_id)}
            for r in self.worker.requests_of(run_id):
                executions[(run_id, r["dag_key"])] += 1
            finished = {
                rep.request["dag_key"]: rep.at_ms
                for rep in self.worker.reports_of(run_id)
                if rep.status == "success"
            }
            for key, deps in TEN_NODES.items():
                if deps and key in requests and all(d in finished for d in deps):
                    upstream_ms = max(finished[d] for d in deps)
                    latency = requests[key]["emitted_at_ms"] - upstream_ms
                    latencies.append(float(latency))
                    at.append(requests[key]["emitted_at_ms"] / 1000)
                    sent_ms = released_at.get((run_id, requests[key]["job_id"]))
                    if sent_ms is not None:
                        resolver_ms.append(float(sent_ms - upstream_ms))
                        scheduler_ms.append(float(requests[key]["emitted_at_ms"] - sent_ms))
        expected = len(self.run_ids) * len(TEN_NODES)
        return {
            "latencies_ms": latencies,
            "resolver_ms": resolver_ms,
            "scheduler_ms": scheduler_ms,
            "latency_at_s": at,
            "executions": sum(executions.values()),
            "lost": expected - len(executions),
            "duplicates": sum(n - 1 for n in executions.values() if n > 1),
            "completed": ends,
        }

    def close(self) -> None:
        self.client.close()
        self.worker.close()
        self.dag_runs.close()
        self.control.close()
        self.resolver.stop()
        self.scheduler.stop(20)


def scenario_latency(run: Run, runs: int, gap_s: float) -> dict[str, Any]:
    """Runs one after another: each starts when the previous one ended (no queueing)."""
    started = time.monotonic()
    for i in range(runs):
        run_id = run.trigger()
        _wait_for(lambda r=run_id: run.completed(r), 60, f"run {i} to end")
        time.sleep(gap_s)
    return {"wall_s": time.monotonic() - started}


def scenario_throughput(run: Run, runs: int, rate_per_s: float) -> dict[str, Any]:
    """``runs`` runs triggered at ``rate_per_s``; how many runs per second complete."""
    started = time.monotonic()
    for i in range(runs):
        delay = started + i / rate_per_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        run.trigger()
    run.client.flush()
    _wait_for(
        lambda: all(run.completed(r) for r in run.run_ids),
        300,
        "every run to end",
    )
    return {"wall_s": time.monotonic() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dag_bench", description=__doc__)
    parser.add_argument("scenario", choices=("latency", "throughput"))
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--rate", type=float, default=50.0, help="throughput: runs/s offered")
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args(argv)
    runs = args.runs or (200 if args.scenario == "latency" else 1000)
    from bench.common import machine, percentiles, plot_series, write_result

    with _services(args.partitions) as common:
        run = Run(common)
        try:
            run.warm_up()
            _progress(f"{args.scenario}: {runs} runs of a 10-node DAG")
            if args.scenario == "latency":
                timing = scenario_latency(run, runs, gap_s=0.05)
            else:
                timing = scenario_throughput(run, runs, args.rate)
            time.sleep(1.0)  # late duplicates would show up here
            measured = run.measure()
        finally:
            run.close()
    ends = measured["completed"]
    first_start = min(
        e["at_ms"]
        for e in run.dag_runs.snapshot()
        if e["kind"] == "started" and e["dag_run_id"] in set(run.run_ids)
    )
    last_end = max(e["at_ms"] for e in ends.values())
    duration_s = (last_end - first_start) / 1000
    latency = percentiles(measured["latencies_ms"])
    name = "dag-latency" if args.scenario == "latency" else f"dag-throughput-{args.rate:g}"
    result = {
        "scenario": name,
        "jobs": measured["executions"],
        "runs": len(run.run_ids),
        "runs_completed": len(ends),
        "runs_failed": sum(e["status"] != "success" for e in ends.values()),
        "duration_s": round(duration_s, 3),
        "runs_per_s": round(len(ends) / duration_s, 2),
        "throughput_jobs_per_s": round(measured["executions"] / duration_s, 1),
        "lateness_ms": latency,
        "release_latency_ms": {**latency, "samples": len(measured["latencies_ms"])},
        "release_latency_breakdown_ms": {
            "resolver": percentiles(measured["resolver_ms"]),
            "scheduler": percentiles(measured["scheduler_ms"]),
            "resolver_means": "upstream success → release command produced (CreateTime)",
            "scheduler_means": "release command produced → execution request emitted",
        },
        "lost": measured["lost"],
        "duplicates": measured["duplicates"],
        "machine": machine(),
        "config": {
            "dag": "10 nodes, 5 layers, 9 releases a run (4 on the critical path)",
            "partitions": common.partitions,
            "runs": runs,
            "offered_runs_per_s": args.rate if args.scenario == "throughput" else None,
            "worker": "simulated, answers at once (success)",
            "roles": "1 scheduler + 1 resolver process, same host",
            "lateness_ms": "release latency: downstream request emitted − last upstream success",
        },
        "wall_s": round(timing["wall_s"], 2),
        # the machine may be shared: say how busy it was
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
    }
    write_result(name, result)
    xs = measured["latency_at_s"]
    t0 = min(xs) if xs else 0.0
    plot_series(
        name,
        f"DAG release latency ({args.scenario}): p50 {latency['p50']} ms, p99 {latency['p99']} ms",
        {"release latency": ([x - t0 for x in xs], measured["latencies_ms"])},
        "time since the first release (s)",
        "upstream success → downstream request (ms)",
    )
    res = result["release_latency_breakdown_ms"]["resolver"]
    sch = result["release_latency_breakdown_ms"]["scheduler"]
    _progress(
        f"{name}: release latency p50 {latency['p50']} ms p99 {latency['p99']} ms "
        f"max {latency['max']} ms (resolver p50/p99 {res['p50']}/{res['p99']} ms, scheduler "
        f"{sch['p50']}/{sch['p99']} ms); {result['runs_per_s']} runs/s; "
        f"lost {result['lost']} duplicates {result['duplicates']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

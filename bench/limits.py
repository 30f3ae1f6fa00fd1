"""Throughput with limits per key on next to limits off, in the same run (issue 18).

    ./run bench limits drain --workers 2 --jobs 10000 --rounds 2

The worker-only drain of ``bench.worker_throughput`` (J execution requests written straight
to exec.normal, then N worker processes started; throughput = J / (last success - first
start); no-op Python targets, so the figures are duetime's own cost), once per mode and
round, the modes interleaved so that a change in the machine's load hits all of them:

- ``off``: no limits (the plain lease claim);
- ``concurrency``: every request has ``concurrency {"key": "k-{payload.k}", "limit": 1000}``
  on 20 keys: each claim resolves the key, takes the per-key lock, counts the live leases and
  writes the key, but the limit (20 x 1,000) is above what the workers run at once, so what
  is measured is the limits' cost, not the waiting they impose;
- ``rate``: ``rate_limit {"key": "k-{payload.k}", "per_s": 100000, "burst": 100000}``: the
  bucket is read and written by every claim, never empty;
- ``both``: the two together.

The cost of a mode is 1 - its median throughput / the median of ``off``. On a shared machine
throughput moves with everything else that runs, so every run also records the CPU time it
took per job, which does not: the worker processes' (from /proc, read just before they stop)
and PostgreSQL's (its postmaster's process tree: live backends, and those that exited, which
the postmaster reaped; on a server of its own, as here, that is this run's work), with the
same cost per mode (``cpu_cost_percent``); its limited claims (round trips, mean batch, mean
round trip: the lease metrics the workers expose); and the 1-minute load average before and
after it. ``--modes off,both`` runs a subset (a profile with
``DUETIME_BENCH_PROFILE=worker``). Results: bench/results/worker-limits.json and .png.
"""

from __future__ import annotations

import argparse
import os
import statistics
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.common import plot_series, progress, write_result
from bench.worker_throughput import (
    NOOP,
    PARTITIONS,
    WORKER_CONCURRENCY,
    Results,
    fresh,
    produce_requests,
    scrape,
    stack,
    start_workers,
    stop,
    summarize_run,
    wait_done,
)

MODES = ("off", "concurrency", "rate", "both")
KEYS = 20


def limits_of(mode: str) -> dict[str, Any]:
    concurrency = {"key": "k-{payload.k}", "limit": 1000}
    rate = {"key": "k-{payload.k}", "per_s": 100000.0, "burst": 100000}
    return {
        "off": {},
        "concurrency": {"concurrency": concurrency},
        "rate": {"rate_limit": rate},
        "both": {"concurrency": concurrency, "rate_limit": rate},
    }[mode]


def limited_claims(metrics: dict[str, float]) -> dict[str, float]:
    """The limited claims' figures from the workers' summed lease metrics (``scrape``)."""
    batches = metrics.get("claim_limited_size_count", 0.0)
    if not batches:
        return {}
    return {
        "round_trips": int(batches),
        "mean_batch": round(metrics.get("claim_limited_size_sum", 0.0) / batches, 1),
        "mean_round_trip_ms": round(
            1000 * metrics.get("claim_limited_seconds_sum", 0.0) / batches, 2
        ),
    }


def cpu_s(pid: int, reaped: bool = False) -> float:
    """CPU seconds (user + system) of a live process; ``reaped``: with its waited-for children's.
    Linux /proc only (proc(5): utime, stime, cutime, cstime follow the state and 10 fields)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if reaped:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def postgres_cpu_s(database_url: str) -> float | None:
    """CPU seconds of the PostgreSQL server so far (the postmaster's process tree); None when
    it is not a local process this user can read."""
    import psycopg

    try:
        with psycopg.connect(database_url) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        postmaster = int(Path(f"/proc/{row[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
        total = cpu_s(postmaster, reaped=True)
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == postmaster:
                    total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, IndexError, ValueError):  # a backend that just exited
                continue
        return total
    except (OSError, psycopg.Error):
        return None


def one_run(base: Any, topics: ExitStack, mode: str, workers: int, jobs: int) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    pg_before = postgres_cpu_s(base.database_url)
    common = topics.enter_context(fresh(base))
    limits = limits_of(mode)
    produce_requests(common, jobs, lambda i: {"payload_json": f'{{"k": {i % KEYS}}}', **limits})
    results = Results(common)
    procs = start_workers(common, workers, f"limits-{mode}")
    try:
        wait_done(results, jobs, 120 + jobs / 50)
        metrics = scrape(workers)
        worker_cpu_s = sum(cpu_s(proc.process.pid) for proc in procs)
    finally:
        results.close()
        stop(procs)
    pg_after = postgres_cpu_s(base.database_url)
    first_start = min(r[0][0] for r in results.running.values()) / 1000
    run = summarize_run(f"{mode}, {workers} workers", results, jobs, first_start, metrics, workers)
    run["mode"] = mode
    run["claim_limited"] = limited_claims(metrics)
    run["load_avg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    run["cpu_ms_per_job"] = {"workers": round(1000 * worker_cpu_s / jobs, 3)}
    if pg_before is not None and pg_after is not None:
        run["cpu_ms_per_job"]["postgres"] = round(1000 * (pg_after - pg_before) / jobs, 3)
    run["cpu_ms_per_job"]["total"] = round(sum(run["cpu_ms_per_job"].values()), 3)
    return run


def scenario_drain(
    workers: int, jobs: int, rounds: int, modes: tuple[str, ...] = MODES
) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with stack(PARTITIONS) as base, ExitStack() as topics:
        for round_no in range(rounds):
            # interleaved, and the order turned each round: no mode always runs first
            order = modes if round_no % 2 == 0 else tuple(reversed(modes))
            for mode in order:
                runs.append(one_run(base, topics, mode, workers, jobs))
                runs[-1]["round"] = round_no + 1
    median = {
        mode: statistics.median(r["throughput_jobs_per_s"] for r in runs if r["mode"] == mode)
        for mode in modes
    }
    cost = (
        {m: round(100 * (1 - median[m] / median["off"]), 1) for m in modes if m != "off"}
        if "off" in median
        else {}
    )
    cpu = {
        mode: {
            part: statistics.median(
                r["cpu_ms_per_job"].get(part, 0.0) for r in runs if r["mode"] == mode
            )
            for part in ("workers", "postgres", "total")
        }
        for mode in modes
    }
    cpu_cost = (
        {
            m: round(100 * (cpu[m]["total"] / cpu["off"]["total"] - 1), 1)
            for m in modes
            if m != "off" and cpu["off"]["total"]
        }
        if "off" in cpu
        else {}
    )
    result = {
        "scenario": "worker-limits",
        "jobs": jobs,
        "throughput_jobs_per_s": median,
        "cost_percent": cost,
        "cpu_ms_per_job": cpu,
        "cpu_cost_percent": cpu_cost,
        "lost": sum(r["lost"] for r in runs),
        "duplicates": sum(r["duplicates"] for r in runs),
        "runs": runs,
        "config": {
            "workers": workers,
            "rounds": rounds,
            "partitions": PARTITIONS,
            "worker_concurrency": WORKER_CONCURRENCY,
            "target": NOOP,
            "keys": KEYS,
            "limits": {m: limits_of(m) for m in modes},
            "measured": "first start → last success (worker only, requests written ahead)",
            "command": f"./run bench limits drain --workers {workers} --jobs {jobs} "
            f"--rounds {rounds}" + ("" if modes == MODES else f" --modes {','.join(modes)}"),
        },
    }
    plot_series(
        "worker-limits",
        f"worker throughput with limits per key on and off, {jobs:,} no-op jobs, {workers} workers",
        {
            mode: (
                [r["round"] for r in runs if r["mode"] == mode],
                [r["throughput_jobs_per_s"] for r in runs if r["mode"] == mode],
            )
            for mode in modes
        },
        "round",
        "executions per second",
    )
    write_result("worker-limits", result)
    progress(f"median jobs/s {median}; cost vs off {cost} %")
    progress(f"median CPU ms per job {cpu}; CPU cost vs off {cpu_cost} %")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run bench limits", description=__doc__)
    parser.add_argument("scenario", choices=["drain"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES)
    )
    args = parser.parse_args(argv)
    modes = tuple(m for m in MODES if m in args.modes.split(","))
    unknown = set(args.modes.split(",")) - set(MODES)
    if unknown or not modes:
        parser.error(f"--modes: unknown {sorted(unknown)}; choose from {', '.join(MODES)}")
    result = scenario_drain(args.workers, args.jobs, args.rounds, modes)
    return 0 if result["lost"] == 0 and result["duplicates"] == 0 else 1

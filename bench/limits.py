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

The cost of a mode is 1 - its median throughput / the median of ``off``. Every run also
records its limited claims (round trips, mean batch, mean round trip: the lease metrics the
workers expose) and the machine's 1-minute load average before and after it, so that a cost
can be read against what else ran. ``--modes off,both`` runs a subset (a profile with
``DUETIME_BENCH_PROFILE=worker``). Results: bench/results/worker-limits.json and .png.
"""

from __future__ import annotations

import argparse
import os
import statistics
from contextlib import ExitStack
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


def one_run(base: Any, topics: ExitStack, mode: str, workers: int, jobs: int) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    common = topics.enter_context(fresh(base))
    limits = limits_of(mode)
    produce_requests(common, jobs, lambda i: {"payload_json": f'{{"k": {i % KEYS}}}', **limits})
    results = Results(common)
    procs = start_workers(common, workers, f"limits-{mode}")
    try:
        wait_done(results, jobs, 120 + jobs / 50)
        metrics = scrape(workers)
    finally:
        results.close()
        stop(procs)
    first_start = min(r[0][0] for r in results.running.values()) / 1000
    run = summarize_run(f"{mode}, {workers} workers", results, jobs, first_start, metrics, workers)
    run["mode"] = mode
    run["claim_limited"] = limited_claims(metrics)
    run["load_avg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
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
    result = {
        "scenario": "worker-limits",
        "jobs": jobs,
        "throughput_jobs_per_s": median,
        "cost_percent": cost,
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

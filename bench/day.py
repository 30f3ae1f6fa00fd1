"""The seed's day, compressed: 10 M jobs/day with a day's shape, played in minutes.

    ./run bench day --minutes 20 --speedup 3

The brief sizes duetime at 10 M jobs a day with a peak of 350 jobs/s. This scenario plays a
24-hour curve with that mean (115.7 jobs/s) and that peak-to-mean ratio (3.0: a quiet night at
~35 jobs/s, the afternoon peak at 350 jobs/s) in ``--minutes`` minutes of wall clock — every
run minute stands for 72 minutes of the day at 20 minutes — with every rate multiplied by
``--speedup``. So the run sees the day's shape and, at ``--speedup 3``, three times the
brief's rates (peak 1,050 jobs/s); it creates ``speedup × 115.7 × 60 × minutes`` jobs (about
417,000 at the defaults), which is the volume of a ``speedup × 10 M`` day sampled in time.
The whole 10 M jobs at the day's shape would need a 3-hour run at ``--minutes 180
--speedup 8`` (peak 2,800 jobs/s), longer than this machine's two cores hold end to end.

How it runs: the worker benchmark's stack (a local Kafka and PostgreSQL, ONE scheduler, two
workers running a no-op Python target, all on this machine's cores with the load generator
and the reader). A feeder thread creates each one-time job with the SDK 30 s before it falls
due, as producer services do. Lateness = the worker's start − the job's time, per job, end
to end (scheduler emit, transaction commit, fetch, lease claim, start). ``lost``: no success
by the end; ``duplicates``: a second start of one job.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
from typing import Any

from bench.common import RESULTS, percentiles, progress, write_result
from bench.worker_throughput import PARTITIONS, WORKER_CONCURRENCY, _timed_run, start_figures

DAY_JOBS = 10_000_000
MEAN_PER_S = DAY_JOBS / 86_400  # 115.7


def shape(hour: float) -> float:
    """Relative load at ``hour`` of the day: a floor of 0.1 and an afternoon peak of 1.0
    (13:00, σ ≈ 2.5 h); its mean over the day is ~0.33, so peak / mean ≈ 3 as in the brief."""
    return 0.1 + 0.9 * math.exp(-(((hour - 13.0) / 3.5) ** 2))


SHAPE_MEAN = sum(shape(h / 100) for h in range(2400)) / 2400


def rate_at(hour: float, speedup: float) -> float:
    return speedup * MEAN_PER_S * shape(hour) / SHAPE_MEAN


def due_times(start_ms: int, minutes: float, speedup: float) -> list[int]:
    """One due time per job: the rate curve integrated over the run (deterministic)."""
    run_ms = minutes * 60_000
    times: list[int] = []
    acc = 0.0
    step_ms = 10
    t = 0
    while t < run_ms:
        hour = 24 * t / run_ms
        acc += rate_at(hour, speedup) * step_ms / 1000
        while acc >= 1:
            times.append(start_ms + t)
            acc -= 1
        t += step_ms
    return times


def scenario_day(minutes: float, speedup: float, workers: int, label: str = "") -> dict[str, Any]:
    """``label`` names a variant run (e.g. ``cluster3``: the servers of ``DUETIME_KAFKA_BOOTSTRAP``
    are a three-broker cluster): its results go to ``day-compressed-<label>``."""
    name = f"day-compressed-{label}" if label else "day-compressed"
    lead_s = 20.0
    peak = max(rate_at(h / 10, speedup) for h in range(240))
    total = len(due_times(0, minutes, speedup))
    progress(
        f"{total:,} jobs over {minutes:g} min (day × {speedup:g}: peak {peak:,.0f}/s, "
        f"= {total * 1440 / minutes / 1e6:.1f} M jobs/day)"
    )
    run = _timed_run(
        name, lambda t0: due_times(t0, minutes, speedup), workers, lead_s, feed_ahead_s=30
    )
    results, t0_ms, times = run.results, run.t0_ms, run.times_ms
    figures = start_figures(results, len(times))
    lateness, scheduled = figures.pop("_series")
    figures.pop("started_throughput_jobs_per_s")
    # per day-hour: offered rate and lateness
    run_ms = minutes * 60_000
    hours: list[dict[str, Any]] = []
    for h in range(24):
        lo, hi = t0_ms + run_ms * h / 24, t0_ms + run_ms * (h + 1) / 24
        late = [x for x, d in zip(lateness, scheduled, strict=True) if lo <= d < hi]
        hours.append(
            {
                "hour": h,
                "rate_jobs_per_s": round(rate_at(h + 0.5, speedup), 1),
                "lateness_ms": percentiles(late),
            }
        )
    result = {
        "scenario": name,
        "jobs": len(times),
        "duration_s": minutes * 60,
        "throughput_jobs_per_s": round(len(results.success) / (minutes * 60), 1),
        "peak_rate_jobs_per_s": round(peak, 1),
        "equivalent_jobs_per_day": round(len(times) * 1440 / minutes),
        **figures,
        "hours": hours,
        "config": {
            "minutes": minutes,
            "speedup": speedup,
            "day_jobs": DAY_JOBS,
            "day_peak_to_mean": round(1 / SHAPE_MEAN, 2),
            "workers": workers,
            "schedulers": 1,
            "partitions": PARTITIONS,
            "worker_concurrency": WORKER_CONCURRENCY,
            "created_ahead_s": 30,
            "measured": "worker started_at − the job's time, end to end",
            "command": f"./run bench day --minutes {minutes:g} --speedup {speedup:g} "
            f"--workers {workers}" + (f" --label {label}" if label else ""),
            "kafka": _kafka_described(),
        },
    }
    progress(
        f"{name}: lateness {result['lateness_ms']}, lost {result['lost']}, "
        f"duplicates {result['duplicates']}"
    )
    _plot(name, hours, minutes, speedup)
    write_result(name, result)
    return result


def _plot(name: str, hours: list[dict[str, Any]], minutes: float, speedup: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [h["hour"] + 0.5 for h in hours]
    ax.bar(xs, [h["rate_jobs_per_s"] for h in hours], width=0.8, alpha=0.3, label="offered jobs/s")
    ax.set_xlabel(f"hour of the day (each played in {minutes * 60 / 24:.0f} s)")
    ax.set_ylabel("jobs/s")
    ax2 = ax.twinx()
    for key, style in (("p50", "o-"), ("p99", "s-"), ("max", "^:")):
        ax2.plot(xs, [h["lateness_ms"][key] for h in hours], style, label=f"lateness {key}")
    ax2.set_ylabel("start lateness (ms)")
    ax2.set_yscale("log")
    ax.set_title(f"10 M jobs/day shape × {speedup:g}, a day in {minutes:g} min, end to end")
    lines, labels = ax.get_legend_handles_labels()
    lines2, labels2 = ax2.get_legend_handles_labels()
    ax2.legend(lines + lines2, labels + labels2, loc="upper left")
    fig.tight_layout()
    RESULTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


def _kafka_described() -> str:
    """Which Kafka the run used: the bench stack's single broker, or the servers named by
    ``DUETIME_KAFKA_BOOTSTRAP`` with their broker count (topics get min(3, brokers) replicas)."""
    from confluent_kafka.admin import AdminClient

    from duetime.core.config import Env

    bootstrap = Env().opt_str("DUETIME_KAFKA_BOOTSTRAP")
    if not bootstrap:
        return "the bench stack's single local broker"
    brokers = len(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers)
    return f"{bootstrap}: {brokers} broker(s), replication factor {min(3, brokers)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./run bench day", description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=20)
    parser.add_argument("--speedup", type=float, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--label", default="", help="a variant's name: results go to day-compressed-<label>"
    )
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[a-z0-9-]{0,40}", args.label):
        parser.error("--label: up to 40 of a-z, 0-9 and '-' (it names the result files)")

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    result = scenario_day(args.minutes, args.speedup, args.workers, args.label)
    print(json.dumps({k: v for k, v in result.items() if k not in ("machine", "hours")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

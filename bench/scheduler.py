"""Scheduler benchmarks (issue 3): emit lateness at a sustained rate, a burst of jobs due at one
instant, RSS per pending job with 1 M pending jobs and the time to restore them on failover.

    ./run bench scheduler rate --rate 350 --duration-s 60
    ./run bench scheduler rate --rate 5000 --duration-s 60
    ./run bench scheduler burst --jobs 100000
    ./run bench scheduler ramp --rates 1000 2000 3000 4000 --duration-s 20
    ./run bench scheduler memory --jobs 1000000
    ./run bench scheduler failover --rate 1000 --duration-s 120 --kill-at-s 30 --restart-at-s 60 \
        --leave-at-s 90

How it runs: a local Kafka (1 GiB heap) and PostgreSQL in ``.duetime/bench``; ONE scheduler
process (``duetime scheduler``, state on disk in SQLite); this process creates the one-time
jobs with the SDK, waits until the scheduler has ingested every definition, and reads the
execution topics with a read_committed consumer. Lateness is measured twice, both against
the occurrence (``scheduled_at``): *emit* lateness (``emitted_at``, stamped by the scheduler
when it builds the transaction) and *visible* lateness (when the read_committed reader
received it), which includes the commit and
the fetch. All on the same 2 cores: broker, scheduler, load generator and reader.
"""

from __future__ import annotations

import argparse
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from bench.common import (
    bench_stack,
    percentiles,
    plot_series,
    progress,
    role_env,
    start_role,
    write_result,
)
from bench.cpu import rss_bytes, tree_cpu_s
from duetime.infra.harness import FAST_FETCH, RoleProc, assign_all, reader, stop_all

TARGET = {"type": "http", "url": "http://127.0.0.1:9/noop"}
LEAD_HINT = "on a busy machine creating and ingesting is slower: give more time with --lead-s"


class Reader:
    """Reads the execution topics as a read_committed consumer; records receive times."""

    def __init__(self, common: Any) -> None:
        from duetime.core.topics import Topics
        from duetime.schemas.codec import Codec

        self.codec = Codec()
        self.seen: list[tuple[str, int, int, int, int]] = []  # job, scheduled, due, emitted, recv
        self.partitions: list[int] = []  # the partition of each of ``seen``
        self._stop = threading.Event()
        self.consumer = reader(common.bootstrap_servers, "bench-reader", **FAST_FETCH)
        assign_all(self.consumer, Topics(common.topic_prefix).executions)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            # a short timeout: consume() waits for a full batch or its timeout, and the
            # receive time is what we measure
            msgs = self.consumer.consume(1000, 0.005)
            now = time.time_ns() // 1_000_000
            for m in msgs:
                if m.error():
                    continue
                r = self.codec.decode("execution", m.value() or b"")
                self.seen.append(
                    (r["job_id"], r["scheduled_at_ms"], r["due_at_ms"], r["emitted_at_ms"], now)
                )
                self.partitions.append(m.partition() or 0)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(10)
        self.consumer.close()


def create_jobs(common: Any, times_ms: list[int]) -> tuple[list[str], float]:
    from duetime.producers.sdk import JobClient

    started = time.monotonic()
    ids: list[str] = []
    with JobClient(settings=common) as client:
        for i, at_ms in enumerate(times_ms):
            at = datetime.fromtimestamp(at_ms / 1000, UTC).isoformat()
            ids.append(
                client.create_job(
                    name=f"bench-{i}", schedule={"at": at}, target=TARGET, wait=False
                ).job_id
            )
            if i and i % 50_000 == 0:
                progress(f"created {i:,} jobs")
    return ids, time.monotonic() - started


def ingest_lag(common: Any) -> int:
    """Job definitions the scheduler group has not consumed yet."""
    from duetime.core.topics import Topics

    topic = Topics(common.topic_prefix).jobs
    c = Consumer(
        {
            "bootstrap.servers": common.bootstrap_servers,
            "group.id": f"{common.topic_prefix}schedulers",
        }
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(common.partitions)]
        committed = c.committed(tps, timeout=10)
        lag = 0
        for tp in committed:
            high = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)[1]
            lag += high - max(tp.offset, 0)
        return lag
    finally:
        c.close()


def wait_ingested(common: Any, total: int, timeout_s: float) -> float:
    started = time.monotonic()
    last_report = 0.0
    while True:
        lag = ingest_lag(common)
        if lag == 0:
            return time.monotonic() - started
        if time.monotonic() - last_report > 5:
            progress(f"scheduler ingest: {total - lag:,}/{total:,} definitions")
            last_report = time.monotonic()
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"scheduler still has {lag} definitions to ingest")
        time.sleep(0.5)


def start_scheduler(common: Any, name: str) -> RoleProc:
    env = role_env(common, DUETIME_INSTANCE_ID=name, DUETIME_LOG_LEVEL="INFO")
    return start_role(["scheduler"], env, name)


def wait_owned(proc: RoleProc, partitions: int, timeout_s: float = 120) -> float:
    """Seconds until the log says every partition is owned (and the states restored)."""
    started = time.monotonic()
    proc.wait_ready(
        lambda: len(set(re.findall(r"owning partition (\d+)", proc.log()))) >= partitions,
        timeout_s,
        f"to own {partitions} partitions",
    )
    return time.monotonic() - started


def summarize(
    name: str, reader: Reader, ids: list[str], t0_ms: int, config: dict[str, Any], title: str
) -> dict[str, Any]:
    """The figures of a run; with a ``title``, also its lateness plot."""
    seen = list(reader.seen)
    counts = Counter(job for job, *_ in seen)
    wanted = set(ids)
    # against the occurrence, not the attempt's due time: a fire the scheduler treated as a
    # misfire carries due = emit time, which would hide its lateness
    emit = [emitted - scheduled for _, scheduled, _, emitted, _ in seen]
    visible = [recv - scheduled for _, scheduled, _, _, recv in seen]
    first_recv = min((recv for *_, recv in seen), default=t0_ms)
    last_recv = max((recv for *_, recv in seen), default=t0_ms)
    # from the first due time, or from the first emission when the crowd lead fired ahead of it
    duration_s = max(0.001, (last_recv - min(t0_ms, first_recv)) / 1000)
    result = {
        "scenario": name,
        "jobs": len(ids),
        "duration_s": round(duration_s, 3),
        "throughput_jobs_per_s": round(len(seen) / max(0.001, (last_recv - first_recv) / 1000), 1)
        if len(seen) > 1
        else None,
        "lateness_ms": percentiles(emit),
        "visible_lateness_ms": percentiles(visible),
        "lost": len(wanted - set(counts)),
        "duplicates": sum(n - 1 for n in counts.values() if n > 1),
        "config": config,
    }
    if not title:
        return result
    xs = [(recv - t0_ms) / 1000 for *_, recv in seen]
    plot_series(
        name,
        title,
        {
            "emit lateness": (xs, emit),
            "visible lateness": (xs, visible),
        },
        "seconds since the first job was due",
        "lateness (ms)",
        logy=True,
    )
    return result


def _fire_and_read(
    name: str,
    partitions: int,
    due_ms: Callable[[int], list[int]],
    lead_s: float,
    describe: str,
) -> tuple[Reader, list[str], int, dict[str, Any]]:
    """The shared run: a stack and one scheduler; one-time jobs created with their due times
    (``due_ms(t0_ms)``), ingested, then read until all fired or 10 s after the last was due.
    Returns the reader, the job ids, T0 and the timing part of the config."""
    with bench_stack(partitions) as common:
        proc = start_scheduler(common, f"{name}-sched")
        try:
            wait_owned(proc, partitions)
            cpu_owned_s = tree_cpu_s(proc.process.pid)
            t0_ms = int((time.time() + lead_s) * 1000)
            times = due_ms(t0_ms)
            n = len(times)
            progress(f"creating {n:,} one-time jobs {describe} (T0 = now + {lead_s:.0f} s)")
            ids, create_s = create_jobs(common, times)
            ingest_s = wait_ingested(common, n, lead_s * 3)
            progress(f"created in {create_s:.1f} s, ingested {ingest_s:.1f} s later")
            # jobs due before the scheduler ingested them measure the ingest, not the fires
            ingested_before_due = time.time() * 1000 < min(times)
            if not ingested_before_due:
                progress(f"WARNING: the first jobs fell due before all were ingested: {LEAD_HINT}")
            reader = Reader(common)
            # the scheduler idles from here to the first due time: its CPU from here to the end
            # is the fires' (and the commits'), whatever else the machine runs meanwhile
            cpu_ingested_s = tree_cpu_s(proc.process.pid)
            rss_ingested = rss_bytes(proc.process.pid)  # what the scheduler keeps for the fires
            # a burst gets two minutes to drain; a steady rate 10 s after its last job
            grace_ms = 130_000 if max(times) == min(times) else 10_000
            end_ms = max(times) + grace_ms
            while time.time() * 1000 < end_ms and len(reader.seen) < n:
                time.sleep(1)
                progress(f"{len(reader.seen):,}/{n:,} execution requests seen")
            cpu_done_s = tree_cpu_s(proc.process.pid)
            time.sleep(2)
            reader.close()
            timing = {
                "partitions": partitions,
                "schedulers": 1,
                "create_s": round(create_s, 1),
                "ingest_after_create_s": round(ingest_s, 1),
                "ingested_before_due": ingested_before_due,
                "scheduler_rss_bytes_ingested": rss_ingested,
                # the creates' definitions read, their states written and committed
                "scheduler_cpu_s_ingesting": None
                if cpu_owned_s is None or cpu_ingested_s is None
                else round(cpu_ingested_s - cpu_owned_s, 2),
                "scheduler_cpu_s_firing": None
                if cpu_ingested_s is None or cpu_done_s is None
                else round(cpu_done_s - cpu_ingested_s, 2),
            }
            return reader, ids, t0_ms, timing
        finally:
            proc.stop(30)


def scenario_rate(rate: float, duration_s: float, partitions: int) -> dict[str, Any]:
    name = f"scheduler-rate-{int(rate)}"
    n = int(rate * duration_s)
    reader, ids, t0_ms, timing = _fire_and_read(
        name,
        partitions,
        lambda t0: [t0 + int(i * 1000 / rate) for i in range(n)],
        20 + n / 3000,
        f"due at {rate:g}/s",
    )
    result = summarize(
        name,
        reader,
        ids,
        t0_ms,
        {
            "rate_jobs_per_s": rate,
            "duration_s": duration_s,
            **timing,
            "command": f"./run bench scheduler rate --rate {rate:g} --duration-s {duration_s:g}",
        },
        f"scheduler emit lateness at {rate:g} jobs/s for {duration_s:g} s",
    )
    result["throughput_jobs_per_s"] = round(len(reader.seen) / duration_s, 1)
    write_result(name, result)
    return result


def scenario_burst(jobs: int, partitions: int, lead_s: float | None = None) -> dict[str, Any]:
    name = f"scheduler-burst-{jobs}"
    lead_s = lead_s if lead_s is not None else 20 + jobs / 3000
    reader, ids, t0_ms, timing = _fire_and_read(
        name, partitions, lambda t0: [t0] * jobs, lead_s, "all due at T0"
    )
    result = summarize(
        name,
        reader,
        ids,
        t0_ms,
        {**timing, "command": f"./run bench scheduler burst --jobs {jobs} --lead-s {lead_s:g}"},
        f"{jobs:,} jobs due at the same instant",
    )
    last = max((recv for *_, recv in reader.seen), default=t0_ms)
    result["all_emitted_after_s"] = round((last - t0_ms) / 1000, 2)
    write_result(name, result)
    return result


def scenario_memory(jobs: int, partitions: int) -> dict[str, Any]:
    name = f"scheduler-memory-{jobs}"
    with bench_stack(partitions) as common:
        proc = start_scheduler(common, f"{name}-sched")
        try:
            wait_owned(proc, partitions)
            time.sleep(2)
            baseline = rss_bytes(proc.process.pid)
            far = int((datetime.now(UTC) + timedelta(days=2)).timestamp() * 1000)
            progress(
                f"creating {jobs:,} jobs due in two days (baseline RSS {baseline / 1e6:.0f} MB)"
            )
            _, create_s = create_jobs(common, [far + i for i in range(jobs)])
            started = time.monotonic()
            ingest_s = wait_ingested(common, jobs, 3600)
            ingest_rate = jobs / max(0.001, time.monotonic() - started + create_s)
            time.sleep(3)
            loaded = rss_bytes(proc.process.pid)
            per_job = (loaded - baseline) / jobs
            progress(f"RSS {loaded / 1e6:.0f} MB: {per_job:.0f} bytes per pending job")
            proc.kill()
            restore_started = time.monotonic()
            proc = start_scheduler(common, f"{name}-restore")
            restore_s = wait_owned(proc, partitions, timeout_s=600)
            progress(f"a new scheduler restored {jobs:,} states in {restore_s:.1f} s")
            result = {
                "scenario": name,
                "jobs": jobs,
                "duration_s": round(time.monotonic() - restore_started + ingest_s + create_s, 1),
                "throughput_jobs_per_s": round(ingest_rate, 1),
                "lateness_ms": {"p50": None, "p99": None, "max": None},
                "lost": 0,
                "duplicates": 0,
                "rss_baseline_bytes": baseline,
                "rss_loaded_bytes": loaded,
                "rss_bytes_per_pending_job": round(per_job, 1),
                "restore_s": round(restore_s, 2),
                "create_s": round(create_s, 1),
                "ingest_after_create_s": round(ingest_s, 1),
                "config": {
                    "partitions": partitions,
                    "state": "SQLite on disk, near-term window 300 s in RAM",
                    "command": f"./run bench scheduler memory --jobs {jobs}",
                },
            }
            plot_series(
                name,
                f"scheduler RSS before (x=0) and with {jobs:,} pending jobs (x=1)",
                {"RSS (MB)": ([0.0, 1.0], [baseline / 1e6, loaded / 1e6])},
                "",
                "MB",
            )
            write_result(name, result)
            return result
        finally:
            proc.stop(30)


def scenario_ramp(rates: list[float], duration_s: float, partitions: int) -> dict[str, Any]:
    """The rate scenario at rising rates: the highest one whose visible p99 stays under 1 s."""
    steps = []
    for rate in rates:
        progress(f"ramp: {rate:g} jobs/s for {duration_s:g} s")
        r = scenario_rate(rate, duration_s, partitions)
        steps.append(
            {
                "rate_jobs_per_s": rate,
                "throughput_jobs_per_s": r["throughput_jobs_per_s"],
                "lateness_ms": r["lateness_ms"],
                "visible_lateness_ms": r["visible_lateness_ms"],
                "lost": r["lost"],
                "duplicates": r["duplicates"],
            }
        )
    held = [s for s in steps if s["lost"] == 0 and (s["visible_lateness_ms"]["p99"] or 0) < 1000]
    best = max(held, key=lambda s: s["rate_jobs_per_s"]) if held else None
    result = {
        "scenario": "scheduler-ramp",
        "jobs": int(sum(rates) * duration_s),
        "duration_s": duration_s * len(rates),
        "throughput_jobs_per_s": None if best is None else best["throughput_jobs_per_s"],
        "lateness_ms": None if best is None else best["lateness_ms"],
        "lost": sum(s["lost"] for s in steps),
        "duplicates": sum(s["duplicates"] for s in steps),
        "highest_rate_with_p99_under_1s": None if best is None else best["rate_jobs_per_s"],
        "steps": steps,
        "config": {
            "partitions": partitions,
            "schedulers": 1,
            "command": "./run bench scheduler ramp --rates "
            + " ".join(f"{r:g}" for r in rates)
            + f" --duration-s {duration_s:g}",
        },
    }
    plot_series(
        "scheduler-ramp",
        "scheduler lateness p50 / p99 by offered rate",
        {
            "emit p99": (rates, [s["lateness_ms"]["p99"] for s in steps]),
            "visible p50": (rates, [s["visible_lateness_ms"]["p50"] for s in steps]),
            "visible p99": (rates, [s["visible_lateness_ms"]["p99"] for s in steps]),
        },
        "offered rate (jobs/s)",
        "lateness (ms)",
        logy=True,
    )
    write_result("scheduler-ramp", result)
    return result


def scenario_failover(
    rate: float,
    duration_s: float,
    partitions: int,
    kill_at_s: float,
    restart_at_s: float,
    leave_at_s: float | None = None,
    lead_s: float | None = None,
) -> dict[str, Any]:
    """Two schedulers share the partitions while jobs fall due at ``rate``; one is SIGKILLed
    ``kill_at_s`` into the run, a replacement started at ``restart_at_s`` (a join) and, with
    ``leave_at_s``, the survivor of the kill stopped with SIGTERM then (a leave). Max
    lateness, and the recovery time: from the kill until the last job that was more than 1 s
    late (as seen by a read_committed reader) became visible; after it, every job was on time
    again. The join and the leave are rebalances too: each one's *extra* lateness is the max
    visible lateness of the jobs due in its phase minus the p99 before the kill (the steady
    state), so the machine's own noise is not counted against the rebalance."""
    name = "scheduler-failover"
    n = int(rate * duration_s)
    # the jobs must all be created (one by one, through the SDK's validation) and ingested
    # before T0: on a busy shared machine that is far slower than 3,000/s, so it can be given
    lead_s = lead_s if lead_s is not None else 20 + n / 3000
    loads: dict[str, float] = {}
    happened: dict[str, int] = {}  # when each event really happened (epoch ms)
    with bench_stack(partitions) as common:
        procs = {"a": start_scheduler(common, f"{name}-a")}
        try:
            wait_owned(procs["a"], partitions)
            procs["b"] = start_scheduler(common, f"{name}-b")
            procs["b"].wait_log("owning partition")
            time.sleep(5)  # the rebalance settles: each owns half
            t0_ms = int((time.time() + lead_s) * 1000)
            times = [t0_ms + int(i * 1000 / rate) for i in range(n)]
            progress(f"creating {n:,} one-time jobs due at {rate:g}/s (T0 = now + {lead_s:.0f} s)")
            ids, create_s = create_jobs(common, times)
            wait_ingested(common, n, lead_s * 3)
            reader = Reader(common)
            kill_ms, restart_ms = t0_ms + int(kill_at_s * 1000), t0_ms + int(restart_at_s * 1000)
            leave_ms = t0_ms + int(leave_at_s * 1000) if leave_at_s is not None else None
            _sleep_until(kill_ms)
            procs["a"].kill()  # SIGKILL: no goodbye to the group, an open transaction
            happened["kill"] = int(time.time() * 1000)
            loads["kill"] = os.getloadavg()[0]
            progress(f"SIGKILLed scheduler a at T0 + {kill_at_s:g} s")
            _sleep_until(restart_ms)
            happened["join"] = int(time.time() * 1000)
            procs["c"] = start_scheduler(common, f"{name}-c")
            loads["join"] = os.getloadavg()[0]
            progress(f"started scheduler c at T0 + {restart_at_s:g} s")
            if leave_ms is not None:
                _sleep_until(leave_ms)
                procs["b"].process.terminate()  # SIGTERM: b hands its partitions back
                happened["leave"] = int(time.time() * 1000)
                loads["leave"] = os.getloadavg()[0]
                progress(f"SIGTERMed scheduler b at T0 + {leave_at_s:g} s")
            end_ms = times[-1] + 60_000
            while time.time() * 1000 < end_ms and len(reader.seen) < n:
                time.sleep(1)
                progress(f"{len(reader.seen):,}/{n:,} execution requests seen")
            time.sleep(2)
            reader.close()
        finally:
            stop_all(procs.values(), 30)
    leave_cmd = f" --leave-at-s {leave_at_s:g}" if leave_at_s is not None else ""
    result = summarize(
        name,
        reader,
        ids,
        t0_ms,
        {
            "rate_jobs_per_s": rate,
            "partitions": partitions,
            "schedulers": "2, one SIGKILLed, a replacement started later"
            + (", then the other SIGTERMed" if leave_at_s is not None else ""),
            "kill_at_s": kill_at_s,
            "restart_at_s": restart_at_s,
            "leave_at_s": leave_at_s,
            "create_s": round(create_s, 1),
            "lead_s": round(lead_s, 1),
            "command": f"./run bench scheduler failover --rate {rate:g} "
            f"--duration-s {duration_s:g} --kill-at-s {kill_at_s:g} "
            f"--restart-at-s {restart_at_s:g}{leave_cmd} --lead-s {lead_s:g}",
        },
        "",  # no plot here: _plot_failover draws one with the kill and the join marked
    )
    end = times[-1] + 1
    join_end = leave_ms if leave_ms is not None else end
    result.update(_failover_figures(reader.seen, t0_ms, kill_ms, restart_ms, join_end, end))
    result["throughput_jobs_per_s"] = round(len(reader.seen) / duration_s, 1)
    result["load_avg_1m_at"] = {k: round(v, 1) for k, v in loads.items()}
    result["events"] = _failover_events(
        reader, happened, t0_ms, [_owned_lines(proc.log()) for proc in procs.values()]
    )
    progress(
        f"{name}: max lateness {result['max_lateness_ms']} ms, recovery {result['recovery_s']} s,"
        f" join +{result['join_extra_lateness_ms']} ms"
        f" (starts +{result.get('join_added_lateness_ms')} ms),"
        f" leave +{result.get('leave_extra_lateness_ms')} ms"
        f" (starts +{result.get('leave_added_lateness_ms')} ms),"
        f" lost {result['lost']}, duplicates {result['duplicates']}"
    )
    _plot_failover(name, reader, t0_ms, kill_at_s, restart_at_s, rate, leave_at_s)
    write_result(name, result)
    return result


def _sleep_until(at_ms: int) -> None:
    while time.time() * 1000 < at_ms:
        time.sleep(0.01)


def _failover_figures(
    seen: list[tuple[str, int, int, int, int]],
    t0_ms: int,
    kill_ms: int,
    restart_ms: int,
    leave_ms: int,
    end_ms: int,
) -> dict[str, Any]:
    """Per phase (by due time): visible lateness percentiles; the recovery from the kill; the
    extra lateness of the join and of the leave over the steady state's p99 (``extra``: the
    hand-over's delay, part of it absorbed by the fire lead when the steady p99 is below 0),
    and the lateness they add to starts (``added``: visible lateness counts from 0, since a
    request seen before its due time is held by its worker until then)."""
    out: dict[str, Any] = {}
    phases = [
        ("before_kill", t0_ms, kill_ms),
        ("kill_to_restart", kill_ms, restart_ms),
        ("after_restart", restart_ms, leave_ms),
    ]
    if leave_ms < end_ms:
        phases.append(("after_leave", leave_ms, end_ms))
    for phase, lo, hi in phases:
        out[f"visible_lateness_ms_{phase}"] = percentiles(
            [recv - s for _, s, _, _, recv in seen if lo <= s < hi]
        )

    # recovery from the kill: until the last job due before the replacement started that
    # was more than 1 s late became visible
    def late(lo: int, hi: int) -> list[int]:
        return [r for _, s, _, _, r in seen if lo <= s < hi and r - s > 1000]

    after_kill, after_join = late(kill_ms - 5000, restart_ms), late(restart_ms, end_ms)
    out["recovery_s"] = round((max(after_kill) - kill_ms) / 1000, 2) if after_kill else 0.0
    out["rejoin_disruption_s"] = (
        round((max(after_join) - restart_ms) / 1000, 2) if after_join else 0.0
    )
    out["jobs_late_over_1s"] = len(after_kill) + len(after_join)
    out["max_lateness_ms"] = max((r - s for _, s, _, _, r in seen), default=0)
    steady = out["visible_lateness_ms_before_kill"].get("p99") or 0.0
    out["steady_p99_ms"] = steady
    for key, phase in (("join", "after_restart"), ("leave", "after_leave")):
        if f"visible_lateness_ms_{phase}" in out:
            worst = out[f"visible_lateness_ms_{phase}"].get("max") or 0.0
            out[f"{key}_max_lateness_ms"] = worst
            out[f"{key}_extra_lateness_ms"] = round(max(0.0, worst - steady), 1)
            # what a start gains: workers hold a request seen early until its due time, so a
            # job's start lateness is its visible lateness where positive, and 0 before it
            out[f"{key}_added_lateness_ms"] = round(max(0.0, worst) - max(0.0, steady), 1)
    return out


_LOG_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?(assigned partitions \[([\d, ]*)\]|"
    r"owning partition (\d+): restored (\d+) states in ([\d.]+) s \(fenced in ([\d.]+) s\))",
    re.MULTILINE,
)


def _owned_lines(log: str) -> list[tuple[int, str, int, dict[str, float]]]:
    """A role's (epoch ms, "assigned" or "owned", partition, figures) from its log lines."""
    out: list[tuple[int, str, int, dict[str, float]]] = []
    for m in _LOG_LINE.finditer(log):
        at_ms = int(datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() * 1000)
        if m[3] is not None:
            out += [(at_ms, "assigned", int(p), {}) for p in m[3].split(",") if p.strip()]
        else:
            figures = {"states": float(m[5]), "restore_s": float(m[6]), "fence_s": float(m[7])}
            out.append((at_ms, "owned", int(m[4]), figures))
    return out


def _failover_events(
    reader: Reader,
    events: dict[str, int],
    t0_ms: int,
    logs: list[list[tuple[int, str, int, dict[str, float]]]],
) -> dict[str, Any]:
    """Per event (kill, join, leave) and per partition that changed owner: when a member was
    given it and when it owned it (restored, fencing included), after the event, from the
    roles' logs; and per partition the max visible lateness of its jobs due from 1 s before
    the event to 20 s after it. Where each event's seconds go."""
    lines = sorted(line for log in logs for line in log)
    out: dict[str, Any] = {}
    for name, at_ms in events.items():
        until_ms = min([t for t in events.values() if t > at_ms], default=at_ms + 60_000)
        moved: dict[int, dict[str, Any]] = {}
        for when, kind, p, figures in lines:
            if not at_ms <= when < until_ms:
                continue
            entry = moved.setdefault(p, {})
            key = f"{kind}_after_ms"
            if key not in entry:
                entry[key] = when - at_ms
                entry.update(figures)
        late: dict[int, int] = {}
        for (_, scheduled, _, _, recv), p in zip(reader.seen, reader.partitions, strict=True):
            if at_ms - 1000 <= scheduled < at_ms + 20_000:
                late[p] = max(late.get(p, 0), recv - scheduled)
        out[name] = {
            "at_s": round((at_ms - t0_ms) / 1000, 1),
            "partitions": {
                str(p): {**moved.get(p, {}), "max_lateness_ms": late.get(p)}
                for p in sorted(set(moved) | set(late))
            },
        }
    return out


def _plot_failover(
    name: str,
    reader: Reader,
    t0_ms: int,
    kill_at_s: float,
    restart_at_s: float,
    rate: float,
    leave_at_s: float | None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.common import RESULTS

    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [(s - t0_ms) / 1000 for _, s, _, _, _ in reader.seen]
    ax.plot(xs, [r - s for _, s, _, _, r in reader.seen], ".", markersize=2, label="visible")
    ax.axvline(kill_at_s, color="red", label="scheduler a SIGKILLed")
    ax.axvline(restart_at_s, color="green", label="scheduler c started")
    if leave_at_s is not None:
        ax.axvline(leave_at_s, color="orange", label="scheduler b SIGTERMed")
    ax.set_yscale("log")
    ax.set_xlabel("job due at (s since T0)")
    ax.set_ylabel("lateness (ms)")
    ax.set_title(f"two schedulers at {rate:g} jobs/s, one SIGKILLed, a replacement joins")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench scheduler", description=__doc__)
    sub = parser.add_subparsers(dest="scenario", required=True)
    rate = sub.add_parser("rate")
    rate.add_argument("--rate", type=float, default=350)
    rate.add_argument("--duration-s", type=float, default=60)
    burst = sub.add_parser("burst")
    burst.add_argument("--jobs", type=int, default=100_000)
    burst.add_argument("--lead-s", type=float, default=None, help="T0 = now + this")
    ramp = sub.add_parser("ramp")
    ramp.add_argument("--rates", type=float, nargs="+", default=[1000, 2000, 3000, 4000])
    ramp.add_argument("--duration-s", type=float, default=20)
    memory = sub.add_parser("memory")
    memory.add_argument("--jobs", type=int, default=1_000_000)
    failover = sub.add_parser("failover")
    failover.add_argument("--rate", type=float, default=1000)
    failover.add_argument("--duration-s", type=float, default=120)
    failover.add_argument("--kill-at-s", type=float, default=30)
    failover.add_argument("--restart-at-s", type=float, default=60)
    failover.add_argument("--leave-at-s", type=float, default=90, help="<0: no leave")
    failover.add_argument("--lead-s", type=float, default=None, help="T0 = now + this")
    for p in (rate, burst, ramp, memory, failover):
        p.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args(argv)
    if args.scenario == "rate":
        result = scenario_rate(args.rate, args.duration_s, args.partitions)
    elif args.scenario == "burst":
        result = scenario_burst(args.jobs, args.partitions, args.lead_s)
    elif args.scenario == "ramp":
        result = scenario_ramp(args.rates, args.duration_s, args.partitions)
    elif args.scenario == "failover":
        result = scenario_failover(
            args.rate,
            args.duration_s,
            args.partitions,
            args.kill_at_s,
            args.restart_at_s,
            args.leave_at_s if args.leave_at_s >= 0 else None,
            args.lead_s,
        )
    else:
        result = scenario_memory(args.jobs, args.partitions)
    print({k: v for k, v in result.items() if k not in ("machine", "versions")})
    return 0

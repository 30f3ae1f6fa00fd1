"""River as a peer: a small Go program on PostgreSQL, measured with duetime's workloads.

Role: ``python -m bench.peers.river_peer --scenario burst --jobs 10000`` (or
``--scenario sustained --rate 350 --duration-s 30``) builds ``bench/peers/river`` with
``go build`` into ``.duetime/peers/river-peer`` (modules from the Go module proxy, pinned
in go.mod/go.sum), starts its own PostgreSQL with duetime's ``LocalPostgres`` (home
``.duetime/peers/pg``, a free loopback port, a fresh database per run), runs the program
and turns the job starts it records into the result. ``run_river(workload)`` does the
same for ``bench/peers/run.py``.

Tuning (River's own benchmark, cmd/river/riverbench/river_bench.go, whose comments say
these "perform quite well ... much better than the client's default values"):
``FetchCooldown`` 2 ms, ``FetchPollInterval`` 20 ms, ``MaxWorkers`` 2,000 on the default
queue. Jobs are inserted with ``InsertMany``; River's scheduler loop (every 5 s, looking
5 s ahead, not configurable) marks scheduled jobs available before they are due when
they are inserted at least ~5 s early, which the default 10 s lead ensures.

PostgreSQL runs with its durable defaults (fsync and synchronous_commit on) unless
``fast_unsafe`` is asked for; the result's config says which.

Guarantees: the Go program and PostgreSQL are stopped on exit, Ctrl-C or SIGTERM; every
wait has a deadline and says what it waited for.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench.cpu import SAMPLE_S, CpuMeter, window_figures
from duetime.infra.local_postgres import LocalPostgres
from duetime.infra.process import free_port

from .common import (
    PEERS_HOME,
    PeerError,
    Workload,
    last_start_s,
    managed,
    progress,
    sigterm_as_keyboard_interrupt,
    summarize,
)

PEER = "river"
SOURCE_DIR = Path(__file__).resolve().parent / "river"
BINARY = PEERS_HOME / "river-peer"
PG_HOME = PEERS_HOME / "pg"
DATABASE = "river_peer"


def build() -> Path:
    """``go build`` the program unless the binary is newer than its sources."""
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
    if go is None:
        raise PeerError("the Go toolchain is missing: install Go 1.26+ (go.mod needs it)")
    sources = [*SOURCE_DIR.glob("*.go"), SOURCE_DIR / "go.mod", SOURCE_DIR / "go.sum"]
    if BINARY.exists() and BINARY.stat().st_mtime >= max(p.stat().st_mtime for p in sources):
        return BINARY
    BINARY.parent.mkdir(parents=True, exist_ok=True)
    progress(PEER, f"go build -> {BINARY} (first time: downloads modules from the proxy)")
    env = {**os.environ, "GOFLAGS": "-mod=readonly", "CGO_ENABLED": "0"}
    try:
        res = subprocess.run(
            [go, "build", "-o", str(BINARY), "."],
            cwd=SOURCE_DIR, env=env, capture_output=True, text=True, timeout=600,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise PeerError("go build did not finish in 600 s") from None
    if res.returncode != 0:
        raise PeerError(f"go build failed:\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
    return BINARY


def run_river(
    workload: Workload,
    max_workers: int = 2000,
    fetch_cooldown_ms: float = 2.0,
    fetch_poll_interval_ms: float = 20.0,
    fast_unsafe: bool = False,
    sink_url: str | None = None,
) -> dict[str, Any]:
    """Run ``workload`` against River on a local PostgreSQL; return the result dictionary.

    ``sink_url``: the HTTP variant, each job POSTs duetime's HTTP-target request there. The
    result's ``cpu_s`` holds the CPU seconds of PostgreSQL and of the Go process (inserts and
    work) from its first insert to the last start (``cpu_window``), ``cpu_s_lifetime`` those
    of PostgreSQL from its start and of the Go process from its start to its exit."""
    binary = build()
    lead_s = workload.effective_lead_s
    logging.getLogger("duetime.infra").setLevel(logging.WARNING)
    pg = LocalPostgres(PG_HOME, port=free_port(), fast_unsafe=fast_unsafe)
    progress(PEER, f"starting PostgreSQL (home {PG_HOME}, port {pg.port})")
    records = PEERS_HOME / "river-starts.jsonl"
    log = PEERS_HOME / "river-peer.log"
    records.unlink(missing_ok=True)
    log.unlink(missing_ok=True)
    try:
        pg.start(timeout_s=120)
        pg.drop_database(DATABASE)
        pg.create_database(DATABASE)
        meter = CpuMeter({"postgresql": pg.pid}, interval_s=SAMPLE_S)
        meter.start()
        cmd = [
            str(binary), "-database-url", pg.url(DATABASE), "-scenario", workload.scenario,
            "-jobs", str(workload.jobs), "-rate", str(workload.rate_per_s),
            "-duration-s", str(workload.duration_s), "-lead-s", str(lead_s),
            "-timeout-s", str(workload.timeout_s), "-max-workers", str(max_workers),
            "-fetch-cooldown", f"{fetch_cooldown_ms}ms",
            "-fetch-poll-interval", f"{fetch_poll_interval_ms}ms", "-records", str(records),
            *(["-sink-url", sink_url] if sink_url else []),
        ]  # fmt: skip
        budget_s = (
            lead_s
            + workload.timeout_s
            + 120
            + (workload.duration_s if workload.scenario == "sustained" else 0)
        )
        progress(PEER, f"running {workload.total} jobs (first due in {lead_s:.1f} s)")
        children_before = os.times()
        with managed(cmd, "river-peer", log, stdout=subprocess.PIPE, stderr=None) as proc:
            meter.add("river_process", proc.pid)
            try:
                out, _ = proc.communicate(timeout=budget_s)
            except subprocess.TimeoutExpired:
                raise PeerError(f"river-peer did not finish in {budget_s:.0f} s") from None
        children_after = os.times()  # the Go process has exited and been reaped
        meter.stop()
        if proc.returncode != 0:
            raise PeerError(f"river-peer failed (exit {proc.returncode})")
        summary: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    finally:
        with contextlib.suppress(Exception):
            pg.stop()
    t0 = summary["first_due_unix_ns"] / 1e9
    starts = []
    with records.open() as f:
        for line in f:
            rec = json.loads(line)
            starts.append((int(rec["seq"]), rec["start_unix_ns"] / 1e9))
    # the window: the first insert (the program inserts job i at its due time − lead) to the
    # last start, as duetime's; the Go process's start-up, migration and wind-down are outside
    assert meter.stopped_s is not None
    cpu = window_figures(meter, t0 - lead_s, last_start_s(starts, workload.total) or t0)
    # the reaped process's whole life, exactly (the meter's last reading precedes its exit)
    cpu["cpu_s_lifetime"]["river_process"] = round(
        children_after.children_user + children_after.children_system
        - children_before.children_user - children_before.children_system, 2
    )  # fmt: skip
    warnings: list[str] = []
    insert_done_s = summary["insert_done_unix_ns"] / 1e9
    if workload.scenario == "burst" and insert_done_s > t0:
        warnings.append(f"inserting ended {insert_done_s - t0:.1f} s after T: raise lead_s")
    if summary["timed_out"]:
        warnings.append("timed out: jobs not started by then are counted as lost")
    config = {
        **summary["config"],
        "postgresql": "LocalPostgres, fast_unsafe (fsync/synchronous_commit off)"
        if fast_unsafe
        else "LocalPostgres, durable defaults (fsync, synchronous_commit on)",
        "process": "one Go process inserts and works the jobs",
    }
    last_completed_s = summary["last_completed_unix_ns"] / 1e9
    extra = {
        "producer_max_behind_s": round(summary["producer_max_behind_s"], 3),
        "insert_s": round(insert_done_s - (t0 - lead_s), 3),
        "all_completed_after_s": round(last_completed_s - t0, 3) if last_completed_s > 0 else None,
        **cpu,
        "warnings": warnings,
    }
    return summarize(PEER, workload, t0, starts, summary["versions"], config, extra)


def main(argv: list[str] | None = None) -> None:
    """CLI: run one scenario against River and print the result JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers.river_peer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--scenario", choices=("burst", "sustained"), required=True)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=350.0)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--lead-s", type=float, default=None)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument("--max-workers", type=int, default=2000)
    parser.add_argument("--fetch-cooldown-ms", type=float, default=2.0)
    parser.add_argument("--fetch-poll-interval-ms", type=float, default=20.0)
    parser.add_argument("--pg-fast-unsafe", action="store_true")
    args = parser.parse_args(argv)
    sigterm_as_keyboard_interrupt()
    workload = Workload(
        args.scenario, args.jobs, args.rate, args.duration_s, args.lead_s, args.timeout_s
    )
    try:
        result = run_river(
            workload, args.max_workers, args.fetch_cooldown_ms, args.fetch_poll_interval_ms,
            args.pg_fast_unsafe,
        )  # fmt: skip
    except KeyboardInterrupt:
        progress(PEER, "interrupted; everything it started is stopped")
        raise SystemExit(130) from None
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

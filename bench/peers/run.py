"""Run the peers (Celery, River) on one of duetime's benchmark workloads, side by side.

Role: ``python -m bench.peers.run --scenario burst --jobs 10000`` or
``python -m bench.peers.run --scenario sustained --rate 350 --duration-s 30`` runs each
peer in turn on this machine and writes ``bench/results/peers-<scenario>.json``
(a sustained rate other than 350 goes to ``peers-sustained-<rate>.json``):
``{"celery": {...}, "river": {...}}``, each with ``scenario, jobs, duration_s,
throughput_jobs_per_s, lateness_ms {p50, p99, max}, lost, duplicates, machine, versions,
config, cpu_s`` (CPU seconds per process) and ``system_cpu_s, cpu_ms_per_job``.
duetime's own benchmark calls ``run_peers(scenario, **params)`` to put the peers beside its
figures.

Guarantees: the peers run one after the other (never competing for the two cores); a
peer that fails is reported as ``{"error": ...}`` and the others still run; Ctrl-C or
SIGTERM stops whatever is running and writes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.cpu import per_job

from .celery_peer import run_celery
from .common import REPO_ROOT, PeerError, Workload, progress, sigterm_as_keyboard_interrupt
from .river_peer import run_river

PEERS: dict[str, Callable[..., dict[str, Any]]] = {"celery": run_celery, "river": run_river}
NOT_SYSTEM = ("producers",)  # measured, but the load generator rather than the system
RESULTS_DIR = REPO_ROOT / "bench" / "results"


def run_peers(scenario: str, **params: Any) -> dict[str, dict[str, Any]]:
    """Run every peer on one workload; return ``{peer: result}``.

    ``params``: ``jobs`` (burst), ``rate`` and ``duration_s`` (sustained), ``lead_s``,
    ``timeout_s``; ``peers`` (names, default all); ``celery`` / ``river``: keyword
    arguments for ``run_celery`` / ``run_river`` (e.g. ``{"pool": "threads"}``).
    """
    peers = list(params.pop("peers", None) or PEERS)
    per_peer: dict[str, dict[str, Any]] = {p: params.pop(p, None) or {} for p in PEERS}
    rate = params.pop("rate", params.pop("rate_per_s", 350.0))
    workload = Workload(scenario=scenario, rate_per_s=float(rate), **params)
    results: dict[str, dict[str, Any]] = {}
    for name in peers:
        if name not in PEERS:
            raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
        progress(name, f"--- {scenario}: {workload.describe()}")
        started = time.monotonic()
        try:
            results[name] = PEERS[name](workload, **per_peer[name])
        except (PeerError, OSError, TimeoutError, ValueError) as exc:
            progress(name, f"FAILED: {exc}")
            results[name] = {"peer": name, "scenario": scenario, "error": str(exc)}
            continue
        r = results[name]
        # CPU per job over the jobs that ran; Celery's producers are the client (as the SDK
        # creating duetime's jobs is), River's inserts run in its one process and stay counted
        r |= per_job(r.get("cpu_s") or {}, r["jobs"] - r["lost"], exclude=NOT_SYSTEM)
        progress(
            name,
            f"done in {time.monotonic() - started:.0f} s: {r['throughput_jobs_per_s']} jobs/s, "
            f"lateness p50/p99/max {r['lateness_ms']['p50']}/{r['lateness_ms']['p99']}/"
            f"{r['lateness_ms']['max']} ms, lost {r['lost']}, duplicates {r['duplicates']}, "
            f"CPU {r['cpu_ms_per_job']} ms/job",
        )
    return results


def default_output(scenario: str, rate: float) -> Path:
    """``peers-<scenario>.json``; sustained rates other than 350 get their own file."""
    if scenario == "sustained" and rate != 350:
        return RESULTS_DIR / f"peers-sustained-{rate:g}.json"
    return RESULTS_DIR / f"peers-{scenario}.json"


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` to ``path`` atomically (a ``.tmp`` beside it, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """CLI; see the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--scenario", choices=("burst", "sustained"), required=True)
    parser.add_argument("--jobs", type=int, default=10_000, help="burst: jobs due at once")
    parser.add_argument("--rate", type=float, default=350.0, help="sustained: jobs due per s")
    parser.add_argument("--duration-s", type=float, default=30.0, help="sustained: seconds")
    parser.add_argument(
        "--lead-s", type=float, default=None,
        help="seconds between a job's insert and its due time (default 10; burst +1 s/1000)",
    )  # fmt: skip
    parser.add_argument("--timeout-s", type=float, default=120.0,
                        help="after the last due time, jobs not started are lost")  # fmt: skip
    parser.add_argument("--peers", nargs="+", choices=sorted(PEERS), default=None)
    parser.add_argument("--out", type=Path, default=None, help="result file")
    args = parser.parse_args(argv)
    sigterm_as_keyboard_interrupt()
    params: dict[str, Any] = {"lead_s": args.lead_s, "timeout_s": args.timeout_s}
    if args.scenario == "burst":
        params["jobs"] = args.jobs
    else:
        params |= {"rate": args.rate, "duration_s": args.duration_s}
    try:
        results = run_peers(args.scenario, peers=args.peers, **params)
    except KeyboardInterrupt:
        print("interrupted: every process the peers started is stopped", file=sys.stderr)
        return 130
    out = args.out or default_output(args.scenario, args.rate)
    write_json(out, results)
    progress("peers", f"wrote {out}")
    return 1 if any("error" in r for r in results.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())

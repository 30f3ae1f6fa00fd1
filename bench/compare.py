"""Side by side: duetime against Celery and River on the same workloads, same box.

    ./run bench compare          # compare the latest results in bench/results
    ./run bench compare --run    # first run every pair, duetime then the peers, back to back

Reads the latest results in ``bench/results``, adds a ``"peers"`` section with the ratios
duetime / peer to duetime's JSON, writes ``bench/results/comparison.json`` and a bar chart, and
prints the README table. ``--run`` makes them first, one after the other on the same box
(about 30 minutes): duetime's ``worker burst --jobs 10000``, ``worker rate --rate 350
--duration-s 30``, ``worker rate --rate 1000 --duration-s 30``, ``http rate --rate 350`` and
``--rate 1000`` (30 s each) on one broker held over the five and warmed first (rounds of an
unmeasured ``worker rate`` workload, 42,000 jobs at 700/s, until the broker's JIT is nearly
done: ``bench.common.warm_bench_stack``, ~6 minutes); then the peers' ``burst --jobs
10000``, ``sustained --rate 350`` and ``sustained --rate 1000`` and ``http peers`` at the
same rates.

Why a warm broker: a production broker runs for months with the JVM's default JIT; one
started for a single run spends minutes compiling (C2 at ~0.3 core) or, with C1 only (the
fresh bench and test brokers), ~25 % more CPU per request for good. The peers' processes (Go,
C, Python) have no JIT to warm. Standalone ``worker`` and ``http`` runs still start a fresh
C1-only broker each; every result says which it had (``broker``).

The pairs (lateness = start − due time, per job; throughput = distinct jobs started ÷ (last
start − first due)):

- *burst*: 10,000 no-op jobs due at one instant; duetime's ``worker-burst-10000`` (scheduler +
  2 workers, end to end) against ``peers-burst``.
- *sustained 350 / 1,000 jobs/s*: duetime's ``worker-rate-<rate>`` against
  ``peers-sustained`` / ``peers-sustained-1000``.
- *http 350/s, http 1000/s*: HTTP targets POSTing to a local sink, lateness = arrival at the
  sink − scheduled time; duetime's ``http-rate-<rate>`` (jobs created over REST, see
  ``bench/http_rate.py``) against ``peers-http-<rate>``. Their rows also carry p50 and max
  lateness and CPU per job.

Every row also carries CPU per job (``cpu_ms_per_job``): the CPU seconds of every process of
the system (duetime: the broker, PostgreSQL, the scheduler, each worker and the projector;
Celery: Redis and the worker with its pool; River: PostgreSQL and its one Go process, which also
inserts) ÷ the jobs completed, with each process's figure in ``cpu_s`` (``bench/cpu.py`` reads
them from /proc). For every system the CPU is that of a span with the same edges, from just before
the first job is created to the last start (``cpu_window``: duetime's ``worker rate`` creates every
job ~20 s before the first is due, the peers each 10 s before it, so its span is ~10 s longer);
each process's CPU over its whole life (its start-up, e.g. a fresh broker's JVM and JIT, and
idle time) is kept beside it in ``cpu_s_lifetime`` and not counted per job. The load
generators (duetime's SDK or REST client, Celery's producers) are not counted.

A throughput ratio above 1 and lateness and CPU ratios below 1 mean duetime is ahead.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

from bench.common import RESULTS, progress, write_result
from duetime.core.redact import redact_text

MEASURED = (
    "lateness = start (http: arrival at the sink) − due time, per job; throughput = distinct "
    "jobs started ÷ (last start − first due); CPU per job (cpu_ms_per_job) = CPU seconds of "
    "every process of the system over the scenario's window, from just before the first job "
    "is created to the last start (http: arrival), the same edges for every system "
    "(cpu_window), with the same lead before the first due time (10 s at a rate, 20 s before "
    "a burst of 10,000), ÷ jobs completed; "
    "cpu_s_lifetime keeps each process's CPU from its own start (idle time; for the broker, "
    "held over duetime's runs, the warm-up and every run before) beside it, not counted per "
    "job; duetime's broker runs the JVM's default JIT and is warmed by an unmeasured workload "
    "before the first run (broker)"
)

PAIRS = {
    "burst-10000": ("worker-burst-10000", "peers-burst"),
    "sustained-350": ("worker-rate-350", "peers-sustained"),
    "sustained-1000": ("worker-rate-1000", "peers-sustained-1000"),
    "http 350/s": ("http-rate-350", "peers-http-350"),
    "http 1000/s": ("http-rate-1000", "peers-http-1000"),
}


def run_all() -> None:
    """Every pair's two sides on this box: duetime's five scenarios on one broker, warmed first
    (bench.common.warm_bench_stack), then the peers' five. A scenario that fails (a load
    generator that cannot hold its rate on a slow box) is recorded as failed and the run goes
    on: the rest of the table is still measured, and no earlier run's figures stand in."""
    from bench import http_rate, worker_throughput
    from bench.common import warm_bench_stack
    from bench.peers.run import default_output, run_peers, write_json

    with warm_bench_stack(worker_throughput.warm_up):
        progress("duetime: burst of 10,000")
        _attempt("worker-burst-10000", lambda: worker_throughput.scenario_burst(10_000, 2))
        for rate in (350.0, 1000.0):
            progress(f"duetime: sustained {rate:g} jobs/s")
            _attempt(
                f"worker-rate-{rate:.0f}", partial(worker_throughput.scenario_rate, rate, 30, 2)
            )
        for rate in (350.0, 1000.0):
            progress(f"duetime: HTTP targets created over REST, {rate:g} jobs/s")
            _attempt(f"http-rate-{rate:.0f}", partial(http_rate.scenario_rate, rate, 30))
    write_json(default_output("burst", 350), run_peers("burst", jobs=10_000))
    for rate in (350.0, 1000.0):
        peers = run_peers("sustained", rate=rate, duration_s=30)
        write_json(default_output("sustained", rate), peers)
    for rate in (350.0, 1000.0):
        _attempt(f"peers-http-{rate:.0f}", partial(http_rate.scenario_peers, rate, 30))


def _attempt(result: str, scenario: Callable[[], object]) -> None:
    """Run ``scenario``; if it raises, write ``result`` as failed, with the reason."""
    try:
        scenario()
    except Exception as exc:
        reason = redact_text(f"{type(exc).__name__}: {exc}")[:300]
        progress(f"{result}: did not finish: {reason}")
        write_result(result, {"scenario": result, "failed": reason})


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None or theirs == 0:
        return None
    return round(ours / theirs, 3)


def _more(result: dict[str, Any]) -> dict[str, Any]:
    """p50 and max lateness, lost, duplicates and CPU per job, for results that have them
    (results written before CPU was measured leave it out)."""
    lateness = result.get("lateness_ms") or {}
    out = {
        "lateness_p50_ms": lateness.get("p50"),
        "lateness_max_ms": lateness.get("max"),
        "lost": result.get("lost"),
        "duplicates": result.get("duplicates"),
    }
    # CPU per job: CPU seconds of every process of the system (broker, database, each role or
    # worker) over the window (first create → last start) ÷ jobs completed; ``cpu_s`` keeps the
    # figure of each process, ``cpu_s_lifetime`` each one's whole life (start-up, idle),
    # ``host_cpu`` the machine over the window (busy, stolen by the hypervisor, not metered)
    # ``broker``: duetime's, fresh (C1 only) or held and warm (the default JIT)
    keys = (
        "cpu_ms_per_job",
        "system_cpu_s",
        "cpu_s",
        "cpu_s_lifetime",
        "cpu_window",
        "host_cpu",
        "broker",
    )
    for key in keys:
        if result.get(key) is not None:
            out[key] = result[key]
    return out


def compare() -> dict[str, Any]:
    table: dict[str, Any] = {}
    for scenario, (ours_name, peers_name) in PAIRS.items():
        ours, peers = _load(ours_name), _load(peers_name)
        if ours is None or peers is None:
            progress(f"{scenario}: missing {ours_name if ours is None else peers_name}.json")
            continue
        row: dict[str, Any] = {
            "duetime": {
                "result": ours_name,
                "throughput_jobs_per_s": ours.get("throughput_jobs_per_s"),
                "lateness_p99_ms": (ours.get("lateness_ms") or {}).get("p99"),
                "jobs": ours.get("jobs"),
                **_more(ours),
                **({"failed": ours["failed"]} if ours.get("failed") else {}),
            }
        }
        section: dict[str, Any] = {}
        for peer, result in peers.items():
            if not isinstance(result, dict) or "throughput_jobs_per_s" not in result:
                continue
            theirs_p99 = (result.get("lateness_ms") or {}).get("p99")
            section[peer] = {
                "result": peers_name,
                "throughput_jobs_per_s": result["throughput_jobs_per_s"],
                "lateness_p99_ms": theirs_p99,
                "jobs": result.get("jobs"),
                "throughput_ratio": _ratio(
                    ours.get("throughput_jobs_per_s"), result["throughput_jobs_per_s"]
                ),
                "lateness_ratio": _ratio(row["duetime"]["lateness_p99_ms"], theirs_p99),
                **_more(result),
            }
            section[peer]["cpu_ratio"] = _ratio(
                row["duetime"].get("cpu_ms_per_job"), section[peer].get("cpu_ms_per_job")
            )
        row["peers"] = section
        table[scenario] = row
        ours["peers"] = section
        (RESULTS / f"{ours_name}.json").write_text(
            json.dumps(ours, indent=2, sort_keys=True) + "\n"
        )
    return table


def readme_table(table: dict[str, Any]) -> str:
    lines = [
        "| scenario | duetime | Celery | River | duetime/Celery throughput, p99, CPU/job | "
        "duetime/River throughput, p99, CPU/job |",
        "|---|---|---|---|---|---|",
    ]

    def cell(d: dict[str, Any]) -> str:
        if d.get("failed"):
            return f"did not finish ({d['failed']})"
        p99 = d.get("lateness_p99_ms")
        shown = "n/m" if p99 is None else f"{p99:.0f} ms"
        cpu = d.get("cpu_ms_per_job")
        more = "" if cpu is None else f", {cpu:.1f} ms CPU/job"
        return f"{d['throughput_jobs_per_s']:,.0f} jobs/s, p99 {shown}{more}"

    def ratios(d: dict[str, Any] | None) -> str:
        if d is None or d.get("throughput_ratio") is None:
            return "–"
        lat, cpu = d["lateness_ratio"], d.get("cpu_ratio")
        return (
            f"{d['throughput_ratio']:.2f}, {'n/m' if lat is None else f'{lat:.2f}'}, "
            f"{'n/m' if cpu is None else f'{cpu:.2f}'}"
        )

    for scenario, row in table.items():
        peers = row["peers"]
        lines.append(
            f"| {scenario} | {cell(row['duetime'])} | "
            f"{cell(peers['celery']) if 'celery' in peers else '–'} | "
            f"{cell(peers['river']) if 'river' in peers else '–'} | "
            f"{ratios(peers.get('celery'))} | {ratios(peers.get('river'))} |"
        )
    return "\n".join(lines)


def _bar_chart(table: dict[str, Any]) -> None:
    """Throughput and p99 lateness per scenario, one bar per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = ["duetime", "celery", "river"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, key, label in (
        (axes[0], "throughput_jobs_per_s", "throughput (jobs/s)"),
        (axes[1], "lateness_p99_ms", "p99 start lateness (ms)"),
    ):
        for j, system in enumerate(systems):
            xs, ys = [], []
            for i, row in enumerate(table.values()):
                d = row["duetime"] if system == "duetime" else row["peers"].get(system)
                if d is not None and d.get(key) is not None:
                    xs.append(i + (j - 1) * 0.27)
                    ys.append(float(d[key]))
            ax.bar(xs, ys, width=0.27, label=system)
        ax.set_xticks(range(len(table)), list(table))
        ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend()
    fig.suptitle("duetime, Celery and River on the same 2-core box")
    fig.tight_layout()
    path = RESULTS / "comparison.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    progress(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    if "--run" in (argv or []):
        run_all()
    table = compare()
    if not table:
        print("nothing to compare: run the scenarios first (see bench/compare.py)", file=sys.stderr)
        return 1
    write_result(
        "comparison", {"scenario": "comparison", "pairs": table, "config": {"measured": MEASURED}}
    )
    _bar_chart(table)
    print(readme_table(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["compare", "main", "readme_table"]

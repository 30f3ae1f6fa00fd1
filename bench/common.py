"""What every benchmark shares: the stack it runs on, the machine record, percentiles, and
writing ``bench/results/<scenario>.json`` plus a PNG plot.

Every result JSON holds at least ``scenario, jobs, duration_s, throughput_jobs_per_s,
lateness_ms {p50, p99, max}, lost, duplicates, machine, config``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from duetime.core.config import CommonSettings
from duetime.infra import harness
from duetime.infra.harness import RoleProc
from duetime.infra.local_kafka import KAFKA_VERSION

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine() -> dict[str, Any]:
    mem_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cores": os.cpu_count(),
        "memory_gb": round(mem_kb / 1024 / 1024, 1),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        # how quiet the box was: other work on the same two cores shows in the tails
        "load_avg_1m_at_write": round(os.getloadavg()[0], 2),
    }


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {}
    for dist in ("duetime", "confluent-kafka", "fastavro", "psycopg"):
        try:
            out[dist] = version(dist)
        except Exception:
            continue
    import confluent_kafka

    out["librdkafka"] = confluent_kafka.libversion()[0]
    out["kafka_broker"] = KAFKA_VERSION
    return out


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])

    return {"p50": at(0.50), "p99": at(0.99), "max": float(ordered[-1])}


def probe_result(scenario: str, **fields: Any) -> dict[str, Any]:
    """A result that measures no jobs (a probe of one mechanism), in the fields every result
    carries (what bench tooling reads), then its own."""
    return {
        "scenario": scenario,
        "jobs": None,
        "duration_s": None,
        "throughput_jobs_per_s": None,
        "lateness_ms": {"p50": None, "p99": None, "max": None},
        "lost": 0,
        "duplicates": 0,
        **fields,
    }


def tuning() -> dict[str, Any]:
    """The settings that change what the figures mean (named here, never the environment as
    a whole: it holds the database URL's password)."""
    from duetime.schedulers.settings import SchedulerSettings

    lead = os.environ.get("DUETIME_SCHEDULER_FIRE_LEAD_MS")
    rate = os.environ.get("DUETIME_SCHEDULER_CROWD_RATE")
    cap = os.environ.get("DUETIME_SCHEDULER_CROWD_LEAD_MAX_MS")
    return {
        # runs are emitted this long before their due time (emit lateness is then negative)
        "scheduler_fire_lead_ms": int(lead) if lead else SchedulerSettings.fire_lead_ms,
        # ...and a burst earlier still, by the time it takes at this rate, up to the cap
        "scheduler_crowd_rate": float(rate) if rate else SchedulerSettings.crowd_rate,
        "scheduler_crowd_lead_max_ms": int(cap) if cap else SchedulerSettings.crowd_lead_max_ms,
    }


STEAL_WARN_SHARE = 0.02
"""A result whose window lost this share of the cores to other guests says so as it is written."""


def write_result(name: str, result: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    result.setdefault("machine", machine())
    result.setdefault("versions", versions())
    result.setdefault("tuning", tuning())
    result.setdefault("finished_at", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    steal = (result.get("host_cpu") or {}).get("steal_share")
    if steal is not None and steal >= STEAL_WARN_SHARE:
        progress(
            f"{name}: the hypervisor took {steal:.0%} of the cores' time in the window (steal): "
            "every figure of this run is slower than the code"
        )
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    progress(f"wrote {path.relative_to(ROOT)}")
    return path


def plot_series(
    name: str,
    title: str,
    series: dict[str, tuple[Sequence[float], Sequence[float]]],
    xlabel: str,
    ylabel: str,
    logy: bool = False,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, ".", markersize=2, label=label) if len(xs) > 200 else ax.plot(
            xs, ys, "o-", label=label
        )
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    progress(f"wrote {path.relative_to(ROOT)}")
    return path


@contextmanager
def bench_stack(partitions: int) -> Iterator[Any]:
    """A local stack in .duetime/bench (its own ports) and a fresh topic prefix and database."""
    from duetime.core.config import CommonSettings, Env
    from duetime.infra.process import free_port
    from duetime.infra.stack import LocalStack, StackSettings

    home = ROOT / ".duetime" / "bench"
    ports = home / "ports"
    if ports.exists():  # a bench stack that may still run (another bench, or a killed one)
        kafka_port, controller_port, pg_port = map(int, ports.read_text().split())
    else:
        kafka_port, controller_port, pg_port = free_port(), free_port(), free_port()
        home.mkdir(parents=True, exist_ok=True)
        ports.write_text(f"{kafka_port} {controller_port} {pg_port}\n")
    stack = LocalStack(
        StackSettings(
            home=home,
            kafka_port=kafka_port,
            controller_port=controller_port,
            pg_port=pg_port,
            kafka_heap_mb=1024,
            # each run's topics are its own: a broker no run uses starts on empty storage
            # (killed runs had left 2,300 partitions behind, each costing the broker CPU)
            scratch_kafka=True,
        )
    )
    stack.acquire()  # registers this run and brings the servers up, under the stack's lock
    try:
        run = uuid.uuid4().hex[:8]
        db = f"bench_{run}"
        stack.postgres.create_database(db)
        common = replace(
            CommonSettings.from_env(Env({})),
            bootstrap_servers=stack.bootstrap_servers,
            database_url=stack.postgres.url(db),
            topic_prefix=f"bench{run}.",
            partitions=partitions,
        )
        stack.prepare(common)
        try:
            yield common
        finally:
            from confluent_kafka.admin import AdminClient

            from duetime.core.topics import Topics

            admin = AdminClient({"bootstrap.servers": common.bootstrap_servers})
            names = [s.name for s in Topics(common.topic_prefix).specs(partitions)]
            for future in admin.delete_topics(names).values():
                try:
                    future.result()
                except Exception:
                    continue
            drop_database(stack.postgres.url("postgres"), db)
    finally:
        if stack.release():
            ports.unlink(missing_ok=True)


def drop_database(url: str, db: str, timeout_s: float = 30.0) -> None:
    """``DROP DATABASE … WITH (FORCE)``, tried again while it is refused for lack of privilege:
    FORCE may not end an autovacuum worker (the superuser's) for the bench's role, and one
    vacuuming the run's database made a finished run end in a traceback without its result."""
    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            return
        except psycopg.errors.InsufficientPrivilege:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # the autovacuum worker is done with a small database in ~1 s


LOGS = ROOT / ".duetime" / "bench" / "logs"


def role_env(common: CommonSettings, **extra: str) -> dict[str, str]:
    """The shared harness's role environment; workers import tasks from bench.* (and tests.*)."""
    return harness.role_env(common, python_modules="bench,tests", **extra)


def start_role(argv: list[str], env: dict[str, str], log_name: str) -> RoleProc:
    """``duetime <argv>`` as a process of the shared harness, its log (fresh: a stale line of
    an earlier run must not satisfy a wait) in ``.duetime/bench/logs/<log_name>.log``."""
    log_path = LOGS / f"{log_name}.log"
    log_path.unlink(missing_ok=True)
    proc = RoleProc.start(log_name, argv, env, log_path=log_path)
    if argv[0] in os.environ.get("DUETIME_BENCH_PROFILE", "").split(","):
        _profile(proc.process.pid, log_name)
    return proc


def _profile(pid: int, log_name: str) -> None:
    """``DUETIME_BENCH_PROFILE=scheduler,worker``: sample those roles with py-spy (attached, so
    signals reach the role itself) into ``bench/results/profiles/<role>.txt`` (collapsed stacks,
    written when the role exits)."""
    import shutil

    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("DUETIME_BENCH_PROFILE needs py-spy (in the test extras)")
    out = RESULTS / "profiles"
    out.mkdir(parents=True, exist_ok=True)
    subprocess.Popen(
        # --subprocesses: the API's uvicorn workers are children of the role's process
        [spy, "record", "--pid", str(pid), "--rate", "200", "--nonblocking", "--subprocesses",
         "--format", "raw", "--output", str(out / f"{log_name}.txt")],
        stdout=subprocess.DEVNULL,
        stderr=open(out / f"{log_name}.py-spy.log", "wb"),  # noqa: SIM115
    )  # fmt: skip


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0

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
from collections.abc import Callable, Iterator, Sequence
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
    if "kafka" in (result.get("cpu_s") or {}):
        result.setdefault("broker", dict(_BROKER))
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


_HELD: list[Any] = []
"""The bench stack ``warm_bench_stack`` holds for this process's runs (at most one)."""
_BROKER: dict[str, Any] = {"jit": "C1 only", "broker": "fresh for each run"}
"""What the results written meanwhile say of the broker (``write_result``)."""


def _local_stack(jvm_opts: tuple[str, ...] | None = None) -> tuple[Any, Path]:
    """The bench's LocalStack in .duetime/bench (its own ports) and its ports file."""
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
            kafka_jvm_opts=jvm_opts,
        )
    )
    return stack, ports


@contextmanager
def bench_stack(partitions: int) -> Iterator[Any]:
    """A local stack in .duetime/bench (its own ports) and a fresh topic prefix and database;
    the one ``warm_bench_stack`` holds, if any."""
    from duetime.core.config import CommonSettings, Env

    held = bool(_HELD)
    if held:
        stack, ports = _HELD[0]
    else:
        stack, ports = _local_stack()
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
        if not held and stack.release():
            ports.unlink(missing_ok=True)


WARM_JIT_SHARE = 0.03
"""``warm_bench_stack`` warms until the broker's JIT compiler threads used less than this share
of a core over a round of the warm-up (they used ~0.24, 0.07, 0.06, 0.03 in four rounds of
60 s at 700 jobs/s, 2026-12-04; the broker's other threads ~0.2-0.3 throughout)."""
WARM_MAX_ROUNDS = 6


@contextmanager
def warm_bench_stack(warm_up: Callable[[], str]) -> Iterator[None]:
    """Every bench run of this process on one broker that runs the JVM's default JIT (C1, then
    C2 for hot code), as a production broker does, warmed first: ``warm_up()`` (an unmeasured
    workload; it returns what it ran) in rounds until the broker's JIT compiler threads used
    less than ``WARM_JIT_SHARE`` of a core over one (at most ``WARM_MAX_ROUNDS``).

    A broker started for one run never gets past its JIT: C2 compiles at ~0.3 core for
    minutes, and C1-only code (the fresh bench and test brokers') costs ~25 % more per request
    than C2's. A production broker runs for months, so per-job figures are taken on a warm one;
    the results say which (``broker``). A bench stack left running by a killed run is stopped
    first; one another live run uses is shared as it is, and the results say so."""
    stack, ports = _local_stack(jvm_opts=())
    if stack.release():  # not registered: stops a stack nobody alive uses (a killed run's)
        ports.unlink(missing_ok=True)
        stack, ports = _local_stack(jvm_opts=())
    stack.acquire()
    shared = bool(stack.other_users())
    _HELD.append((stack, ports))
    started = time.monotonic()
    try:
        from bench.broker_profile import jit_cpu_s

        pid = stack.kafka.pid
        if pid is None:
            raise RuntimeError("the bench broker did not start")
        rounds: list[float] = []
        ran = ""
        while len(rounds) < WARM_MAX_ROUNDS:
            jit_before, round_started = jit_cpu_s(pid), time.monotonic()
            ran = warm_up()
            share = (jit_cpu_s(pid) - jit_before) / (time.monotonic() - round_started)
            rounds.append(round(share, 3))
            progress(f"warm-up round {len(rounds)}: the broker's JIT used {share:.0%} of a core")
            if share < WARM_JIT_SHARE:
                break
        _BROKER.clear()
        _BROKER.update(
            jit="as another live run started it (shared)" if shared else "default (C1 + C2)",
            broker="held over this process's runs",
            warmed_by=f"{len(rounds)} x {ran}",
            warm_up_jit_core_share=rounds,
            warm_up_s=round(time.monotonic() - started, 1),
        )
        yield
    finally:
        _HELD.clear()
        _BROKER.clear()
        _BROKER.update(jit="C1 only", broker="fresh for each run")
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

"""Celery as a peer: ETA tasks on Redis, measured with duetime's two workloads.

Role: ``python -m bench.peers.celery_peer --scenario burst --jobs 10000`` (or
``--scenario sustained --rate 350 --duration-s 30``) builds its own virtualenv
(``.duetime/peers/celery-venv``, ``celery[redis]`` pinned), installs Debian's
``redis-server`` with apt-get when it is missing, starts Redis and one Celery worker,
publishes the workload as ETA tasks, waits until every task ran and prints the result.
``run_celery(workload)`` does the same for ``bench/peers/run.py``.

Configuration (and why), recorded in the result's ``config``:
- Redis: loopback only, a free port, a fresh temp dir, ``--save ''`` and
  ``--appendonly no`` (no persistence at all: Celery gets a broker that never touches
  the disk, which favours it against PostgreSQL-backed peers).
- Worker: the prefork pool (Celery's default and the one its docs recommend unless tasks
  are I/O-bound), ``--concurrency`` = cores, ``-O fair`` (the default strategy in Celery
  5), ``--without-gossip --without-mingle`` (one node: no cluster chatter),
  ``--loglevel WARNING`` (no per-task log lines). App settings in
  ``celery_app.CELERY_SETTINGS``: ``task_acks_late`` on (at-least-once),
  ``worker_prefetch_multiplier`` 128, rate limits off, no result backend.

Guarantees: every process it starts (Redis, the worker and its pool, the producer) is in
a process group that is stopped on exit, Ctrl-C or SIGTERM; every wait has a deadline
and says what it waited for.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cpu import SAMPLE_S, CpuMeter, window_figures

from .common import (
    PEERS_HOME,
    REPO_ROOT,
    PeerError,
    Workload,
    last_start_s,
    managed,
    progress,
    sigterm_as_keyboard_interrupt,
    summarize,
    wait_for,
)

CELERY_VERSION = "5.7.0"
VENV_DIR = PEERS_HOME / "celery-venv"
VENV_PYTHON = VENV_DIR / "bin" / "python"
PEER = "celery"


def ensure_venv() -> None:
    """Create the virtualenv with ``celery[redis]==CELERY_VERSION`` unless it has it."""
    marker = VENV_DIR / f".installed-celery-{CELERY_VERSION}"
    if marker.exists() and VENV_PYTHON.exists():
        return
    progress(PEER, f"creating {VENV_DIR} with celery[redis]=={CELERY_VERSION}")
    VENV_DIR.parent.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "venv", "--clear", str(VENV_DIR)], "creating the venv", 120)
    _run(
        [str(VENV_PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         f"celery[redis]=={CELERY_VERSION}"],
        "pip install celery[redis]", 600,
    )  # fmt: skip
    marker.touch()


def ensure_redis() -> str:
    """Path of ``redis-server``; installs Debian's package non-interactively if missing."""
    found = shutil.which("redis-server")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise PeerError("redis-server is missing: apt-get install -y redis-server (as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Keep Debian's own redis service from starting during the install (policy-rc.d 101).
    policy = Path("/usr/sbin/policy-rc.d")
    added = not policy.exists()
    if added:
        policy.write_text(
            "#!/bin/sh\n# duetime bench: no service starts during install\nexit 101\n"
        )
        policy.chmod(0o755)
    try:
        progress(PEER, "installing redis-server with apt-get (it is missing)")
        _run(["apt-get", "update"], "apt-get update", 600, env=env)
        _run(["apt-get", "install", "-y", "--no-install-recommends", "redis-server"],
             "apt-get install redis-server", 600, env=env)  # fmt: skip
    finally:
        if added:
            policy.unlink(missing_ok=True)
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
    )
    if not found:
        raise PeerError("installed redis-server but found no redis-server binary")
    return found


def _run(cmd: list[str], what: str, timeout_s: float, env: dict[str, str] | None = None) -> str:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                             stdin=subprocess.DEVNULL)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise PeerError(f"{what} did not finish in {timeout_s:.0f} s") from None
    if res.returncode != 0:
        raise PeerError(
            f"{what} failed (exit {res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}"
        )
    return res.stdout


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _redis_ping(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5) as s:
        s.sendall(b"PING\r\n")
        return s.recv(16).startswith(b"+PONG")
    return False


def _version_of(cmd: list[str]) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    return "unknown"


class _StartCounter:
    """Counts the lines the worker processes have appended so far, reading only new bytes."""

    def __init__(self, records_dir: Path) -> None:
        self.records_dir = records_dir
        self.offsets: dict[Path, int] = {}
        self.lines = 0

    def poll(self) -> int:
        for path in self.records_dir.glob("starts-*.txt"):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            complete = data.rfind(b"\n") + 1
            self.lines += data.count(b"\n", 0, complete)
            self.offsets[path] = self.offsets.get(path, 0) + complete
        return self.lines


def _read_starts(records_dir: Path) -> list[tuple[int, float]]:
    starts: list[tuple[int, float]] = []
    for path in records_dir.glob("starts-*.txt"):
        for line in path.read_text().splitlines():
            seq, at = line.split()
            starts.append((int(seq), float(at)))
    return starts


def default_producers(workload: Workload) -> int:
    """Producer processes: one per ~500 tasks/s of a sustained rate; two for a burst."""
    if workload.scenario == "burst":
        return 2
    return max(1, math.ceil(workload.rate_per_s / 500.0))


def run_celery(workload: Workload, concurrency: int | None = None, pool: str = "prefork",
               producers: int | None = None,
               sink_url: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``workload`` against Redis + one Celery worker; return the result dictionary.

    ``sink_url``: the HTTP variant, each task POSTs duetime's HTTP-target request there.
    The result's ``cpu_s`` holds the CPU seconds of Redis, the worker (with its pool) and
    the producers from just before the first publish to the last start (``cpu_window``);
    ``cpu_s_lifetime`` those of Redis and the worker from their own start."""
    producers = producers or default_producers(workload)
    ensure_venv()
    redis_server = ensure_redis()
    concurrency = concurrency or os.cpu_count() or 2
    lead_s = workload.effective_lead_s
    worker_flags = [
        f"--pool={pool}", f"--concurrency={concurrency}", "-O", "fair",
        "--without-gossip", "--without-mingle", "--loglevel=WARNING",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="celery-peer-", dir=PEERS_HOME) as tmp:
        tmp_dir = Path(tmp)
        records_dir = tmp_dir / "records"
        records_dir.mkdir()
        port = _free_port()
        broker_url = f"redis://127.0.0.1:{port}/0"
        redis_cmd = [
            redis_server, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(tmp_dir),
            "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        redis_log, worker_log = tmp_dir / "redis.log", PEERS_HOME / "celery-worker.log"
        worker_log.unlink(missing_ok=True)
        with managed(redis_cmd, "redis-server", redis_log) as redis_proc:
            wait_for(lambda: _redis_ping(port), 20, f"redis-server to answer PING on {port}",
                     redis_proc, redis_log)  # fmt: skip
            progress(PEER, f"redis-server up on 127.0.0.1:{port} (no persistence)")
            worker_cmd = [
                str(VENV_PYTHON), "-m", "bench.peers.celery_app", "worker",
                "--broker-url", broker_url, "--records-dir", str(records_dir), *worker_flags,
            ]  # fmt: skip
            with managed(worker_cmd, "celery worker", worker_log, cwd=REPO_ROOT, env=env) as worker:
                wait_for(lambda: (records_dir / "worker-ready").exists(), 60,
                         "the Celery worker to be ready", worker, worker_log)  # fmt: skip
                progress(PEER, f"worker ready ({' '.join(worker_flags)})")
                meter = CpuMeter(
                    {"redis": redis_proc.pid, "celery_worker": worker.pid}, interval_s=SAMPLE_S
                )
                meter.start()  # just before the producers' first publish
                t0 = time.time() + lead_s
                children_before = os.times()
                produced = _produce(
                    workload, broker_url, records_dir, t0, lead_s, producers, env, sink_url
                )
                children_after = os.times()  # the producers have exited and been reaped
                timed_out = _wait_for_starts(workload, records_dir, t0, worker, worker_log)
                meter.stop()
                starts = _read_starts(records_dir)
        # the window: the first publish to the last start, as duetime's (bench.cpu)
        assert meter.started_s is not None and meter.stopped_s is not None
        end_s = last_start_s(starts, workload.total) or meter.stopped_s
        cpu = window_figures(meter, meter.started_s, end_s)
        cpu["cpu_s"]["producers"] = round(
            children_after.children_user + children_after.children_system
            - children_before.children_user - children_before.children_system, 2
        )  # fmt: skip
        publish_done = float(produced["publish_done_unix_s"])
        warnings: list[str] = []
        if workload.scenario == "burst" and publish_done > t0:
            warnings.append(f"publishing ended {publish_done - t0:.1f} s after T: raise lead_s")
        if timed_out:
            warnings.append("timed out: jobs not started by then are counted as lost")
        versions = {
            "celery": CELERY_VERSION,
            "redis-server": _version_of([redis_server, "--version"]),
            "python": _version_of([str(VENV_PYTHON), "--version"]),
        }
        config = {
            "pool": pool,
            "concurrency": concurrency,
            "worker_flags": worker_flags,
            "redis": "loopback, --save '' --appendonly no (no persistence)",
            "settings": _celery_settings(),
            "producer": f"apply_async(eta=due) over one producer connection in each of "
            f"{producers} process(es)",
            "target": "http (keep-alive http.client POST per pool process)" if sink_url else "noop",
        }
        extra = {
            "producer_max_behind_s": round(float(produced["producer_max_behind_s"]), 3),
            "publish_s": round(publish_done - (t0 - lead_s), 3),
            **cpu,
            "warnings": warnings,
        }
        return summarize(PEER, workload, t0, starts, versions, config, extra)


def _celery_settings() -> dict[str, Any]:
    out = _run([str(VENV_PYTHON), "-c",
                "import json; from bench.peers.celery_app import CELERY_SETTINGS as s; "
                "print(json.dumps(s))"], "reading CELERY_SETTINGS", 60,
               env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})  # fmt: skip
    settings: dict[str, Any] = json.loads(out)
    return settings


def _produce(workload: Workload, broker_url: str, records_dir: Path, t0: float, lead_s: float,
             producers: int, env: dict[str, str],
             sink_url: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Run ``producers`` producer processes to the end and merge their summaries.

    Their progress lines pass through to stderr. kombu's Redis publish costs ~1 ms of
    Python per task, so one process tops out near 600 tasks/s here.
    """
    base = [
        str(VENV_PYTHON), "-m", "bench.peers.celery_app", "produce", "--broker-url", broker_url,
        "--records-dir", str(records_dir), "--scenario", workload.scenario,
        "--jobs", str(workload.jobs), "--rate", str(workload.rate_per_s),
        "--duration-s", str(workload.duration_s), "--lead-s", str(lead_s), "--t0", repr(t0),
        "--shards", str(producers), *(["--sink-url", sink_url] if sink_url else []),
    ]  # fmt: skip
    deadline = (
        time.monotonic()
        + lead_s
        + 300
        + (workload.duration_s if workload.scenario == "sustained" else 0)
    )
    progress(PEER, f"publishing {workload.total} ETA tasks with {producers} producer(s) "
                   f"(first due in {lead_s:.1f} s)")  # fmt: skip
    summaries: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        procs = [
            stack.enter_context(managed(
                [*base, "--shard", str(i)], f"celery producer {i}",
                PEERS_HOME / f"celery-producer-{i}.log", cwd=REPO_ROOT, env=env,
                stdout=subprocess.PIPE, stderr=None,
            ))
            for i in range(producers)
        ]  # fmt: skip
        for i, proc in enumerate(procs):
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise PeerError(f"Celery producer {i} did not finish before its deadline") from None
            if proc.returncode != 0:
                raise PeerError(f"Celery producer {i} failed (exit {proc.returncode})")
            summaries.append(json.loads(out.decode().strip().splitlines()[-1]))
    merged = {
        "published": sum(int(s["published"]) for s in summaries),
        "publish_done_unix_s": max(float(s["publish_done_unix_s"]) for s in summaries),
        "producer_max_behind_s": max(float(s["producer_max_behind_s"]) for s in summaries),
    }
    progress(PEER, f"published {merged['published']} tasks")
    return merged


def _wait_for_starts(workload: Workload, records_dir: Path, t0: float,
                     worker: subprocess.Popen[bytes], worker_log: Path) -> bool:  # fmt: skip
    """Wait until every task has started at least once; True if the timeout came first."""
    total = workload.total
    deadline = workload.due_s(t0, total - 1) + workload.timeout_s
    counter = _StartCounter(records_dir)
    last_report = 0.0
    while True:
        n = counter.poll()
        now = time.time()
        if n >= total:
            progress(PEER, f"started {n}/{total}")
            # Wait briefly for late duplicates (none are expected) before stopping.
            time.sleep(1.0)
            return False
        if worker.poll() is not None:
            raise PeerError(f"the Celery worker exited with {worker.returncode}; see {worker_log}")
        if now > deadline:
            progress(
                PEER, f"gave up after the {workload.timeout_s:.0f} s timeout: {n}/{total} started"
            )
            return True
        if now - last_report >= 2.0:
            due_note = f"first due in {t0 - now:.1f} s" if now < t0 else "running"
            progress(PEER, f"started {n}/{total} ({due_note})")
            last_report = now
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> None:
    """CLI: run one scenario against Celery and print the result JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers.celery_peer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--scenario", choices=("burst", "sustained"), required=True)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=350.0)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--lead-s", type=float, default=None)
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument(
        "--pool", default="prefork", choices=("prefork", "threads", "solo", "gevent")
    )
    parser.add_argument("--concurrency", type=int, default=None)
    parser.add_argument("--producers", type=int, default=None)
    args = parser.parse_args(argv)
    sigterm_as_keyboard_interrupt()
    workload = Workload(
        args.scenario, args.jobs, args.rate, args.duration_s, args.lead_s, args.timeout_s
    )
    try:
        result = run_celery(workload, args.concurrency, args.pool, args.producers)
    except KeyboardInterrupt:
        progress(PEER, "interrupted; everything it started is stopped")
        raise SystemExit(130) from None
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

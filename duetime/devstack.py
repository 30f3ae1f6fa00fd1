"""``duetime dev``: the whole local stack on one machine, with a small demo workload.

Starts Kafka and PostgreSQL (``infra/``) unless ``DUETIME_KAFKA_BOOTSTRAP`` and
``DUETIME_DATABASE_URL`` point at existing ones, creates the topics, migrates the database,
runs every role as a supervised child process (a crashed role is restarted with backoff),
loads the demo and follows what happens. Ctrl-C (SIGINT) or SIGTERM stops the roles, then the
services it started, and leaves nothing running.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

log = logging.getLogger("duetime.dev")

# (name, command arguments after ``duetime``, metrics port); each runs as its own process.
# The ports match infra/prometheus/prometheus.yml (the API serves /metrics on its own port).
ROLES: list[tuple[str, list[str], int]] = [
    ("scheduler", ["scheduler"], 9401),
    ("worker-1", ["worker"], 9402),
    ("worker-2", ["worker"], 9403),
    ("resolver", ["resolver"], 9404),
    ("projector", ["projector"], 9405),
    ("api", ["api"], 0),
]


def add_dev_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-demo", action="store_true", help="do not load the demo workload")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="print every fire (default: a summary every 10 s)",
    )
    parser.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="stop by itself after this many seconds (for scripted runs)",
    )


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    log_path: str = ""

    def start(self) -> None:
        out = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child for its lifetime
        self.process = subprocess.Popen(
            [sys.executable, "-m", "duetime.cli", *self.argv],
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        log.info("started %s (pid %s), log %s", self.name, self.process.pid, self.log_path)

    def poll(self) -> None:
        """Restart a crashed child, with a growing delay so a crash loop does not spin."""
        if self.process is None or self.process.poll() is None:
            return
        now = time.monotonic()
        if self.next_start == 0.0:
            delay = min(30.0, 0.5 * 2**self.restarts)
            log.warning(
                "%s exited with %s; restarting in %.1f s",
                self.name,
                self.process.returncode,
                delay,
            )
            self.next_start = now + delay
        elif now >= self.next_start:
            self.restarts += 1
            self.next_start = 0.0
            self.start()

    def stop(self, timeout_s: float = 15.0) -> None:
        from duetime.infra.process import terminate

        if self.process is not None:
            terminate(self.process, timeout_s, self.name, kill_wait_s=5)


@dataclass
class Supervisor:
    children: list[Child] = field(default_factory=list)
    stop_event: threading.Event = field(default_factory=threading.Event)

    def run(self, duration_s: float | None) -> None:
        for child in self.children:
            child.start()
        deadline = None if duration_s is None else time.monotonic() + duration_s
        while not self.stop_event.wait(0.5):
            for child in self.children:
                child.poll()
            if deadline is not None and time.monotonic() > deadline:
                break

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()


def run_dev(args: argparse.Namespace) -> int:
    from duetime.core.config import CommonSettings, Env
    from duetime.core.logs import setup_logging
    from duetime.infra.stack import LocalStack, StackSettings

    env = Env()
    common = CommonSettings.from_env(env)
    setup_logging(common.log_format, common.log_level, role="dev")
    external = env.opt_str("DUETIME_KAFKA_BOOTSTRAP") and env.opt_str("DUETIME_DATABASE_URL")
    stack = LocalStack(StackSettings.from_env(env))
    supervisor = Supervisor()

    def on_signal(signum: int, _: Any) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        supervisor.stop_event.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        if not external:
            started = time.monotonic()
            stack.up()
            common = stack.settings_for(common, env)
            t = stack.timings_s
            print(
                f"kafka      {common.bootstrap_servers}  started in {t['kafka_start']:.1f} s\n"
                f"postgresql {common.database_url}  started in {t['postgres_start']:.1f} s\n"
                f"(install checks {t['kafka_jars'] + t['postgres_install']:.1f} s, "
                f"total {time.monotonic() - started:.1f} s)",
                flush=True,
            )
        stack.prepare(common)
        logs_dir = stack.settings.home / "logs"
        logs_dir.mkdir(parents=True, exist_ok=True)
        child_env = {
            # a laptop's stack: workers may call loopback targets (the demo's, the user's
            # local services; link-local metadata addresses stay denied) and run the demo's
            # tasks. An operator's own setting wins.
            "DUETIME_WORKER_EGRESS_ALLOW": "loopback",
            "DUETIME_WORKER_PYTHON_MODULES": "duetime.demo",
            # the demo writes its first jobs while the workers join: read from the beginning
            "DUETIME_WORKER_NEW_GROUP_START": "beginning",
            **os.environ,
            "DUETIME_KAFKA_BOOTSTRAP": common.bootstrap_servers,
            "DUETIME_DATABASE_URL": common.database_url,
            "DUETIME_TOPIC_PREFIX": common.topic_prefix,
            "DUETIME_PARTITIONS": str(common.partitions),
        }
        for name, argv, metrics_port in ROLES:
            env_for_role = {
                **child_env,
                "DUETIME_INSTANCE_ID": f"dev-{name}",
                "DUETIME_METRICS_PORT": str(metrics_port),
            }
            supervisor.children.append(
                Child(name, argv, env_for_role, log_path=str(logs_dir / f"{name}.log"))
            )
        follower = None
        if not args.no_demo:
            follower = threading.Thread(
                target=_demo, args=(common, supervisor.stop_event, args.verbose), daemon=True
            )
            follower.start()
        print(f"roles: {', '.join(r[0] for r in ROLES)}; logs in {logs_dir}", flush=True)
        print(
            "metrics    "
            + ", ".join(f"{n} http://127.0.0.1:{p}/metrics" for n, _, p in ROLES if p),
            flush=True,
        )
        api_url = _api_url(env)
        print(
            f"api        {api_url}  (OpenAPI docs {api_url}/docs, metrics {api_url}/metrics; "
            f"try: duetime jobs list)",
            flush=True,
        )
        print(f"dashboard  {api_url}/ui", flush=True)
        print("Ctrl-C stops everything.", flush=True)
        supervisor.run(args.duration_s)
    finally:
        supervisor.stop_event.set()
        supervisor.stop()
        if not external:
            stack.down()
        print("stopped: nothing left running", flush=True)
    return 0


def _api_url(env: Any) -> str:
    from duetime.producers.api.settings import ApiSettings

    api = ApiSettings.from_env(env)
    host = "127.0.0.1" if api.host in ("0.0.0.0", "") else api.host
    return f"http://{host}:{api.port}"


def _demo_id(name: str) -> str:
    """Fixed ids: running the demo again updates its jobs instead of adding more."""
    import uuid

    return str(uuid.uuid5(uuid.UUID("0b6c1f0e-3a5e-4d8e-9f57-6b1e2d3c4a59"), name))


@dataclass
class FireSummary:
    """What the follower saw since its last line: fires per priority, their lateness (emit
    time minus due time) and records it could not read (shown, never fatal)."""

    every_s: float = 10.0
    fires: dict[str, int] = field(default_factory=dict)
    lateness_ms: list[int] = field(default_factory=list)
    unreadable: int = 0
    total: int = 0

    def add(self, priority: str, lateness_ms: int) -> None:
        self.fires[priority] = self.fires.get(priority, 0) + 1
        self.lateness_ms.append(lateness_ms)
        self.total += 1

    def line(self) -> str | None:
        """The summary line, and a fresh period; None when nothing happened."""
        if not self.lateness_ms and not self.unreadable:
            return None
        late = sorted(self.lateness_ms)
        parts = [f"last {self.every_s:g} s: {len(late)} fired"]
        if late:
            by = ", ".join(f"{p} {n}" for p, n in sorted(self.fires.items()))
            p50 = late[len(late) // 2]
            parts.append(f"({by}); lateness p50 {p50} ms, max {late[-1]} ms")
        if self.unreadable:
            parts.append(f"; {self.unreadable} unreadable records skipped")
        parts.append(f"; {self.total} fired since start")
        self.fires, self.lateness_ms, self.unreadable = {}, [], 0
        return " ".join(parts).replace(" ;", ";")


def _demo(common: Any, stop: threading.Event, verbose: bool = False) -> None:
    """Load the demo jobs, then follow the execution requests as they are emitted: a summary
    every 10 s, or every fire with ``verbose``."""
    from duetime.producers.sdk import JobClient
    from duetime.schemas.codec import Codec

    from .core import kafka
    from .core.topics import Topics

    soon = datetime.now(UTC) + timedelta(seconds=3)
    with JobClient(settings=common) as client:
        jobs = [
            client.create_job(
                job_id=_demo_id("demo-every-5s"),
                name="demo-every-5s",
                schedule={"cron": "*/5 * * * * *"},
                target={"type": "http", "url": "http://127.0.0.1:8080/healthz", "method": "GET"},
                overlap="allow",
            ),
            *[
                client.create_job(
                    job_id=_demo_id(f"demo-once-{i}"),
                    name=f"demo-once-{i}",
                    schedule={"at": (soon + timedelta(seconds=i)).isoformat()},
                    target={"type": "python", "ref": "duetime.demo:hello"},
                    payload={"n": i},
                    priority=("critical", "high", "normal", "low")[i % 4],
                )
                for i in range(4)
            ],
            # fails every attempt: two quick retries, then the dead-letter queue
            client.create_job(
                job_id=_demo_id("demo-dead-letter"),
                name="demo-dead-letter",
                schedule={"at": (soon + timedelta(seconds=2)).isoformat()},
                target={"type": "python", "ref": "duetime.demo:always_fails"},
                retry={"max_retries": 2, "base_delay_s": 1, "max_delay_s": 5},
            ),
        ]
        # a DAG every 30 s: extract → (transform, audit) → load
        hello = {"type": "python", "ref": "duetime.demo:hello"}
        dag = client.create_dag(
            "demo-pipeline",
            [
                {"key": "extract", "name": "demo-extract", "target": hello},
                {
                    "key": "transform",
                    "name": "demo-transform",
                    "target": hello,
                    "depends_on": ["extract"],
                },
                {"key": "audit", "name": "demo-audit", "target": hello, "depends_on": ["extract"]},
                {
                    "key": "load",
                    "name": "demo-load",
                    "target": hello,
                    "depends_on": ["transform", "audit"],
                },
            ],
            schedule={"cron": "*/30 * * * * *"},
        )
    names = {j.job_id: j.definition.name for j in jobs}
    print(f"demo: created {len(jobs)} jobs: {', '.join(names.values())}", flush=True)
    print(f"demo: DAG demo-pipeline ({dag.dag_id}) runs every 30 s", flush=True)
    topics = Topics(common.topic_prefix)
    # a display only: start at the end and let the client commit, so a rerun shows new fires
    consumer = kafka.consumer(
        common,
        f"{common.topic_prefix}dev-follower",
        **{"auto.offset.reset": "latest", "enable.auto.commit": True},
    )
    consumer.subscribe(topics.executions)
    codec = Codec()
    summary = FireSummary()
    next_line = time.monotonic() + summary.every_s
    try:
        while not stop.is_set():
            for msg in consumer.consume(100, 0.5):
                if not msg.error():
                    _follow(codec, msg.value() or b"", summary, verbose)
            if time.monotonic() >= next_line:
                next_line += summary.every_s
                text = summary.line()
                if text is not None and not verbose:
                    print(f"demo: {text}", flush=True)
    finally:
        consumer.close()


def _follow(codec: Any, value: bytes, summary: FireSummary, verbose: bool) -> None:
    """One execution request into the summary (and printed with ``verbose``); a record that
    does not decode (anyone may write to the topic) is counted, not fatal."""
    from duetime.core.errors import DuetimeError
    from duetime.core.records import ExecutionRequest

    try:
        request = codec.load(ExecutionRequest, value)
        lateness = request.emitted_at_ms - request.due_at_ms
        scheduled = datetime.fromtimestamp(request.scheduled_at_ms / 1000, UTC)
    except (DuetimeError, ValueError, OverflowError, OSError):
        summary.unreadable += 1
        return
    summary.add(request.priority.value, lateness)
    if verbose:
        print(
            f"fired {request.name[:40]!r:<18} priority={request.priority.value:<8} "
            f"scheduled={scheduled:%H:%M:%S.%f} "
            f"lateness={lateness} ms trigger={request.trigger.value}",
            flush=True,
        )

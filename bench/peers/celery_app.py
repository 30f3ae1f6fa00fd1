"""The Celery side of the Celery peer: the worker and the producer, run in Celery's venv.

Role: ``python -m bench.peers.celery_app worker ...`` runs one Celery worker with the
no-op task; ``python -m bench.peers.celery_app produce ...`` publishes the workload as
ETA tasks. ``bench/peers/celery_peer.py`` starts both (from the virtualenv it builds
under ``.duetime/peers/celery-venv``); this module imports nothing from duetime.

Guarantees:
- The task appends one line ``"<seq> <unix start time>\\n"`` with a single
  ``os.write`` on an ``O_APPEND`` file per worker process (atomic for lines this short,
  safe across threads and processes); a task run twice leaves two lines.
- A producer publishes job i (those with i % shards == shard) with ``eta`` = its due
  time, at due − lead (a burst: all at once, before T), over one producer connection,
  and prints one JSON line with the time its last publish finished and how far it fell
  behind its plan.
- Building the app reads nothing from the environment: everything comes from argv.
- ``produce --sink-url URL`` publishes the HTTP variant instead: the task records its start,
  then POSTs duetime's HTTP-target request to URL (API.md: body ``{job_id, execution_id,
  attempt, scheduled_at, payload: {seq}}``, headers ``Idempotency-Key: <task id>``,
  ``X-Duetime-Job-Id``, ``X-Duetime-Attempt``) over a keep-alive ``http.client`` connection
  per pool process; a non-2xx answer or a connection failure is retried (1 s, at most 3
  times), as duetime's default retry policy does.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Celery lives only in the virtualenv that celery_peer.py builds; duetime's own venv
# (where mypy runs) does not have it.
from celery import Celery  # type: ignore[import-not-found, unused-ignore]
from celery.signals import worker_ready  # type: ignore[import-not-found, unused-ignore]

TASK_NAME = "duetime_peer.noop"
HTTP_TASK_NAME = "duetime_peer.http"

# Settings and why (Celery's "Optimizing" guide and task best practices):
CELERY_SETTINGS: dict[str, Any] = {
    # No result backend: results are not needed ("Ignore results you don't want").
    "task_ignore_result": True,
    # At-least-once like duetime and River: ack after the task ran, so a worker crash
    # redelivers instead of losing the task.
    "task_acks_late": True,
    # Many short tasks: "this number should be large ... Say 64, or 128" (Optimizing →
    # Prefetch Limits). ETA tasks are held in memory regardless of it.
    "worker_prefetch_multiplier": 128,
    # "Disable rate limits if they're not used" (Tasks → Performance and Strategies).
    "worker_disable_rate_limits": True,
    # Redis redelivers unacked messages after the visibility timeout: keep Celery's 1 h
    # default, far beyond any ETA in these runs, so no redelivery happens by design.
    "broker_transport_options": {"visibility_timeout": 3600},
    "broker_connection_retry_on_startup": True,
    "worker_hijack_root_logger": False,
    "task_serializer": "json",
    "accept_content": ["json"],
    "enable_utc": True,
}


def make_app(broker_url: str, records_dir: Path) -> Celery:
    """A Celery app on ``broker_url`` whose no-op task records its start in ``records_dir``."""
    app = Celery("duetime_peer", broker=broker_url, set_as_current=True)
    app.conf.update(CELERY_SETTINGS)
    state: dict[str, int] = {}

    def noop(seq: int) -> None:
        now = time.time()
        fd = state.get("fd")
        if fd is None or state.get("pid") != os.getpid():
            path = records_dir / f"starts-{os.getpid()}.txt"
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            state["fd"], state["pid"] = fd, os.getpid()
        os.write(fd, f"{seq} {now:.6f}\n".encode())

    app.task(name=TASK_NAME)(noop)

    connections: dict[tuple[str, int], http.client.HTTPConnection] = {}

    def post(url: str, body: bytes, headers: dict[str, str]) -> int:
        """POST over this process's keep-alive connection; one reconnect if it went stale."""
        parts = urlsplit(url)
        key = (parts.hostname or "127.0.0.1", parts.port or 80)
        for attempt in (1, 2):
            conn = connections.get(key)
            if conn is None:
                conn = connections[key] = http.client.HTTPConnection(*key, timeout=30)
            try:
                conn.request("POST", parts.path or "/", body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                return response.status
            except (OSError, http.client.HTTPException):
                conn.close()
                connections.pop(key, None)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def http_post(task: Any, seq: int, due_ms: int, url: str, job_id: str) -> None:
        noop(seq)  # the start, as the no-op task records it
        attempt = task.request.retries + 1
        body = json.dumps({
            "job_id": job_id, "execution_id": task.request.id, "attempt": attempt,
            "scheduled_at": iso_ms(due_ms), "payload": {"seq": seq},
        }).encode()  # fmt: skip
        headers = {
            "Content-Type": "application/json", "Idempotency-Key": task.request.id,
            "X-Duetime-Job-Id": job_id, "X-Duetime-Attempt": str(attempt),
            "User-Agent": "celery-peer",
        }  # fmt: skip
        try:
            status = post(url, body, headers)
        except (OSError, http.client.HTTPException) as exc:
            raise task.retry(exc=exc, countdown=1, max_retries=3) from exc
        if not 200 <= status < 300:
            raise task.retry(exc=RuntimeError(f"HTTP {status}"), countdown=1, max_retries=3)

    app.task(name=HTTP_TASK_NAME, bind=True)(http_post)
    return app


def iso_ms(ms: int) -> str:
    """RFC 3339 UTC with milliseconds, as duetime's worker writes ``scheduled_at``."""
    text = datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def run_worker(args: argparse.Namespace, worker_args: list[str]) -> None:
    """Run the worker until SIGTERM (warm shutdown); touch ``ready`` once it consumes."""
    records_dir = Path(args.records_dir)
    app = make_app(args.broker_url, records_dir)
    ready_file = records_dir / "worker-ready"

    def on_ready(**_: Any) -> None:
        ready_file.write_text(str(os.getpid()))

    worker_ready.connect(on_ready, weak=False)
    app.worker_main(["worker", *worker_args])


def run_producer(args: argparse.Namespace) -> None:
    """Publish the workload and print one JSON line about how it went."""
    app = make_app(args.broker_url, Path(args.records_dir))
    task = app.tasks[HTTP_TASK_NAME if args.sink_url else TASK_NAME]
    total = args.jobs if args.scenario == "burst" else int(args.rate * args.duration_s)
    t0 = float(args.t0)

    def due(seq: int) -> float:
        return t0 if args.scenario == "burst" else t0 + seq / args.rate

    max_behind_s = 0.0
    last_report = time.monotonic()
    with app.producer_or_acquire() as producer:
        for seq in range(args.shard, total, args.shards):
            submit_at = due(seq) - args.lead_s
            if args.scenario == "sustained":
                wait_s = submit_at - time.time()
                if wait_s > 0.002:
                    time.sleep(wait_s)
                max_behind_s = max(max_behind_s, time.time() - submit_at)
            eta = datetime.fromtimestamp(due(seq), tz=UTC)
            if args.sink_url:
                due_ms = round(due(seq) * 1000)
                task_args: tuple[Any, ...] = (seq, due_ms, args.sink_url, str(uuid.uuid4()))
            else:
                task_args = (seq,)
            task.apply_async(task_args, eta=eta, producer=producer)
            if time.monotonic() - last_report >= 2.0:
                print(f"celery producer {args.shard}: at job {seq + 1}/{total}", file=sys.stderr,
                      flush=True)  # fmt: skip
                last_report = time.monotonic()
    done = time.time()
    published = len(range(args.shard, total, args.shards))
    print(f"celery producer {args.shard}: published {published}", file=sys.stderr, flush=True)
    print(json.dumps({"published": published, "publish_done_unix_s": done,
                      "producer_max_behind_s": max_behind_s}), flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """``worker`` or ``produce``; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers.celery_app")
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--broker-url", required=True)
    w.add_argument("--records-dir", required=True)
    p = sub.add_parser("produce")
    p.add_argument("--broker-url", required=True)
    p.add_argument("--records-dir", required=True)
    p.add_argument("--scenario", choices=("burst", "sustained"), required=True)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--rate", type=float, default=350.0)
    p.add_argument("--duration-s", type=float, default=30.0)
    p.add_argument("--lead-s", type=float, required=True)
    p.add_argument("--t0", type=float, required=True, help="first due time, unix seconds")
    p.add_argument(
        "--shard", type=int, default=0, help="this producer publishes seq %% shards == shard"
    )
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--sink-url", default=None, help="the HTTP variant: each task POSTs here")
    # Options the parser does not know are the worker's own (``--pool=prefork`` ...).
    args, worker_args = parser.parse_known_args(argv)
    if args.cmd == "worker":
        run_worker(args, worker_args)
    elif worker_args:
        parser.error(f"unrecognized arguments: {' '.join(worker_args)}")
    else:
        run_producer(args)


if __name__ == "__main__":
    main()

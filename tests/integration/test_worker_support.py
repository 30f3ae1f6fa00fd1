"""What the worker tests share: an HTTP sink on 127.0.0.1, a worker in a thread, Python targets.

The sink is the downstream service of API.md: it counts deliveries per ``Idempotency-Key``
and applies each key's effect once (an idempotent consumer), so a second attempt shows up
as a second delivery, never as a second effect. Its behaviour per request comes from the
payload: ``sleep_s`` (answer after sleeping), ``fail_times`` (answer 500 to the first n
deliveries of a key), ``status`` (answer this status while the sink is ``broken``),
``gated`` (hold the request until the test opens the sink's ``gate``), ``answer_status`` and
``answer_body`` (always answer with this status and body text).

Workers started here allow what these tests need unless told otherwise: HTTP to loopback (the
sink) and Python refs under ``tests`` (see :class:`RunningWorker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import socket
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from duetime.consumers.tasks import ExecutionContext, TaskRegistry
from duetime.consumers.worker.policy import EgressPolicy
from duetime.consumers.worker.service import Worker
from duetime.consumers.worker.settings import WorkerSettings
from duetime.core.errors import FailPermanently, RetryLater
from tests.helpers import serve_loopback, stop_server


@dataclass
class Delivery:
    key: str
    job_id: str
    attempt: int
    body: dict[str, Any]
    headers: dict[str, str]
    at: float


@dataclass
class Sink:
    """An HTTP target on 127.0.0.1 that records every delivery."""

    deliveries: list[Delivery] = field(default_factory=list)
    effects: Counter[str] = field(default_factory=Counter)
    """Effects applied per Idempotency-Key: at most 1 by construction (the assertion target
    is that every expected key has one)."""
    broken: bool = False
    gate: threading.Event = field(default_factory=threading.Event)
    """Requests whose payload says ``gated`` wait for this (set by default) before sleeping."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def start(self) -> Sink:
        sink = self
        self.gate.set()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                sink.handle(self, body)

            def do_GET(self) -> None:
                sink.handle(self, {})

            def log_message(self, *args: Any) -> None:
                pass

        self.server = serve_loopback(Handler)
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def handle(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        key = handler.headers.get("Idempotency-Key", "")
        payload = body.get("payload") or {}
        delivery = Delivery(
            key=key,
            job_id=handler.headers.get("X-Duetime-Job-Id", ""),
            attempt=int(handler.headers.get("X-Duetime-Attempt") or 0),
            body=body,
            headers=dict(handler.headers.items()),
            at=time.time(),
        )
        with self.lock:
            self.deliveries.append(delivery)
            seen = sum(1 for d in self.deliveries if d.key == key)
        status = 200
        answer = b"{}"
        if "answer_status" in payload:
            status = int(payload["answer_status"])
            answer = str(payload.get("answer_body", "")).encode()
        elif self.broken:
            status = int(payload.get("status", 503))
        elif seen <= int(payload.get("fail_times", 0)):
            status = 500
        if payload.get("gated"):
            self.gate.wait(60)
        time.sleep(float(payload.get("sleep_s", 0)))
        if status == 200:
            with self.lock:
                if not self.effects[key]:
                    self.effects[key] += 1  # idempotent: the effect happens once per key
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "text/plain")
            handler.send_header("Content-Length", str(len(answer)))
            handler.end_headers()
            handler.wfile.write(answer)
        except OSError:
            pass  # the worker went away (killed, or it cancelled the call)

    def of_key(self, key: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.key == key]

    def delivery_counts(self) -> Counter[str]:
        with self.lock:
            return Counter(d.key for d in self.deliveries)

    def stop(self) -> None:
        if self.server is not None:
            stop_server(self.server)


def with_test_allowances(settings: WorkerSettings) -> WorkerSettings:
    """The settings, plus what the test suite's targets need when they allow nothing: the
    loopback sinks (``DUETIME_WORKER_EGRESS_ALLOW=loopback``) and refs under ``tests``."""
    if settings.egress == EgressPolicy():
        settings = replace(settings, egress=EgressPolicy(loopback=True))
    if not settings.python_modules:
        settings = replace(settings, python_modules=("tests",))
    # a test's topics are new and its requests are often written before its worker has its
    # partitions: read them from the beginning (the production default, the end, is tested
    # by tests/e2e/test_queue_pools.py)
    return replace(settings, new_group_start="beginning")


async def _build(settings: WorkerSettings, registry: TaskRegistry | None) -> Worker:
    return Worker(settings, registry)  # on the loop it will run on: it binds its clients


class RunningWorker:
    """A worker on its own event loop in a thread of the test process.

    ``test_allowances`` (default): see :func:`with_test_allowances`; False runs the settings
    exactly as given (a test of the policies themselves)."""

    def __init__(
        self,
        settings: WorkerSettings,
        registry: TaskRegistry | None = None,
        *,
        test_allowances: bool = True,
    ) -> None:
        if test_allowances:
            settings = with_test_allowances(settings)
        self.loop = asyncio.new_event_loop()
        self.worker = self.loop.run_until_complete(_build(settings, registry))
        self.thread = threading.Thread(
            target=self.loop.run_until_complete, args=(self.worker.run(),), daemon=True
        )
        self.thread.start()

    def assigned(self) -> int:
        return len(self.worker.state.assigned)

    def stop(self, timeout_s: float = 60) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.worker.stop)
            self.thread.join(timeout_s)
            assert not self.thread.is_alive(), f"worker did not stop within {timeout_s} s"
        self.loop.close()


# --- Python targets (referenced as tests.integration.test_worker_support:<name>) ---------

CALLS: dict[str, list[ExecutionContext]] = defaultdict(list)
RUNNING: Counter[str] = Counter()
MAX_RUNNING: Counter[str] = Counter()
STARTED: dict[str, float] = {}
_LOCK = threading.Lock()


def reset() -> None:
    with _LOCK:
        CALLS.clear()
        RUNNING.clear()
        MAX_RUNNING.clear()
        STARTED.clear()
        CANCEL_SEEN.clear()
        CANCEL_STARTED.clear()


def record(ctx: ExecutionContext) -> dict[str, Any]:
    """Sync: note the call, return the payload."""
    with _LOCK:
        CALLS[ctx.job_id].append(ctx)
    return {"echo": ctx.payload}


async def noop(ctx: ExecutionContext) -> None:
    return None


async def tracked(ctx: ExecutionContext) -> None:
    """Async: count running executions per priority, sleep ``payload.sleep_s``."""
    with _LOCK:
        STARTED.setdefault(ctx.execution_id, time.time())
        RUNNING[ctx.priority] += 1
        running_non_critical = sum(v for k, v in RUNNING.items() if k != "critical")
        MAX_RUNNING[ctx.priority] = max(MAX_RUNNING[ctx.priority], RUNNING[ctx.priority])
        MAX_RUNNING["non_critical"] = max(MAX_RUNNING["non_critical"], running_non_critical)
    try:
        await asyncio.sleep(float((ctx.payload or {}).get("sleep_s", 0)))
    finally:
        with _LOCK:
            RUNNING[ctx.priority] -= 1


async def slow_async(ctx: ExecutionContext) -> None:
    await asyncio.sleep(float(ctx.payload.get("sleep_s", 10)))


def slow_sync(ctx: ExecutionContext) -> None:
    time.sleep(float(ctx.payload.get("sleep_s", 10)))


def sleepy(ctx: ExecutionContext) -> dict[str, Any]:
    """Sync, for subprocess workers: sleep ``payload.sleep_s`` and report it."""
    time.sleep(float(ctx.payload.get("sleep_s", 1)))
    return {"slept_s": ctx.payload.get("sleep_s", 1)}


def retry_later(ctx: ExecutionContext) -> None:
    if ctx.attempt < 2:
        raise RetryLater("not yet", delay_s=0.3)


def give_up(ctx: ExecutionContext) -> None:
    raise FailPermanently("the invoice is void")


REGISTRY = TaskRegistry()


@REGISTRY.task("test.echo")
async def echo(ctx: ExecutionContext) -> dict[str, Any]:
    return {"attempt": ctx.attempt, "payload": ctx.payload, "worker": ctx.worker_id}


# --- hostile tasks: what a task must not be able to do to its worker ----------------------


def exits(ctx: ExecutionContext) -> None:
    """Sync: ``sys.exit`` from a task thread."""
    raise SystemExit(3)


async def exits_async(ctx: ExecutionContext) -> None:
    raise SystemExit(4)


async def interrupts_async(ctx: ExecutionContext) -> None:
    raise KeyboardInterrupt


def interrupts(ctx: ExecutionContext) -> None:
    raise KeyboardInterrupt


async def generator_exit(ctx: ExecutionContext) -> None:
    raise GeneratorExit


async def cancels_itself(ctx: ExecutionContext) -> None:
    raise asyncio.CancelledError


async def ignores_cancellation(ctx: ExecutionContext) -> None:
    """Swallows the worker's cancellation (the timeout) and keeps going for a while."""
    deadline = time.monotonic() + float(ctx.payload.get("for_s", 5))
    while time.monotonic() < deadline:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)


def big_output(ctx: ExecutionContext) -> str:
    """Returns 60 KB (under the 64 KiB output limit)."""
    return "x" * 60_000


# --- cancellable tasks (tests/integration/test_worker_cancel.py) --------------------------

CANCEL_SEEN: dict[str, float] = {}
"""job_id → when (time.time()) the task saw its cancellation."""
CANCEL_STARTED: dict[str, float] = {}
"""job_id → when the task started."""


def waits_for_cancel(ctx: ExecutionContext) -> str:
    """Sync: works in steps until ``ctx.cancelled`` is set (at most ``payload.for_s``)."""
    with _LOCK:
        CANCEL_STARTED[ctx.job_id] = time.time()
    if ctx.cancelled.wait(float(ctx.payload.get("for_s", 60))):
        with _LOCK:
            CANCEL_SEEN[ctx.job_id] = time.time()
        return "stopped"
    return "finished"


async def awaits_cancel(ctx: ExecutionContext) -> str:
    """Async: sleeps ``payload.for_s``; notes the worker's cancellation and lets it through."""
    with _LOCK:
        CANCEL_STARTED[ctx.job_id] = time.time()
    try:
        await asyncio.sleep(float(ctx.payload.get("for_s", 60)))
    except asyncio.CancelledError:
        with _LOCK:
            CANCEL_SEEN[ctx.job_id] = time.time()
        raise
    return "finished"


@dataclass
class HoldingSink:
    """An HTTP target that holds every request open (up to ``hold_s``) and notes when the
    client aborted it: the moment the worker's end of the connection closed."""

    hold_s: float = 60.0
    arrived: dict[str, float] = field(default_factory=dict)
    """Idempotency-Key → when the request arrived."""
    aborted: dict[str, float] = field(default_factory=dict)
    """Idempotency-Key → when the client closed the connection before the answer."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def start(self) -> HoldingSink:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                sink.hold(self, self.headers.get("Idempotency-Key", ""))

            def log_message(self, *args: Any) -> None:
                pass

        self.server = serve_loopback(Handler)
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def hold(self, handler: BaseHTTPRequestHandler, key: str) -> None:
        with self.lock:
            self.arrived[key] = time.time()
        conn = handler.connection
        deadline = time.monotonic() + self.hold_s
        while time.monotonic() < deadline:
            readable, _, _ = select.select([conn], [], [], 0.05)
            if readable:
                try:
                    closed = conn.recv(1, socket.MSG_PEEK) == b""
                except OSError:  # reset by the peer: aborted too
                    closed = True
                if closed:
                    with self.lock:
                        self.aborted[key] = time.time()
                    return
        with contextlib.suppress(OSError):
            handler.send_response(200)
            handler.send_header("Content-Length", "0")
            handler.end_headers()

    def stop(self) -> None:
        if self.server is not None:
            stop_server(self.server)

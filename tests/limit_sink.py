"""An HTTP sink that records when each request started and ended, and the checks of the
limits per key on what it recorded (issue 18: the e2e test, the fault scenario, the bench).

A request's JSON body is the worker's (``{"payload": ...}``); the payload's ``key`` names the
limit key the test gave the job (the sink never resolves templates itself) and ``sleep_s``
how long the call takes. Each request is recorded once it has answered, with the
``Idempotency-Key`` header (the execution): a key seen twice with a success is a duplicate
effect.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.helpers import serve_loopback, stop_server


@dataclass(frozen=True, slots=True)
class Call:
    execution: str
    key: str
    job_id: str
    start_s: float
    end_s: float


@dataclass
class IntervalSink:
    calls: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    server: ThreadingHTTPServer | None = None

    def start(self) -> IntervalSink:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                start_s = time.time()
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                payload = body.get("payload") if isinstance(body, dict) else None
                payload = payload if isinstance(payload, dict) else {}
                time.sleep(float(payload.get("sleep_s", 0)))
                end_s = time.time()
                try:
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:
                    return  # the worker went away: no effect recorded
                with sink.lock:
                    sink.calls.append(
                        Call(
                            execution=self.headers.get("Idempotency-Key", ""),
                            key=str(payload.get("key", "")),
                            job_id=self.headers.get("X-Duetime-Job-Id", ""),
                            start_s=start_s,
                            end_s=end_s,
                        )
                    )

            def log_message(self, *args: Any) -> None:
                pass

        self.server = serve_loopback(Handler)
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/limits"

    def snapshot(self) -> list[Call]:
        with self.lock:
            return list(self.calls)

    def stop(self) -> None:
        if self.server is not None:
            stop_server(self.server)


def max_overlap(calls: Iterable[Call]) -> dict[str, int]:
    """Per key, the most calls in progress at one moment (an end at the same instant as a
    start counts as before it)."""
    events: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for call in calls:
        events[call.key] += [(call.start_s, 1), (call.end_s, -1)]
    peaks: dict[str, int] = {}
    for key, marks in events.items():
        running = peak = 0
        for _, step in sorted(marks, key=lambda m: (m[0], m[1])):
            running += step
            peak = max(peak, running)
        peaks[key] = peak
    return peaks


def max_in_window(calls: Iterable[Call], window_s: float) -> dict[str, int]:
    """Per key, the most call starts inside any window of ``window_s`` seconds."""
    starts: dict[str, list[float]] = defaultdict(list)
    for call in calls:
        starts[call.key].append(call.start_s)
    most: dict[str, int] = {}
    for key, times in starts.items():
        times.sort()
        best, lo = 0, 0
        for hi, at in enumerate(times):
            while at - times[lo] > window_s:
                lo += 1
            best = max(best, hi - lo + 1)
        most[key] = best
    return most


def duplicates(calls: Iterable[Call]) -> int:
    """Executions that reached the sink more than once with a success."""
    counts = Counter(call.execution for call in calls)
    return sum(1 for n in counts.values() if n > 1)

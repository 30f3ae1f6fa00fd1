"""Shared test helpers: waiting with a deadline and reading topics as a read_committed consumer
(both live in the shared harness, :mod:`duetime.infra.harness`, which the benchmarks use too),
and a scheduler in a thread of the test process."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from duetime.infra.harness import TopicReader, execution_reader, reader, wait_for

__all__ = [
    "RunningScheduler",
    "TopicReader",
    "committed_offsets",
    "execution_reader",
    "reader",
    "wait_for",
]


def committed_offsets(
    bootstrap_servers: str, group: str, tps: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """The offsets ``group`` has committed on each (topic, partition) of ``tps``, read by a
    consumer that never joins the group (negative: nothing committed there)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap_servers, "group.id": group, "enable.auto.commit": False}
    )
    try:
        got = consumer.committed([TopicPartition(t, p) for t, p in tps], timeout=10)
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): tp.offset for tp in got}


class RunningScheduler:
    """A scheduler in a thread of the test process (for process-level tests use subprocesses)."""

    def __init__(self, settings: Any) -> None:
        from duetime.schedulers.service import Scheduler

        self.scheduler = Scheduler(settings)
        self.thread = threading.Thread(target=self.scheduler.run, daemon=True)
        self.thread.start()

    def owned(self) -> int:
        return len(self.scheduler.owners)

    def stop(self) -> None:
        self.scheduler.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "scheduler did not stop within 30 s"


class _LoopbackServer(ThreadingHTTPServer):
    request_queue_size = 1024
    """The listen backlog (socketserver's default is 5: a hundred workers' connections at once
    overflowed it, the kernel dropped their handshakes and the clients resent them 1, 2, 4, 8,
    16 s later, so a test waiting 30 s for 100 requests in flight saw 72)."""


def serve_loopback(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """An HTTP server for ``handler`` on 127.0.0.1 at a free port, serving from a daemon thread
    (each request in a daemon thread of its own); stop it with :func:`stop_server`."""
    server = _LoopbackServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop_server(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()

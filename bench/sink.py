"""A fast local HTTP sink for the HTTP-target benchmarks: it records when each delivery arrived.

    python -m bench.sink --port-file F --records R.jsonl   # serves on 127.0.0.1, a free port

Role: the target every system under test POSTs to (duetime's HTTP target, the Celery task's
POST, the River worker's POST). It answers ``200`` with an empty body as soon as a request is
complete, and keeps, per request, the arrival time (wall clock, ms), the ``Idempotency-Key``
header and the raw body; the body (API.md: ``{job_id, execution_id, attempt, scheduled_at,
payload}``) is parsed only when the records are written, so the hot path stays a few
microseconds. ``GET /_sink/count`` answers the number of deliveries so far, ``GET
/_sink/records`` the records as JSON lines; on SIGTERM or SIGINT the sink writes them to
``--records`` (a ``.tmp`` beside it, then a rename: never half written) and exits 0.

Guarantees: it listens on 127.0.0.1 only; a malformed request gets a ``400`` (a body over
1 MiB a ``413``, a chunked one a ``411``) and its connection is closed, without stopping the
sink or losing any record; keep-alive and pipelining work (HTTP/1.1, ``Content-Length``
bodies). Only the standard library (plus uvloop when installed), so any virtualenv runs it.

``Sink`` runs it as a child process for a benchmark; ``delivery_figures`` turns its records
into start lateness (arrival − the body's ``scheduled_at``), lost and duplicates.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, cast

MAX_BODY_BYTES = 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024
_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def _answer(status: str, body: bytes = b"", close: bool = False) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n"
    if body:
        head += "Content-Type: text/plain\r\n"
    if close:
        head += "Connection: close\r\n"
    return head.encode() + b"\r\n" + body


class Store:
    """Every delivery, in arrival order: (arrival_ns, idempotency key, method, path, body)."""

    def __init__(self) -> None:
        self.raw: list[tuple[int, str, str, str, bytes]] = []
        self.rejected = 0

    def lines(self) -> Iterable[str]:
        for arrival_ns, key, method, path, body in self.raw:
            yield json.dumps(record_of(arrival_ns, key, method, path, body)) + "\n"


def record_of(arrival_ns: int, key: str, method: str, path: str, body: bytes) -> dict[str, Any]:
    """One delivery as a JSON-able record; a body that is not the expected JSON is kept as
    ``error`` (the benchmark counts it; it is never silently dropped)."""
    rec: dict[str, Any] = {
        "arrival_ms": arrival_ns / 1e6,
        "key": key,
        "method": method,
        "path": path,
    }
    try:
        doc = json.loads(body) if body else None
        if not isinstance(doc, dict):
            raise ValueError("body is not a JSON object")
        rec["job_id"] = doc.get("job_id")
        rec["execution_id"] = doc.get("execution_id")
        rec["attempt"] = doc.get("attempt")
        rec["scheduled_at_ms"] = parse_rfc3339_ms(str(doc["scheduled_at"]))
        payload = doc.get("payload")
        rec["seq"] = payload.get("seq") if isinstance(payload, dict) else None
    except (ValueError, KeyError, TypeError) as exc:
        rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
    return rec


def parse_rfc3339_ms(text: str) -> float:
    """``2026-12-01T15:50:04.123Z`` (or with an offset) → unix ms."""
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"scheduled_at {text!r} has no time zone")
    return value.timestamp() * 1000


class SinkProtocol(asyncio.Protocol):
    """One connection: parse HTTP/1.1 requests from the buffer, answer each at once."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        arrival_ns = time.time_ns()
        self.buffer += data
        out: list[bytes] = []
        try:
            while self.buffer and self._one(arrival_ns, out):
                pass
        except _BadRequest as exc:
            out.append(_answer(exc.status, str(exc).encode(), close=True))
            self.store.rejected += 1
            assert self.transport is not None
            self.transport.write(b"".join(out))
            self.transport.close()
            self.buffer.clear()
            return
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    def _one(self, arrival_ns: int, out: list[bytes]) -> bool:
        """Handle one complete request from the buffer; False when more bytes are needed."""
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise _BadRequest("431 Request Header Fields Too Large", "header too large")
            return False
        head = bytes(self.buffer[:end]).decode("latin-1")
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise _BadRequest("400 Bad Request", "malformed request line")
        method, path = parts[0], parts[1]
        length, key = _headers(lines[1:])
        total = end + 4 + length
        if len(self.buffer) < total:
            return False
        body = bytes(self.buffer[end + 4 : total])
        del self.buffer[:total]
        if method == "GET" and path.startswith("/_sink/"):
            out.append(self._control(path))
        else:
            self.store.raw.append((arrival_ns, key, method, path, body))
            out.append(_OK)
        return True

    def _control(self, path: str) -> bytes:
        if path == "/_sink/count":
            return _answer("200 OK", str(len(self.store.raw)).encode())
        if path == "/_sink/records":
            return _answer("200 OK", "".join(self.store.lines()).encode())
        return _answer("404 Not Found", b"unknown sink path")


def _headers(lines: list[str]) -> tuple[int, str]:
    """The Content-Length and the Idempotency-Key of a request's header lines."""
    length, key = 0, ""
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest("400 Bad Request", "malformed header line")
        lname = name.strip().lower()
        if lname == "content-length":
            length = _content_length(value)
        elif lname == "idempotency-key":
            key = value.strip()
        elif lname == "transfer-encoding":
            raise _BadRequest("411 Length Required", "send a Content-Length body")
    return length, key


def _content_length(value: str) -> int:
    try:
        length = int(value.strip())
    except ValueError:
        raise _BadRequest("400 Bad Request", "bad Content-Length") from None
    if length < 0:
        raise _BadRequest("400 Bad Request", "bad Content-Length")
    if length > MAX_BODY_BYTES:
        raise _BadRequest("413 Payload Too Large", "body over 1 MiB")
    return length


class _BadRequest(Exception):
    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def write_records(store: Store, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        f.writelines(store.lines())
    os.replace(tmp, path)


async def serve(port: int, port_file: Path | None, records: Path | None) -> None:
    store = Store()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: SinkProtocol(store), "127.0.0.1", port, backlog=1024, reuse_address=True
    )
    bound = server.sockets[0].getsockname()[1]
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if port_file is not None:
        tmp = port_file.with_suffix(port_file.suffix + ".tmp")
        tmp.write_text(f"{bound}\n")
        os.replace(tmp, port_file)  # whoever waits for it reads a whole port number
    print(f"sink listening on 127.0.0.1:{bound}", file=sys.stderr, flush=True)
    await stop.wait()
    server.close()
    if records is not None:
        write_records(store, records)
    print(
        f"sink: {len(store.raw)} deliveries, {store.rejected} rejected requests",
        file=sys.stderr,
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sink", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    parser.add_argument("--port-file", type=Path, default=None, help="write the bound port here")
    parser.add_argument("--records", type=Path, default=None, help="JSON lines, on SIGTERM")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(args.port, args.port_file, args.records))
    except ImportError:
        asyncio.run(serve(args.port, args.port_file, args.records))
    return 0


# --- the benchmark's side -------------------------------------------------------------------


class Sink:
    """``python -m bench.sink`` as a child process (its own session, so its CPU is its own).

    ``with Sink(workdir) as sink:`` waits until it listens; ``sink.url``, ``sink.count()``;
    leaving the block stops it and loads ``sink.records``."""

    def __init__(self, workdir: Path, name: str = "sink", python: str | None = None) -> None:
        self.workdir = workdir
        self.name = name
        self.python = python or sys.executable
        self.port_file = workdir / f"{name}.port"
        self.records_path = workdir / f"{name}.jsonl"
        self.records: list[dict[str, Any]] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def __enter__(self) -> Sink:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port_file.unlink(missing_ok=True)
        self.records_path.unlink(missing_ok=True)
        root = Path(__file__).resolve().parent.parent
        with open(self.workdir / f"{self.name}.log", "wb") as log:
            self.proc = subprocess.Popen(
                [self.python, "-m", "bench.sink", "--port-file", str(self.port_file),
                 "--records", str(self.records_path)],
                cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(f"the sink did not start: see {self.workdir}/{self.name}.log")
            time.sleep(0.02)
        self.port = int(self.port_file.read_text())
        return self

    def count(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/_sink/count", timeout=5) as r:
            return int(r.read())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is None:
            return
        # imported here: the sink itself (``python -m bench.sink``) runs in any virtualenv
        from duetime.infra.process import terminate

        terminate(self.proc, 60, self.name)
        if self.records_path.exists():
            with self.records_path.open() as f:
                self.records = [json.loads(line) for line in f]


def delivery_figures(
    records: Sequence[dict[str, Any]],
    expected: Collection[int],
    first_due_ms: float,
    planned_due_ms: Callable[[int], float] | None = None,
) -> dict[str, Any]:
    """Lateness, lost, duplicates and throughput from a sink's records.

    Jobs are told apart by ``payload.seq`` (``expected``: the seqs of the jobs that were
    created; a delivery with any other seq counts as malformed); a job's lateness is its
    first arrival − its planned due time (``planned_due_ms(seq)``; without it, the body's
    ``scheduled_at``). Both differ when a job was created after its planned due time: duetime
    runs a one-time job due in the past at once, with ``scheduled_at`` = its creation, so
    ``lateness_vs_scheduled_at_ms`` then hides how late the creation was and
    ``lateness_ms`` does not. *lost*: seqs that never arrived; *duplicates*: extra
    arrivals of an Idempotency-Key already seen (the sink answered each with 200);
    throughput: distinct jobs arrived ÷ (last first-arrival − first due), as the peers'
    harness measures starts. ``_series`` holds (scheduled_ms, lateness_ms) for a plot."""
    wanted = expected if isinstance(expected, (set, frozenset, range)) else set(expected)
    first: dict[int, tuple[float, float, float]] = {}  # seq -> (arrival, due, scheduled_at)
    keys: Counter[str] = Counter()
    malformed = 0
    for rec in records:
        seq = rec.get("seq")
        if "error" in rec or not isinstance(seq, int) or seq not in wanted:
            malformed += 1
            continue
        keys[rec.get("key") or f"no-key-{seq}-{rec['arrival_ms']}"] += 1
        arrival, scheduled = float(rec["arrival_ms"]), float(rec["scheduled_at_ms"])
        if seq not in first or arrival < first[seq][0]:
            due = scheduled if planned_due_ms is None else planned_due_ms(seq)
            first[seq] = (arrival, due, scheduled)
    lateness = sorted(arrival - due for arrival, due, _ in first.values())
    vs_body = sorted(arrival - scheduled for arrival, _, scheduled in first.values())
    last_ms = max((a for a, _, _ in first.values()), default=first_due_ms)
    span_s = max(0.001, (last_ms - first_due_ms) / 1000)
    return {
        "lateness_ms": _percentiles(lateness),
        "lateness_vs_scheduled_at_ms": _percentiles(vs_body),
        "arrived": len(first),
        "lost": len(wanted) - len(first),
        "duplicates": sum(n - 1 for n in keys.values() if n > 1),
        "deliveries": len(records),
        "malformed_deliveries": malformed,
        "throughput_jobs_per_s": round(len(first) / span_s, 1),
        "_series": sorted((d, a - d) for a, d, _ in first.values()),
    }


def _percentiles(ordered: list[float]) -> dict[str, float | None]:
    """Nearest rank, as bench.peers.common.percentile (the peers' figures use the same)."""
    if not ordered:
        return {"p50": None, "p99": None, "max": None}

    def at(q: float) -> float:
        rank = max(1, math.ceil(q * len(ordered)))
        return round(ordered[min(rank, len(ordered)) - 1], 1)

    return {"p50": at(0.50), "p99": at(0.99), "max": round(ordered[-1], 1)}


if __name__ == "__main__":
    raise SystemExit(main())

"""HTTP clients for the worker's HTTP targets: httpx vs aiohttp against a fast local sink.

``.venv/bin/python -m bench.http_clients [--duration-s 5]`` writes
``bench/results/http-clients.json``.

What it measures: requests per second and latency (p50/p99/max) of one asyncio client making
the worker's request (a POST of a ~200-byte JSON body with the worker's headers) to a sink on
127.0.0.1, at 1, 10 and 100 requests in flight (each in-flight slot is a task sending one
request after the other, as the worker's slots do). The sink is a minimal asyncio HTTP/1.1
server (keep-alive, ``200`` with a 2-byte body) in a process of its own, so that it does not
share the client's interpreter; on a 2-core machine each gets a core.

Clients: ``httpx.AsyncClient`` (pool limit = concurrency), ``aiohttp.ClientSession`` with a
plain ``TCPConnector`` (limit = concurrency), and the worker's own session
(``http_target.new_session``: the egress-guarded resolver and socket factory, no cookie jar).
Each (client, concurrency) runs for ``--duration-s`` after a short warm-up, on a new
connection pool, ``--rounds`` times interleaved (other work on a shared machine comes and
goes); the JSON keeps every round's rate and the median run's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.common import percentiles, progress, write_result

CONCURRENCY = (1, 10, 100)
WARMUP_S = 0.5
BODY = json.dumps(
    {
        "job_id": "0b1c2a5e-8a4b-4c1d-9e8f-0a1b2c3d4e5f",
        "execution_id": "6f1c2a5e-8a4b-4c1d-9e8f-0a1b2c3d4e5f",
        "attempt": 1,
        "scheduled_at": "2026-01-01T00:00:00.000Z",
        "payload": {"invoice": 42, "note": "x" * 40},
    }
).encode()
HEADERS = {
    "Idempotency-Key": "6f1c2a5e-8a4b-4c1d-9e8f-0a1b2c3d4e5f",
    "X-Duetime-Job-Id": "0b1c2a5e-8a4b-4c1d-9e8f-0a1b2c3d4e5f",
    "X-Duetime-Attempt": "1",
    "User-Agent": "duetime-worker",
    "Content-Type": "application/json",
}

# --- the sink -----------------------------------------------------------------------------

_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
    b"Connection: keep-alive\r\n\r\n{}"
)


class _SinkProtocol(asyncio.Protocol):
    """Answers every request on a connection with 200 (keep-alive); pipelining-safe."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            length = 0
            marker = head.find(b"content-length:")
            if marker >= 0:
                length = int(head[marker + 15 :].split(b"\r\n", 1)[0].strip())
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            assert self.transport is not None
            self.transport.write(_ANSWER)


def _serve(sock: socket.socket) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_SinkProtocol, sock=sock, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def start_sink() -> tuple[Any, str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    process = multiprocessing.get_context("fork").Process(target=_serve, args=(sock,), daemon=True)
    process.start()
    sock.close()  # the child has its copy
    return process, f"http://127.0.0.1:{port}/hook"


# --- the clients --------------------------------------------------------------------------

Send = Callable[[], Awaitable[int]]


async def _load(send: Send, concurrency: int, duration_s: float) -> dict[str, Any]:
    """``concurrency`` tasks sending back to back; figures from after the warm-up."""
    latencies_ms: list[float] = []
    errors = 0
    measuring = False
    stop_at = time.perf_counter() + WARMUP_S + duration_s

    async def slot() -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            try:
                status = await send()
                ok = 200 <= status < 300
            except Exception:
                ok = False
            if measuring:
                if ok:
                    latencies_ms.append((time.perf_counter() - started) * 1000)
                else:
                    errors += 1

    tasks = [asyncio.create_task(slot()) for _ in range(concurrency)]
    await asyncio.sleep(WARMUP_S)
    measuring = True
    began = time.perf_counter()
    await asyncio.gather(*tasks)
    elapsed_s = time.perf_counter() - began
    return {
        "requests": len(latencies_ms),
        "errors": errors,
        "elapsed_s": round(elapsed_s, 3),
        "req_per_s": round(len(latencies_ms) / elapsed_s, 1),
        "latency_ms": {
            k: None if v is None else round(v, 2) for k, v in percentiles(latencies_ms).items()
        },
    }


async def run_httpx(url: str, concurrency: int, duration_s: float) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, follow_redirects=False) as client:

        async def send() -> int:
            response = await client.post(url, content=BODY, headers=HEADERS, timeout=30)
            return response.status_code

        return await _load(send, concurrency, duration_s)


async def _run_aiohttp_session(
    session: Any, url: str, concurrency: int, duration_s: float
) -> dict[str, Any]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=30)

    async def send() -> int:
        async with session.post(
            url, data=BODY, headers=HEADERS, allow_redirects=False, timeout=timeout
        ) as response:
            await response.read()
            return int(response.status)

    try:
        return await _load(send, concurrency, duration_s)
    finally:
        await session.close()


async def run_aiohttp(url: str, concurrency: int, duration_s: float) -> dict[str, Any]:
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))
    return await _run_aiohttp_session(session, url, concurrency, duration_s)


async def run_worker_session(url: str, concurrency: int, duration_s: float) -> dict[str, Any]:
    from duetime.consumers.worker.http_target import new_session
    from duetime.consumers.worker.policy import EgressPolicy

    session = new_session(EgressPolicy(loopback=True), concurrency)
    return await _run_aiohttp_session(session, url, concurrency, duration_s)


CLIENTS = {
    "httpx": run_httpx,
    "aiohttp": run_aiohttp,
    "aiohttp_worker_session": run_worker_session,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.http_clients", description=__doc__)
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="run every (client, concurrency) this many times, interleaved; report the median",
    )
    args = parser.parse_args(argv)
    from importlib.metadata import version

    sink, url = start_sink()
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        name: {str(c): [] for c in CONCURRENCY} for name in CLIENTS
    }
    try:
        for round_no in range(1, args.rounds + 1):
            for name, run in CLIENTS.items():
                for concurrency in CONCURRENCY:
                    figure = asyncio.run(run(url, concurrency, args.duration_s))
                    runs[name][str(concurrency)].append(figure)
                    progress(
                        f"round {round_no}: {name} at {concurrency} in flight: "
                        f"{figure['req_per_s']} req/s, p99 {figure['latency_ms']['p99']} ms, "
                        f"{figure['errors']} errors"
                    )
    finally:
        sink.terminate()
        sink.join(5)
    figures = {
        name: {c: _median_run(cell) for c, cell in by_concurrency.items()}
        for name, by_concurrency in runs.items()
    }
    result = {
        "scenario": "http-clients",
        "figures": figures,
        "config": {
            "concurrency": list(CONCURRENCY),
            "duration_s": args.duration_s,
            "rounds": args.rounds,
            "warmup_s": WARMUP_S,
            "body_bytes": len(BODY),
            "sink": "asyncio HTTP/1.1 keep-alive server in its own process on 127.0.0.1",
            "httpx": version("httpx"),
            "aiohttp": version("aiohttp"),
        },
    }
    write_result("http-clients", result)
    print(json.dumps(figures, indent=2))
    return 0


def _median_run(cell: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median throughput (its latencies with it), plus every round's rate."""
    ordered = sorted(cell, key=lambda f: float(f["req_per_s"]))
    return {**ordered[len(ordered) // 2], "req_per_s_rounds": [f["req_per_s"] for f in cell]}


if __name__ == "__main__":
    raise SystemExit(main())

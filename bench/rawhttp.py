"""A minimal keep-alive HTTP/1.1 client connection on asyncio streams, for load generators.

The load generators share the two cores with everything they measure, and a full client
(httpx, aiohttp) costs several times the CPU per request (measured: ``/healthz`` tops out at
~430/s through httpx on this machine). ``Content-Length`` answers only (the API's).
"""

from __future__ import annotations

import asyncio


class RawHttpConnection:
    """One keep-alive connection; ``request`` sends a JSON body, returns (status, body)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readline()
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        payload = await self.reader.readexactly(length)
        parts = status_line.split()
        if len(parts) < 2:
            raise ValueError(f"malformed status line {status_line[:100]!r}")
        return int(parts[1]), payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

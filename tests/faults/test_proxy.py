"""The black-holing TCP proxy itself (no broker needed): relays, holds, releases in order."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.faults.proxy import TcpProxy


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return

            def echo_back(c: socket.socket = conn) -> None:
                with c:
                    while data := c.recv(65536):
                        c.sendall(data)

            threading.Thread(target=echo_back, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def _recv(sock: socket.socket, n: int, timeout_s: float) -> bytes:
    sock.settimeout(timeout_s)
    out = b""
    try:
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                break
            out += chunk
    except TimeoutError:
        pass
    return out


def test_relays_then_holds_both_ways_then_releases_in_order(echo: int) -> None:
    proxy = TcpProxy(echo).start()
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as c:
            c.sendall(b"hello")
            assert _recv(c, 5, 5) == b"hello"
            big = bytes(range(256)) * 4096  # 1 MiB: more than the socket buffers hold
            proxy.blackhole()
            sender = threading.Thread(target=c.sendall, args=(big,), daemon=True)
            sender.start()
            assert _recv(c, 1, 1.0) == b""  # nothing comes back while the hole is open
            # a connection made meanwhile is accepted but goes nowhere
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as late:
                late.sendall(b"late")
                assert _recv(late, 4, 0.5) == b""
                proxy.restore()
                assert _recv(late, 4, 5) == b"late"
            assert _recv(c, len(big), 10) == big  # everything, in order, nothing lost
            sender.join(5)
    finally:
        proxy.close()

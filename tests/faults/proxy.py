"""A loopback TCP proxy that can black-hole its traffic both ways on demand.

``TcpProxy(target_port).start()`` listens on 127.0.0.1:<port> and relays every connection to
127.0.0.1:<target_port>. ``blackhole()`` stops relaying in both directions without closing
anything: bytes stay where they are (in the kernels' socket buffers or in the relay), new
connections are accepted but not connected upstream, so both peers see a silent network as
with an ``iptables -j DROP`` rule. ``restore()`` lets everything held flow again, in order,
as TCP retransmission would after the rule is removed (a peer that gave up meanwhile closes
its connection; the relay then closes the other side).

Kafka clients learn broker addresses from metadata, so a proxied client only stays behind the
proxy if the broker advertises the proxy's address to it: give the broker a second listener
whose advertised address is the proxy (see ``ProxiedStack`` in ``test_network_faults.py``) and
bootstrap the client to the proxy. Every connection of that client then crosses the proxy,
and a fault applies to it alone.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from dataclasses import dataclass, field

_CHUNK = 65536
_TICK_S = 0.05


@dataclass
class _Pair:
    client: socket.socket
    upstream: socket.socket | None = None
    closed: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        self.closed.set()
        for s in (self.client, self.upstream):
            if s is not None:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()


class TcpProxy:
    def __init__(self, target_port: int, port: int = 0, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(256)
        self._listener.settimeout(_TICK_S)  # accept() wakes up to see close()
        self.port: int = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._stopping = threading.Event()
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True)
        self.connections = 0
        self.bytes_relayed = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def blackhole(self) -> None:
        """Relay nothing more, either way, until :meth:`restore`."""
        self._open.clear()

    def restore(self) -> None:
        self._open.set()

    @property
    def blackholed(self) -> bool:
        return not self._open.is_set()

    def close(self) -> None:
        self._stopping.set()
        self._open.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            pair.close()
        self._thread.join(5)

    # --- relaying -------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            pair = _Pair(client)
            with self._lock:
                self._pairs.append(pair)
                self.connections += 1
            threading.Thread(target=self._connect, args=(pair,), daemon=True).start()

    def _wait_open(self, pair: _Pair) -> bool:
        while not self._open.wait(_TICK_S):
            if pair.closed.is_set() or self._stopping.is_set():
                return False
        return not (pair.closed.is_set() or self._stopping.is_set())

    def _connect(self, pair: _Pair) -> None:
        if not self._wait_open(pair):  # a SYN into the void: connect only once restored
            return
        try:
            pair.upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            pair.close()
            return
        for src, dst in ((pair.client, pair.upstream), (pair.upstream, pair.client)):
            threading.Thread(target=self._pump, args=(pair, src, dst), daemon=True).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not pair.closed.is_set():
                if not self._wait_open(pair):
                    return
                # sockets stay blocking (a timeout would also cut a slow sendall the other way)
                readable, _, _ = select.select([src], [], [], _TICK_S)
                if not readable:
                    continue
                data = src.recv(_CHUNK)
                if not data:
                    return
                # read just as the hole opened: hold it, as the network would, until restored
                if not self._wait_open(pair):
                    return
                dst.sendall(data)
                self.bytes_relayed += len(data)
        except OSError:
            return
        finally:
            pair.close()
            with self._lock, contextlib.suppress(ValueError):
                self._pairs.remove(pair)
